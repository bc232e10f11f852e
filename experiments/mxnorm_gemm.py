"""The norm -> MXFP8 cast -> GEMM chain at Llama 3 8B shapes (GPU only): how much of the chain the norm + cast is,
so the cast is not measured in a vacuum (issue item 5).

    python -m experiments.mxnorm_gemm [--tokens 8192 16384] [--out results/mxnorm_gemm]

Shapes: x ``[T, 4096]`` bf16 (T tokens, D = 4096, Llama 3 8B hidden size) -> the fused QKV projection (N = 6144)
and the fused gate|up projection (N = 28672; ``normfuse.shapes.MODEL_PRESETS``), weight ``W [N, 4096]`` quantized
to MXFP8 once (FLOOR), outside timing.

Norm + cast (each checked with ``normfuse.techniques.mxnorm.check`` before timing): the Triton single-pass RMSNorm
+ cast, the Triton MXNorm (p = 1, 2) kernels, torch.compile RMSNorm + cast (per shape, dynamic=False).
GEMM consumers of the MXFP8 activation (each checked against ``kernels_triton.mxfp8_gemm.reference``):

* ``triton_dot_scaled``: ``kernels_triton.mxfp8_gemm.mxfp8_matmul`` (``tl.dot_scaled``), best of its configs.
  On the H200 this is a bf16 *emulation* (operands upcast to bf16, bf16 wgmma): there is no MX MMA on Hopper;
* ``dequant_cublas``: dequantize the activation to bf16 (PyTorch ops, compiled per shape) + cuBLAS bf16 GEMM with the
  weight dequantized once.

Reference point without quantization: cuBLAS bf16 ``y @ W^T`` on the bf16 RMSNorm output.

For every (norm+cast, GEMM) pair: ``share = T_normcast / (T_normcast + T_gemm)``. Timing: p50 of
``normfuse.timing.bench`` (do_bench, L2 flushed). Writes ``<out>/<run_id>/{results.csv, summary.md, meta.json}``.
Without a CUDA device it exits with a message (``plan()`` lists the measurements).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

D = 4096
NS = {"qkv": 6144, "gate_up": 28672}
NORM_CASTS = ("triton/rmsnorm_cast", "triton/mxnorm_p1", "triton/mxnorm_p2", "torch_compile_rmsnorm_cast")
GEMMS = ("triton_dot_scaled", "dequant_cublas")


def plan(tokens=(8192, 16384)) -> list[dict]:
    """The measurements: one row per (T, layer, norm_cast) and per (T, layer, gemm), plus the bf16 reference GEMM."""
    out = []
    for T in tokens:
        out += [{"T": T, "kind": "norm_cast", "impl": nc} for nc in NORM_CASTS]
        for layer, N in NS.items():
            out += [{"T": T, "N": N, "layer": layer, "kind": "gemm", "impl": g} for g in GEMMS + ("cublas_bf16",)]
    return out


def run(tokens, out_dir: Path) -> Path:
    import torch

    from kernels_triton import mxnorm as kt
    from normfuse.techniques import mxnorm as spec
    from normfuse.timing import bench

    eps = 1e-6
    rows = []
    for T in tokens:
        inp = spec.make_inputs(T, D, dtype="bf16", device="cuda", seed=T, specials=False)
        x = inp["x"]
        casts = {}
        fns = {"triton/rmsnorm_cast": ("rmsnorm_cast", lambda: kt.rmsnorm_mxfp8(x, eps=eps)),
               "triton/mxnorm_p1": ("mxnorm_p1", lambda: kt.mxnorm_mxfp8(x, p=1, eps=eps)),
               "triton/mxnorm_p2": ("mxnorm_p2", lambda: kt.mxnorm_mxfp8(x, p=2, eps=eps)),
               "torch_compile_rmsnorm_cast": ("rmsnorm_cast",
                                              spec.baseline("torch_compile_rmsnorm_cast", inp, eps, "rmsnorm_cast"))}
        for name, (variant, fn) in fns.items():
            try:
                out = fn()
                chk = spec.check("norm_cast", out, inp, eps, variant)
                t = bench(fn)["p50_ms"] if chk["ok"] else float("nan")
                casts[name] = out
                rows.append({"T": T, "kind": "norm_cast", "impl": name, "ok": chk["ok"], "p50_ms": t,
                             "gbps": spec.bytes_moved("norm_cast", T, D) / (t * 1e-3) / 1e9})
            except Exception as e:  # noqa: BLE001 -- recorded, the run goes on
                rows.append({"T": T, "kind": "norm_cast", "impl": name, "ok": False, "error": f"{type(e).__name__}: {e}"})
        if "triton/rmsnorm_cast" not in casts:
            continue
        a, sa, _ = casts["triton/rmsnorm_cast"]
        y_bf16 = (x.float() * casts["triton/rmsnorm_cast"][2][:, None]).to(torch.bfloat16)
        for layer, N in NS.items():
            try:
                rows.extend(_gemms(T, layer, N, a, sa, y_bf16))
            except Exception as e:  # noqa: BLE001 -- recorded, the run goes on
                rows.append({"T": T, "N": N, "layer": layer, "kind": "gemm", "impl": "all", "ok": False,
                             "error": f"{type(e).__name__}: {e}"})
        del inp, x, casts
        torch.cuda.empty_cache()
    return _write(rows, tokens, out_dir)


def _gemms(T, layer, N, a, sa, y_bf16) -> list[dict]:
    """The GEMM consumers of the MXFP8 activation ``a, sa`` for one layer (rows as in ``run``)."""
    import torch

    from kernels_triton import mxfp8_gemm
    from normfuse import mxfp8
    from normfuse.timing import bench

    rows = []
    g = torch.Generator(device="cuda").manual_seed(N)
    w = (torch.randn(N, D, generator=g, device="cuda") / D ** 0.5).to(torch.bfloat16)
    wq, ws = mxfp8.quantize(w, "floor")
    ref = mxfp8_gemm.reference(a, sa, wq, ws)
    tol = 2e-2 * ref.abs().max().item()
    best = (float("nan"), None)
    for cname, cfg in mxfp8_gemm.CONFIGS.items():
        fn = (lambda cfg=cfg: mxfp8_gemm.mxfp8_matmul(a, sa, wq, ws, config=cfg))
        ok = (fn().float() - ref).abs().max().item() <= tol
        t = bench(fn)["p50_ms"] if ok else float("nan")
        rows.append({"T": T, "N": N, "layer": layer, "kind": "gemm_config", "impl": f"triton_dot_scaled/{cname}",
                     "ok": ok, "p50_ms": t})
        if ok and not (t >= best[0]):
            best = (t, cname)
    rows.append({"T": T, "N": N, "layer": layer, "kind": "gemm", "impl": "triton_dot_scaled",
                 "config": best[1], "ok": best[1] is not None, "p50_ms": best[0],
                 "tflops": 2 * T * N * D / (best[0] * 1e-3) / 1e12})
    w_deq = mxfp8.dequantize(wq, ws, dtype=torch.bfloat16)  # once: the weight is static
    torch._dynamo.reset()
    deq = torch.compile(lambda a, sa: mxfp8.dequantize(a, sa, dtype=torch.bfloat16), dynamic=False)

    def dq_mm():
        return deq(a, sa) @ w_deq.T

    ok = (dq_mm().float() - ref).abs().max().item() <= tol
    t = bench(dq_mm)["p50_ms"] if ok else float("nan")
    rows.append({"T": T, "N": N, "layer": layer, "kind": "gemm", "impl": "dequant_cublas", "ok": ok,
                 "p50_ms": t, "tflops": 2 * T * N * D / (t * 1e-3) / 1e12})
    t = bench(lambda: y_bf16 @ w.T)["p50_ms"]
    rows.append({"T": T, "N": N, "layer": layer, "kind": "gemm", "impl": "cublas_bf16", "ok": True,
                 "p50_ms": t, "tflops": 2 * T * N * D / (t * 1e-3) / 1e12})
    del w, wq, ws, ref, w_deq
    return rows


def _write(rows, tokens, out_dir: Path) -> Path:
    """results.csv, chain.csv, summary.md and meta.json under ``out_dir/<run_id>``."""
    import pandas as pd
    import torch

    from normfuse import hardware
    from normfuse.sweep import git_info

    df = pd.DataFrame(rows)
    chain = []
    nc = df[df.kind == "norm_cast"]
    gm = df[df.kind == "gemm"]
    for r in nc[nc.ok].itertuples():
        for g in gm[(gm["T"] == r.T) & gm.ok].itertuples():
            if g.impl == "cublas_bf16":
                continue
            tot = r.p50_ms + g.p50_ms
            chain.append({"T": r.T, "layer": g.layer, "N": g.N, "norm_cast": r.impl, "gemm": g.impl,
                          "normcast_us": 1e3 * r.p50_ms, "gemm_us": 1e3 * g.p50_ms, "chain_us": 1e3 * tot,
                          "normcast_share_%": 100 * r.p50_ms / tot})
    ch = pd.DataFrame(chain)
    run_id = f"{dt.datetime.now():%Y%m%d-%H%M%S}_gpu"
    out = out_dir / run_id
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "results.csv", index=False)
    ch.to_csv(out / "chain.csv", index=False)
    text = ("# norm -> MXFP8 cast -> GEMM, Llama 3 8B (D = 4096), bf16 in, FLOOR scales; tl.dot_scaled is a bf16 "
            "emulation on Hopper\n\n## measurements\n\n" + df.to_markdown(index=False, floatfmt=".4g")
            + "\n\n## chain (share of norm + cast)\n\n" + ch.to_markdown(index=False, floatfmt=".3g") + "\n")
    (out / "summary.md").write_text(text)
    meta = {"experiment": "mxnorm_gemm", "run_id": run_id, "tokens": list(tokens), "D": D, "N": NS,
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "hardware": hardware.read_gpu(), "torch": torch.__version__, **git_info()}
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        pass
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    print(text)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "mxnorm_gemm")
    ap.add_argument("--plan", action="store_true", help="print the measurements and exit (no GPU needed)")
    args = ap.parse_args(argv)
    if args.plan:
        for p in plan(args.tokens):
            print(p)
        return None
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("mxnorm_gemm times GPU kernels: no CUDA device is visible (use --plan to list them)")
    return run(args.tokens, args.out)


if __name__ == "__main__":
    main()
