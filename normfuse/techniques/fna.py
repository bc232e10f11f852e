r"""FlashNormAttention, variant ``gdpa``: the blog's Kunlun PFFN block, i.e. a LayerNorm prologue, GDPA
(gated dot-product attention: an elementwise GELU instead of softmax), a residual, an RMSNorm and a second
residual, fused into one attention kernel. This module holds the math, inputs, reference, cost model, tolerance
and the torch.compile baseline.

Math (techniques.md section 7; fp32 statistics, output in the input dtype), per token t of sequence b::

    ln_q[t]   = LayerNorm(q[t])                over all H*D features of the token (eps, no affine, biased var)
    s[t, h]   = ln_q[t, h] @ k[b, :, h]^T      [Lkv]; qk_scale 1.0
    g[t, h]   = gelu_tanh(s[t, h]) @ v[b, :, h]   [D]; NO softmax
    r[t]      = g[t] + ln_q[t]                 residual 1
    y[t]      = RMSNorm(r[t])                  over all H*D features (eps, no affine)
    out[t]    = y[t] + q[t]                    residual 2

Both norms span all heads of a token, so the heads of a Q tile must cooperate (the blog: a cluster of H CTAs
exchanging per-token partial sums through DSMEM; see ``kernels_<dsl>/fna.py`` for what each DSL does).

Layout: ``q [total_q, H, D]`` jagged (packed), ``q_offsets [B+1]`` int32/int64 (non-decreasing, q_offsets[0] = 0,
q_offsets[B] = total_q; zero-length sequences allowed), ``k, v [B, Lkv, H, D]`` dense with Lkv = 128.

Input contract (``check_inputs``; every DSL's ``gdpa`` validates it before compiling and serves all of it with its
default config, so a call is accepted or rejected the same way in Triton, Helion and TLX): H in [2, 8]; D a power
of two in ``HEAD_DIMS`` = 32..128 (the TLX kernel's P @ V wgmma needs N = D >= 32); Lkv a power of two in
``KV_LENS`` = 16..128 (the short-KV kernels keep all of K_h/V_h resident; TLX pads Lkv = 16 to its smallest wgmma
tile with zero rows, which changes no bit of the result); bf16/fp16 on CUDA. CPU tensors (the Triton interpreter
and Helion ref mode, the CPU test vehicles) also take fp32 and D = 16. Any number of sequences (the Triton and TLX
wrappers launch once per 65535 sequences: the grid's y limit) and of elements (64-bit token offsets), any
16-byte-misaligned view (TLX copies K/V, which it loads by TMA, to aligned memory; the other loads are pointer
loads), and a batch of one token (Helion pads q to two rows: its code generation breaks on a size-1 dimension).

Sweep point mapping (the runner's points are (M, N, K) ints): ``M = max_len`` (the exclusive bound of the Q
lengths, which are uniform in [1, max_len) as in the blog's tutorial generator), ``N = H`` (heads), ``K = D``
(head dim). The batch B is the technique option ``batch`` (default 768, the blog's) and Lkv the option ``kv_len``
(default 128, the short-KV kernels' requirement).

Baseline ``torch_compile_gdpa`` (the blog's "Inductor-compiled baseline"): the module written in PyTorch and
compiled with ``torch.compile(dynamic=False)`` for one shape. Choice of padding: the norms and both residuals run
on the packed ``[total_q, H*D]`` tensor (no work on padding); only GDPA, which plain PyTorch cannot express on a
jagged batch without materializing per-token K/V, scatters ln_q into a zero-padded ``[B, max_len, H, D]`` batch,
does two batched matmuls there and gathers the valid rows back (padding rows cost matmul work, ~2x at uniform
lengths; a torch user would do the same or worse).

Tolerance: flash-attention's rule, ``2 x max|torch_same_dtype - ref| + 1e-3 max|ref|`` (``lazy_prenorm.tolerance``),
where torch_same_dtype is the eager PyTorch module in the input dtype.

Metric: ``saving = (T_baseline - T_fused) / T_baseline`` (``normfuse.metrics.add_saving``), the blog's "latency
saving as a percentage of the total baseline latency".

Sources: "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels", PyTorch blog,
2026-07-10, https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
(section FlashNormAttention, charts 13/14).

Variants: this module implements ``gdpa``. The LLM variant ``qknorm_softmax`` (per-head QK-RMSNorm + online
softmax) lives in its own spec module ``normfuse.techniques.fna_llm`` (technique ``fna_llm``), since its shapes,
inputs and baselines differ; ``VARIANTS`` here lists only what this module serves.
"""

from __future__ import annotations

import math

import torch

from normfuse.techniques.lazy_prenorm import DTYPES, compare, tolerance, torch_dtype  # noqa: F401
from normfuse.validate import check_eps

NAME = "fna"
VARIANTS = ("gdpa",)  # extension point: other variants get their own spec module (fna_llm: qknorm_softmax)
IMPLS = ("fused",)
BASELINES = ("torch_compile_gdpa", "torch_eager_gdpa")
KERNEL_FUNCTIONS = {"gdpa": "gdpa"}
PRIMARY_METRIC = "saving"
METRIC_LABEL = "% latency saving vs the torch.compile module"  # report / figure wording
GRID_AXES = ("M", "N")  # figures over (max Q length, H): K = D is fixed in the blog grid
DIM_LABELS = {"M": "max_len", "N": "H", "K": "D"}
SAVING_BASELINE = "torch_compile_gdpa"  # normfuse.metrics.add_saving: saving relative to this baseline
BATCH = 768   # the blog's batch (default of the `batch` option)
KV_LEN = 128  # the blog's K/V length (default of the `kv_len` option)
MAX_HEADS = 8
HEAD_DIMS = (32, 64, 128)        # D on CUDA (all three DSLs)
CPU_HEAD_DIMS = (16,) + HEAD_DIMS  # D on CPU (interpreter / ref mode tests)
KV_LENS = (16, 32, 64, 128)      # Lkv
REF_CHUNK = 64  # sequences per padded chunk in the reference / same-dtype module (bounded memory at B = 768)

# The blog's B200 forward latency savings (%) vs the Inductor-compiled baseline, chart 13: (max_len, H) -> %
BLOG_SAVING_B200 = {
    (1000, 2): 20.13, (1000, 3): 26.27, (1000, 4): 15.68,
    (3000, 2): 35.39, (3000, 3): 28.25, (3000, 4): 19.62,
    (5000, 2): 34.97, (5000, 3): 27.98, (5000, 4): 21.86,
    (10000, 2): 32.96, (10000, 3): 30.34, (10000, 4): 22.99,
}
BLOG_VARIANT = "gdpa"


def _check_variant(variant) -> str:
    if variant is None:
        return "gdpa"
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} for fna; choices: {', '.join(VARIANTS)} "
                         "(qknorm_softmax: technique fna_llm)")
    return variant


def check_shape(M: int, N: int, K: int) -> None:
    """Sweep point (M = max_len, N = H, K = D): ValueError unless max_len >= 1, 2 <= H <= MAX_HEADS (the norms span
    heads; the blog's kernel requires H > 1) and D in ``CPU_HEAD_DIMS`` (16..128, powers of two; CUDA inputs need
    D >= 32, see ``check_inputs``)."""
    for name, v in (("M (max_len)", M), ("N (H)", N), ("K (D)", K)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not 2 <= N <= MAX_HEADS:
        raise ValueError(f"H = N = {N} must be in [2, {MAX_HEADS}] (norms over H*D need several heads)")
    if K not in CPU_HEAD_DIMS:
        raise ValueError(f"D = K = {K} must be a power of two in [16, 128] (tensor-core tiles; >= 32 on CUDA)")


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor, max_len: int,
                 eps: float | None = None) -> tuple[int, int, int, int, int]:
    """Validate the module's inputs (the contract in the module docstring); return (total_q, B, H, D, Lkv).

    ``q [total_q, H, D]``, ``k, v [B, Lkv, H, D]`` (one dtype, contiguous, one device), ``q_offsets [B+1]``
    int32/int64 on q's device, ``max_len`` an int >= 1 (every length must be <= max_len: a kernel grids over it).
    Raises TypeError for non-tensors and wrong dtypes (bf16/fp16; fp32 only on the CPU), ValueError for wrong
    ranks or shapes, H outside [2, 8], D not in ``HEAD_DIMS`` (CPU: ``CPU_HEAD_DIMS``), Lkv not in ``KV_LENS``,
    non-contiguous tensors, mixed devices or ``eps`` (when given) not a finite number > 0. The offsets' values
    (monotone, q_offsets[-1] == total_q, lengths <= max_len) are checked only on the CPU (a GPU check would
    synchronize); ``check_offsets`` checks them anywhere.
    """
    for name, t in (("q", q), ("k", k), ("v", v), ("q_offsets", q_offsets)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor")
    on_cpu = q.device.type == "cpu"
    dtypes = tuple(DTYPES.values()) if on_cpu else (torch.bfloat16, torch.float16)
    if q.dtype not in dtypes or k.dtype != q.dtype or v.dtype != q.dtype:
        allowed = "bf16/fp16/fp32" if on_cpu else "bf16/fp16 (fp32: CPU only)"
        raise TypeError(f"q, k, v must share one dtype of {allowed}, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q_offsets.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"q_offsets must be int32 or int64, got {q_offsets.dtype}")
    if q.dim() != 3 or k.dim() != 4 or v.dim() != 4 or q_offsets.dim() != 1:
        raise ValueError(f"need q [total_q, H, D], k/v [B, Lkv, H, D], q_offsets [B+1]; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}, q_offsets {tuple(q_offsets.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    total_q, H, D = q.shape
    B, Lkv = k.shape[0], k.shape[1]
    if k.shape[2:] != (H, D):
        raise ValueError(f"k/v heads and head dim {tuple(k.shape[2:])} differ from q's {(H, D)}")
    if q_offsets.shape[0] != B + 1:
        raise ValueError(f"q_offsets must have B+1 = {B + 1} entries, got {q_offsets.shape[0]}")
    if not 2 <= H <= MAX_HEADS:
        raise ValueError(f"H = {H} must be in [2, {MAX_HEADS}] (norms over H*D need several heads)")
    head_dims = CPU_HEAD_DIMS if on_cpu else HEAD_DIMS
    if D not in head_dims:
        raise ValueError(f"D = {D} must be a power of two in [{head_dims[0]}, {head_dims[-1]}]"
                         + ("" if on_cpu else " on CUDA (the TLX P @ V wgmma needs N = D >= 32)"))
    if Lkv not in KV_LENS:
        raise ValueError(f"Lkv = {Lkv} must be a power of two in [{KV_LENS[0]}, {KV_LENS[-1]}] (short-KV kernels: "
                         "K_h and V_h stay resident)")
    if len({t.device for t in (q, k, v, q_offsets)}) != 1:
        raise ValueError("q, k, v, q_offsets must be on one device")
    if not all(t.is_contiguous() for t in (q, k, v, q_offsets)):
        raise ValueError("q, k, v, q_offsets must be contiguous")
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
        raise ValueError(f"max_len must be an int >= 1, got {max_len!r}")
    if eps is not None:
        check_eps(eps)
    if on_cpu:
        check_offsets(q_offsets, total_q, max_len)
    return total_q, B, H, D, Lkv


def check_offsets(q_offsets: torch.Tensor, total_q: int, max_len: int) -> None:
    """ValueError unless q_offsets[0] == 0, q_offsets[-1] == total_q and 0 <= length <= max_len everywhere."""
    o = q_offsets.detach().cpu().long()
    lengths = o[1:] - o[:-1]
    if o[0].item() != 0 or o[-1].item() != total_q:
        raise ValueError(f"q_offsets must start at 0 and end at total_q = {total_q}, got {o[0].item()}..{o[-1].item()}")
    if lengths.numel() and (lengths.min().item() < 0 or lengths.max().item() > max_len):
        raise ValueError(f"sequence lengths must be in [0, max_len = {max_len}], got "
                         f"{lengths.min().item()}..{lengths.max().item()}")


def make_lengths(B: int, max_len: int, *, seed: int = 0, edge_cases: bool = False) -> torch.Tensor:
    """Q lengths uniform in [1, max_len) (the blog's generator; all 1 when max_len <= 2). ``edge_cases``: sequence 0
    gets length 1, sequence 1 length 0 and the last one max_len - 1 (when B allows). int64 [B], on the CPU."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max(max_len, 2), (B,), generator=g)
    if edge_cases:
        lengths[0] = 1
        if B > 2:
            lengths[1] = 0
            lengths[-1] = max(max_len - 1, 1)
    return lengths


def make_inputs(M: int, N: int, K: int, *, dtype: str = "bf16", device: str = "cpu", seed: int = 0,
                batch: int = BATCH, kv_len: int = KV_LEN, edge_cases: bool = False, mean_shift: float = 0.0) -> dict:
    """Seeded inputs for the point (M = max_len, N = H, K = D): ``q [total_q, H, D]`` with per-token scales
    0.25..4 (a missing normalization is visible) plus ``mean_shift`` (stresses the LayerNorm variance), ``k``
    N(0, 1/D) and ``v`` N(0, 1/Lkv) ``[batch, kv_len, H, D]`` (so s and g are O(1) and GELU is exercised on both
    sides), ``q_offsets`` int32 ``[batch+1]``, ``max_len`` = M, ``seq_ids`` / ``positions`` int64 ``[total_q]``
    (sequence and position of every token, for the baseline's padded GDPA). Never zeros."""
    check_shape(M, N, K)
    max_len, H, D = M, N, K
    if batch < 1 or kv_len < 1:
        raise ValueError(f"batch and kv_len must be >= 1, got {batch}, {kv_len}")
    dt = torch_dtype(dtype)
    lengths = make_lengths(batch, max_len, seed=seed, edge_cases=edge_cases)
    total = int(lengths.sum())
    offsets = torch.zeros(batch + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    seq_ids = torch.repeat_interleave(torch.arange(batch), lengths)
    positions = torch.arange(total) - offsets[seq_ids]
    g = torch.Generator(device=device).manual_seed(seed)
    tok_scale = torch.exp2(torch.rand(total, 1, 1, generator=g, device=device) * 4 - 2)
    q = torch.randn(total, H, D, generator=g, device=device) * tok_scale + mean_shift
    k = torch.randn(batch, kv_len, H, D, generator=g, device=device) / math.sqrt(D)
    v = torch.randn(batch, kv_len, H, D, generator=g, device=device) / math.sqrt(kv_len) * 4
    return {"q": q.to(dt), "k": k.to(dt), "v": v.to(dt), "q_offsets": offsets.to(torch.int32).to(device),
            "max_len": max_len, "seq_ids": seq_ids.to(device), "positions": positions.to(device)}


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """The blog's fast_gelu: 0.5 x (1 + tanh(0.7978845608 (x + 0.044715 x^3))) = GELU(approximate='tanh')."""
    return torch.nn.functional.gelu(x, approximate="tanh")


def _gdpa_padded(ln_q: torch.Tensor, k, v, seq_ids, positions, max_len: int, chunk: int | None = None) -> torch.Tensor:
    """GDPA of packed ``ln_q [T, H, D]`` through a zero-padded ``[B, H, max_len, D]`` batch: returns ``[T, H, D]``
    in ln_q's dtype (matmuls in that dtype, fp32 accumulation by the backend). ``chunk``: process that many
    sequences at a time (same numbers, bounded memory; used by the reference at the benchmark shapes)."""
    T, H, D = ln_q.shape
    B = k.shape[0]
    if chunk is not None and B > chunk:
        out = torch.empty_like(ln_q)
        for b0 in range(0, B, chunk):
            sel = (seq_ids >= b0) & (seq_ids < b0 + chunk)
            out[sel] = _gdpa_padded(ln_q[sel], k[b0:b0 + chunk], v[b0:b0 + chunk], seq_ids[sel] - b0,
                                    positions[sel], max_len)
        return out
    padded = ln_q.new_zeros(B, max_len, H, D)
    padded[seq_ids, positions] = ln_q
    s = torch.matmul(padded.transpose(1, 2), k.permute(0, 2, 3, 1))       # [B, H, max_len, Lkv]
    g = torch.matmul(gelu_tanh(s), v.transpose(1, 2))                      # [B, H, max_len, D]
    return g.transpose(1, 2)[seq_ids, positions]                           # [T, H, D]


def module(q, k, v, seq_ids, positions, max_len: int, eps: float, chunk: int | None = None) -> torch.Tensor:
    """The module in PyTorch in q's dtype (the baseline; fp32 inputs give the reference): norms on the packed
    ``[T, H*D]`` tensor, GDPA through a padded batch (``_gdpa_padded``)."""
    T, H, D = q.shape
    x = q.reshape(T, H * D)
    ln_q = torch.nn.functional.layer_norm(x, (H * D,), None, None, eps)
    g = _gdpa_padded(ln_q.view(T, H, D), k, v, seq_ids, positions, max_len, chunk).reshape(T, H * D)
    y = torch.nn.functional.rms_norm(g + ln_q, (H * D,), None, eps)
    return (y + x).view(T, H, D)


def reference(variant: str | None, inputs: dict, eps: float) -> torch.Tensor:
    """fp32 reference ``out [total_q, H, D]``: the module on fp32 upcasts with true fp32 matmuls (TF32 off)."""
    _check_variant(variant)
    f = {n: inputs[n].float() for n in ("q", "k", "v")}
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return module(f["q"], f["k"], f["v"], inputs["seq_ids"], inputs["positions"], inputs["max_len"], eps,
                      chunk=REF_CHUNK)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def same_dtype(variant: str | None, inputs: dict, eps: float) -> torch.Tensor:
    """The eager PyTorch module in the input dtype; its error against ``reference`` sets the tolerance."""
    _check_variant(variant)
    return module(inputs["q"], inputs["k"], inputs["v"], inputs["seq_ids"], inputs["positions"], inputs["max_len"],
                  eps, chunk=REF_CHUNK)


def _dims(M: int, N: int, K: int, batch: int = BATCH, kv_len: int = KV_LEN) -> tuple[float, int, int, int]:
    return batch * M / 2.0, N, K, kv_len  # expected total_q: lengths uniform in [1, max_len) -> mean ~ max_len / 2


# --- cost model (expected total_q = B * max_len / 2 with B = BATCH, Lkv = KV_LEN; see the module docstring) ----
def flops(impl: str, M: int, N: int, K: int) -> float:
    """Useful FLOPs at the expected token count T = BATCH*M/2: the two GEMMs ``4 T H Lkv D`` plus ~10 T H D for the
    norms and residuals (padding work of the baseline not counted)."""
    if impl not in IMPLS + BASELINES:
        raise ValueError(f"unknown impl {impl!r}")
    T, H, D, L = _dims(M, N, K)
    return 4.0 * T * H * L * D + 10.0 * T * H * D


def bytes_moved(impl: str, M: int, N: int, K: int, itemsize: int = 2) -> float:
    """Fewest bytes: read q, write out (``2 T H D``), read K and V once (``2 B Lkv H D``), in ``itemsize``."""
    if impl not in IMPLS + BASELINES:
        raise ValueError(f"unknown impl {impl!r}")
    T, H, D, L = _dims(M, N, K)
    return (2.0 * T * H * D + 2.0 * BATCH * L * H * D) * itemsize


# --- how the worker calls each implementation ----------------------------------------------------------------
def kernel_function_name(impl: str, variant: str | None = None) -> str:
    """``gdpa`` in every ``kernels_<dsl>/fna.py`` (impl 'fused')."""
    if impl != "fused":
        raise ValueError(f"unknown impl {impl!r} for fna; choices: {', '.join(IMPLS)}")
    return KERNEL_FUNCTIONS[_check_variant(variant)]


def compile_inputs(M: int, N: int, K: int, dtype: str, batch: int = 4, kv_len: int = KV_LEN) -> tuple:
    """CPU tensors with the kernel's argument shapes for the sm_90 compile-only check: ``q [batch*M//2+1, N, K]``,
    ``k``, ``v [batch, kv_len, N, K]``, ``q_offsets`` int32 ``[batch+1]`` (valid), ``max_len`` = M."""
    dt = torch_dtype(dtype)
    lengths = make_lengths(batch, M)
    offsets = torch.zeros(batch + 1, dtype=torch.int32)
    offsets[1:] = torch.cumsum(lengths, 0)
    T = int(offsets[-1])
    return (torch.empty(T, N, K, dtype=dt), torch.empty(batch, kv_len, N, K, dtype=dt),
            torch.empty(batch, kv_len, N, K, dtype=dt), offsets, M)


def kernel_call(kernel, impl: str, inputs: dict, eps: float, config: dict, variant: str | None = None):
    """Zero-argument callable: ``gdpa(q, k, v, q_offsets, max_len, eps=, config=)``."""
    kernel_function_name(impl, variant)
    q, k, v, o, L = inputs["q"], inputs["k"], inputs["v"], inputs["q_offsets"], inputs["max_len"]
    return lambda: kernel(q, k, v, o, L, eps=eps, config=config)


def baseline(impl: str, inputs: dict, eps: float, variant: str | None = None):
    """Zero-argument callables: 'torch_compile_gdpa' (``module`` compiled by Inductor for this one shape: a dynamo
    reset, then ``dynamic=False``; seq_ids/positions are precomputed inputs) and 'torch_eager_gdpa'."""
    _check_variant(variant)
    if impl not in BASELINES:
        raise ValueError(f"unknown baseline {impl!r}; choices: {', '.join(BASELINES)}")
    args = (inputs["q"], inputs["k"], inputs["v"], inputs["seq_ids"], inputs["positions"])
    L = inputs["max_len"]
    fn = module
    if impl == "torch_compile_gdpa":
        torch._dynamo.reset()
        fn = torch.compile(module, dynamic=False)
    return lambda: fn(*args, L, eps)


def check(impl: str, out, inputs: dict, eps: float, variant: str | None = None) -> dict:
    """Errors of ``out [total_q, H, D]`` against the fp32 ``reference`` with the flash-attention tolerance (2x the
    same-dtype eager PyTorch error + 1e-3 max|ref|); a wrong shape or dtype fails."""
    ref = reference(variant, inputs, eps)
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape or out.dtype != inputs["q"].dtype:
        return {"max_abs_err": float("inf"), "rel_err": float("inf"), "tol": 0.0, "ok": False}
    return compare(out, ref, tolerance(ref, same_dtype(variant, inputs, eps)))
