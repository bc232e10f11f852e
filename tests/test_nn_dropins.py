"""Tests of the autograd drop-ins of ``normfuse.nn`` on a CPU-only machine.

1. Triton interpreter (``TRITON_INTERPRET=1``; one subprocess shared through a module fixture), fp32 and fp16: for
   every drop-in, the output and the gradient of every differentiable input against torch autograd on fp64 inputs
   by the repository's flash-attention rule (``normfuse.nn.check_grads``: the same-dtype torch error sets the
   tolerance), at odd shapes (M = 1 or 37, K = 40, N = 24, S = 33, D = 16, jagged lengths 0 / 1 / max) and
   benchmark-like ones (several tiles in M, N and K; the shipped tile sizes): Lazy Pre-Norm (tile and row-block
   schedules), Linear -> RMSNorm / LayerNorm (multi-CTA ``last_cta`` and ``two_kernels``, naive fusion), QK-norm
   attention (GQA, causal or not, the three ``K_NORM`` modes, output norm), the blog's ``gdpa`` module, MXNorm ->
   MXFP8 -> Linear (the straight-through backward; p = 1, 2 and the exact RMSNorm cast, the kernel's rho checked
   against the spec's reference). Also: the modules equal the PyTorch pairs they replace (``from_modules``), the
   inference path of ``LinearRMSNorm`` (affine in the kernel) equals the autograd path and refuses a backward, and
   ``torch.compile`` (aot_eager) traces the custom ops forward and backward to the eager result; a negative control
   (a backward with dx 1 % off) fails the rule.
2. Helion reference mode (``HELION_INTERPRET=1``, a second subprocess): ``dsl="helion"`` forwards with the PyTorch
   reference of the backward primitives (the two interpreters cannot share a process).
3. In-process: argument validation (ValueError / TypeError / RuntimeError naming the problem) before any kernel.

GPU checks at the benchmark shapes in bf16: ``tests/test_nn_gpu.py`` (marker ``gpu``).
"""

from __future__ import annotations

import pytest
import torch

from normfuse.testing import run_python_json

_SCRIPT = r"""
import json
import torch
from normfuse.nn import check_grads
from normfuse.nn import fna as G, fna_llm as Q, lazy_prenorm as L, linear_norm as LN, mxnorm as MX
from normfuse.techniques import fna
from normfuse.techniques.mxnorm import reference_rstd
from kernels_triton import norms, norms_bwd

norms._DEFAULT_NUM_SMS = norms_bwd._DEFAULT_NUM_SMS = 2  # off-GPU grid sizes: few programs (the interpreter's cost)
DT = {"fp32": torch.float32, "fp16": torch.float16}
out = {}

def rand(*shape, g, scale=1.0, shift=0.0, rows=False):
    t = torch.randn(*shape, generator=g) * scale + shift
    if rows:  # per-row scales 0.25..4: a missing normalization is visible
        t = t * torch.exp2(torch.rand(shape[0], *([1] * (len(shape) - 1)), generator=g) * 4 - 2)
    return t

def record(key, rep):
    out[key] = {"ok": all(v["ok"] for v in rep.values()),
                "worst": max(rep, key=lambda k: rep[k]["max_abs_err"] / max(rep[k]["tol"], 1e-30)),
                "ratio": max(v["max_abs_err"] / max(v["tol"], 1e-30) for v in rep.values()),
                "names": sorted(rep)}

for dn, dt in DT.items():
    g = torch.Generator().manual_seed(0)
    # --- Lazy Pre-Norm: odd shapes, one tile; benchmark-like: 2 x 2 output tiles x 4 K steps; row-block schedule
    for tag, (M, K, N), cfg in (("odd", (37, 40, 24), None), ("m1", (1, 64, 40), None),
                                ("bench", (160, 256, 384), None),
                                ("rowblock", (160, 256, 384), {"schedule": "rowblock", "sumsq": "prepass"})):
        inp = dict(x=rand(M, K, g=g, rows=True).to(dt), gamma=rand(K, g=g, scale=0.1, shift=1).to(dt),
                   weight=rand(N, K, g=g, scale=K ** -0.5).to(dt))
        record(f"lazy-{tag}-{dn}", check_grads(lambda cfg=cfg, **a: L.lazy_rmsnorm_linear(**a, config=cfg),
                                               L.reference, inp, ("x", "gamma", "weight")))
    # --- Linear -> RMSNorm / LayerNorm
    for impl, tag, (M, K, N), cfg in (("multi_cta", "odd", (37, 40, 24), None),
                                      ("multi_cta", "last_cta", (160, 64, 200), {"BLOCK_N": 64}),
                                      ("multi_cta", "two_kernels", (160, 64, 200),
                                       {"BLOCK_N": 64, "exchange": "two_kernels"}),
                                      ("naive_fusion", "odd", (37, 40, 24), None),
                                      ("naive_fusion", "bench", (160, 64, 256 if dn == "fp16" else 128), None)):
        x, w = rand(M, K, g=g, shift=0.3).to(dt), rand(K, N, g=g, scale=K ** -0.5).to(dt)
        nw, nb = rand(N, g=g, scale=0.1, shift=1).to(dt), rand(N, g=g, scale=0.1).to(dt)
        kw = dict(impl=impl, config=cfg)
        record(f"linear_rms-{impl}-{tag}-{dn}", check_grads(
            lambda x, w, weight, kw=kw: LN.linear_rmsnorm(x, w, weight, eps=1e-6, **kw),
            lambda x, w, weight: LN.reference(x, w, weight, eps=1e-6, norm="rmsnorm"),
            dict(x=x, w=w, weight=nw), ("x", "w", "weight")))
        record(f"linear_ln-{impl}-{tag}-{dn}", check_grads(
            lambda x, w, weight, bias, kw=kw: LN.linear_layernorm(x, w, weight, bias, eps=1e-5, **kw),
            lambda x, w, weight, bias: LN.reference(x, w, weight, bias, eps=1e-5, norm="layernorm"),
            dict(x=x, w=w, weight=nw, bias=nb), ("x", "w", "weight", "bias")))
    # --- QK-norm attention (small tiles: the interpreter's cost grows with the tile)
    for tag, (B, Hq, Hkv, S, D), causal, k_norm, o_norm in (
            ("gqa-causal", (2, 4, 2, 33, 16), True, "prepass", False),
            ("bench", (1, 4, 1, 80, 32), True, "prepass", False),
            ("noncausal-onorm", (1, 2, 2, 40, 32), False, "prepass", True),
            ("inloop", (1, 2, 1, 33, 16), True, "inloop", False),
            ("materialize", (1, 2, 1, 33, 16), False, "materialize", False)):
        names = ("q", "k", "v", "q_weight", "k_weight") + (("o_weight",) if o_norm else ())
        inp = dict(q=rand(B, Hq, S, D, g=g, scale=2).to(dt), k=rand(B, Hkv, S, D, g=g, shift=0.5).to(dt),
                   v=rand(B, Hkv, S, D, g=g).to(dt), q_weight=rand(D, g=g, scale=0.2, shift=1).to(dt),
                   k_weight=rand(D, g=g, scale=0.2, shift=1).to(dt),
                   o_weight=rand(D, g=g, scale=0.2, shift=1).to(dt) if o_norm else None)
        cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "K_NORM": k_norm}
        record(f"qknorm-{tag}-{dn}", check_grads(
            lambda causal=causal, cfg=cfg, **a: Q.qknorm_attention(**a, causal=causal, config=cfg),
            lambda causal=causal, **a: Q.reference(**a, causal=causal), inp, names))
    # --- gdpa: jagged Q with lengths 1, 0 and max_len - 1 (edge_cases), mean-shifted q
    for tag, (L_, H, D, B) in (("odd", (9, 2, 16, 3)), ("bench", (40, 4, 32, 4))):
        i = fna.make_inputs(L_, H, D, dtype="fp32", batch=B, kv_len=16, edge_cases=True, mean_shift=0.5, seed=1)
        inp = dict(q=i["q"].to(dt), k=i["k"].to(dt), v=i["v"].to(dt), q_offsets=i["q_offsets"], max_len=L_)
        record(f"gdpa-{tag}-{dn}", check_grads(lambda **a: G.gdpa(**a, eps=1e-5, config={"BLOCK_M": 16}),
                                               lambda **a: G.reference(**a, eps=1e-5), inp, ("q", "k", "v")))
    # --- MXNorm -> MXFP8 -> Linear (straight-through); rho: the kernel's, checked against the spec's reference
    for variant in MX.VARIANTS:
        for tag, (M, K, N) in (("odd", (37, 96, 40)), ("bench", (64, 256, 128))):
            x = rand(M, K, g=g, rows=True).to(dt)
            inp = dict(x=x, gamma=rand(K, g=g, scale=0.1, shift=1).to(dt),
                       weight=rand(N, K, g=g, scale=K ** -0.5).to(dt))
            with torch.no_grad():
                _, rho = MX._op(x, inp["gamma"], inp["weight"], variant, 1e-6, "floor", "dequant", "triton", "")
            rr = reference_rstd(variant, x, 1e-6)
            record(f"mxnorm-{variant}-{tag}-{dn}", check_grads(
                lambda variant=variant, **a: MX.mxnorm_linear(**a, variant=variant),
                lambda variant=variant, rho=rho, **a: MX.reference(**a, variant=variant, rho=rho), inp,
                ("x", "gamma", "weight")))
            out[f"mxnorm-{variant}-{tag}-{dn}"]["rho_rel"] = ((rho - rr).abs() / rr).max().item()

# --- negative control: a backward whose dx is 1 % off must fail the rule (the checks can fail)
for dn, dt in DT.items():
    g = torch.Generator().manual_seed(0)
    inp = dict(x=rand(37, 40, g=g, rows=True).to(dt), gamma=rand(40, g=g, scale=0.1, shift=1).to(dt),
               weight=rand(24, 40, g=g, scale=40 ** -0.5).to(dt))
    right = L.norm_ops.rms_norm_bwd
    L.norm_ops.rms_norm_bwd = lambda *a: (lambda dx, dw: (dx * 1.01, dw))(*right(*a))
    try:
        rep = check_grads(L.lazy_rmsnorm_linear, L.reference, inp, ("x", "gamma", "weight"))
    finally:
        L.norm_ops.rms_norm_bwd = right
    out[f"neg-lazy-{dn}"] = {k: v["ok"] for k, v in rep.items()}

# --- modules against the PyTorch pairs they replace (fp16)
g = torch.Generator().manual_seed(5)
x = rand(2, 7, 64, g=g).half()
norm, lin = torch.nn.RMSNorm(64, eps=1e-6).half(), torch.nn.Linear(64, 48, bias=True).half()
with torch.no_grad():
    norm.weight.copy_(rand(64, g=g, scale=0.1, shift=1))
m = L.LazyRMSNormLinear.from_modules(norm, lin)
ref = torch.nn.functional.linear(torch.nn.functional.rms_norm(x.double(), (64,), norm.weight.double(), 1e-6),
                                 lin.weight.double(), lin.bias.double())
out["module-lazy"] = {"err": (m(x).double() - ref).abs().max().item(), "scale": ref.abs().max().item(),
                      "shape": list(m(x).shape)}
lin2, ln2 = torch.nn.Linear(64, 32, bias=False).half(), torch.nn.LayerNorm(32, eps=1e-5).half()
with torch.no_grad():
    ln2.weight.copy_(rand(32, g=g, scale=0.1, shift=1)); ln2.bias.copy_(rand(32, g=g, scale=0.1))
m2 = LN.LinearLayerNorm.from_modules(lin2, ln2, config={"BLOCK_N": 16})
ref2 = torch.nn.functional.layer_norm(x.double() @ lin2.weight.double().t(), (32,), ln2.weight.double(),
                                      ln2.bias.double(), 1e-5)
y_grad = m2(x)                       # parameters require grad: autograd path (affine after the kernel)
with torch.no_grad():
    y_inf = m2(x)                    # inference path: affine in the kernel's epilogue
out["module-linear_ln"] = {"err": (y_grad.double() - ref2).abs().max().item(), "scale": ref2.abs().max().item(),
                           "paths": (y_grad.double() - y_inf.double()).abs().max().item()}
try:  # the forward-only op (used without gradients) refuses a backward with torch's error
    from normfuse.nn.linear_norm import _affine_op
    xi = x.clone().requires_grad_()
    yf = _affine_op(xi.reshape(-1, 64), lin2.weight.t().contiguous(), None, None, 1e-6, True, "multi_cta", "triton", "")
    yf.sum().backward()
    out["forward_only_backward"] = "no error"
except RuntimeError as e:
    out["forward_only_backward"] = str(e)[:200]

# --- torch.compile (aot_eager: AOTAutograd traces the custom ops and their backward) equals eager
torch._dynamo.reset()
xs = rand(33, 64, g=g).half()
ms = L.LazyRMSNormLinear(64, 40, dtype=torch.float16)
qa = Q.QKNormAttention(16, causal=True, config={"BLOCK_M": 16, "BLOCK_N": 16}, dtype=torch.float16)
q4, k4, v4 = (rand(1, h, 20, 16, g=g).half() for h in (2, 1, 1))
def f(x, q, k, v):
    return ms(x).float().sum() + qa(q, k, v).float().sum()
res = {}
for name, fn in (("eager", f), ("compiled", torch.compile(f, backend="aot_eager", fullgraph=True))):
    leaves = [t.clone().requires_grad_() for t in (xs, q4, k4, v4)]
    grads = torch.autograd.grad(fn(*leaves), leaves + [ms.weight, qa.q_weight])
    res[name] = grads
out["compile"] = {"max_diff": max((a.double() - b.double()).abs().max().item()
                                  for a, b in zip(res["eager"], res["compiled"]))}
print(json.dumps(out))
"""

_HELION = r"""
import json
import torch
from normfuse.nn import check_grads
from normfuse.nn import lazy_prenorm as L, linear_norm as LN
g = torch.Generator().manual_seed(0)
x = torch.randn(37, 40, generator=g).half()
inp = dict(x=x, gamma=(1 + 0.1 * torch.randn(40, generator=g)).half(),
           weight=(torch.randn(24, 40, generator=g) / 7).half())
out = {"lazy": check_grads(lambda **a: L.lazy_rmsnorm_linear(**a, dsl="helion"), L.reference, inp,
                           ("x", "gamma", "weight"))}
inp = dict(x=x, w=(torch.randn(40, 24, generator=g) / 7).half(), weight=(1 + 0.1 * torch.randn(24, generator=g)).half())
out["linear_rms"] = check_grads(lambda **a: LN.linear_rmsnorm(**a, dsl="helion"),
                                lambda **a: LN.reference(**a, eps=1e-6, norm="rmsnorm"), inp, ("x", "w", "weight"))
print(json.dumps({k: all(r["ok"] for r in v.values()) for k, v in out.items()}))
"""


@pytest.fixture(scope="module")
def interp():
    return run_python_json(_SCRIPT, env={"TRITON_INTERPRET": "1"}, timeout=1500)


_LINEAR = (("multi_cta", "odd"), ("multi_cta", "last_cta"), ("multi_cta", "two_kernels"), ("naive_fusion", "odd"),
           ("naive_fusion", "bench"))
_KEYS = ([f"lazy-{t}" for t in ("odd", "m1", "bench", "rowblock")]
         + [f"linear_{n}-{i}-{t}" for n in ("rms", "ln") for i, t in _LINEAR]
         + [f"qknorm-{t}" for t in ("gqa-causal", "bench", "noncausal-onorm", "inloop", "materialize")]
         + [f"gdpa-{t}" for t in ("odd", "bench")]
         + [f"mxnorm-{v}-{t}" for v in ("mxnorm_p2", "mxnorm_p1", "rmsnorm_cast") for t in ("odd", "bench")])


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("key", _KEYS)
def test_gradients_match_fp64_autograd(interp, key, dtype):
    r = interp[f"{key}-{dtype}"]
    assert r["ok"], r
    assert "out" in r["names"] and len(r["names"]) >= 4  # the output and every differentiable input were compared


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_mxnorm_kernel_rho_matches_spec(interp, dtype):
    for v in ("mxnorm_p2", "mxnorm_p1", "rmsnorm_cast"):
        for t in ("odd", "bench"):
            assert interp[f"mxnorm-{v}-{t}-{dtype}"]["rho_rel"] <= 1e-5


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_negative_control_fails(interp, dtype):
    # dx scaled by 1.01 in the backward: the x gradient fails the rule, the others still pass
    assert interp[f"neg-lazy-{dtype}"] == {"out": True, "x": False, "gamma": True, "weight": True}


def test_modules_equal_the_pairs_they_replace(interp):
    for k in ("module-lazy", "module-linear_ln"):
        r = interp[k]
        assert r["err"] <= 1e-2 * r["scale"], (k, r)  # fp16 against fp64: a few fp16 roundings
    assert interp["module-lazy"]["shape"] == [2, 7, 48]
    assert interp["module-linear_ln"]["paths"] <= 1e-2 * interp["module-linear_ln"]["scale"]


def test_forward_only_op_refuses_backward(interp):
    assert "autograd" in interp["forward_only_backward"]


def test_compiled_equals_eager(interp):
    assert interp["compile"]["max_diff"] <= 1e-3


def test_helion_ref_mode_forwards():
    r = run_python_json(_HELION, env={"HELION_INTERPRET": "1"}, timeout=900)
    assert r == {"lazy": True, "linear_rms": True}


# --------------------------------------------------------------------------------------------------------------
# in-process: argument validation (no kernel runs)
# --------------------------------------------------------------------------------------------------------------
def test_bad_arguments_raise():
    from normfuse.nn import (LazyRMSNormLinear, LinearRMSNorm, MXNormLinear, QKNormAttention, gdpa,
                             lazy_rmsnorm_linear, linear_rmsnorm, mxnorm_linear, qknorm_attention)

    x, g, w = torch.randn(4, 16).half(), torch.ones(16).half(), torch.randn(8, 16).half()
    with pytest.raises(ValueError, match="unknown dsl"):
        lazy_rmsnorm_linear(x, g, w, dsl="cuda")
    with pytest.raises(ValueError, match="eps"):
        lazy_rmsnorm_linear(x, g, w, eps=0.0)
    with pytest.raises(ValueError, match="K mismatch"):
        lazy_rmsnorm_linear(x, g[:8], w)
    with pytest.raises(TypeError, match="torch.Tensor"):
        lazy_rmsnorm_linear(x.numpy(), g, w)
    with pytest.raises(ValueError, match="unknown impl"):
        linear_rmsnorm(x, w.t(), impl="two_ctas")
    with pytest.raises(ValueError, match="w \\[K, N\\]"):
        linear_rmsnorm(x, w)
    with pytest.raises(TypeError, match="causal"):
        qknorm_attention(x, x, x, g, g, causal=1)
    with pytest.raises(ValueError, match="max_len"):
        gdpa(x, x, x, torch.zeros(2, dtype=torch.int32), 0)
    with pytest.raises(ValueError, match="unknown variant"):
        mxnorm_linear(x, g, w, variant="mxnorm_p3")
    with pytest.raises(ValueError, match="unknown gemm"):
        mxnorm_linear(x, g, w, gemm="fp8")
    with pytest.raises(ValueError, match="scale"):
        mxnorm_linear(x, g, w, scale_mode="ceil")
    with pytest.raises(TypeError, match="config"):
        LazyRMSNormLinear(16, 8, config=3)
    with pytest.raises(ValueError, match="unknown dsl"):
        LinearRMSNorm(16, 8, dsl="cutlass")
    with pytest.raises(TypeError, match="causal"):
        QKNormAttention(16, causal="yes")
    with pytest.raises(ValueError, match="unknown variant"):
        MXNormLinear(32, 8, variant="rms")


def test_tlx_outside_its_environment_is_a_clear_error():
    pytest.importorskip("triton")
    try:
        import triton.language.extra.tlx  # noqa: F401
        pytest.skip("this interpreter has TLX")
    except ImportError:
        pass
    from normfuse.nn import lazy_rmsnorm_linear

    with pytest.raises(RuntimeError, match="TLX environment"):
        lazy_rmsnorm_linear(torch.randn(4, 16).half(), torch.ones(16).half(), torch.randn(8, 16).half(), dsl="tlx")
