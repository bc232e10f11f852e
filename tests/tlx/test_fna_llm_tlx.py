"""fna_llm in TLX (kernels_tlx/fna_llm.py), run with fbtriton:

1. sm_90a compile (fake driver, no GPU) of every shipped config, both ops, causal and not, with / without the output
   norm: wgmma, TMA loads (device-side descriptors), mbarriers and setmaxnreg in the PTX, shared memory within the
   H200's limit, the ping-pong named barriers exactly when PINGPONG is on; the K pre-pass compiled exactly for the
   fused op with K_NORM = prepass (rstd_k) / materialize (k_n); no register spills beyond a few bytes (all three
   K_NORM modes); K_NORM = prepass reads no K tile from shared memory into registers (fewer ld.shared than inloop);
   K_NORM = materialize has no K work in the KV loop: its only global loads are the weight vectors (no rstd_k load,
   which prepass issues per KV tile), no K tile read into registers, and the pre-pass stores k_n;
2. bad inputs and configs (a bad K_NORM raises ValueError);
3. GPU (marker ``gpu``): every shipped config through the sweep worker's check and the NaN isolation check.
"""

import re
from pathlib import Path

import pytest
import torch
import yaml

from normfuse import compile_only

# the fake sm_90 driver replaces the real one for the whole pytest process, so it is installed only where there is
# no GPU: installed unconditionally it broke every TLX GPU test collected after this module (they ran against the
# fake driver: "'_CompileOnlyDriver' object has no attribute 'launcher_cls'"); on a GPU host the compile tests
# below target the real H200 (sm_90) instead
if not torch.cuda.is_available():
    compile_only.install(90)

from kernels_tlx import fna_llm as K  # noqa: E402
from normfuse.techniques import fna_llm as T  # noqa: E402
import fna_llm_compile as C  # noqa: E402  (tests/tlx/fna_llm_compile.py)

CONFIGS = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/tiling/fna_llm_h200.yaml").read_text())["tlx"]
CONFIGS = [c for c in CONFIGS if not (c.get("PERSISTENT") or c.get("LAZY_Q") or c.get("PDL"))]  # own test files
assert len(CONFIGS) == 10 and {c["K_NORM"] for c in CONFIGS} == {"prepass", "inloop", "materialize"}, CONFIGS


def _cfg(c):
    c = dict(c)
    return c.pop("name"), c


@pytest.mark.parametrize("entry", CONFIGS, ids=[c["name"] for c in CONFIGS])
@pytest.mark.parametrize("op", ["qknorm_attention", "attention"])
@pytest.mark.parametrize("causal", [True, False])
def test_shipped_configs_compile_for_sm90a(entry, op, causal):
    _, cfg = _cfg(entry)
    r = K.compile_sm90(op, *T.compile_inputs(1000, 2, 32, "bf16"), config=cfg, causal=causal, o_norm=causal)
    m = r["ptx_markers"]
    assert m["wgmma"] > 0 and m["tma_load"] > 0 and m["mbarrier"] > 0 and m["setmaxnreg"] > 0, m
    assert r["smem_ok"], r
    assert r["num_warps"] == 12  # producer warpgroup + 2 consumer warpgroups
    assert r["tensormap_create"]
    assert (r["pingpong_barriers"] > 0) == cfg.get("PINGPONG", True)
    assert r["grid"] == (8, 64, 1)
    # the K pre-pass: fused op with K_NORM = prepass (rstd_k) or materialize (k_n) only (attention ignores K_NORM)
    k_norm = cfg.get("K_NORM", "prepass") if op == "qknorm_attention" else None
    pre = r.get("k_rstd")
    assert (pre is not None) == (k_norm in ("prepass", "materialize")), r
    assert r.get("k_prepass") == {"prepass": "_k_rstd_kernel", "materialize": "_k_norm_kernel"}.get(k_norm), r
    if pre is not None:
        assert pre["smem_ok"] and pre["ptx_markers"]["wgmma"] == 0, pre
    # global (non-TMA) loads, per consumer warpgroup: q_weight [+ k_weight] [+ o_weight] once, + prepass's rstd_k
    # vector per KV tile (PIPELINE: a second rstd_k load site, the peeled first tile's); materialize loads no K-side
    # data at all (k_n arrives by TMA like the plain attention's K)
    per_group = {"prepass": 3, "inloop": 2, "materialize": 1, None: 0}[k_norm] + (k_norm is not None and causal)
    per_group += k_norm == "prepass" and cfg.get("PIPELINE", False)
    assert r["global_loads"] == K.NUM_MMA_GROUPS * per_group, (k_norm, causal, r["global_loads"])


def test_registers_and_spills():
    """ptxas -v on the PTX of the default config (both ops, all three K_NORM modes): no spills beyond a few words;
    the prepass and materialize kernels read the K tile from shared memory only through wgmma (fewer ld.shared than
    inloop); materialize's only ld.global are the q_weight loads (one per consumer warpgroup), prepass's add k_weight
    and the per-tile rstd_k vector."""
    from normfuse.codestats import ptxas_log, spill_store_bytes

    ld_shared, ld_global = {}, {}
    for norms, k_norm in ((True, "prepass"), (True, "inloop"), (True, "materialize"), (False, "prepass")):
        ptx = C.ptx({"K_NORM": k_norm}, norms, True)
        ld_shared[(norms, k_norm)] = len(re.findall(r"\bld\.shared", ptx))
        ld_global[(norms, k_norm)] = len(re.findall(r"\bld\.global", ptx))
        rc, log = ptxas_log(ptx)
        assert rc == 0, log[-2000:]
        assert spill_store_bytes(log) <= 64, log  # RuntimeError without a spill line
    assert ld_shared[(True, "prepass")] < ld_shared[(True, "inloop")], ld_shared
    assert ld_shared[(True, "materialize")] <= ld_shared[(True, "prepass")], ld_shared
    assert ld_global[(True, "materialize")] == K.NUM_MMA_GROUPS < ld_global[(True, "prepass")], ld_global
    assert ld_global[(False, "prepass")] == 0, ld_global


def test_materialize_prepass_writes_normalized_k():
    """K_NORM = materialize: the pre-pass (_k_norm_kernel) reads K and k_weight and stores k_n in K's dtype
    (st.global of 16-bit values, an rsqrt-style reduction); the attention kernel gets k_n, not k, as its K operand,
    and the same (shape, dtype) scratch as k."""
    q, k, v, qw, kw = T.compile_inputs(1000, 2, 32, "bf16")
    _, launches, kwd, pre = K._prepare(q, k, v, qw, kw, None, True, 1e-6, {"K_NORM": "materialize"}, True,
                                       need_cuda=False)
    (args, grid), = launches
    kernel, pre_args, pre_grid, pre_kw = pre
    assert kernel is K._k_norm_kernel and pre_args[0] is k and pre_args[1] is kw
    k_n = pre_args[2]
    assert args[1] is k_n and k_n is not k and k_n.shape == k.shape and k_n.dtype == k.dtype
    assert kwd["K_MATERIALIZED"] and kwd["NORM_QK"] and not kwd["K_PREPASS"]
    assert pre_grid == (-(-2 * 8 * 1000 // K.RSTD_BLOCK_ROWS), 1, 1)
    ptx = kernel.warmup(*pre_args, grid=pre_grid, **pre_kw).asm["ptx"]
    assert re.search(r"\bst\.global(?:\.v\d)?\.b(?:16|32|64|128)", ptx) and "sqrt" in ptx, ptx[-3000:]
    # the prepass mode's rstd_k buffer is not allocated for materialize
    assert args[7] is q  # RSTD_K slot: the dummy


def test_bad_inputs_and_configs():
    inp = T.make_inputs(8, 1, 2, dtype="bf16", kv_heads=1, head_dim=64)
    q, k, v, qw, kw = inp["q"], inp["k"], inp["v"], inp["q_weight"], inp["k_weight"]
    with pytest.raises(ValueError, match="CUDA"):
        K.qknorm_attention(q, k, v, qw, kw, causal=True)
    with pytest.raises(TypeError, match="causal"):
        K.attention(q, k, v, causal=None)
    with pytest.raises(TypeError, match="bf16/fp16"):
        K.attention(q.float(), k.float(), v.float(), causal=True)
    q32 = torch.randn(1, 2, 8, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head dim 64 or 128"):
        K.attention(q32, q32, q32, causal=True)
    with pytest.raises(ValueError, match="BLOCK_M"):
        K.TilingConfig(BLOCK_M=64)
    with pytest.raises(ValueError, match="BLOCK_N"):
        K.TilingConfig(BLOCK_N=256)
    with pytest.raises(ValueError, match="NUM_BUFFERS"):
        K.TilingConfig(NUM_BUFFERS=1)
    with pytest.raises(ValueError, match="K_NORM"):
        K.TilingConfig(K_NORM="PREPASS")
    with pytest.raises(ValueError, match="K_NORM"):
        K.TilingConfig(K_NORM="materialized")
    with pytest.raises(ValueError, match="CUDA"):  # a valid materialize config still needs CUDA tensors
        K.qknorm_attention(q, k, v, qw, kw, causal=True, config={"K_NORM": "materialize"})
    assert K.TilingConfig(K_NORM="materialize").K_NORM == "materialize"
    with pytest.raises(ValueError, match="K_NORM"):
        K.compile_sm90("qknorm_attention", *T.compile_inputs(64, 1, 8, "bf16"), config={"K_NORM": 1})
    assert K.TilingConfig().K_NORM == "prepass"
    with pytest.raises(ValueError, match="choices"):
        K.compile_sm90("matmul", *T.compile_inputs(64, 1, 8, "bf16"))


@pytest.mark.gpu
@pytest.mark.parametrize("check", ["fna_llm", "fna_llm_gqa", "nan_isolation"])
def test_shipped_fna_llm_configs_correct_on_gpu(check):
    """Every shipped config at the odd shapes (fna_llm), at the benchmark head layout (fna_llm_gqa), and NaN/Inf
    isolation between batch elements (three tests, so that tools/gpu_tests_parallel.py compiles them side by side)."""
    from normfuse.gpu_checks import check_all, check_fna_llm_nan_isolation

    failures = check_fna_llm_nan_isolation("tlx") if check == "nan_isolation" else check_all("tlx", check)
    assert not failures, "\n".join(failures)
