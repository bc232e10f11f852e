"""CPU checks of the cluster form's FILL_IDLE_SMS option (``kernels_tlx.lazy_prenorm``; TLX venv: ``.venv-tlx/bin/python
-m pytest tests/tlx/test_lazy_prenorm_fill_tlx.py``): the SMs the persistent cluster grid leaves idle run the last
rows with the REUSE_RSTD one-CTA-per-tile kernel, launched as a programmatic dependent grid of the cluster kernel.

- ``fill_rows``: the SM-and-rate share of the rows, a multiple of BLOCK_M, 0 without idle SMs.
- Config validation (cluster form, persistent; FILL_RATE_PCT range), the shipped configs and their YAML entries.
- The cluster kernel with ``PDL_TRIGGER`` holds ``griddepcontrol.launch_dependents`` (compile-only, sm_90a), the
  filler with ``PDL_WAIT_END`` a ``griddepcontrol.wait``, and without the flags neither: the other builds are
  unchanged.

The launch itself needs the GPU: ``python -m kernels_tlx.lazy_prenorm --quick --no-bench --config
cluster_c4_defer_elem_fill ...`` on the H200 checks both parts' rows against the fp32 reference (odd shapes, M >= 1408
split), as ``make test-gpu`` does for every shipped config.
"""

from __future__ import annotations

import sys
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
from normfuse.testing import run_python_json  # noqa: E402

FILL = {"cluster_c4_defer_elem_fill": 100, "cluster_c4_defer_elem_fill80": 80, "cluster_c4_defer_elem_fill70": 70,
        "cluster_c4_defer_elem_fill60": 60, "cluster_c8_defer_fill": 100, "cluster_c8_defer_fill80": 80,
        "cluster_c8_defer_fill60": 60}
LN_FILL = {"ln_cluster_c4_defer_elem_asm_mma_fill": 100, "ln_cluster_c4_defer_elem_asm_mma_fill80": 80,
           "ln_cluster_c4_defer_elem_asm_mma_fill65": 65, "ln_cluster_c4_defer_elem_asm_mma_fill50": 50,
           "ln_cluster_c4_defer_elem_asm_mma_fill90": 90, "ln_cluster_c4_defer_elem_asm_mma_fill85": 85}


def test_fill_rows():
    # the H200's c4 grid: 120 busy, 12 idle SMs; M = 262144 rows of 128
    assert lp.fill_rows(262144, 120, 12, 100, 128) == 23808  # floor(262144 / 11 / 128) * 128
    assert lp.fill_rows(262144, 120, 12, 80, 128) == 19328
    assert lp.fill_rows(4096, 120, 12, 100, 128) == 256
    assert lp.fill_rows(1000, 120, 12, 100, 128) == 0  # fewer than BLOCK_M rows for the filler: none
    assert lp.fill_rows(262144, 132, 0, 100, 128) == 0 == lp.fill_rows(262144, 0, 132, 100, 128)
    for M in (1, 129, 4096, 17793, 262144):
        for rate in (1, 80, 100, 400):
            f = lp.fill_rows(M, 120, 12, rate, 128)
            assert 0 <= f < M and f % 128 == 0, (M, rate, f)


def test_configs_and_validation():
    for name, rate in {**FILL, **LN_FILL}.items():
        cfg = {**lp.SHIPPED_CONFIGS, **lp.SHIPPED_LN_CONFIGS}[name]
        assert cfg.FILL_IDLE_SMS and cfg.FILL_RATE_PCT == rate and cfg.CLUSTER_SIZE in (4, 8), name
        # the same cluster kernel as without the option (multi_cta's config does not carry it)
        base = {**cfg.to_dict(), "FILL_IDLE_SMS": False, "FILL_RATE_PCT": 100}
        assert lp.TilingConfig.from_dict(base).cluster_config() == cfg.cluster_config(), name
    with pytest.raises(ValueError, match="FILL_IDLE_SMS=True needs CLUSTER_SIZE > 1 and PERSISTENT=True"):
        lp.TilingConfig(FILL_IDLE_SMS=True)
    with pytest.raises(ValueError, match="FILL_IDLE_SMS=True needs CLUSTER_SIZE > 1 and PERSISTENT=True"):
        lp.TilingConfig(CLUSTER_SIZE=4, PERSISTENT=False, FILL_IDLE_SMS=True)
    with pytest.raises(ValueError, match="FILL_RATE_PCT=500 must be in 1 .. 400"):
        lp.TilingConfig(CLUSTER_SIZE=4, FILL_IDLE_SMS=True, FILL_RATE_PCT=500)
    with pytest.raises(ValueError, match="FILL_RATE_PCT must be a positive integer"):
        lp.TilingConfig(CLUSTER_SIZE=4, FILL_IDLE_SMS=True, FILL_RATE_PCT=0.8)
    with pytest.raises(ValueError, match="FILL_RATE_PCT=80 applies with FILL_IDLE_SMS=True only"):
        lp.TilingConfig(CLUSTER_SIZE=4, FILL_RATE_PCT=80)


def test_yaml_entries():
    for path, names in (("configs/tiling/lazy_prenorm_h200.yaml", FILL), ("configs/tiling/lazy_prenorm_ln_h200.yaml",
                                                                          LN_FILL)):
        entries = {e["name"]: e for e in yaml.safe_load((REPO / path).read_text())["tlx"]}
        shipped = {**lp.SHIPPED_CONFIGS, **lp.SHIPPED_LN_CONFIGS}
        for name in names:
            yname = name.replace("ln_cluster", "ln-cluster").replace("cluster_", "cluster-").replace("_", "-")
            e = dict(entries[f"{yname}-128x256x64-s3"])
            e.pop("name")
            assert e.pop("impls") == ["fused"], e
            assert lp.TilingConfig.from_dict(e) == shipped[name], (name, e)


_SCRIPT = r"""
import json, sys, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import lazy_prenorm as lp, multi_cta as km
a = torch.empty(4096, 512, dtype=torch.bfloat16)
b = torch.empty(512, 1024, dtype=torch.bfloat16)
cfg = lp.SHIPPED_CONFIGS["cluster_c4_defer_elem_fill"].cluster_config()
*_, args, kw = km._prepare(a, b, None, None, 1e-6, "lazy_rms", cfg, need_cuda=False)
out = {}
for trig in (False, True):
    ptx = km._multi_cta_norm_kernel.warmup(*args, grid=(4,), **kw, **({"PDL_TRIGGER": True} if trig else {})).asm["ptx"]
    out[str(trig)] = ptx.count("griddepcontrol.launch_dependents")
print(json.dumps(out))
"""


def test_pdl_trigger_compiles():
    r = run_python_json(_SCRIPT, timeout=300)
    assert r == {"False": 0, "True": 1}, r


_WAIT_SCRIPT = r"""
import json, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import lazy_prenorm as lp
a = torch.empty(4096, 512, dtype=torch.bfloat16)
b = torch.empty(512, 1024, dtype=torch.bfloat16)
c = torch.empty(4096, 1024, dtype=torch.bfloat16)
args, grid, kw = lp._launch_args(a, b, c, 1e-6, True, lp.SHIPPED_CONFIGS["reuse_rstd"], 12)
print(json.dumps({str(w): lp._lazy_prenorm_ws_kernel.warmup(*args, grid=grid, PDL_WAIT_END=w, **kw).asm["ptx"]
                  .count("griddepcontrol.wait") for w in (False, True)}))
"""


def test_filler_waits_for_the_cluster_grid_before_it_exits():
    """The filler (PDL_WAIT_END) ends its producer with griddepcontrol.wait: it completes only after the cluster
    grid, so later work on the stream sees both row blocks; the kernel without the flag is unchanged."""
    r = run_python_json(_WAIT_SCRIPT, timeout=300)
    assert r == {"False": 0, "True": 1}, r


def test_out_argument_of_prepare():
    cfg = lp.SHIPPED_CONFIGS["cluster_c4_defer_elem"].cluster_config()
    a = torch.empty(256, 64, dtype=torch.bfloat16)
    b = torch.empty(64, 1024, dtype=torch.bfloat16)
    y = torch.empty(512, 1024, dtype=torch.bfloat16)
    _, _, outs, *_ = km._prepare(a, b, None, None, 1e-6, "lazy_rms", cfg, need_cuda=False, out=y[256:])
    assert outs[0].data_ptr() == y[256:].data_ptr()
    with pytest.raises(ValueError, match=r"out must be a row-major \[256, 1024\]"):
        km._prepare(a, b, None, None, 1e-6, "lazy_rms", cfg, need_cuda=False, out=y[:, :512])
