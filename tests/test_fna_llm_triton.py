"""fna_llm in Triton (kernels_triton/fna_llm.py):

1. semantics under ``TRITON_INTERPRET=1`` (fp16/fp32; odd S, S = 1, GQA, Hq = 3 with Hkv = 1, causal and not,
   output norm, the unmasked / masked KV-loop split with BLOCK_N < BLOCK_M and BLOCK_N > BLOCK_M; the fused op in
   the three K_NORM modes, prepass and materialize agreeing with inloop), NaN/Inf isolation between batch elements
   (every K_NORM mode),
   bad inputs (a bad K_NORM raises ValueError);
2. sm_90 compile of every shipped config (wgmma present, shared memory within the H200's limit; the rstd_k pre-pass
   compiled too exactly when K_NORM = prepass, the normalized-K pre-pass exactly when K_NORM = materialize).
"""

import json

import pytest
import torch

from normfuse.testing import run_python_json

_INTERP = r"""
import json, torch
from normfuse.techniques import fna_llm as T
from kernels_triton import fna_llm as K

def run(impl, inp, variant, cfg):
    fn = getattr(K, T.kernel_function_name(impl))
    return T.kernel_call(fn, impl, inp, 1e-6, cfg, variant)()

CASES = [  # S, B, Hq, Hkv, D, config
    (70, 2, 4, 2, 32, {"BLOCK_M": 32, "BLOCK_N": 16}),
    (70, 1, 3, 1, 32, {"BLOCK_M": 16, "BLOCK_N": 32}),
    (1, 2, 2, 1, 16, {"BLOCK_M": 16, "BLOCK_N": 16}),
    (64, 1, 2, 2, 64, {"BLOCK_M": 32, "BLOCK_N": 32}),
    (70, 2, 4, 2, 32, {"BLOCK_M": 32, "BLOCK_N": 16, "TMA": True}),
    (1, 1, 3, 1, 16, {"BLOCK_M": 16, "BLOCK_N": 32, "TMA": True}),
]
rows, agree = [], []
for dtype in ("fp16", "fp32"):
    for S, B, Hq, Hkv, D, cfg in CASES:
        for o_norm in (False, True):
            inp = T.make_inputs(S, B, Hq, dtype=dtype, kv_heads=Hkv, head_dim=D, o_norm=o_norm, seed=S + Hq)
            for variant in T.VARIANTS:
                for impl in T.IMPLS:
                    if impl == "attention" and o_norm:
                        continue
                    outs = {}
                    # the fused op in every K_NORM mode; attention ignores K_NORM (one run, with "inloop")
                    for k_norm in (K.K_NORM_MODES if impl == "fused" else ("inloop",)):
                        out = run(impl, inp, variant, dict(cfg, K_NORM=k_norm))
                        outs[k_norm] = out
                        r = T.check(impl, out, inp, 1e-6, variant)
                        rows.append(dict(dtype=dtype, S=S, Hq=Hq, variant=variant, impl=impl, o_norm=o_norm,
                                         k_norm=k_norm, ok=r["ok"], err=r["max_abs_err"], tol=r["tol"],
                                         shape_ok=out.shape == inp["q"].shape and out.dtype == inp["q"].dtype))
                    if impl == "fused":  # prepass / materialize vs inloop: within the tolerance of the check
                        for mode in ("prepass", "materialize"):
                            diff = (outs[mode].float() - outs["inloop"].float()).abs().max().item()
                            agree.append(dict(dtype=dtype, S=S, variant=variant, o_norm=o_norm, mode=mode, diff=diff,
                                              tol=r["tol"]))

# NaN in q, Inf in k, NaN in v of batch element 1: batch 1 non-finite, batches 0 and 2 unchanged
nan = []
for variant in T.VARIANTS:
    for impl, k_norm in (("fused", "prepass"), ("fused", "inloop"), ("fused", "materialize"), ("attention", "prepass")):
        inp = T.make_inputs(45, 3, 2, dtype="fp32", kv_heads=1, head_dim=16, seed=9)
        cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "TMA": k_norm == "inloop", "K_NORM": k_norm}
        clean = run(impl, inp, variant, cfg)
        bad = dict(inp, q=inp["q"].clone(), k=inp["k"].clone(), v=inp["v"].clone())
        bad["q"][1, 0, 0, 3] = float("nan")
        bad["k"][1, 0, 44, 2] = float("inf")
        bad["v"][1, 0, 20, 1] = float("nan")
        out = run(impl, bad, variant, cfg)
        nan.append(dict(variant=variant, impl=impl, k_norm=k_norm, own=not bool(torch.isfinite(out[1]).all()),
                        others=bool(torch.equal(out[0], clean[0]) and torch.equal(out[2], clean[2]))))
print(json.dumps({"rows": rows, "agree": agree, "nan": nan}))
"""


@pytest.fixture(scope="module")
def interp():
    return run_python_json(_INTERP, env={"TRITON_INTERPRET": "1"}, timeout=600)


def test_interpreter_matches_reference(interp):
    bad = [r for r in interp["rows"] if not (r["ok"] and r["shape_ok"])]
    assert not bad, bad
    # per dtype and case: fused (3 K_NORM modes) x 2 o_norm x 2 variants + attention x 2 variants
    assert len(interp["rows"]) == 2 * 6 * (3 * 2 * 2 + 2)
    assert {r["k_norm"] for r in interp["rows"] if r["impl"] == "fused"} == {"prepass", "inloop", "materialize"}


def test_k_norm_modes_agree(interp):
    """K_NORM = prepass (raw K in the dot, columns scaled by rstd_k, γk folded into Q), materialize (a normalized
    copy of K) and inloop (K normalized per tile) are the same math: prepass and materialize differ from inloop by
    less than the check's tolerance (fp32: ~1e-6)."""
    assert len(interp["agree"]) == 2 * 6 * 2 * 2 * 2
    for r in interp["agree"]:
        assert r["diff"] <= r["tol"], r
        if r["dtype"] == "fp32":
            assert r["diff"] < 1e-4, r


def test_interpreter_fp32_is_tight(interp):
    """fp32 with input_precision='ieee': the kernel is an exact reformulation (errors ~1e-6, not just in tol)."""
    for r in interp["rows"]:
        if r["dtype"] == "fp32":
            assert r["err"] < 1e-4, r


def test_nan_stays_in_its_batch_element(interp):
    assert len(interp["nan"]) == 8
    for r in interp["nan"]:
        assert r["own"] and r["others"], r


def test_bad_inputs_and_configs():
    from kernels_triton import fna_llm as K
    from normfuse.techniques import fna_llm as T

    inp = T.make_inputs(8, 1, 2, dtype="fp16", kv_heads=1, head_dim=16)
    q, k, v, qw, kw = inp["q"], inp["k"], inp["v"], inp["q_weight"], inp["k_weight"]
    with pytest.raises(ValueError, match="CUDA"):
        K.qknorm_attention(q, k, v, qw, kw, causal=True)
    with pytest.raises(TypeError, match="causal"):
        K.attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match="q_weight and k_weight"):
        K.qknorm_attention(q, k, v, None, kw, causal=True)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        K.attention(q[:, :1].contiguous(), torch.cat([k, k], 1), torch.cat([v, v], 1), causal=False)
    with pytest.raises(ValueError, match="BLOCK_N"):
        K.attention(q, k, v, causal=True, config={"BLOCK_N": 48})
    with pytest.raises(ValueError, match="valid keys"):
        K.TilingConfig.from_dict({"BLOCK_K": 64})
    with pytest.raises(ValueError, match="num_stages"):
        K.TilingConfig(num_stages=0)
    with pytest.raises(ValueError, match="K_NORM"):
        K.TilingConfig(K_NORM="pre")
    with pytest.raises(ValueError, match="K_NORM"):
        K.qknorm_attention(q, k, v, qw, kw, causal=True, config={"K_NORM": None})
    assert K.TilingConfig().K_NORM == "prepass"


_COMPILE = r"""
import json, yaml
from normfuse import compile_only
compile_only.install(90)
from normfuse.techniques import fna_llm as T
from kernels_triton import fna_llm as K
cfgs = yaml.safe_load(open("configs/tiling/fna_llm_h200.yaml"))["triton"]
out = []
for c in cfgs:
    c = dict(c); name = c.pop("name")
    for op in ("qknorm_attention", "attention"):
        for causal in (True, False):
            r = K.compile_sm90(op, *T.compile_inputs(1000, 2, 32, "bf16"), config=c, causal=causal, o_norm=causal)
            pre = r.get("k_rstd", r.get("k_norm"))
            out.append(dict(name=name, op=op, causal=causal, wgmma=r["ptx_markers"]["wgmma"], smem_ok=r["smem_ok"],
                            num_warps=r["num_warps"], tma=r["ptx_markers"]["tma_load"], want_tma=c.get("TMA", False),
                            k_norm=c.get("K_NORM", "prepass"), prepass="k_rstd" in r, materialize="k_norm" in r,
                            prepass_ok=pre is None or (pre["smem_ok"] and pre["ptx_markers"]["wgmma"] == 0)))
print(json.dumps(out))
"""


def test_shipped_configs_compile_for_sm90_with_wgmma():
    out = run_python_json(_COMPILE, timeout=600)
    assert len(out) == 7 * 4
    assert {r["k_norm"] for r in out} == {"prepass", "inloop", "materialize"}
    for r in out:
        assert r["wgmma"] > 0 and r["smem_ok"], r
        assert (r["tma"] > 0) == r["want_tma"], r
        # the rstd_k pre-pass is launched for the fused op with K_NORM = prepass only (attention ignores K_NORM)
        assert r["prepass"] == (r["op"] == "qknorm_attention" and r["k_norm"] == "prepass"), r
        assert r["materialize"] == (r["op"] == "qknorm_attention" and r["k_norm"] == "materialize"), r
        assert r["prepass_ok"], r


def test_compile_sm90_rejects_unknown_op():
    from kernels_triton import fna_llm as K
    from normfuse.techniques import fna_llm as T

    with pytest.raises(ValueError, match="choices"):
        K.compile_sm90("matmul", *T.compile_inputs(64, 1, 8, "bf16"))
    assert json.dumps(K.TilingConfig().to_dict())


_FOLD = r"""
import json, torch
from kernels_triton import fna_llm as K
torch.manual_seed(0)
k = torch.randn(1, 2, 37, 32) * 3
kw, qw = torch.rand(32) + 0.5, torch.rand(32) + 0.5
out = {}
for fold in (False, True):
    pre, rstd_k, k_n = K.k_prepass(k, kw, 1e-6, "materialize", qw if fold else None)
    kernel, args, grid, kwd = pre
    kernel[grid](*args, **kwd)
    want = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6) * kw * (qw if fold else 1.0)
    out[str(fold)] = dict(err=(k_n - want).abs().max().item(), flag=kwd["FOLD_QW"], rstd=rstd_k is None)
print(json.dumps(out))
"""


def test_k_norm_prepass_folds_q_weight():
    """``k_prepass(..., "materialize", fold_q_weight=q_weight)`` (the TLX ``LAZY_Q`` pre-pass) writes
    ``rmsnorm(k)·γk·γq``; without it ``rmsnorm(k)·γk`` (fp32, ``TRITON_INTERPRET=1``)."""
    r = run_python_json(_FOLD, env={"TRITON_INTERPRET": "1"}, timeout=300)
    assert r["False"]["flag"] is False and r["True"]["flag"] is True
    assert r["False"]["err"] < 1e-5 and r["True"]["err"] < 1e-5 and r["True"]["rstd"], r
    from kernels_triton import fna_llm as K

    k, w = torch.empty(1, 1, 4, 16), torch.empty(16)
    for mode in ("prepass", "inloop", None):  # only the normalized copy can carry γq
        with pytest.raises(ValueError, match="fold_q_weight needs k_norm='materialize'"):
            K.k_prepass(k, w, 1e-6, mode, w)
