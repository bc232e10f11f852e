"""GPU gradient checks of the drop-ins at benchmark shapes (used by ``tests/test_nn_gpu.py`` and, for TLX,
``tests/tlx/test_nn_tlx.py``; marker ``gpu``).

``CASES`` names one check per drop-in; ``run_case(name, dsl)`` builds its seeded bf16 inputs on the GPU at a
benchmark shape (the Llama 3 8B QKV projection for the Lazy Pre-Norm and MXNorm linears, the blog's multi-CTA /
naive-fusion widths, a causal 4K-token GQA attention, the blog's ``gdpa`` grid point), runs
``normfuse.nn.check_grads`` (fp64 reference by torch autograd, flash-attention rule with the bf16 PyTorch error)
and returns its report. Torch only at import time.
"""

from __future__ import annotations

import torch

CASES = ("lazy_qkv", "linear_rmsnorm_multi_cta", "linear_layernorm_multi_cta", "linear_rmsnorm_naive",
         "linear_layernorm_naive", "qknorm_attention", "gdpa", "mxnorm_linear_dequant", "mxnorm_linear_dot_scaled")


def _rand(*shape, gen, scale=1.0, shift=0.0, rows=False, dtype=torch.bfloat16):
    t = torch.randn(*shape, generator=gen, device="cuda") * scale + shift
    if rows:
        t = t * torch.exp2(torch.rand(shape[0], *([1] * (len(shape) - 1)), generator=gen, device="cuda") * 4 - 2)
    return t.to(dtype)


def run_case(name: str, dsl: str = "triton", *, seed: int = 0) -> dict:
    """``check_grads`` report of case ``name`` (one of ``CASES``) with forward kernels of ``dsl``. ValueError for an
    unknown name. Needs CUDA."""
    from normfuse.nn import check_grads, fna, fna_llm, lazy_prenorm, linear_norm, mxnorm

    g = torch.Generator(device="cuda").manual_seed(seed)
    if name == "lazy_qkv":  # Llama 3 8B: 8192 tokens, hidden 4096 -> fused QKV 6144
        M, K, N = 8192, 4096, 6144
        inp = dict(x=_rand(M, K, gen=g, rows=True), gamma=_rand(K, gen=g, scale=0.1, shift=1.0),
                   weight=_rand(N, K, gen=g, scale=K ** -0.5))
        return check_grads(lambda **a: lazy_prenorm.lazy_rmsnorm_linear(**a, dsl=dsl), lazy_prenorm.reference, inp,
                           ("x", "gamma", "weight"))
    if name.startswith("linear_"):
        norm, impl = name.split("_")[1], "multi_cta" if name.endswith("multi_cta") else "naive_fusion"
        M, K, N = (8192, 4096, 1024) if impl == "multi_cta" else (8192, 4096, 256)  # TLX defaults: 4 x 256, 256
        inp = dict(x=_rand(M, K, gen=g, shift=0.3), w=_rand(K, N, gen=g, scale=K ** -0.5),
                   weight=_rand(N, gen=g, scale=0.1, shift=1.0))
        if norm == "rmsnorm":
            return check_grads(lambda **a: linear_norm.linear_rmsnorm(**a, impl=impl, dsl=dsl),
                               lambda **a: linear_norm.reference(**a, eps=1e-6, norm="rmsnorm"), inp,
                               ("x", "w", "weight"))
        inp["bias"] = _rand(N, gen=g, scale=0.1)
        return check_grads(lambda **a: linear_norm.linear_layernorm(**a, impl=impl, dsl=dsl),
                           lambda **a: linear_norm.reference(**a, eps=1e-5, norm="layernorm"), inp,
                           ("x", "w", "weight", "bias"))
    if name == "qknorm_attention":  # causal, 4K tokens, Llama 3 8B heads (32 / 8 of 128)
        B, Hq, Hkv, S, D = 1, 32, 8, 4096, 128
        inp = dict(q=_rand(B, Hq, S, D, gen=g, scale=2.0), k=_rand(B, Hkv, S, D, gen=g, shift=0.5),
                   v=_rand(B, Hkv, S, D, gen=g), q_weight=_rand(D, gen=g, scale=0.2, shift=1.0),
                   k_weight=_rand(D, gen=g, scale=0.2, shift=1.0))
        return check_grads(lambda **a: fna_llm.qknorm_attention(**a, causal=True, dsl=dsl),
                           lambda **a: fna_llm.reference(**a, causal=True), inp,
                           ("q", "k", "v", "q_weight", "k_weight"))
    if name == "gdpa":  # the blog's grid point max_len 1000, H 4, D 128 (batch 256 of the blog's 768)
        from normfuse.techniques import fna as spec

        i = spec.make_inputs(1000, 4, 128, dtype="bf16", device="cuda", batch=256, edge_cases=True, seed=seed)
        inp = {k: i[k] for k in ("q", "k", "v", "q_offsets")} | {"max_len": 1000}
        return check_grads(lambda **a: fna.gdpa(**a, dsl=dsl), fna.reference, inp, ("q", "k", "v"))
    if name.startswith("mxnorm_linear_"):
        gemm = name.removeprefix("mxnorm_linear_")
        M, K, N = 8192, 4096, 6144
        x = _rand(M, K, gen=g, rows=True)
        inp = dict(x=x, gamma=_rand(K, gen=g, scale=0.1, shift=1.0), weight=_rand(N, K, gen=g, scale=K ** -0.5))
        with torch.no_grad():  # the kernel's rho: both sides then cast the same fp32 values
            _, rho = mxnorm._op(x, inp["gamma"], inp["weight"], "mxnorm_p2", 1e-6, "floor", gemm, dsl, "")
        return check_grads(lambda **a: mxnorm.mxnorm_linear(**a, gemm=gemm, dsl=dsl),
                           lambda **a: mxnorm.reference(**a, rho=rho), inp, ("x", "gamma", "weight"))
    raise ValueError(f"unknown case {name!r}; choices: {', '.join(CASES)}")
