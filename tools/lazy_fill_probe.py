"""Can the SMs a cluster schedule leaves idle be put to work? On the H200 only 30 clusters of 4 (120 of 132 SMs) are
co-resident, so Lazy Pre-Norm's c4 cluster form at N = 1024 runs its GEMM on 91 % of the GPU. This probe splits
the rows: the first ``Mc`` (a multiple of BLOCK_M) go to the persistent c4 kernel, which lets a programmatic
dependent grid start as soon as all its CTAs are resident (``griddepcontrol.launch_dependents`` at its start,
``PDL_TRIGGER``), and the rest to the one-CTA-per-tile kernel with REUSE_RSTD (``kernels_tlx.lazy_prenorm``'s
``reuse_rstd``, its statistic once per M-tile) launched as that dependent (``launch_pdl``) on as many CTAs as SMs
are idle, on the same stream. Timed paired (``normfuse.timing.bench_graph_interleaved``) against the c4 kernel on
all rows, the best plain GEMM (``lazy_prenorm.matmul``, default config) and the two parts alone; every variant's
output checked against the fp32 reference first. GPU only:

    python -m tools.lazy_fill_probe --out DIR [--rounds 20]

from the repository root, TLX environment on the path (``NORMFUSE_GIT_SHA=$(cat .normfuse_git_sha)``). Writes
DIR/probe.json and DIR/meta.json and prints a table (median µs)."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import triton

from kernels_tlx import lazy_prenorm as lp
from kernels_tlx import multi_cta as km
from normfuse import hardware, timing
from normfuse.techniques import lazy_prenorm as spec
from normfuse.worker import versions

SHAPES = [(262144, 1024, K) for K in (512, 1024, 2048)]
EPS = 1e-6
CLUSTER_CFG = "cluster_c4_defer_elem"  # the c4 Lazy RMSNorm kernel of the committed runs
FILL_CFG = "reuse_rstd"
FRACTIONS = (0.895, 0.909, 0.925)  # rows to the cluster kernel (120 / 132 = 0.909)


def cluster_part(a, b, pdl_trigger: bool):
    """Launcher of the c4 kernel on ``a`` (rows of the cluster part) and its output."""
    cfg = lp.SHIPPED_CONFIGS[CLUSTER_CFG].cluster_config()
    (M, N, K), bn, outs, args, kwargs = km._prepare(a, b, None, None, EPS, "lazy_rms", cfg, need_cuda=True)
    if pdl_trigger:
        kwargs["PDL_TRIGGER"] = True
    ck = km._multi_cta_norm_kernel.warmup(*args, grid=(cfg.CLUSTER_SIZE, ), **kwargs)
    avail = km._max_active_clusters(ck, cfg.CLUSTER_SIZE, a.device)
    if not avail:  # the probe measures the idle SMs of the persistent grid: without its size there are none to fill
        raise RuntimeError("cuOccupancyMaxActiveClusters gave no co-resident cluster count for the c4 kernel: the "
                           "probe needs it (the persistent grid and its idle SMs)")
    grid = km._grid(cfg, M, avail)
    return (lambda: km._multi_cta_norm_kernel[grid](*args, **kwargs)), outs[0], avail * cfg.CLUSTER_SIZE


def fill_part(a, b, num_ctas: int, pdl: bool):
    """Launcher of the REUSE_RSTD one-CTA-per-tile kernel on ``a`` with ``num_ctas`` persistent CTAs."""
    cfg = lp.SHIPPED_CONFIGS[FILL_CFG]
    c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    args, grid, kwargs = lp._launch_args(a, b, c, EPS, True, cfg, num_ctas)
    if pdl:
        kwargs.update(launch_pdl=True, PDL_WAIT_END=True)
    return (lambda: lp._lazy_prenorm_ws_kernel[grid](*args, **kwargs)), c


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for probe.json and meta.json")
    ap.add_argument("--rounds", type=int, default=20, help="paired rounds per cell")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("GPU only: the probe times TLX kernels on a CUDA device")
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for M, N, K in SHAPES:
        inp = spec.make_inputs(M, N, K, dtype="bf16", device="cuda", seed=M + N + K)
        a, b = inp["a"], inp["b_folded"]
        full, y_full, busy = cluster_part(a, b, False)
        idle = num_sms - busy
        fns, outs = {"c4": full}, {"c4": [(0, y_full)]}
        g = lp.SHIPPED_CONFIGS["default"]
        fns["gemm"] = lambda: lp.matmul(a, b, config=g)
        for f in FRACTIONS:
            mc = min(M, triton.cdiv(int(f * M), 128) * 128)
            run_c, y_c, _ = cluster_part(a[:mc], b, True)
            run_f, y_f = fill_part(a[mc:], b, idle, True)

            def hybrid(run_c=run_c, run_f=run_f):
                run_c()
                run_f()
            fns[f"fill_{f}"] = hybrid
            outs[f"fill_{f}"] = [(0, y_c), (mc, y_f)]
            if f == FRACTIONS[1]:
                fns["c4_part"] = cluster_part(a[:mc], b, False)[0]
                fns["fill_part"] = fill_part(a[mc:], b, idle, False)[0]
        ref, same = spec.references("fused", inp, EPS, "rmsnorm")
        for name, fn in fns.items():  # correct before timed (the parts alone: their rows)
            fn()
            torch.cuda.synchronize()
            for r0, y in outs.get(name, []):
                rs = slice(r0, r0 + y.shape[0])
                res = spec.compare(y, ref[rs], spec.tolerance(ref[rs], same[rs]))
                if not res["ok"]:
                    raise SystemExit(f"{name} failed its check at {M}x{N}x{K} rows {r0}+: {res}")
        with hardware.Sampler() as sampler:
            t = timing.bench_graph_interleaved(fns, rounds=args.rounds, graph_ms=3.0)
        nvml = sampler.stats()
        for name, s in t.items():
            rows.append(dict(M=M, N=N, K=K, name=name, us=1e3 * statistics.median(s), samples=s, idle_sms=idle,
                             **nvml))
        print(f"done K={K}: idle SMs {idle}, SM clock {nvml['sm_clock_mhz_min']}-{nvml['sm_clock_mhz_max']} MHz",
              flush=True)
        del inp, fns, outs, a, b, ref, same
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = hardware.read_gpu()
    (out / "probe.json").write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1, default=str))
    from normfuse.sweep import git_info

    meta = {"tool": "tools.lazy_fill_probe", "argv": vars(args), **git_info(), "versions": versions(), "gpu": gpu,
            "shapes": SHAPES, "cluster_config": CLUSTER_CFG, "fill_config": FILL_CFG, "fractions": FRACTIONS,
            "checked": "every timed variant against the fp32 reference first (per part: its rows)"}
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    names = list(dict.fromkeys(r["name"] for r in rows))
    print(f"{'K':>6s}" + "".join(f"{n:>13s}" for n in names) + "   (median µs)")
    for M, N, K in SHAPES:
        us = {r["name"]: r["us"] for r in rows if r["K"] == K}
        print(f"{K:6d}" + "".join(f"{us[n]:13.1f}" for n in names))


if __name__ == "__main__":
    main()
