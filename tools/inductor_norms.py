"""Dump what Inductor generates for the standalone-norm baseline (GPU host): kernel source, launch config, time.

The ``torch_compile_norm`` baseline of the norms sweep is ``F.rms_norm`` / ``F.layer_norm`` (no affine) compiled
by ``torch.compile(dynamic=False)`` for one shape. To learn why it is faster than our kernels at some shapes (issue
13), this script compiles it at each shape with the caches off, runs it, and records per shape the Triton kernels
Inductor generated (source), the config its autotuner kept (XBLOCK / R0_BLOCK / num_warps / num_stages) and every
candidate config when Inductor tuned several.

    python3 tools/inductor_norms.py --out DIR [--M 262144 4096] [--N 512 1024 ...]

Writes ``DIR/<norm>_<M>x<N>.kernel.txt`` (the kernel sources, Triton-Python text) and ``DIR/inductor_norms.jsonl`` (one row per kernel).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def _autotuners():
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    # type(), not isinstance(): gc also holds weak proxies, and isinstance() on a dead one raises ReferenceError
    return [o for o in gc.get_objects() if issubclass(type(o), CachingAutotuner)]


def _config_dict(cfg) -> dict:
    return {"kwargs": dict(cfg.kwargs), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def dump(norm: str, M: int, N: int, out: Path) -> list[dict]:
    """Compile ``norm`` ('rmsnorm' | 'layernorm') for one bf16 ``[M, N]`` shape and describe its kernels."""
    torch._dynamo.reset()
    seen = {id(a) for a in _autotuners()}
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    if norm == "rmsnorm":
        fn = torch.compile(lambda t: F.rms_norm(t, (N,), None, 1e-5), dynamic=False)
    else:
        fn = torch.compile(lambda t: F.layer_norm(t, (N,), None, None, 1e-5), dynamic=False)
    fn(x)
    torch.cuda.synchronize()
    from triton.testing import do_bench
    ms = do_bench(lambda: fn(x), warmup=25, rep=100, return_mode="median")
    rows, sources = [], []
    for a in _autotuners():
        if id(a) in seen:
            continue
        src = getattr(getattr(a, "fn", None), "src", "")
        best = [_config_dict(lc.config) for lc in (getattr(a, "launchers", []) or [])]
        cands = [_config_dict(c) for c in (getattr(a, "configs", []) or [])]
        rows.append({"norm": norm, "M": M, "N": N, "kernel": getattr(a.fn, "__name__", "?"),
                     "chosen": best, "candidates": cands, "heuristics": str(getattr(a, "heuristic_type", "")),
                     "size_hints": str(getattr(a, "size_hints", "")),
                     "inductor_meta": {k: str(v) for k, v in (getattr(a, "inductor_meta", {}) or {}).items()},
                     "p50_ms": ms, "GBps": 2 * M * N * 2 / ms / 1e6})
        sources.append(f"# {norm} {M}x{N}: chosen {best}\n# candidates {cands}\n{src}\n")
    (out / f"{norm}_{M}x{N}.kernel.txt").write_text("\n".join(sources))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--M", type=int, nargs="+", default=[262144, 4096])
    ap.add_argument("--N", type=int, nargs="+", default=[512, 1024, 8192, 16384, 32768])
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "inductor_norms.jsonl", "w") as f:
        for M in a.M:
            for N in a.N:
                for norm in ("rmsnorm", "layernorm"):
                    try:
                        rows = dump(norm, M, N, a.out)
                    except Exception as e:  # keep going: one shape's failure is a row
                        rows = [{"norm": norm, "M": M, "N": N, "error": repr(e)[:500]}]
                    for r in rows:
                        f.write(json.dumps(r) + "\n")
                        f.flush()
                        print(norm, M, N, r.get("chosen"), f"{r.get('GBps', 0):.0f} GB/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
