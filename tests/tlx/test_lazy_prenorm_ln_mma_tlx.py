"""CPU checks of the Lazy LayerNorm cluster form's LN_RANK1_MMA, LN_SHIFT_PREFETCH and LN_SHIFT_SMEM options (TLX venv:
``.venv-tlx/bin/python -m pytest tests/tlx/test_lazy_prenorm_ln_mma_tlx.py``): the epilogue's rank-1 correction as
one more m64 k16 wgmma per tile, its B operand (this rank's split colsum / beta_b) built once per kernel, its A
operand staged in the consumer's own output staging buffer; the next M-tile's per-row shift loaded during this
tile's epilogue, or read from the M-tile's first A slice in shared memory.

- Config validation: options of the cluster form (CLUSTER_SIZE > 1); LN_RANK1_MMA needs STORE_DEFER and
  BLOCK_N >= 64, and names itself when the shared memory does not fit (c8 with 3 stages); ``lazy_layernorm_matmul``
  only (the other fused ops raise, ``matmul_cluster`` runs the GEMM without them); the launch flags.
- Compile-only for sm_90a at the benchmark shapes (c2 at N = 512, c4 at N = 1024) and a ragged one: the kernel fits
  in shared memory (the A operand reuses the staging buffer: c4 would not fit otherwise), one more k16 wgmma per
  consumer, no per-tile colsum / beta_b loads left in the epilogue, no ptxas spills at the
  benchmark shapes; LN_SHIFT_PREFETCH: the shift's loads twice in the PTX (before the tile walk and at the end of
  each tile's K loop) instead of once; LN_SHIFT_SMEM: no global load of the shift left.

Compile-only cannot see wrong sums: ``python -m kernels_tlx.lazy_prenorm --quick --no-bench --variant layernorm
--config ln_cluster_c2_defer_elem_asm_mma --config ln_cluster_c4_defer_elem_asm_mma --config
ln_cluster_c2_defer_elem_asm_mma_pf --config ln_cluster_c4_defer_elem_asm_mma_pf`` (and the ``_smemshift``
configs) on the H200 is the correctness
test (odd shapes, mean-shifted rows), and so is ``tests/tlx/test_kernels_tlx.py::test_ln_shipped_configs_correct_on_gpu``
(``make test-gpu``), which covers every shipped LayerNorm config.
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
from normfuse.compile_only import SMEM_LIMIT_BYTES  # noqa: E402

MMA = ("ln_cluster_c2_defer_elem_asm_mma", "ln_cluster_c4_defer_elem_asm_mma")
MMA_PF = ("ln_cluster_c2_defer_elem_asm_mma_pf", "ln_cluster_c4_defer_elem_asm_mma_pf")
MMA_SMEM = ("ln_cluster_c2_defer_elem_asm_mma_smemshift", "ln_cluster_c4_defer_elem_asm_mma_smemshift")
FLAGS = ("LN_RANK1_MMA", "LN_SHIFT_PREFETCH", "LN_SHIFT_SMEM")


def test_options_of_the_cluster_form():
    for flag in FLAGS:
        with pytest.raises(ValueError, match=f"{flag}=True.*need CLUSTER_SIZE > 1"):
            lp.TilingConfig(**{flag: True})
    for name in MMA + MMA_PF + MMA_SMEM:
        cfg = lp.SHIPPED_LN_CONFIGS[name].cluster_config()
        assert cfg.LN_RANK1_MMA and cfg.LN_SHIFT_PREFETCH == name.endswith("_pf"), name
        assert cfg.LN_SHIFT_SMEM == name.endswith("_smemshift"), name
    for cls in (lp.TilingConfig, km.TilingConfig):  # where the shift comes from: one of the two
        with pytest.raises(ValueError, match="LN_SHIFT_SMEM and LN_SHIFT_PREFETCH are exclusive"):
            cls(CLUSTER_SIZE=2, STORE_DEFER=True, LN_SHIFT_PREFETCH=True, LN_SHIFT_SMEM=True)


def test_needs_store_defer_block_n_and_fits():
    with pytest.raises(ValueError, match="LN_RANK1_MMA=True needs STORE_DEFER=True"):
        lp.TilingConfig(CLUSTER_SIZE=4, LN_RANK1_MMA=True)  # at construction
    with pytest.raises(ValueError, match="LN_RANK1_MMA=True needs STORE_DEFER=True"):
        km.TilingConfig(CLUSTER_SIZE=4, LN_RANK1_MMA=True)
    for flag in FLAGS:
        with pytest.raises(ValueError, match=f"{flag}=True needs CLUSTER_SIZE > 1"):
            km.TilingConfig(CLUSTER_SIZE=1, STORE_DEFER=True, **{flag: True})
    small = km.TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True, STATS_ELEMENTWISE=True, LN_RANK1_MMA=True)
    with pytest.raises(ValueError, match=r"LN_RANK1_MMA=True needs BLOCK_N >= 64 \(got 32\)"):
        small.block_n(64)  # (the automatic BLOCK_N: 32 for N = 64 at c2)
    c8 = km.TilingConfig(CLUSTER_SIZE=8, STORE_DEFER=True, STATS_ELEMENTWISE=True, LN_RANK1_MMA=True)
    with pytest.raises(ValueError, match="LN_RANK1_MMA=True adds 8192 B: drop it or use NUM_STAGES=2"):
        c8.block_n(2048)
    assert km.TilingConfig(CLUSTER_SIZE=8, NUM_STAGES=2, STORE_DEFER=True, LN_RANK1_MMA=True).block_n(2048) == 256


def test_launch_flags_and_rejects():
    cfg = lp.SHIPPED_LN_CONFIGS["ln_cluster_c2_defer_elem_asm_mma_pf"].cluster_config()
    a = torch.empty(256, 64, dtype=torch.bfloat16)
    b = torch.empty(64, 512, dtype=torch.bfloat16)
    *_, kw = km._prepare(a, b, None, None, 1e-5, "lazy_layer", cfg, need_cuda=False)
    assert kw["LN_MMA"] is True and kw["SHIFT_PF"] is True
    *_, kw = km._prepare(a, b, None, None, 1e-5, "none", cfg, need_cuda=False)
    assert "LN_MMA" not in kw and "SHIFT_PF" not in kw  # matmul_cluster: the same GEMM as without the options
    cfg = lp.SHIPPED_LN_CONFIGS["ln_cluster_c2_defer_elem_asm_mma_smemshift"].cluster_config()
    *_, kw = km._prepare(a, b, None, None, 1e-5, "lazy_layer", cfg, need_cuda=False)
    assert kw["SHIFT_SMEM"] is True and "SHIFT_PF" not in kw
    *_, kw = km._prepare(a, b, None, None, 1e-5, "none", cfg, need_cuda=False)
    assert "SHIFT_SMEM" not in kw
    for norm, op in (("rms", "matmul_rmsnorm"), ("layer", "matmul_layernorm"), ("lazy_rms", "lazy_rmsnorm_matmul")):
        for flag in FLAGS:
            one = km.TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True, **{flag: True})
            with pytest.raises(ValueError, match=f"{flag}=True applies to lazy_layernorm_matmul only .* got {op}"):
                km._prepare(a, b, None, None, 1e-5, norm, one, need_cuda=False)


def test_smem_estimate_counts_the_b_operand():
    base = km.TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True)
    mma = km.TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True, LN_RANK1_MMA=True)
    assert mma.smem_bytes(256, 2) - base.smem_bytes(256, 2) == 16 * 256 * 2 + 8
    assert mma.smem_bytes(256, 1) == base.smem_bytes(256, 1)  # (one statistic: not a LayerNorm kernel)


_SCRIPT = r"""
import hashlib, json, sys
from normfuse import compile_only
compile_only.install(90)
from normfuse.testing import compile_lazy_cluster_pairs


def measure(cfg, ptx):
    return {"wgmma": ptx.count("wgmma.mma_async"),
            "ld_global_f32": ptx.count("ld.global.v2.b32") + ptx.count("ld.global.b32"),
            "ld_global_b16": ptx.count("ld.global.b16"), "sha": hashlib.sha256(ptx.encode()).hexdigest()}


print(json.dumps(compile_lazy_cluster_pairs(json.loads(sys.argv[1]), ("new", "base"), measure)))
"""


@pytest.fixture(scope="module")
def compiled():
    jobs = [("ln_cluster_c2_defer_elem_asm_mma", "ln_cluster_c2_defer_elem_asm", 512, 1024),
            ("ln_cluster_c4_defer_elem_asm_mma", "ln_cluster_c4_defer_elem_asm", 1024, 512),
            ("ln_cluster_c4_defer_elem_asm_mma_pf", "ln_cluster_c4_defer_elem_asm_mma", 1024, 512),
            ("ln_cluster_c4_defer_elem_asm_mma", "ln_cluster_c4_defer_elem_asm", 1000, 520),  # ragged N, K
            ("ln_cluster_c4_defer_elem_asm_mma_pf", "ln_cluster_c4_defer_elem_asm_mma", 1000, 520),
            ("ln_cluster_c2_defer_elem_asm_mma_smemshift", "ln_cluster_c2_defer_elem_asm_mma", 512, 1024),
            ("ln_cluster_c4_defer_elem_asm_mma_smemshift", "ln_cluster_c4_defer_elem_asm_mma", 1024, 512),
            ("ln_cluster_c4_defer_elem_asm_mma_smemshift", "ln_cluster_c4_defer_elem_asm_mma", 1000, 520)]
    return run_python_json_parallel(_SCRIPT, jobs, timeout=400)


def test_compile(compiled):
    assert len(compiled) == 8
    for key, r in compiled.items():
        new, base = r["new"], r["base"]
        assert new["smem"] <= SMEM_LIMIT_BYTES, (key, new["smem"])
        if key.endswith("/512") or key.endswith("/1024"):  # benchmark shapes
            assert new["ptxas"]["spill_stores"] == 0 == new["ptxas"]["spill_loads"], (key, new["ptxas"])
        if "_pf/" in key:  # the prefetch moves the shift load, nothing else
            assert new["sha"] != base["sha"] and new["wgmma"] == base["wgmma"], key
            assert new["ld_global_f32"] == base["ld_global_f32"], key
            # the shift's bf16 loads: before the walk and in the tile loop, instead of at the tile start only
            assert base["ld_global_b16"] > 0 and new["ld_global_b16"] == 2 * base["ld_global_b16"], (key, new, base)
            continue
        if "_smemshift/" in key:  # the shift from the first A slice: no global load of it, nothing else moved
            assert new["sha"] != base["sha"] and new["wgmma"] == base["wgmma"], key
            assert new["ld_global_f32"] == base["ld_global_f32"], key
            assert base["ld_global_b16"] > 0 and new["ld_global_b16"] == 0, (key, new, base)
            assert new["ptxas"]["spill_stores"] == 0 == new["ptxas"]["spill_loads"], (key, new["ptxas"])
            continue
        # one more wgmma (k16) per consumer code copy (the kernel specializes the two consumers)
        assert new["wgmma"] - base["wgmma"] == 2, (key, new["wgmma"], base["wgmma"])
        # the fp32 colsum / beta_b loads: once per kernel (consumer 0, vectors) instead of per tile and quarter
        assert new["ld_global_f32"] < base["ld_global_f32"] // 4, (key, new["ld_global_f32"], base["ld_global_f32"])
        # B only (+ the compiler's scratch for the once-per-kernel B build and alignment: 592 B at c2)
        assert new["smem"] - base["smem"] <= 16 * 256 * 2 + 1024, (key, new["smem"], base["smem"])


@pytest.mark.gpu
@pytest.mark.parametrize("C", [2, 4])
def test_smemshift_same_results_on_gpu(C):
    """LN_SHIFT_SMEM reads the same shift values from shared memory that the kernel without it loads from global
    memory, so the outputs must be bitwise equal (mean-shifted rows, a benchmark-like N and ragged M, N, K)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the TLX kernel targets sm_90 (wgmma, clusters)")
    base = lp.SHIPPED_LN_CONFIGS[f"ln_cluster_c{C}_defer_elem_asm_mma"]
    new = lp.SHIPPED_LN_CONFIGS[f"ln_cluster_c{C}_defer_elem_asm_mma_smemshift"]
    gen = torch.Generator(device="cuda").manual_seed(C)
    for M, N, K in ((4096, 256 * C, 512), (1000, 256 * C - 24, 1000), (1, 256 * C - 8, 72)):
        a = torch.randn(M, K, device="cuda", generator=gen).add_(10.0).bfloat16()
        b = (torch.randn(K, N, device="cuda", generator=gen) / K ** 0.5).bfloat16()
        colsum = b.float().sum(0)
        beta_b = torch.randn(N, device="cuda", generator=gen)
        y0 = lp.lazy_layernorm_matmul(a, b, colsum, beta_b, config=base)
        y1 = lp.lazy_layernorm_matmul(a, b, colsum, beta_b, config=new)
        assert y1.isfinite().all() and y1.abs().sum() > 0, (M, N, K)
        assert torch.equal(y0, y1), (M, N, K, (y0.float() - y1.float()).abs().max().item())
