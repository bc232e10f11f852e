"""The TLX Lazy Pre-Norm *cluster form* (``kernels_tlx.lazy_prenorm.TilingConfig.CLUSTER_SIZE``; the kernel is
``kernels_tlx.multi_cta``'s, NORM ``lazy_rms`` / ``lazy_layer``), on the CPU (TLX venv:
``.venv-tlx/bin/python -m pytest tests/tlx/test_lazy_prenorm_cluster_tlx.py``).

1. Compile-only for sm_90a of every shipped cluster config (RMSNorm ``SHIPPED_CONFIGS``, LayerNorm
   ``SHIPPED_LN_CONFIGS``) at the blog shape it serves and at odd cluster shapes (M = 1, K = 8 < BLOCK_K, K tails,
   a partial last column slice), through ``kernels_tlx.lazy_prenorm.compile_sm90`` (which delegates): ptxas ok and
   no spills, the cluster shape ``[C, 1, 1]``, the DSMEM exchange (``mapa``, ``st.async`` sites, the receive
   barrier armed with the peers' bytes), shared memory under 227 KB and within 4 KB of the estimate; the cluster
   GEMM (``matmul``) of such a config compiles too.
2. Config validation (ValueError), ``supports(N)`` ranges, the host wiring (``_run`` delegates the LayerNorm op
   to ``multi_cta.lazy_layernorm_matmul``; colsum / beta_b validated), the self-check's case lists.
3. The experiment ``lazy_prenorm_ln_cluster`` and the tiling entries (plain YAML; Hydra composition is in
   tests/test_configs.py, main venv).

Compile-only does not catch deadlocks, races or numerics: ``python -m kernels_tlx.lazy_prenorm --variant layernorm
--config ln_cluster_c2 ...`` on the H200 is the correctness test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from kernels_tlx import lazy_prenorm as klp  # noqa: E402
from kernels_tlx import multi_cta as km  # noqa: E402
from kernels_tlx.lazy_prenorm import SHIPPED_CONFIGS, SHIPPED_LN_CONFIGS, TilingConfig  # noqa: E402
from normfuse.compile_only import SMEM_LIMIT_BYTES  # noqa: E402
from normfuse.testing import run_python_json_parallel  # noqa: E402

RMS_OP, LN_OP = "lazy_rmsnorm_matmul", "lazy_layernorm_matmul"
CLUSTER_RMS = {n: c for n, c in SHIPPED_CONFIGS.items() if c.CLUSTER_SIZE > 1}
CLUSTER_LN = {n: c for n, c in SHIPPED_LN_CONFIGS.items() if c.CLUSTER_SIZE > 1}
BLOG_N = {2: 512, 4: 1024, 8: 2048}  # the N each cluster size serves on the blog grid (BLOCK_N 256)
ODD_N = {2: 488, 4: 1000, 8: 2024}  # a partial last column slice
BLOG_M, BLOG_K = 262144, 1024


def _jobs():
    """(op, name, M, N, K): blog shape for every config; odd shapes (M = 1 with a K tail, K = 8, K = 72) for the
    LayerNorm ones, one odd shape for the RMSNorm ones (GPU-checked already); the cluster GEMM once."""
    jobs = []
    for name, cfg in CLUSTER_RMS.items():
        C, full = cfg.CLUSTER_SIZE, cfg.CLUSTER_SIZE * cfg.TILES_PER_CTA * cfg.BLOCK_N  # the row the cluster covers
        jobs += [(RMS_OP, name, BLOG_M, full, BLOG_K), (RMS_OP, name, 129, full - 24, 8)]
    for name, cfg in CLUSTER_LN.items():
        C = cfg.CLUSTER_SIZE
        jobs += [(LN_OP, name, BLOG_M, BLOG_N[C], BLOG_K), (LN_OP, name, 1, ODD_N[C], 1000),
                 (LN_OP, name, 129, ODD_N[C], 8)]
    jobs.append((LN_OP, "ln_cluster_c4", 1000, 1024, 72))  # K = 1 full + 1 partial step, full row
    jobs.append(("matmul", "ln_cluster_c4", 1000, 1000, 1000))  # the cluster GEMM of a cluster config
    return jobs


_COMPILE_SCRIPT = r"""
import json, sys, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import lazy_prenorm as klp, multi_cta as km
from normfuse.codestats import ptxas_info

out = {}
for op, name, M, N, K in json.loads(sys.argv[1]):
    cfg = {**klp.SHIPPED_CONFIGS, **klp.SHIPPED_LN_CONFIGS}[name]
    a = torch.empty(M, K, dtype=torch.bfloat16)  # never read
    b = torch.empty(K, N, dtype=torch.bfloat16)
    s = klp.compile_sm90(op, a, b, eps=1e-5, config=cfg)
    # ptxas -v of the same (cached) build
    mcfg = cfg.cluster_config()
    norm = {"matmul": "none", **km._NORM_OF_OP}[op]
    _, _, _, args, kw = km._prepare(a, b, None, None, 1e-5, norm, mcfg, need_cuda=False)
    ck = km._multi_cta_norm_kernel.warmup(*args, grid=km._grid(mcfg, M, None), **kw)
    s["ptxas"] = ptxas_info(ck.asm["ptx"])
    s["launch"] = {k: v for k, v in kw.items() if k in ("EVEN_K", "HAS_W", "HAS_B", "NORM", "STORE_DEFER")}
    out[f"{op}/{name}/{M}x{N}x{K}"] = s
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled():
    return run_python_json_parallel(_COMPILE_SCRIPT, _jobs(), timeout=900)  # two compile processes in parallel


# --------------------------------------------------------------------------------------------------------
# 1. compile-only for sm_90a
# --------------------------------------------------------------------------------------------------------
def test_compile_every_shipped_cluster_config(compiled):
    assert len(compiled) == len(_jobs())
    for key, r in compiled.items():
        op, name, shape = key.split("/")
        M, N, K = map(int, shape.split("x"))
        cfg = {**SHIPPED_CONFIGS, **SHIPPED_LN_CONFIGS}[name]
        C = cfg.CLUSTER_SIZE
        mk, ex = r["ptx_markers"], r["ptx_extra"]
        assert r["block_n"] == cfg.BLOCK_N, key
        assert r["ptxas"]["registers"] is not None, (key, r["ptxas"])  # ptxas compiled it
        # no spills at the blog shapes; at a ragged N (not a multiple of 16: the masked colsum / beta_b loads are not
        # vectorized) at most a few registers' worth, as multi_cta's affine (16 B seen: LayerNorm c8, N = 2024)
        # (STATS_ELEMENTWISE LayerNorm holds 64 more registers: 72 B seen for c8 at N = 2024; measured slower anyway)
        spills = r["ptxas"]["spill_stores"] + r["ptxas"]["spill_loads"]
        # (LN_SHIFT_PREFETCH carries the next tile's shift through the epilogue: 104 B for c4 at (1, 1000, 1000); a
        # measured-slower option)
        ragged_limit = 80 if name == "ln_cluster_c8_defer_elem" else 128 if name.endswith("_mma_pf") else 64
        assert spills <= (0 if N == C * cfg.BLOCK_N else ragged_limit), (key, r["ptxas"])
        assert r["smem_ok"] and r["shared_bytes"] <= SMEM_LIMIT_BYTES, key
        # the estimate bounds the build, tightly for the fused ops (the cluster GEMM has no exchange slots)
        slack = r["smem_estimate"] - r["shared_bytes"]
        assert 0 <= slack <= (4096 if op != "matmul" else 8192), (key, r["smem_estimate"], r["shared_bytes"])
        assert r["num_warps"] == 12, key
        assert mk["wgmma"] > 0 and mk["tma_load"] > 0 and mk["mbarrier"] > 0, (key, mk)
        assert cfg.CONSUMER_REGS in ex["setmaxnreg"] and ex["wgmma_wait_1"] >= 1, (key, ex)
        assert r["cluster_dims"] == [C, 1, 1] and ex["reqnctapercluster"].replace(" ", "") == f"{C},1,1", key
        assert r["grid"] == [-(-M // cfg.BLOCK_M) * C], key
        assert ex["fence_mbarrier_init"] >= 1 and ex["cluster_ctarank"] >= 1, key
        sync = r["ttgir_cluster_sync"]  # entry + exit cluster barrier in every region, none before the split
        assert sync["pre"] == 0 and sync["regions"] == [[2, 2]] * 3, (key, sync)
        if cfg.MULTICAST_A:
            assert ex["tma_multicast"] >= C * cfg.NUM_CONSUMERS and ex["remote_arrive"] > 0, (key, ex)
        else:
            assert ex["tma_multicast"] == 0 and ex["remote_arrive"] == 0, (key, ex)
        if op == "matmul":  # the cluster GEMM: no exchange at all
            assert ex["st_async"] == 0 and r["launch"]["NORM"] == "none", key
            continue
        nstat = 2 if op == LN_OP else 1
        # DSMEM exchange: the statistic lives in the A-slice load's row layout (4 rows per thread, vs 2 in the
        # accumulator's for matmul_rmsnorm): st.async sites = consumers x static peers x 4 x statistics, each
        # predicated to one owner thread (STATS_IN_PRODUCER: 1 row per thread, as loaded from the hand-off buffer);
        # the receive barrier expects exactly the C - 1 peers' bytes
        rows = 1 if cfg.STATS_IN_PRODUCER else 4
        assert ex["st_async"] == cfg.NUM_CONSUMERS * C * rows * nstat, (key, ex)
        assert mk["mapa"] >= ex["st_async"], (key, mk)
        assert nstat * cfg.rows_per_consumer * 4 * (C - 1) in r["expect_tx_bytes"], (key, r["expect_tx_bytes"])
        if op == LN_OP:
            assert r["launch"]["NORM"] == "lazy_layer" and r["launch"]["EVEN_K"] == (K % cfg.BLOCK_K == 0), key
            assert r["launch"]["HAS_W"] is False and r["launch"]["HAS_B"] is False, key
        else:
            assert r["launch"]["NORM"] == "lazy_rms", key
        assert r["launch"].get("STORE_DEFER", False) == cfg.STORE_DEFER, key


def test_ln_and_rms_cluster_builds_differ_only_by_the_statistic(compiled):
    """Same ring and exchange protocol (cluster dims, barrier bytes of a stage) for the two ops of one cluster size."""
    for C in (2, 4, 8):
        rms = compiled[f"{RMS_OP}/cluster_c{C}/{BLOG_M}x{BLOG_N[C]}x{BLOG_K}"]
        ln = compiled[f"{LN_OP}/ln_cluster_c{C}/{BLOG_M}x{BLOG_N[C]}x{BLOG_K}"]
        assert rms["cluster_dims"] == ln["cluster_dims"] == [C, 1, 1]
        stage = (128 * 64 + 64 * 256) * 2
        assert stage in rms["expect_tx_bytes"] and stage in ln["expect_tx_bytes"], C
        assert ln["ptx_extra"]["st_async"] == 2 * rms["ptx_extra"]["st_async"], C  # (S1, S2) vs sum of squares
        assert ln["ptx_sha256"] != rms["ptx_sha256"]


# --------------------------------------------------------------------------------------------------------
# 2. configs, validation, host wiring, self-check cases
# --------------------------------------------------------------------------------------------------------
def test_shipped_cluster_ln_configs():
    base = {"ln_cluster_c2", "ln_cluster_c4", "ln_cluster_c8", "ln_cluster_c2_defer", "ln_cluster_c4_defer",
            "ln_cluster_c8_defer"}
    elem = {"ln_cluster_c2_defer_elem", "ln_cluster_c4_defer_elem", "ln_cluster_c8_defer_elem",
            "ln_cluster_c2_defer_elem_asm", "ln_cluster_c4_defer_elem_asm"}  # STATS_ELEMENTWISE (+ STATS_UNPACK_ASM)
    # + LN_RANK1_MMA (+ LN_SHIFT_PREFETCH / LN_SHIFT_SMEM)
    mma = {f"ln_cluster_c{c}_defer_elem_asm_mma{p}" for c in (2, 4) for p in ("", "_pf", "_smemshift")}
    mma |= {f"ln_cluster_c4_defer_elem_asm_mma_fill{r}" for r in ("", "80", "65", "50", "90", "85")}  # + FILL_IDLE_SMS
    mma.add("ln_cluster_c8_s2_defer_elem_asm_mma")  # (2 stages: the B operand does not fit c8 with 3)
    elem |= mma
    assert set(CLUSTER_LN) == base | elem
    for name, cfg in CLUSTER_LN.items():
        C = cfg.CLUSTER_SIZE
        stages = 2 if "_s2_" in name else 3
        assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, cfg.NUM_STAGES) == (128, 256, 64, stages), name
        assert cfg.STORE_DEFER == ("_defer" in name) and not cfg.MULTICAST_A, name
        assert cfg.STATS_ELEMENTWISE == (name in elem) and cfg.STATS_UNPACK_ASM == ("_asm" in name), name
        assert cfg.LN_RANK1_MMA == (name in mma) and cfg.LN_SHIFT_PREFETCH == name.endswith("_pf"), name
        assert cfg.LN_SHIFT_SMEM == name.endswith("_smemshift"), name
        assert TilingConfig.from_dict(cfg.to_dict()) == cfg, name
        mc = cfg.cluster_config()
        assert mc.CLUSTER_SIZE == C and mc.STORE_DEFER == cfg.STORE_DEFER and not mc.LN_PACKED and not mc.PINGPONG
        # the multi_cta shared-memory estimate with two statistics (the exchange slots) fits
        assert mc.smem_bytes(256, nstat=2) <= SMEM_LIMIT_BYTES, name


@pytest.mark.parametrize("C, lo, hi", [(2, 256, 512), (4, 768, 1024), (8, 1792, 2048)])
def test_supports_ranges(C, lo, hi):
    for cfg in (SHIPPED_CONFIGS[f"cluster_c{C}"], SHIPPED_LN_CONFIGS[f"ln_cluster_c{C}"],
                SHIPPED_LN_CONFIGS[f"ln_cluster_c{C}_defer"]):
        assert not cfg.supports(lo) and cfg.supports(lo + 8) and cfg.supports(hi) and not cfg.supports(hi + 8)
        assert cfg.supports(ODD_N[C]) and cfg.supports(BLOG_N[C])
    assert TilingConfig().supports(8) and TilingConfig().supports(8192)  # CLUSTER_SIZE = 1: every N


@pytest.mark.parametrize("bad, match", [
    ({"CLUSTER_SIZE": 3}, "CLUSTER_SIZE=3"),
    ({"CLUSTER_SIZE": 16}, "CLUSTER_SIZE=16"),
    ({"CLUSTER_SIZE": 2, "REUSE_RSTD": True}, "cluster form"),
    ({"CLUSTER_SIZE": 2, "A_FROM_REGS": True}, "cluster form"),
    ({"CLUSTER_SIZE": 2, "STATS_WARPGROUP": True, "BLOCK_N": 128, "CONSUMER_REGS": 192}, "cluster form"),
    ({"CLUSTER_SIZE": 2, "STATS_IN_PRODUCER": True, "STATS_ELEMENTWISE": True}, "not applicable"),
    ({"CLUSTER_SIZE": 4, "LN_EPILOGUE_MMA": False}, "cluster form"),
    ({"STORE_DEFER": True}, "need CLUSTER_SIZE > 1"),
    ({"MULTICAST_A": True}, "need CLUSTER_SIZE > 1"),
])
def test_cluster_config_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        TilingConfig.from_dict(bad)


def test_ln_op_delegates_and_validates(monkeypatch):
    """The LayerNorm op of a cluster config goes to ``multi_cta.lazy_layernorm_matmul`` (with the cluster config);
    there colsum / beta_b are validated (before any CUDA check) and unsupported N / options raise ValueError."""
    seen = {}

    def fake(a, b, colsum, beta_b, *, eps, config):
        seen.update(a=a, colsum=colsum, beta_b=beta_b, eps=eps, config=config)
        return "y"

    monkeypatch.setattr(km, "lazy_layernorm_matmul", fake)
    a, b = torch.empty(128, 64, dtype=torch.bfloat16), torch.empty(64, 512, dtype=torch.bfloat16)
    cs, bb = torch.zeros(512), torch.zeros(512)
    cfg = SHIPPED_LN_CONFIGS["ln_cluster_c2_defer"]
    assert klp.lazy_layernorm_matmul(a, b, cs, bb, eps=1e-5, config=cfg) == "y"
    assert seen["config"] == cfg.cluster_config() and seen["colsum"] is cs and seen["beta_b"] is bb
    assert seen["eps"] == 1e-5
    monkeypatch.undo()
    # the real multi_cta entry point: vector checks first (TypeError / ValueError naming them), then N, device
    with pytest.raises(TypeError, match="colsum"):
        klp.lazy_layernorm_matmul(a, b, cs.double(), bb, config=cfg)
    with pytest.raises(ValueError, match="beta_b"):
        klp.lazy_layernorm_matmul(a, b, cs, torch.zeros(256), config=cfg)
    with pytest.raises(ValueError, match="too wide|idle"):
        klp.lazy_layernorm_matmul(a, torch.empty(64, 1024, dtype=torch.bfloat16), torch.zeros(1024),
                                  torch.zeros(1024), config=cfg)
    with pytest.raises(ValueError, match="CUDA"):
        klp.lazy_layernorm_matmul(a, b, cs, bb, config=cfg)
    with pytest.raises(ValueError, match="eps"):
        klp.lazy_layernorm_matmul(a, b, cs, bb, eps=-1.0, config=cfg)
    for bad in ({"CLUSTER_SIZE": 2, "PINGPONG": True, "STORE_DEFER": True}, {"CLUSTER_SIZE": 2, "LN_PACKED": True}):
        with pytest.raises(ValueError, match="not supported"):
            km.lazy_layernorm_matmul(a, b, cs, bb, config=bad)


def test_ln_launch_arguments():
    """``_prepare`` for "lazy_layer": colsum / beta_b in the weight / bias slots with HAS_W = HAS_B = False, A for
    the shift, EVEN_K from K, a mean output; the other norms' launch keywords carry none of it."""
    cfg = SHIPPED_LN_CONFIGS["ln_cluster_c4"].cluster_config()
    for K, even in ((1024, True), (1000, False)):
        a, b = torch.empty(300, K, dtype=torch.bfloat16), torch.empty(K, 1000, dtype=torch.bfloat16)
        cs, bb = torch.zeros(1000), torch.ones(1000)
        _, bn, outs, args, kw = km._prepare(a, b, None, None, 1e-5, "lazy_layer", cfg, need_cuda=False,
                                            ln_vectors=(cs, bb))
        assert bn == 256 and args[3] is cs and args[4] is bb and kw["a_ptr"] is a and kw["EVEN_K"] is even
        assert kw["HAS_W"] is False and kw["HAS_B"] is False and kw["NORM"] == "lazy_layer"
        assert outs[1] is not None and outs[1].shape == (300, ) and outs[2].shape == (300, )
        for norm in ("rms", "layer", "lazy_rms", "none"):
            _, _, _, _, kw2 = km._prepare(a, b, None, None, 1e-5, norm, cfg, need_cuda=False)
            assert "a_ptr" not in kw2 and "EVEN_K" not in kw2, norm


def test_self_check_cases_cover_every_cluster_config():
    """Every shipped cluster LayerNorm config gets unshifted and mean-shifted (10 and 100) cases it supports, with
    M = 1, a K < BLOCK_K and a K tail; no config is given an N it cannot serve (the loop filters by supports)."""
    for name, cfg in CLUSTER_LN.items():
        plain = [s for s in klp._CHECK_SHAPES + klp._CLUSTER_CHECK_SHAPES if cfg.supports(s[1])]
        shifted = [c for c in klp._LN_SHIFT_CASES + klp._LN_CLUSTER_SHIFT_CASES if cfg.supports(c[1])]
        assert plain and shifted, name
        assert {c[3] for c in shifted} == {10.0, 100.0}, (name, shifted)
        assert any(M == 1 for M, _, _ in plain) and any(M % 128 for M, _, _ in plain if M > 1), (name, plain)
        assert any(K % 64 for _, _, K in plain) and any(K < 64 for _, _, K in plain), (name, plain)
        assert any(N < cfg.CLUSTER_SIZE * 256 for _, N, _ in plain), (name, plain)  # a partial last slice
    for name, cfg in CLUSTER_RMS.items():  # (the RMSNorm loop filters the same lists by supports)
        plain = [s for s in klp._CHECK_SHAPES + klp._CLUSTER_CHECK_SHAPES if cfg.supports(s[1])]
        assert any(M == 1 for M, _, _ in plain) and any(K < 64 for _, _, K in plain), (name, plain)
        assert any(N < cfg.CLUSTER_SIZE * cfg.TILES_PER_CTA * cfg.BLOCK_N for _, N, _ in plain), (name, plain)


# --------------------------------------------------------------------------------------------------------
# 3. tiling entries and experiment (plain YAML)
# --------------------------------------------------------------------------------------------------------
def _yaml(path):
    import yaml

    return yaml.safe_load((REPO / path).read_text())


def test_ln_tiling_entries_match_the_configs():
    entries = {e["name"]: e for e in _yaml("configs/tiling/lazy_prenorm_ln_h200.yaml")["tlx"]}
    for C in (2, 4, 8):
        for suffix, name in (("", f"ln_cluster_c{C}"), ("-defer", f"ln_cluster_c{C}_defer")):
            e = dict(entries[f"ln-cluster-c{C}{suffix}-128x256x64-s3"])
            e.pop("name")
            impls = e.pop("impls", None)
            assert impls == (["fused"] if suffix else None), e
            assert TilingConfig.from_dict(e) == SHIPPED_LN_CONFIGS[name], (name, e)
    e = dict(entries["ln-cluster-c8-defer-elem-asm-mma-128x256x64-s2"])
    e.pop("name")
    assert e.pop("impls") == ["fused"]
    assert TilingConfig.from_dict(e) == SHIPPED_LN_CONFIGS["ln_cluster_c8_s2_defer_elem_asm_mma"], e
    for C in (2, 4):  # LN_RANK1_MMA (+ LN_SHIFT_PREFETCH / LN_SHIFT_SMEM): lazy_prenorm_ln_mma, _ln_smemshift
        for suffix, name in (("mma", f"ln_cluster_c{C}_defer_elem_asm_mma"),
                             ("mma-pf", f"ln_cluster_c{C}_defer_elem_asm_mma_pf"),
                             ("mma-smemshift", f"ln_cluster_c{C}_defer_elem_asm_mma_smemshift")):
            e = dict(entries[f"ln-cluster-c{C}-defer-elem-asm-{suffix}-128x256x64-s3"])
            e.pop("name")
            assert e.pop("impls") == ["fused"], e
            assert TilingConfig.from_dict(e) == SHIPPED_LN_CONFIGS[name], (name, e)


def test_ln_cluster_experiment():
    exp = _yaml("configs/experiment/lazy_prenorm_ln_cluster.yaml")
    assert exp["experiment_name"] == "lazy_prenorm_ln_cluster" and exp["replicates"] == 1
    assert exp["defaults"][0] == "lazy_prenorm_ln" and exp["timing"]["paired"]["only"] is True
    tiling = {e["name"] for e in _yaml("configs/tiling/lazy_prenorm_ln_h200.yaml")["tlx"]}
    tlx = [e["name"] for e in exp["tiling_only"]["tlx"]]
    assert set(tlx) <= tiling and "ln-ws-persistent-128x256x64-s3-sub" in tlx
    assert sum(n.startswith("ln-cluster-") for n in tlx) == 6
    triton_names = {e["name"] for e in _yaml("configs/tiling/lazy_prenorm_ln_h200.yaml")["triton"]}
    assert {e["name"] for e in exp["tiling_only"]["triton"]} <= triton_names


def test_ln_cluster_experiment_composes():
    pytest.importorskip("hydra", reason="Hydra is in the main venv: tests/test_configs.py composes every experiment")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from normfuse import sweep

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=["experiment=lazy_prenorm_ln_cluster"]),
                                     resolve=True)
    assert sweep.expand_points(cfg, "gpu")


@pytest.mark.parametrize("op, bad", [("lazy_rmsnorm_matmul", {"CLUSTER_SIZE": 2, "PINGPONG": True, "STORE_DEFER": True}),
                                     ("lazy_layernorm_matmul", {"CLUSTER_SIZE": 2, "PINGPONG": True, "STORE_DEFER": True}),
                                     ("lazy_layernorm_matmul", {"CLUSTER_SIZE": 2, "LN_PACKED": True})])
def test_lazy_ops_reject_unsupported_options_everywhere(op, bad):
    """The cluster form's option limits are checked where the launch is prepared (multi_cta._prepare), so the op and
    its compile-only twin refuse the same configs, before any compile or launch."""
    a = torch.empty(128, 64, dtype=torch.bfloat16)
    b = torch.empty(64, 512, dtype=torch.bfloat16)
    vectors = (torch.zeros(512), torch.zeros(512)) if op == LN_OP else ()
    with pytest.raises(ValueError, match="not supported"):
        getattr(km, op)(a, b, *vectors, config=bad)
    with pytest.raises(ValueError, match="not supported"):
        km.compile_sm90(op, a, b, config=bad)
