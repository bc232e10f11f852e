"""CPU checks of the cluster form's STATS_ELEMENTWISE option (TLX venv: ``.venv-tlx/bin/python -m pytest
tests/tlx/test_lazy_prenorm_elem_tlx.py``): Lazy RMSNorm's a^2 accumulated elementwise in a [64, BLOCK_K] fp32
register tile across the K loop (Lazy LayerNorm: the shifted terms and their squares, two tiles), reduced across
threads once per tile.

- Config validation: an option of the cluster form (CLUSTER_SIZE > 1); Lazy Pre-Norm only (the multi-CTA norm ops
  raise, ``matmul_cluster`` runs the GEMM without it).
- Compile-only for sm_90a at the benchmark shapes: no cross-thread shuffle inside the K loop (the kernel without the
  option has 3 per row there), the same shared loads of the A slice, no spills; with STATS_UNPACK_ASM the 32 bf16
  conversions per step replaced by one shl + one and per packed pair (PTX; the SASS is Nsight Compute's to count),
  and only for bf16 inputs.

Compile-only cannot see wrong sums: ``python -m kernels_tlx.lazy_prenorm --quick --no-bench --variant rmsnorm
--config cluster_c2_defer_elem --config cluster_c4_defer_elem --config cluster_c8_defer_elem --config
cluster_c2_t2_elem --config cluster_c2_defer_elem_asm --config cluster_c2_t2_elem_asm`` and ``--variant layernorm
--config ln_cluster_c2_defer_elem --config ln_cluster_c4_defer_elem --config ln_cluster_c8_defer_elem --config
ln_cluster_c2_defer_elem_asm --config ln_cluster_c4_defer_elem_asm`` on the H200 are the correctness tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from kernels_tlx import lazy_prenorm as lp  # noqa: E402
from kernels_tlx import multi_cta as km  # noqa: E402
from normfuse.testing import run_python_json_parallel  # noqa: E402

ELEM = ("cluster_c2_defer_elem", "cluster_c4_defer_elem", "cluster_c8_defer_elem", "cluster_c2_t2_elem")
LN_ELEM = ("ln_cluster_c2_defer_elem", "ln_cluster_c4_defer_elem", "ln_cluster_c8_defer_elem")


def test_needs_the_cluster_form():
    with pytest.raises(ValueError, match="STATS_ELEMENTWISE=True: .* need CLUSTER_SIZE > 1"):
        lp.TilingConfig(STATS_ELEMENTWISE=True)
    for name in ELEM:
        assert lp.SHIPPED_CONFIGS[name].cluster_config().STATS_ELEMENTWISE, name
    for name in LN_ELEM:
        assert lp.SHIPPED_LN_CONFIGS[name].cluster_config().STATS_ELEMENTWISE, name


def test_unpack_asm_flags():
    with pytest.raises(ValueError, match="STATS_UNPACK_ASM=True needs STATS_ELEMENTWISE=True"):
        km.TilingConfig(CLUSTER_SIZE=2, STATS_UNPACK_ASM=True)
    with pytest.raises(ValueError, match="STATS_UNPACK_ASM=True: .* need CLUSTER_SIZE > 1"):
        lp.TilingConfig(STATS_UNPACK_ASM=True)
    with pytest.raises(ValueError, match="STATS_UNPACK_ASM=True needs STATS_ELEMENTWISE=True"):
        lp.TilingConfig(CLUSTER_SIZE=2, STATS_UNPACK_ASM=True)  # at construction, not only at the first call
    with pytest.raises(ValueError, match="A_FROM_REGS=True: CLUSTER_SIZE > 1 .* takes no"):
        lp.TilingConfig(CLUSTER_SIZE=2, STATS_ELEMENTWISE=True, A_FROM_REGS=True)  # names the field at fault
    cfg = lp.SHIPPED_CONFIGS["cluster_c2_defer_elem_asm"].cluster_config()
    b = torch.empty(64, 512, dtype=torch.bfloat16)
    *_, kw = km._prepare(torch.empty(256, 64, dtype=torch.bfloat16), b, None, None, 1e-6, "lazy_rms", cfg,
                         need_cuda=False)
    assert kw["SS_2D"] is True and kw["UNPACK_ASM"] is True
    *_, kw = km._prepare(torch.empty(256, 64, dtype=torch.float16), b.half(), None, None, 1e-6, "lazy_rms", cfg,
                         need_cuda=False)
    assert kw["SS_2D"] is True and "UNPACK_ASM" not in kw  # fp16: the ordinary conversion
    *_, kw = km._prepare(torch.empty(256, 64, dtype=torch.bfloat16), b, None, None, 1e-6, "none", cfg,
                         need_cuda=False)
    assert "UNPACK_ASM" not in kw and "SS_2D" not in kw


def test_launch_flags_and_rejects():
    cfg = lp.SHIPPED_CONFIGS["cluster_c2_defer_elem"].cluster_config()
    a = torch.empty(256, 64, dtype=torch.bfloat16)
    b = torch.empty(64, 512, dtype=torch.bfloat16)
    for norm in ("lazy_rms", "lazy_layer"):
        *_, kw = km._prepare(a, b, None, None, 1e-6, norm, cfg, need_cuda=False)
        assert kw["SS_2D"] is True, norm
    *_, kw = km._prepare(a, b, None, None, 1e-6, "none", cfg, need_cuda=False)
    assert "SS_2D" not in kw  # matmul_cluster: the kernel's default, the same GEMM as without the option
    for norm in ("rms", "layer"):
        with pytest.raises(ValueError, match="STATS_ELEMENTWISE=True applies to Lazy Pre-Norm only .* got matmul_"):
            km._prepare(a, b, None, None, 1e-6, norm, cfg, need_cuda=False)


_SCRIPT = r"""
import json, sys
from normfuse import compile_only
compile_only.install(90)
from normfuse.testing import compile_lazy_cluster_pairs


def measure(cfg, ptx):
    # the consumers' first K loop ends at its wgmma.wait_group 0: the shuffles issued before it are in the loop
    loop = ptx[:ptx.index("wgmma.wait_group.sync.aligned 0;")]
    return {"bfly_in_loop": loop.count("shfl.sync.bfly"), "cvt_in_loop": loop.count("cvt.f32.bf16"),
            "shl_in_loop": loop.count("shl.b32"), "and_in_loop": loop.count("and.b32"),
            "fma_in_loop": loop.count("fma.rn.f32"), "bfly": ptx.count("shfl.sync.bfly"),
            "ld_shared_v4": ptx.count("ld.shared.v4")}


print(json.dumps(compile_lazy_cluster_pairs(json.loads(sys.argv[1]), ("elem", "base"), measure)))
"""


@pytest.fixture(scope="module")
def compiled():
    jobs = [("cluster_c2_defer_elem", "cluster_c2_defer", 512, 2048),
            ("cluster_c2_t2_elem", "cluster_c2_t2", 1024, 2048),
            ("ln_cluster_c4_defer_elem", "ln_cluster_c4_defer", 1024, 1000),  # (K tail: the masked shifted terms)
            ("cluster_c2_defer_elem_asm", "cluster_c2_defer_elem", 512, 2048),
            ("ln_cluster_c2_defer_elem_asm", "ln_cluster_c2_defer_elem", 512, 2048)]
    return run_python_json_parallel(_SCRIPT, jobs, timeout=400)


def test_compile_benchmark_shapes(compiled):
    assert len(compiled) == 5
    for key, r in compiled.items():
        e, base = r["elem"], r["base"]
        if "_asm/" in key:  # STATS_UNPACK_ASM against the same elementwise kernel without it
            assert e["ptxas"]["spill_stores"] == 0 == e["ptxas"]["spill_loads"], (key, e["ptxas"])
            assert base["cvt_in_loop"] >= 32 and e["cvt_in_loop"] == base["cvt_in_loop"] - 32, (key, e, base)
            assert e["shl_in_loop"] - base["shl_in_loop"] == 16 == e["and_in_loop"] - base["and_in_loop"], (key, e)
            assert e["fma_in_loop"] == base["fma_in_loop"] and e["bfly_in_loop"] == 0, (key, e, base)
            continue
        assert e["ptxas"]["spill_stores"] == 0 == e["ptxas"]["spill_loads"], (key, e["ptxas"])
        assert base["bfly_in_loop"] >= 3 * 4, (key, base)  # 3 butterfly levels x 4 rows per thread, every K step
        assert e["bfly_in_loop"] == 0, (key, e)  # the row sums left the K loop
        assert e["bfly"] <= base["bfly"], (key, e, base)  # moved after the loop (two-tile: both loops, fewer)
        assert e["ld_shared_v4"] == base["ld_shared_v4"], (key, e, base)  # the same reads of the A slice
