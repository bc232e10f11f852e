"""CPU checks of the Multi-CTA kernel's FILL_IDLE_SMS option (``kernels_tlx.multi_cta``; TLX venv:
``.venv-tlx/bin/python -m pytest tests/tlx/test_multi_cta_fill_tlx.py``): the SMs the persistent c4 / c8 grid leaves
idle run the last rows with the half-size two-tile cluster kernel (``TilingConfig.fill_config()``), launched as a
programmatic dependent grid.

- Config validation, ``fill_config()``, the N check of both kernels, the shipped configs and their YAML entries.
- RECOMPUTE_TILES (``_recompute_norm_kernel``: each CTA's tiles computed twice, no parked tile; the filler of the
  c8 grid with FILL_RECOMPUTE): validation, the configs, and its sm_90a build (no spills, the cluster exchange, the
  shared memory of one tile).
- The row split (``_run_filled``) with the launches recorded instead of run: the two grids, their rows and their
  outputs (row blocks of one y / mean / rstd), ``launch_pdl`` on the filler only, no split without idle SMs.
- The cluster kernel with ``PDL_TRIGGER`` holds ``griddepcontrol.launch_dependents`` and the filler with
  ``PDL_WAIT_END`` a ``griddepcontrol.wait`` (compile-only, sm_90a); without the flags neither.

The launches themselves need the GPU: ``python -m kernels_tlx.multi_cta --quick --no-bench --config
c4_defer_lnpack_fill ...`` on the H200 checks both kernels' rows against the fp32 reference (M = 17793 and 40000
split), as ``make test-gpu`` does for every YAML entry.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from kernels_tlx import lazy_prenorm as lp  # noqa: E402
from kernels_tlx import multi_cta as km  # noqa: E402
from normfuse.testing import run_python_json, run_python_json_parallel  # noqa: E402

FILL = {"c4_defer_lnpack_fill": (4, 100), "c4_defer_lnpack_fill90": (4, 90), "c4_defer_lnpack_fill80": (4, 80),
        "c8_defer_lnpack_fill": (8, 100)}
FILL_RC = {"c8_defer_lnpack_fill_rc50": 50, "c8_defer_lnpack_fill_rc40": 40}
RC = {"c1_t2_rc": (1, 2, 512), "c2_t2_rc_lnpack": (2, 2, 1024), "c2_t4_rc_lnpack": (2, 4, 2048)}


def test_configs_and_validation():
    for name, (C, rate) in FILL.items():
        cfg = km.SHIPPED_CONFIGS[name]
        assert cfg.FILL_IDLE_SMS and cfg.FILL_RATE_PCT == rate and cfg.CLUSTER_SIZE == C and cfg.STORE_DEFER, name
        fc = cfg.fill_config()
        assert (fc.CLUSTER_SIZE, fc.TILES_PER_CTA, fc.LN_PACKED, fc.FILL_IDLE_SMS) == (C // 2, 2, True, False), name
    assert km.SHIPPED_CONFIGS["c4_defer_lnpack_fill"].fill_config() == km.SHIPPED_CONFIGS["c2_t2_lnpack"]
    assert km.SHIPPED_CONFIGS["c8_defer_lnpack_fill"].fill_config() == km.SHIPPED_CONFIGS["c4_t2_lnpack"]
    need = "FILL_IDLE_SMS=True needs CLUSTER_SIZE 4 or 8, PERSISTENT=True and TILES_PER_CTA=1"
    for bad in (dict(CLUSTER_SIZE=2), dict(CLUSTER_SIZE=16), dict(PERSISTENT=False),
                dict(CLUSTER_SIZE=4, TILES_PER_CTA=2)):
        with pytest.raises(ValueError, match=need):
            km.TilingConfig(**{"CLUSTER_SIZE": 4, **bad, "FILL_IDLE_SMS": True})
    with pytest.raises(ValueError, match="FILL_RATE_PCT=500 must be in 1 .. 400"):
        km.TilingConfig(FILL_IDLE_SMS=True, FILL_RATE_PCT=500)
    with pytest.raises(ValueError, match="FILL_RATE_PCT=80 applies with FILL_IDLE_SMS=True only"):
        km.TilingConfig(FILL_RATE_PCT=80)
    with pytest.raises(ValueError, match="FILL_RATE_PCT"):
        km.TilingConfig(FILL_IDLE_SMS=True, FILL_RATE_PCT=0.8)


def test_recompute_configs_and_validation():
    for name, rate in FILL_RC.items():
        cfg = km.SHIPPED_CONFIGS[name]
        assert cfg.FILL_IDLE_SMS and cfg.FILL_RECOMPUTE and cfg.FILL_RATE_PCT == rate and cfg.CLUSTER_SIZE == 8
        assert cfg.fill_config() == km.SHIPPED_CONFIGS["c2_t4_rc_lnpack"], name  # 2 CTAs x 4 tiles = 8 x 1 tile
        assert cfg.supports(2048) and cfg.supports(1000), name
    for name, (C, T, N) in RC.items():
        cfg = km.SHIPPED_CONFIGS[name]
        assert cfg.RECOMPUTE_TILES and (cfg.CLUSTER_SIZE, cfg.TILES_PER_CTA) == (C, T) and cfg.block_n(N) == 256
        assert not cfg.supports(2 * N), name
    for bad in (dict(CLUSTER_SIZE=2, TILES_PER_CTA=3), dict(CLUSTER_SIZE=2, TILES_PER_CTA=8),
                dict(CLUSTER_SIZE=4, TILES_PER_CTA=4)):  # only the sizes built and tested
        with pytest.raises(ValueError, match=r"RECOMPUTE_TILES=True needs TILES_PER_CTA in \(2, 4\) and CLUSTER_SIZE"):
            km.TilingConfig(**bad, LN_PACKED=True, RECOMPUTE_TILES=True)
    with pytest.raises(ValueError, match=r"fill_config\(\) needs FILL_IDLE_SMS=True"):
        km.SHIPPED_CONFIGS["c4_defer_lnpack"].fill_config()
    with pytest.raises(ValueError, match="RECOMPUTE_TILES=True needs LN_PACKED=True"):
        km.TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=4, RECOMPUTE_TILES=True)
    with pytest.raises(ValueError, match="RECOMPUTE_TILES=True excludes STORE_DEFER, PINGPONG"):
        km.TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=4, LN_PACKED=True, RECOMPUTE_TILES=True, STORE_DEFER=True,
                        PINGPONG=True)
    with pytest.raises(ValueError, match="TILES_PER_CTA=4 must be 1 or 2"):  # parked tiles: still at most 2
        km.TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=4, LN_PACKED=True)
    with pytest.raises(ValueError, match="FILL_RECOMPUTE=True applies with FILL_IDLE_SMS=True only"):
        km.TilingConfig(CLUSTER_SIZE=8, FILL_RECOMPUTE=True)
    a = torch.empty(256, 64, dtype=torch.bfloat16)
    b = torch.empty(64, 2048, dtype=torch.bfloat16)
    for norm in ("none", "lazy_rms"):
        with pytest.raises(ValueError, match="RECOMPUTE_TILES=True applies to matmul_rmsnorm / matmul_layernorm"):
            km._prepare(a, b, None, None, 1e-6, norm, km.SHIPPED_CONFIGS["c2_t4_rc_lnpack"], need_cuda=False)


_RC_SCRIPT = r"""
import json, sys, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import multi_cta as km
out = {}
for name, N, K, affine in json.loads(sys.argv[1]):
    a = torch.empty(4096, K, dtype=torch.bfloat16)
    b = torch.empty(K, N, dtype=torch.bfloat16)
    for op in ("matmul_rmsnorm", "matmul_layernorm"):
        r = km.compile_sm90(op, a, b, config=km.SHIPPED_CONFIGS[name], affine=affine, ptxas=True)
        out[f"{name}/{op}/{N}/{int(affine)}"] = dict(spills=r["ptxas"]["spill_stores"], shared=r["shared_bytes"],
                                                    est=r["smem_estimate"], markers=r["ptx_markers"],
                                                    st_async=r["ptx_extra"]["st_async_b64"], bn=r["block_n"],
                                                    fence=r["ptx_extra"]["fence_mbarrier_init"],
                                                    tx=r["expect_tx_bytes"])
print(json.dumps(out))
"""


def test_recompute_kernel_compiles():
    """sm_90a builds of the RECOMPUTE_TILES kernel at the benchmark N (and a ragged N with affine): no spills, the
    shared memory of one tile per CTA (under 227 KB, as estimated), wgmma + TMA, and with a cluster the packed
    exchange (one 64-bit st.async per peer and row)."""

    jobs = [(name, N, 1024, False) for name, (_, _, N) in RC.items()] + [("c2_t4_rc_lnpack", 1800, 72, True)]
    r = run_python_json_parallel(_RC_SCRIPT, jobs, timeout=600)
    assert len(r) == 2 * len(jobs)
    for key, v in r.items():
        name = key.split("/")[0]
        assert v["spills"] == 0, (key, v)
        assert v["shared"] <= km.SMEM_LIMIT_BYTES and 0 <= v["est"] - v["shared"] <= 4096, (key, v)
        assert v["markers"]["wgmma"] > 0 and v["markers"]["tma_load"] > 0, (key, v)
        C = km.SHIPPED_CONFIGS[name].CLUSTER_SIZE
        assert (v["st_async"] > 0) == (C > 1) and v["fence"] == (C > 1), (key, v)  # the cluster-wide barrier init
        # the ring stage (A of both consumers + the B tile) and, with a peer, its 64 packed words per consumer
        assert (128 * 64 + 64 * v["bn"]) * 2 in v["tx"] and ((64 * 8 * (C - 1)) in v["tx"]) == (C > 1), (key, v)


def test_both_kernels_must_serve_n():
    cfg = km.SHIPPED_CONFIGS["c4_defer_lnpack_fill"]
    assert cfg.supports(1024) and cfg.supports(512) and not cfg.supports(2048)
    # a 7-stage ring fits the c4 kernel with a half-size staging tile, not the two-tile filler with its whole parked one
    deep = dict(CLUSTER_SIZE=4, BLOCK_K=32, NUM_STAGES=7, EPILOGUE_SUBTILE=True)
    assert km.TilingConfig(**deep).supports(1024)
    with pytest.raises(ValueError, match=r"the filler \(fill_config\(\)\) cannot serve N=1024: .*shared memory"):
        km.TilingConfig(**deep, FILL_IDLE_SMS=True).block_n(1024)


def test_lazy_ops_refuse_the_option():
    a = torch.empty(256, 64, dtype=torch.bfloat16)
    b = torch.empty(64, 1024, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="use kernels_tlx.lazy_prenorm's TilingConfig.FILL_IDLE_SMS"):
        km._prepare(a, b, None, None, 1e-6, "lazy_rms", km.SHIPPED_CONFIGS["c4_defer_lnpack_fill"], need_cuda=False)


def test_yaml_entries():
    entries = {e["name"]: e for e in yaml.safe_load((REPO / "configs/tiling/multi_cta_h200.yaml").read_text())["tlx"]}
    for name in [*FILL, *FILL_RC, "c2_t2_rc_lnpack", "c2_t4_rc_lnpack"]:
        e = dict(entries[name.replace("_", "-") + "-persistent-s3"])
        e.pop("name")
        assert e.pop("impls") == ["fused"], e
        assert km.TilingConfig.from_dict(e) == km.SHIPPED_CONFIGS[name], (name, e)


class _Launches:
    """Stands in for ``_multi_cta_norm_kernel``: records each launch's grid, rows (M) and output pointers (y: the
    tensor of its c_desc)."""

    def __init__(self):
        self.calls = []

    def warmup(self, *args, **kwargs):
        return object()

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append(dict(grid=grid, M=args[7], y=args[2].base.data_ptr(), mean=args[5].data_ptr(),
                                   rstd=args[6].data_ptr(), C=kwargs["CLUSTER_SIZE"], TILES=kwargs.get("TILES", 1),
                                   pdl=kwargs.get("launch_pdl", False), trigger=kwargs.get("PDL_TRIGGER", False),
                                   wait=kwargs.get("PDL_WAIT_END", False)))
        return launch


@pytest.fixture
def recorded(monkeypatch):
    rec = _Launches()
    prepare = km._prepare
    monkeypatch.setattr(km, "_multi_cta_norm_kernel", rec)
    monkeypatch.setattr(km, "_prepare", lambda *a, need_cuda, **k: prepare(*a, need_cuda=False, **k))
    monkeypatch.setattr(km, "_num_sms", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "device", lambda device: nullcontext())
    return rec, monkeypatch


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_rows_split_between_the_two_grids(recorded, norm):
    rec, mp = recorded
    mp.setattr(km, "_max_active_clusters", lambda ck, C, device: 30)  # the H200's c4 grid: 120 of 132 SMs
    M, N, K = 17793, 1024, 64
    a = torch.empty(M, K, dtype=torch.bfloat16)
    b = torch.empty(K, N, dtype=torch.bfloat16)
    cfg = km.SHIPPED_CONFIGS["c4_defer_lnpack_fill90"]
    y, mean, rstd = km._run_filled(a, b, None, None, 1e-5, norm, cfg)
    m_fill = lp.fill_rows(M, 120, 12, 90, 128)
    m_c = M - m_fill
    assert m_fill > 0 and m_fill % 128 == 0
    main, fill = rec.calls
    assert (main["grid"], main["M"], main["C"], main["TILES"]) == ((120, ), m_c, 4, 1)
    assert main["trigger"] and not main["pdl"] and not main["wait"]
    # the filler: 6 c2 clusters (12 idle SMs), two tiles per CTA, a programmatic dependent launch that waits at its end
    assert (fill["grid"], fill["M"], fill["C"], fill["TILES"]) == ((12, ), m_fill, 2, 2)
    assert fill["pdl"] and fill["wait"] and not fill["trigger"]
    # both write row blocks of the same outputs
    assert main["y"] == y.data_ptr() and fill["y"] == y[m_c:].data_ptr()
    assert fill["rstd"] == rstd[m_c:].data_ptr() and main["rstd"] == rstd.data_ptr()
    if norm == "layer":
        assert fill["mean"] == mean[m_c:].data_ptr() and main["mean"] == mean.data_ptr()
    else:
        assert mean is None


def test_recompute_filler_of_the_c8_grid(recorded):
    """FILL_RECOMPUTE: the c8 grid (15 clusters, 120 SMs) on the first rows, six 2-CTA clusters of the
    RECOMPUTE_TILES kernel (four tiles per CTA) on the last rows at 50 % of a cluster SM's rate."""
    rec, mp = recorded
    mp.setattr(km, "_recompute_norm_kernel", rec)
    mp.setattr(km, "_max_active_clusters", lambda ck, C, device: 15)
    M, N, K = 262144, 2048, 64
    a = torch.empty(M, K, dtype=torch.bfloat16)
    b = torch.empty(K, N, dtype=torch.bfloat16)
    y, mean, rstd = km._run_filled(a, b, None, None, 1e-5, "layer", km.SHIPPED_CONFIGS["c8_defer_lnpack_fill_rc50"])
    m_fill = lp.fill_rows(M, 120, 12, 50, 128)
    main, fill = rec.calls
    assert (main["grid"], main["M"], main["C"], main["TILES"], main["trigger"]) == ((120, ), M - m_fill, 8, 1, True)
    assert (fill["grid"], fill["M"], fill["C"], fill["TILES"], fill["pdl"], fill["wait"]) == ((12, ), m_fill, 2, 4,
                                                                                              True, True)
    assert fill["y"] == y[M - m_fill:].data_ptr() and fill["mean"] == mean[M - m_fill:].data_ptr()


def test_fill_split():
    """The H200's grids: c4 / c8 hold 120 SMs (30 / 15 clusters), the filler the other 12 as 6 clusters of 2 (or 3
    of 4: c8's two-tile c4 filler); the split follows lazy_prenorm.fill_rows over the SMs the filler uses."""
    c4, c8, rc = (km.SHIPPED_CONFIGS[n] for n in ("c4_defer_lnpack_fill90", "c8_defer_lnpack_fill",
                                                  "c8_defer_lnpack_fill_rc50"))
    assert km.fill_split(c4, 262144, 30, 132) == (lp.fill_rows(262144, 120, 12, 90, 128), 6)
    assert km.fill_split(c8, 262144, 15, 132) == (lp.fill_rows(262144, 120, 12, 100, 128), 3)
    assert km.fill_split(rc, 262144, 15, 132) == (lp.fill_rows(262144, 120, 12, 50, 128), 6) == (12416, 6)
    assert km.fill_split(c4, 262144, 30, 131) == (lp.fill_rows(262144, 120, 10, 90, 128), 5)  # an odd idle SM: unused
    assert km.fill_split(c4, 262144, None, 132) == (0, 0) == km.fill_split(c4, 262144, 33, 132)
    assert km.fill_split(c4, 1000, 30, 132) == (0, 0)  # fewer than BLOCK_M rows for the filler
    # the split assumes the whole persistent grid busy, also for few M-tiles (as GPU-checked: M <= 1000 unsplit)
    assert km.fill_split(c4, 2048, 30, 132) == (lp.fill_rows(2048, 120, 12, 90, 128), 6) == (128, 6)


def test_no_split_without_idle_sms_or_rows(recorded):
    rec, mp = recorded
    cfg = km.SHIPPED_CONFIGS["c4_defer_lnpack_fill"]
    b = torch.empty(64, 1024, dtype=torch.bfloat16)
    for clusters, M in ((33, 262144), (30, 1000), (None, 4096)):  # no idle SM / < BLOCK_M filler rows / unknown
        rec.calls.clear()
        mp.setattr(km, "_max_active_clusters", lambda ck, C, device, n=clusters: n)
        a = torch.empty(M, 64, dtype=torch.bfloat16)
        if clusters is None:  # said, not silent
            with pytest.warns(RuntimeWarning, match="co-resident cluster count is unknown"):
                km._run_filled(a, b, None, None, 1e-6, "rms", cfg)
        else:
            km._run_filled(a, b, None, None, 1e-6, "rms", cfg)
        assert len(rec.calls) == 1 and rec.calls[0]["M"] == M and not rec.calls[0]["pdl"], (clusters, M)


_SCRIPT = r"""
import json, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import multi_cta as km
a = torch.empty(4096, 512, dtype=torch.bfloat16)
out = {}
for name, N in (("c4_defer_lnpack_fill", 1024), ("c8_defer_lnpack_fill", 2048), ("c8_defer_lnpack_fill_rc50", 2048)):
    b = torch.empty(512, N, dtype=torch.bfloat16)
    cfg = km.SHIPPED_CONFIGS[name]
    for role, c, flag, marker in (("main", cfg, "PDL_TRIGGER", "griddepcontrol.launch_dependents"),
                                  ("fill", cfg.fill_config(), "PDL_WAIT_END", "griddepcontrol.wait")):
        *_, args, kw = km._prepare(a, b, None, None, 1e-5, "layer", c, need_cuda=False)
        for on in (False, True):
            ptx = km._kernel(c).warmup(*args, grid=(c.CLUSTER_SIZE,), **kw, **({flag: True} if on else {})).asm["ptx"]
            out[f"{name}/{role}/{on}"] = ptx.count(marker)
print(json.dumps(out))
"""


def test_pdl_instructions_compile():
    r = run_python_json(_SCRIPT, timeout=600)
    for name in ("c4_defer_lnpack_fill", "c8_defer_lnpack_fill", "c8_defer_lnpack_fill_rc50"):
        for role in ("main", "fill"):
            assert (r[f"{name}/{role}/False"], r[f"{name}/{role}/True"]) == (0, 1), (name, role, r)


_MCAST_SCRIPT = r"""
import json, sys, torch
from dataclasses import replace
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import multi_cta as km
cfg = km.SHIPPED_CONFIGS["c4_defer_lnpack_mcast_fill"]
out = {}
for N in json.loads(sys.argv[1]):
    a = torch.empty(4096, 512, dtype=torch.bfloat16)
    b = torch.empty(512, N, dtype=torch.bfloat16)
    for op in ("matmul_rmsnorm", "matmul_layernorm"):
        r = km.compile_sm90(op, a, b, config=replace(cfg, FILL_IDLE_SMS=False), ptxas=True)
        out[f"{op}/{N}"] = dict(spills=r["ptxas"]["spill_stores"] + r["ptxas"]["spill_loads"],
                                mcast=r["ptx_extra"]["tma_multicast"], shared=r["shared_bytes"])
print(json.dumps(out))
"""


def test_mcast_fill_primary_compiles():
    """``c4_defer_lnpack_mcast_fill``: its filler is the plain two-tile c2 kernel (no multicast: ``fill_config``);
    its primary, the c4 STORE_DEFER kernel with MULTICAST_A (not shipped alone), builds for sm_90a with the
    multicast TMA loads and no spills at the benchmark N and a ragged one."""
    cfg = km.SHIPPED_CONFIGS["c4_defer_lnpack_mcast_fill"]
    assert cfg.MULTICAST_A and cfg.FILL_IDLE_SMS and not cfg.fill_config().MULTICAST_A
    assert cfg.fill_config() == km.SHIPPED_CONFIGS["c2_t2_lnpack"]
    r = run_python_json_parallel(_MCAST_SCRIPT, [1024, 1000], timeout=600)
    assert len(r) == 4
    for key, v in r.items():
        assert v["spills"] == 0 and v["mcast"] > 0 and v["shared"] <= km.SMEM_LIMIT_BYTES, (key, v)
