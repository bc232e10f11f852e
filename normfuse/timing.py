"""Kernel timing: ``triton.testing.do_bench`` (CUDA events, 256 MB L2 flush before every call) or CUDA-graph
replay, summarized as p20/p50/p80 in milliseconds. Compilation and warm-up happen before, outside the samples."""

from __future__ import annotations

import statistics


def bench(fn, *, warmup_ms: float = 25.0, rep_ms: float = 100.0, method: str = "do_bench") -> dict:
    """Time ``fn()`` on the current CUDA device; return {p20_ms, p50_ms, p80_ms, mean_ms, n_samples, timing}.

    ``method='do_bench'`` flushes L2 before each call (cold-cache kernel time); ``'cudagraph'`` replays a graph
    of back-to-back calls (no flush, no launch gaps). ``warmup_ms``/``rep_ms`` are durations, as in Triton.
    Raises ValueError for an unknown method.
    """
    from triton.testing import do_bench, do_bench_cudagraph

    if method == "do_bench":
        times = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
    elif method == "cudagraph":
        times = do_bench_cudagraph(fn, rep=rep_ms, return_mode="all")
    else:
        raise ValueError(f"unknown timing method {method!r}; choices: do_bench, cudagraph")
    times = sorted(float(t) for t in (times if isinstance(times, (list, tuple)) else [times]))
    return {**summarize(times), "timing": method}


def summarize(times_ms: list[float]) -> dict:
    """p20/p50/p80 (linear interpolation), mean and count of a list of times in ms."""
    if not times_ms:
        raise ValueError("no timing samples")
    if len(times_ms) == 1:
        t = times_ms[0]
        return {"p20_ms": t, "p50_ms": t, "p80_ms": t, "mean_ms": t, "n_samples": 1}
    q = statistics.quantiles(times_ms, n=10, method="inclusive")  # deciles: q[1]=p20, q[4]=p50, q[7]=p80
    return {"p20_ms": q[1], "p50_ms": q[4], "p80_ms": q[7], "mean_ms": statistics.fmean(times_ms),
            "n_samples": len(times_ms)}


def calibrate(device: str = "cuda", copy_bytes: int = 2 << 30, gemm_n: int = 8192) -> dict:
    """Measure the two ceilings once: device-to-device copy bandwidth (bytes read + written, TB/s) and cuBLAS
    bf16 ``gemm_n``³ on random data (TFLOP/s). Medians of do_bench."""
    import torch

    src = torch.empty(copy_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    t_copy = bench(lambda: dst.copy_(src))["p50_ms"]
    src = dst = None  # free 2 x copy_bytes before the GEMM
    a = torch.randn(gemm_n, gemm_n, dtype=torch.bfloat16, device=device)
    b = torch.randn(gemm_n, gemm_n, dtype=torch.bfloat16, device=device)
    t_mm = bench(lambda: a @ b, rep_ms=300)["p50_ms"]
    return {"copy_tbps": 2 * copy_bytes / t_copy / 1e9, "copy_bytes": copy_bytes,
            "cublas_bf16_tflops": 2 * gemm_n**3 / t_mm / 1e9, "cublas_n": gemm_n}
