r"""The consumer of the MXFP8 norm-cast kernels: ``C = A @ B^T`` with both operands in MXFP8 (E4M3 data, E8M0 scales
per 32 elements along K), in upstream Triton with ``tl.dot_scaled``, for the norm -> cast -> GEMM chain
(``experiments/mxnorm_gemm.py``).

**Hopper caveat.** The H200 (sm_90) has no block-scaled MMA. Triton lowers ``tl.dot_scaled`` there to a software
emulation: both operands are upcast to bf16 with their scales applied, then a bf16 wgmma runs (Triton's docstring:
"microscaled lhs/rhs are upcasted to bf16"; dsl-primer C.3 saw bf16 wgmma in the sm_90 PTX). Expect the bf16 tensor
core rate minus the upcast, not fp8's. On Blackwell the same code would use the native MX MMA.

Shapes: ``a [M, K]`` and ``b [N, K]`` float8_e4m3fn (or their uint8 codes), ``a_scales [M, K/32]``,
``b_scales [N, K/32]`` uint8 E8M0 (the layout the norm-cast kernels write; B is the weight ``[out, in]``, K-major, as
``torch.nn.Linear`` stores it); ``c [M, N]`` bf16, fp32 accumulation. K a multiple of ``BLOCK_K`` (and of 32).

Reference: ``normfuse.mxfp8.dequantize(a) @ dequantize(b).T`` in fp32. Status: compile-checked for sm_90 on CPU
(the 3.6 interpreter cannot run ``dot_scaled``); correctness and speed are for the GPU
(``python -m experiments.mxnorm_gemm`` checks every config before timing it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from normfuse.tiling import TilingConfigBase

__all__ = ["TilingConfig", "CONFIGS", "mxfp8_matmul", "reference", "compile_sm90_kernel"]


def _is_pow2(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and (v & (v - 1)) == 0


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """BLOCK_M/N (powers of 2 in [16, 256]), BLOCK_K (power of 2 in [32, 256]), GROUP_M (L2 swizzle, >= 1),
    num_warps (4 or 8), num_stages (1..6). ValueError names the violated constraint."""

    BLOCK_M: int = 128
    BLOCK_N: int = 128
    BLOCK_K: int = 128
    GROUP_M: int = 8
    num_warps: int = 8
    num_stages: int = 3

    def __post_init__(self):
        for name, lo, hi in (("BLOCK_M", 16, 256), ("BLOCK_N", 16, 256), ("BLOCK_K", 32, 256)):
            v = getattr(self, name)
            if not (_is_pow2(v) and lo <= v <= hi):
                raise ValueError(f"TilingConfig.{name}={v!r} must be a power of 2 in [{lo}, {hi}]")
        if not (isinstance(self.GROUP_M, int) and self.GROUP_M >= 1):
            raise ValueError(f"TilingConfig.GROUP_M={self.GROUP_M!r} must be an integer >= 1")
        if self.num_warps not in (4, 8):
            raise ValueError(f"TilingConfig.num_warps={self.num_warps!r} must be 4 or 8")
        if not (isinstance(self.num_stages, int) and 1 <= self.num_stages <= 6):
            raise ValueError(f"TilingConfig.num_stages={self.num_stages!r} must be in [1, 6]")


CONFIGS = {  # candidates for M = 8192-16384, N in {6144, 28672}, K = 4096 on the H200 (untimed)
    "128x128x128-s3": TilingConfig(),
    "128x256x64-s3": TilingConfig(BLOCK_N=256, BLOCK_K=64),
    "128x128x64-s4-w4": TilingConfig(BLOCK_K=64, num_stages=4, num_warps=4),
}


@triton.jit
def _mx_matmul_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % size_m
    pid_n = (pid % (GROUP_M * num_n)) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = (rm < M)[:, None]
    n_ok = (rn < N)[:, None]
    KS = K // 32
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        rs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        a = tl.load(a_ptr + rm.to(tl.int64)[:, None] * K + rk[None, :], mask=m_ok, other=0.0)
        sa = tl.load(as_ptr + rm.to(tl.int64)[:, None] * KS + rs[None, :], mask=m_ok, other=127)
        b = tl.load(b_ptr + rn.to(tl.int64)[:, None] * K + rk[None, :], mask=n_ok, other=0.0)
        sb = tl.load(bs_ptr + rn.to(tl.int64)[:, None] * KS + rs[None, :], mask=n_ok, other=127)
        acc = tl.dot_scaled(a, sa, "e4m3", b.T, sb, "e4m3", acc)
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], c, mask=m_ok & (rn < N)[None, :])


def _check(a, a_scales, b, b_scales, cfg: TilingConfig):
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.float8_e4m3fn, torch.uint8) or t.dim() != 2:
            raise TypeError(f"{name} must be a 2-D float8_e4m3fn (or uint8 code) tensor")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    M, K = a.shape
    N, Kb = b.shape
    if Kb != K:
        raise ValueError(f"a is [M, K] = {tuple(a.shape)} and b must be [N, K], got {tuple(b.shape)}")
    if K % cfg.BLOCK_K:
        raise ValueError(f"K = {K} must be a multiple of BLOCK_K = {cfg.BLOCK_K}")
    for name, s, rows in (("a_scales", a_scales, M), ("b_scales", b_scales, N)):
        if not isinstance(s, torch.Tensor) or s.dtype != torch.uint8 or tuple(s.shape) != (rows, K // 32) \
                or not s.is_contiguous():
            raise ValueError(f"{name} must be a contiguous uint8 [{rows}, {K // 32}] tensor")
    return M, N, K


def mxfp8_matmul(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor, *,
                 config=None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``C [M, N] = dequant(a) @ dequant(b)^T`` with ``tl.dot_scaled`` (bf16 emulation on Hopper, see module docstring).
    ``a [M, K]``, ``b [N, K]`` E4M3, ``*_scales`` uint8 E8M0 ``[rows, K/32]``; ``config``: ``TilingConfig``, a dict
    or None. Raises TypeError/ValueError for bad inputs (dtypes, shapes, K % BLOCK_K) or config values."""
    cfg = TilingConfig.from_dict(config)
    M, N, K = _check(a, a_scales, b, b_scales, cfg)
    c = torch.empty(M, N, dtype=out_dtype, device=a.device)
    grid = (triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N), )
    _mx_matmul_kernel[grid](a.view(torch.float8_e4m3fn), a_scales, b.view(torch.float8_e4m3fn), b_scales, c, M, N, K,
                            BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
                            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return c


def reference(a, a_scales, b, b_scales) -> torch.Tensor:
    """fp32 ``dequant(a) @ dequant(b)^T`` (TF32 off)."""
    from normfuse.mxfp8 import dequantize

    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return dequantize(a, a_scales) @ dequantize(b, b_scales).T
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def compile_sm90_kernel(M: int, N: int, K: int, config=None):
    """Compile for sm_90 without launching (needs ``normfuse.compile_only.install(90)``); returns the CompiledKernel."""
    cfg = TilingConfig.from_dict(config)
    a = torch.empty(M, K, dtype=torch.float8_e4m3fn)
    b = torch.empty(N, K, dtype=torch.float8_e4m3fn)
    sa = torch.empty(M, K // 32, dtype=torch.uint8)
    sb = torch.empty(N, K // 32, dtype=torch.uint8)
    _check(a, sa, b, sb, cfg)
    c = torch.empty(M, N, dtype=torch.bfloat16)
    grid = (triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N), )
    return _mx_matmul_kernel.warmup(a, sa, b, sb, c, M, N, K, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                                    BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M, num_warps=cfg.num_warps,
                                    num_stages=cfg.num_stages, grid=grid)
