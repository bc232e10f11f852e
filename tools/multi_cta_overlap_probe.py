"""Where EPILOGUE_OVERLAP's time goes (kernels_tlx/multi_cta.py): time paired (``normfuse.timing.
bench_graph_interleaved``, 3 ms graphs like the runner's paired windows) the one-tile c4 kernels at N = 1024,
M = 262144: ``defer`` (c4_defer_lnpack: the immediate epilogue, deferred store), ``ovl`` (c4_ovl_lnpack: the
deferred epilogue inside the next mainloop), ``ovl_wait_only`` (``PROBE_OVL = 1``: only the exchange wait inside
it, the normalization and stores after it), ``ovl_after`` (``PROBE_OVL = 2``: the whole deferred epilogue after
the next mainloop: the parked-tile structure without any overlap) and ``gemm`` (the same schedule without the
norm, ``matmul_cluster``). ``PROBE_OVL`` is a kernel constexpr the library never sets. Every variant is checked
against the fp32 reference before it is timed. GPU only:

    python -m tools.multi_cta_overlap_probe --out DIR [--rounds 20]

from the repository root, TLX environment on the path (``NORMFUSE_GIT_SHA=$(cat .normfuse_git_sha)`` on a host whose
copy of the tree carries a stale ``.git``). Writes DIR/probe.json (every sample, the NVML statistics of each cell's
window) and DIR/meta.json, prints a table (median µs)."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from kernels_tlx import multi_cta as km
from normfuse import hardware, timing
from normfuse.techniques import multi_cta as spec
from normfuse.worker import versions

SHAPES = [(262144, 1024, K) for K in (512, 2048)]
EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}


def launcher(inp, variant: str, cfg_name: str, probe: int = 0):
    """A zero-argument callable launching the fused (or, ``variant='none'``, the GEMM) kernel with ``PROBE_OVL =
    probe``, as ``multi_cta._run`` does (persistent grid from the occupancy query); returns the op's outputs."""
    cfg = km.SHIPPED_CONFIGS[cfg_name]
    norm = {"rmsnorm": "rms", "layernorm": "layer", "none": "none"}[variant]
    (M, N, K), bn, outs, args, kwargs = km._prepare(inp["a"], inp["b"], None, None, EPS.get(variant, 1e-6), norm, cfg,
                                                   need_cuda=True)
    if probe:
        kwargs["PROBE_OVL"] = probe
    ck = km._multi_cta_norm_kernel.warmup(*args, grid=(cfg.CLUSTER_SIZE, ), **kwargs)
    grid = km._grid(cfg, M, km._max_active_clusters(ck, cfg.CLUSTER_SIZE, inp["a"].device))
    y, mean, rstd = outs
    ret = (y, ) if variant == "none" else (y, rstd) if variant == "rmsnorm" else (y, mean, rstd)

    def fn():
        km._multi_cta_norm_kernel[grid](*args, **kwargs)
        return ret
    return fn


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for probe.json and meta.json")
    ap.add_argument("--rounds", type=int, default=20, help="paired rounds per cell")
    ap.add_argument("--variants", nargs="+", default=["layernorm", "rmsnorm"], choices=sorted(EPS))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("GPU only: the probe times TLX kernels on a CUDA device")
    rows = []
    for variant in args.variants:
        for M, N, K in SHAPES:
            inp = spec.make_inputs(M, N, K, dtype="bf16", device="cuda", seed=M + N + K, affine=False,
                                   mean_shift=30.0 if variant == "layernorm" else 0.0)
            fns = {"defer": launcher(inp, variant, "c4_defer_lnpack"), "ovl": launcher(inp, variant, "c4_ovl_lnpack"),
                   "ovl_wait_only": launcher(inp, variant, "c4_ovl_lnpack", 1),
                   "ovl_after": launcher(inp, variant, "c4_ovl_lnpack", 2),
                   "gemm": launcher(inp, "none", "c4_defer_lnpack")}
            for name, fn in fns.items():  # correct before timed
                out = fn()
                torch.cuda.synchronize()
                if name == "gemm":
                    ok = torch.allclose(out[0].float(), (inp["a"].float() @ inp["b"].float()), rtol=2e-2, atol=2e-1)
                    res = {"ok": ok}
                else:
                    res = spec.check("fused", out, inp, EPS[variant], variant)
                if not res["ok"]:
                    raise SystemExit(f"{name} failed its check at {M}x{N}x{K} {variant}: {res}")
            with hardware.Sampler() as sampler:
                t = timing.bench_graph_interleaved(fns, rounds=args.rounds, graph_ms=3.0)
            nvml = sampler.stats()
            for name, s in t.items():
                rows.append(dict(M=M, N=N, K=K, variant=variant, name=name, us=1e3 * statistics.median(s), samples=s,
                                 **nvml))
            print(f"done {variant} K={K}: SM clock {nvml['sm_clock_mhz_min']}-{nvml['sm_clock_mhz_max']} MHz, "
                  f"power median {nvml['power_w_median']} W", flush=True)
            del inp, fns
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = hardware.read_gpu()
    (out / "probe.json").write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1, default=str))
    from normfuse.sweep import git_info  # pandas: the GPU host's python has it, the CPU TLX venv not

    meta = {"tool": "tools.multi_cta_overlap_probe", "argv": vars(args), **git_info(), "versions": versions(),
            "gpu": gpu, "shapes": SHAPES,
            "checked": "every timed variant against the fp32 reference first (gemm: against a @ b in fp32)"}
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    names = list(dict.fromkeys(r["name"] for r in rows))
    print(f"{'cell':22s}" + "".join(f"{n:>15s}" for n in names) + "   (median µs)")
    for variant in args.variants:
        for M, N, K in SHAPES:
            us = {r["name"]: r["us"] for r in rows if (r["variant"], r["K"]) == (variant, K)}
            print(f"{variant:9s} K={K:5d}       " + "".join(f"{us[n]:15.1f}" for n in names))


if __name__ == "__main__":
    main()
