"""Test helpers shared by the three DSLs' CPU tests (importable in both environments: torch + pytest only)."""

from __future__ import annotations

import pytest
import torch


def assert_rejects_bad_inputs(fn, dtype: torch.dtype, bad_config: dict) -> None:
    """Every kernel entry point (``fn(a, b, config=...)``) must reject bad inputs with a TypeError/ValueError
    naming the constraint: mixed or unsupported dtypes, non-tensors, wrong rank, mismatched K, non-contiguous
    inputs, K or N not a multiple of 8, and an invalid tiling ``bad_config`` (a power-of-2 violation)."""
    a, b = torch.randn(16, 16).to(dtype), torch.randn(16, 16).to(dtype)
    with pytest.raises(TypeError):  # mixed dtypes
        fn(a, b.to(torch.float32 if dtype != torch.float32 else torch.float16))
    with pytest.raises(TypeError):  # unsupported dtype
        fn(a.to(torch.int32), b.to(torch.int32))
    with pytest.raises(TypeError):  # not a tensor
        fn(a.float().numpy(), b)
    with pytest.raises(ValueError):  # rank
        fn(a[None], b)
    with pytest.raises(ValueError, match="inner dimensions"):
        fn(a, torch.randn(24, 16).to(dtype))
    with pytest.raises(ValueError, match="contiguous"):
        fn(torch.randn(32, 16).to(dtype)[::2], b)
    with pytest.raises(ValueError, match="multiple of 8"):  # K (16-byte TMA rows)
        fn(torch.randn(16, 12).to(dtype), torch.randn(12, 16).to(dtype))
    with pytest.raises(ValueError, match="multiple of 8"):  # N
        fn(a, torch.randn(16, 20).to(dtype))
    with pytest.raises(ValueError, match="power(s)? of (2|two)"):  # bad tiling through the public function
        fn(a, b, config=bad_config)


def run_python_json(code: str, *argv: str, env: dict | None = None, timeout: float = 300):
    """Run ``code`` (dedented) with ``argv`` in a fresh interpreter at the repository root and return the JSON
    value printed on its last stdout line; fail the calling test with stdout/stderr if it exits non-zero.

    Interpreter switches are process-wide and read at import, hence the fresh process: ``TRITON_INTERPRET`` and
    ``HELION_INTERPRET`` are cleared unless ``env`` sets them (e.g. ``env={"TRITON_INTERPRET": "1"}``)."""
    import json
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join([root] + ([full["PYTHONPATH"]] if full.get("PYTHONPATH") else []))
    full.pop("TRITON_INTERPRET", None)
    full.pop("HELION_INTERPRET", None)
    full.update(env or {})
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *argv], cwd=root, env=full,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"subprocess failed (rc={proc.returncode})\n--- stdout\n{proc.stdout[-4000:]}\n"
                    f"--- stderr\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_python_json_parallel(code: str, jobs: list, *, parts: int = 2, timeout: float = 300) -> dict:
    """``run_python_json(code, json.dumps(part))`` for ``parts`` interleaved slices of ``jobs`` in parallel
    processes (compile-only tests: one compile + ptxas per job, CPU-bound), merging the dicts they print. Fails the
    calling test with the stderr of the first process that exits non-zero."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    slices = [jobs[i::parts] for i in range(parts) if jobs[i::parts]]
    out: dict = {}
    with ThreadPoolExecutor(len(slices) or 1) as pool:
        for part in pool.map(lambda sl: run_python_json(code, json.dumps(sl), timeout=timeout), slices):
            out.update(part)
    return out


def compile_multi_cta_pairs(jobs: list, labels: tuple[str, str], measure=None) -> dict:
    """Compile-only for sm_90a of pairs of shipped ``kernels_tlx.multi_cta`` configs, for a subprocess script of the
    TLX environment that has called ``normfuse.compile_only.install(90)`` (never the test process: see
    tests/test_compile_only_hygiene.py). For each job ``(name, base, N, op)``: ``compile_sm90(op, a, b, config=...,
    ptxas=True)`` of the configs ``name`` and ``base`` at ``a [4096, 1024]``, ``b [1024, N]`` bf16. Returns
    ``{"<name>/<op>/<N>": {labels[0]: r, labels[1]: r}}`` (``labels`` name the two configs' entries), each ``r``
    holding ``ptxas``, ``smem`` (``shared_bytes``), ``est`` (``smem_estimate``) and ``extra`` (``ptx_extra``), plus
    the dict ``measure(cfg, op, a, b)`` returns when given (e.g. counts read off the compiled PTX)."""
    from kernels_tlx import multi_cta as km

    out = {}
    for name, base, N, op in jobs:
        a = torch.empty(4096, 1024, dtype=torch.bfloat16)
        b = torch.empty(1024, N, dtype=torch.bfloat16)
        r = {}
        for label, cfg_name in zip(labels, (name, base)):
            cfg = km.SHIPPED_CONFIGS[cfg_name]
            s = km.compile_sm90(op, a, b, config=cfg, ptxas=True)
            r[label] = {"ptxas": s["ptxas"], "smem": s["shared_bytes"], "est": s["smem_estimate"],
                        "extra": s["ptx_extra"], **(measure(cfg, op, a, b) if measure else {})}
        out[f"{name}/{op}/{N}"] = r
    return out


def compile_lazy_cluster_pairs(jobs: list, labels: tuple[str, str], measure=None) -> dict:
    """Compile-only for sm_90a of pairs of shipped Lazy Pre-Norm cluster-form configs (``kernels_tlx.lazy_prenorm``'s
    SHIPPED_CONFIGS, or SHIPPED_LN_CONFIGS for names starting with ``ln_``), for a subprocess script of the TLX
    environment that has called ``normfuse.compile_only.install(90)`` (as ``compile_multi_cta_pairs``). For each job
    ``(name, base, N, K)``: the fused op (``lazy_rmsnorm_matmul`` / ``lazy_layernorm_matmul``) of the configs ``name``
    and ``base`` at ``a [4096, K]``, ``b [K, N]`` bf16, through ``compile_sm90(..., ptxas=True)`` and the kernel's
    PTX. Returns ``{"<name>/<N>/<K>": {labels[0]: r, labels[1]: r}}``, each ``r`` holding ``ptxas`` and ``smem``
    (``shared_bytes``), plus the dict ``measure(cluster_config, ptx)`` returns when given."""
    from kernels_tlx import lazy_prenorm as lp
    from kernels_tlx import multi_cta as km

    out = {}
    for name, base, N, K in jobs:
        a = torch.empty(4096, K, dtype=torch.bfloat16)
        b = torch.empty(K, N, dtype=torch.bfloat16)
        ln = name.startswith("ln_")
        op, norm, eps = ("lazy_layernorm_matmul", "lazy_layer", 1e-5) if ln else ("lazy_rmsnorm_matmul", "lazy_rms",
                                                                                 1e-6)
        vec = (torch.empty(N), torch.empty(N)) if ln else None
        r = {}
        for label, cfg_name in zip(labels, (name, base)):
            cfg = (lp.SHIPPED_LN_CONFIGS if ln else lp.SHIPPED_CONFIGS)[cfg_name].cluster_config()
            s = km.compile_sm90(op, a, b, config=cfg, ptxas=True,
                                **(dict(colsum=vec[0], beta_b=vec[1]) if ln else {}))
            *_, args, kw = km._prepare(a, b, None, None, eps, norm, cfg, need_cuda=False, ln_vectors=vec)
            ptx = km._multi_cta_norm_kernel.warmup(*args, grid=(cfg.CLUSTER_SIZE, ), **kw).asm["ptx"]
            r[label] = {"ptxas": s["ptxas"], "smem": s["shared_bytes"], **(measure(cfg, ptx) if measure else {})}
        out[f"{name}/{N}/{K}"] = r
    return out


def fna_llm_int64_inputs(B: int = 2049, device: str = "cuda") -> dict:
    """QK-norm attention inputs whose q has more than 2^31 elements at the default B: ``q [B, 16, 512, 128]``,
    ``k``, ``v [B, 8, 512, 128]`` bf16 (batch 2048 starts at element 2^31), ``q_weight`` / ``k_weight`` [128] near 1,
    no ``o_weight``; seeded (generator seed 0), so every DSL's GPU test sees the same tensors."""
    Hq, Hkv, S, D = 16, 8, 512, 128
    g = torch.Generator(device=device).manual_seed(0)
    mk = lambda *s: torch.randn(*s, generator=g, device=device, dtype=torch.bfloat16)  # noqa: E731
    return {"q": mk(B, Hq, S, D), "k": mk(B, Hkv, S, D), "v": mk(B, Hkv, S, D),
            "q_weight": (1 + 0.2 * mk(D)).to(torch.bfloat16), "k_weight": (1 + 0.2 * mk(D)).to(torch.bfloat16),
            "o_weight": None}


# ------------------------------------------------------------------------------------------------------------
# One contract across DSLs (issue 15): the same call is accepted or rejected the same way in Triton, Helion and
# TLX. The cases are data, shared by the CPU tests of both environments (tests/test_bad_inputs_gemm.py runs them
# in the Triton interpreter and Helion's ref mode, tests/tlx/test_bad_inputs_gemm_tlx.py against TLX) and by the
# GPU tests (normfuse.gpu_checks.check_contract).
# ------------------------------------------------------------------------------------------------------------
def misaligned(t: torch.Tensor, offset_elems: int = 1) -> torch.Tensor:
    """A contiguous copy of ``t`` whose data pointer lies ``offset_elems`` elements past a 16-byte boundary: a
    view with a storage offset (2 bytes off for bf16/fp16, 4 for fp32), what slicing a larger buffer gives."""
    buf = torch.empty(t.numel() + 16 // t.element_size() + offset_elems, dtype=t.dtype, device=t.device)
    start = (-buf.data_ptr() % 16) // t.element_size() + offset_elems
    view = buf[start:start + t.numel()].view(t.shape)
    view.copy_(t.detach())
    assert view.data_ptr() % 16 == (offset_elems * t.element_size()) % 16 and view.is_contiguous()
    return view


class ContractCase:
    """One call of a technique's public wrapper: ``fn`` (its name in every ``kernels_<dsl>/<technique>.py``),
    ``build(dtype, device) -> (args, kwargs)``, the expected outcome ``error`` (an exception class name:
    "TypeError", "ValueError", "NotImplementedError", "ConfigError"; None = accepted) and ``match``, a regex the
    error message must contain (it must name the violated constraint)."""

    def __init__(self, id: str, fn: str, build, error: str | None = None, match: str = ""):
        self.id, self.fn, self.build, self.error, self.match = id, fn, build, error, match

    def __repr__(self) -> str:
        return f"ContractCase({self.id})"


# shapes every default config of every DSL serves (TLX multi-CTA's default 4-CTA cluster: 104 <= N <= 1024)
CONTRACT_GEMM = (40, 128, 64)  # M, N, K
CONTRACT_NORM = (8, 128)  # M, N
_BAD_EPS = {"eps_none": None, "eps_zero": 0.0, "eps_negative": -1e-5, "eps_nan": float("nan"), "eps_bool": True,
            "eps_str": "1e-5"}


def _rand(shape, dtype, device, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def _grad(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def _norm_cases() -> list[ContractCase]:
    M, N = CONTRACT_NORM

    def inputs(dtype, device):
        return _rand((M, N), dtype, device, 1), _rand((N,), dtype, device, 2, 0.1) + 1, _rand((N,), dtype, device, 3)

    def ln(mutate=lambda x, w, b, kw: (x, w, b, kw), **kw):
        def build(dtype, device):
            x, w, b = inputs(dtype, device)
            x, w, b, kw2 = mutate(x, w, b, dict(kw))
            return (x, w, b), {"eps": 1e-5, **kw2}
        return build

    def rms(mutate=lambda x, w, kw: (x, w, kw)):
        def build(dtype, device):
            x, w, _ = inputs(dtype, device)
            x, w, kw = mutate(x, w, {})
            return (x, w), {"eps": 1e-6, **kw}
        return build

    cases = [
        ContractCase("valid", "layer_norm", ln()),
        ContractCase("valid_rms", "rms_norm", rms()),
        ContractCase("no_affine", "layer_norm", ln(lambda x, w, b, kw: (x, None, None, kw))),
        ContractCase("weight_fp32", "layer_norm", ln(lambda x, w, b, kw: (x, w.float(), b, kw)), "TypeError",
                     "weight must have x's dtype"),
        ContractCase("bias_fp32", "layer_norm", ln(lambda x, w, b, kw: (x, w, b.float(), kw)), "TypeError",
                     "bias must have x's dtype"),
        ContractCase("rms_weight_fp32", "rms_norm", rms(lambda x, w, kw: (x, w.float(), kw)), "TypeError",
                     "weight must have x's dtype"),
        ContractCase("weight_shape", "layer_norm", ln(lambda x, w, b, kw: (x, w[:-8].contiguous(), b, kw)),
                     "ValueError", r"weight must have shape \[N\]"),
        ContractCase("weight_strided", "layer_norm",
                     ln(lambda x, w, b, kw: (x, torch.stack([w, w], 1).reshape(-1)[::2], b, kw)), "ValueError",
                     "weight must be contiguous"),
        ContractCase("x_int", "layer_norm", ln(lambda x, w, b, kw: (x.to(torch.int32), None, None, kw)), "TypeError",
                     "x must be bf16, fp16 or fp32"),
        ContractCase("x_3d", "layer_norm", ln(lambda x, w, b, kw: (x[None], w, b, kw)), "ValueError", "2-D"),
        ContractCase("x_strided", "layer_norm", ln(lambda x, w, b, kw: (torch.cat([x, x], 1)[:, ::2], w, b, kw)),
                     "ValueError", "contiguous"),
        ContractCase("x_no_rows", "layer_norm", ln(lambda x, w, b, kw: (x[:0], w, b, kw)), "ValueError",
                     "M must be a positive integer"),
        ContractCase("misaligned_x", "layer_norm", ln(lambda x, w, b, kw: (misaligned(x), w, b, kw))),
        ContractCase("misaligned_x_rms", "rms_norm", rms(lambda x, w, kw: (misaligned(x), w, kw))),
        ContractCase("misaligned_weight", "layer_norm", ln(lambda x, w, b, kw: (x, misaligned(w), misaligned(b), kw))),
        ContractCase("x_requires_grad", "layer_norm", ln(lambda x, w, b, kw: (_grad(x), w, b, kw)),
                     "NotImplementedError", "forward-only"),
        ContractCase("weight_requires_grad", "rms_norm", rms(lambda x, w, kw: (x, _grad(w), kw)),
                     "NotImplementedError", "forward-only"),
        ContractCase("config_unknown_key", "layer_norm", ln(config={"BLOCK_Q": 64}), "ConfigError", "unknown"),
    ]
    for name, eps in _BAD_EPS.items():
        cases.append(ContractCase(name, "layer_norm", ln(eps=eps), "ValueError", "eps must be a finite number"))
    cases.append(ContractCase("rms_eps_none", "rms_norm", rms(lambda x, w, kw: (x, w, {"eps": None})), "ValueError",
                              "eps must be a finite number"))
    return cases


def _post_norm_cases() -> list[ContractCase]:
    """``matmul_layernorm(a, b, weight, bias, eps=, config=)`` / ``matmul_rmsnorm(a, b, weight, eps=, config=)``:
    naive fusion and Multi-CTA norm fusion share this contract."""
    M, N, K = CONTRACT_GEMM

    def inputs(dtype, device):
        a = _rand((M, K), dtype, device, 1)
        b = _rand((K, N), dtype, device, 2, K ** -0.5)
        return a, b, _rand((N,), dtype, device, 3, 0.1) + 1, _rand((N,), dtype, device, 4, 0.1)

    def ln(mutate=lambda a, b, w, c, kw: (a, b, w, c, kw), **kw):
        def build(dtype, device):
            a, b, w, c = inputs(dtype, device)
            a, b, w, c, kw2 = mutate(a, b, w, c, dict(kw))
            return (a, b, w, c), {"eps": 1e-5, **kw2}
        return build

    def rms(mutate=lambda a, b, w, kw: (a, b, w, kw)):
        def build(dtype, device):
            a, b, w, _ = inputs(dtype, device)
            a, b, w, kw = mutate(a, b, w, {})
            return (a, b, w), {"eps": 1e-6, **kw}
        return build

    other = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float16}
    cases = [
        ContractCase("valid", "matmul_layernorm", ln()),
        ContractCase("valid_rms", "matmul_rmsnorm", rms()),
        ContractCase("no_affine", "matmul_layernorm", ln(lambda a, b, w, c, kw: (a, b, None, None, kw))),
        ContractCase("weight_fp32", "matmul_layernorm", ln(lambda a, b, w, c, kw: (a, b, w.float(), c, kw)),
                     "TypeError", "weight must have a's dtype"),
        ContractCase("bias_fp32", "matmul_layernorm", ln(lambda a, b, w, c, kw: (a, b, w, c.float(), kw)),
                     "TypeError", "bias must have a's dtype"),
        ContractCase("rms_weight_fp32", "matmul_rmsnorm", rms(lambda a, b, w, kw: (a, b, w.float(), kw)),
                     "TypeError", "weight must have a's dtype"),
        ContractCase("weight_shape", "matmul_layernorm", ln(lambda a, b, w, c, kw: (a, b, w[:-8].contiguous(), c, kw)),
                     "ValueError", r"weight must have shape \[N\]"),
        ContractCase("bias_strided", "matmul_layernorm",
                     ln(lambda a, b, w, c, kw: (a, b, w, torch.stack([c, c], 1).reshape(-1)[::2], kw)), "ValueError",
                     "bias must be contiguous"),
        ContractCase("mixed_dtypes", "matmul_layernorm", ln(lambda a, b, w, c, kw: (a, b.to(other[b.dtype]), w, c, kw)),
                     "TypeError", "share one dtype"),
        ContractCase("int_dtype", "matmul_rmsnorm",
                     rms(lambda a, b, w, kw: (a.to(torch.int32), b.to(torch.int32), None, kw)), "TypeError",
                     "share one dtype"),
        ContractCase("inner_mismatch", "matmul_layernorm", ln(lambda a, b, w, c, kw: (a[:, :K - 8].contiguous(), b, w,
                                                                                       c, kw)),
                     "ValueError", "inner dimensions"),
        ContractCase("n_not_multiple_of_8", "matmul_rmsnorm", rms(lambda a, b, w, kw: (a, b[:, :N - 4].contiguous(),
                                                                                        None, kw)),
                     "ValueError", "multiple of 8"),
        ContractCase("a_strided", "matmul_layernorm", ln(lambda a, b, w, c, kw: (torch.cat([a, a], 1)[:, ::2], b, w,
                                                                                  c, kw)),
                     "ValueError", "contiguous"),
        ContractCase("a_no_rows", "matmul_layernorm", ln(lambda a, b, w, c, kw: (a[:0], b, w, c, kw)), "ValueError",
                     "M must be a positive integer"),
        ContractCase("a_3d", "matmul_layernorm", ln(lambda a, b, w, c, kw: (a[None], b, w, c, kw)), "ValueError",
                     "2-D"),
        # a and b feed TMA descriptors in every DSL: a 2-byte offset is rejected before anything is launched
        ContractCase("misaligned_a", "matmul_layernorm", ln(lambda a, b, w, c, kw: (misaligned(a), b, w, c, kw)),
                     "ValueError", "a must start at a 16-byte aligned address"),
        ContractCase("misaligned_b", "matmul_rmsnorm", rms(lambda a, b, w, kw: (a, misaligned(b), w, kw)),
                     "ValueError", "b must start at a 16-byte aligned address"),
        # the affine vectors are plain loads everywhere: any data pointer works
        ContractCase("misaligned_affine", "matmul_layernorm",
                     ln(lambda a, b, w, c, kw: (a, b, misaligned(w), misaligned(c), kw))),
        ContractCase("a_requires_grad", "matmul_layernorm", ln(lambda a, b, w, c, kw: (_grad(a), b, w, c, kw)),
                     "NotImplementedError", "forward-only"),
        ContractCase("weight_requires_grad", "matmul_rmsnorm", rms(lambda a, b, w, kw: (a, b, _grad(w), kw)),
                     "NotImplementedError", "forward-only"),
        ContractCase("config_unknown_key", "matmul_layernorm", ln(config={"BLOCK_Q": 64}), "ConfigError", "unknown"),
    ]
    for name, eps in _BAD_EPS.items():
        cases.append(ContractCase(name, "matmul_layernorm", ln(eps=eps), "ValueError", "eps must be a finite number"))
    cases.append(ContractCase("rms_eps_none", "matmul_rmsnorm", rms(lambda a, b, w, kw: (a, b, w, {"eps": None})),
                              "ValueError", "eps must be a finite number"))
    return cases


def _lazy_cases() -> list[ContractCase]:
    """``matmul(a, b)``, ``lazy_rmsnorm_matmul(a, b_folded, eps=)``, ``lazy_layernorm_matmul(a, b_folded, colsum,
    beta_b, eps=)``."""
    M, N, K = CONTRACT_GEMM

    def inputs(dtype, device):
        a = _rand((M, K), dtype, device, 1)
        b = _rand((K, N), dtype, device, 2, K ** -0.5)
        return a, b, b.float().sum(0), _rand((N,), torch.float32, device, 3, 0.1)

    def call(fn, mutate=lambda a, b, cs, bb, kw: (a, b, cs, bb, kw), **kw):
        def build(dtype, device):
            a, b, cs, bb = inputs(dtype, device)
            a, b, cs, bb, kw2 = mutate(a, b, cs, bb, dict(kw))
            if fn == "matmul":
                return (a, b), kw2
            if fn == "lazy_rmsnorm_matmul":
                return (a, b), {"eps": 1e-6, **kw2}
            return (a, b, cs, bb), {"eps": 1e-5, **kw2}
        return build

    cases = [
        ContractCase("valid_gemm", "matmul", call("matmul")),
        ContractCase("valid_rms", "lazy_rmsnorm_matmul", call("lazy_rmsnorm_matmul")),
        ContractCase("valid_ln", "lazy_layernorm_matmul", call("lazy_layernorm_matmul")),
        ContractCase("misaligned_a", "lazy_rmsnorm_matmul",
                     call("lazy_rmsnorm_matmul", lambda a, b, cs, bb, kw: (misaligned(a), b, cs, bb, kw)), "ValueError",
                     "a must start at a 16-byte aligned address"),
        ContractCase("misaligned_b_gemm", "matmul",
                     call("matmul", lambda a, b, cs, bb, kw: (a, misaligned(b), cs, bb, kw)), "ValueError",
                     "b must start at a 16-byte aligned address"),
        ContractCase("misaligned_vectors", "lazy_layernorm_matmul",
                     call("lazy_layernorm_matmul", lambda a, b, cs, bb, kw: (a, b, misaligned(cs), misaligned(bb), kw))),
        ContractCase("colsum_half", "lazy_layernorm_matmul",
                     call("lazy_layernorm_matmul", lambda a, b, cs, bb, kw: (a, b, cs.to(a.dtype), bb, kw)),
                     "TypeError", "colsum must be float32"),
        ContractCase("mixed_dtypes", "lazy_rmsnorm_matmul",
                     call("lazy_rmsnorm_matmul", lambda a, b, cs, bb, kw: (a, b.to(torch.float32 if b.dtype != torch.float32
                                                                                    else torch.float16), cs, bb, kw)),
                     "TypeError", "share one dtype"),
        ContractCase("a_requires_grad", "lazy_rmsnorm_matmul",
                     call("lazy_rmsnorm_matmul", lambda a, b, cs, bb, kw: (_grad(a), b, cs, bb, kw)),
                     "NotImplementedError", "forward-only"),
        ContractCase("b_requires_grad_gemm", "matmul",
                     call("matmul", lambda a, b, cs, bb, kw: (a, _grad(b), cs, bb, kw)), "NotImplementedError",
                     "forward-only"),
        ContractCase("colsum_requires_grad", "lazy_layernorm_matmul",
                     call("lazy_layernorm_matmul", lambda a, b, cs, bb, kw: (a, b, _grad(cs), bb, kw)),
                     "NotImplementedError", "forward-only"),
        ContractCase("config_unknown_key", "lazy_rmsnorm_matmul", call("lazy_rmsnorm_matmul", config={"BLOCK_Q": 64}),
                     "ConfigError", "unknown"),
        ContractCase("gemm_config_unknown_key", "matmul", call("matmul", config={"BLOCK_Q": 64}), "ConfigError",
                     "unknown"),
    ]
    for name, eps in _BAD_EPS.items():
        cases.append(ContractCase(name, "lazy_rmsnorm_matmul", call("lazy_rmsnorm_matmul", eps=eps), "ValueError",
                                  "eps must be a finite number"))
    cases.append(ContractCase("ln_eps_none", "lazy_layernorm_matmul", call("lazy_layernorm_matmul", eps=None),
                              "ValueError", "eps must be a finite number"))
    return cases


CONTRACT_TECHNIQUES = ("norms", "naive_fusion", "multi_cta", "lazy_prenorm")


def contract_cases(technique: str) -> list[ContractCase]:
    """The contract of ``technique``'s public wrappers as a list of calls with their expected outcome."""
    if technique == "norms":
        return _norm_cases()
    if technique in ("naive_fusion", "multi_cta"):
        return _post_norm_cases()
    if technique == "lazy_prenorm":
        return _lazy_cases()
    raise ValueError(f"no contract cases for {technique!r}; choices: {', '.join(CONTRACT_TECHNIQUES)}")


def _outputs(out) -> tuple:
    return (out,) if isinstance(out, torch.Tensor) else tuple(t for t in out if t is not None)


def run_contract(module, technique: str, *, dtype: torch.dtype, device: str = "cpu",
                 launch_error: str | None = None, only=None) -> dict[str, str]:
    """Run every contract case of ``technique`` (or those whose id passes ``only``) against ``module`` (a
    ``kernels_<dsl>.<technique>`` module) with ``dtype`` inputs on ``device``; return ``{case id: failure}`` with
    ``""`` for a case the module keeps. A case fails when the outcome's exception class differs from the expected
    one, when the message misses ``match``, or, for an accepted call on misaligned inputs, when its outputs differ
    from the same call on aligned copies (a misaligned view must be handled, not computed wrong). With
    ``launch_error`` (a regex), a ValueError matching it counts as accepted: the call was validated and then
    refused only for the device (TLX on a machine without a GPU). On CUDA every case ends with a synchronize: an
    input must never cost the process its CUDA context."""
    import re

    results = {}
    for case in contract_cases(technique):
        if only is not None and not only(case.id):
            continue
        fn = getattr(module, case.fn)
        args, kwargs = case.build(dtype, device)
        try:
            out = fn(*args, **kwargs)
            got, msg = None, ""
        except Exception as e:  # noqa: BLE001  (the outcome is what the test compares)
            out, got, msg = None, type(e).__name__, str(e)
            if launch_error is not None and got == "ValueError" and re.search(launch_error, msg):
                got, msg = None, ""
        failure = ""
        if got != case.error or (case.error and not re.search(case.match, msg)):
            failure = (f"{module.__name__}.{case.fn} [{case.id}]: expected {case.error or 'accepted'}"
                       f"{' matching ' + repr(case.match) if case.error else ''}, got {got or 'accepted'}"
                       f"{': ' + msg[:300] if msg else ''}")
        elif out is not None and case.id.startswith("misaligned"):
            again = _outputs(fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], **kwargs))
            for i, (x, y) in enumerate(zip(_outputs(out), again)):
                if not torch.allclose(x.float(), y.float(), rtol=1e-3, atol=1e-3, equal_nan=True):
                    failure = (f"{module.__name__}.{case.fn} [{case.id}]: output {i} on the misaligned view differs "
                               f"from the aligned call (max diff {(x.float() - y.float()).abs().max().item():.3g})")
        if device == "cuda":
            torch.cuda.synchronize()
        results[case.id] = failure
    return results
