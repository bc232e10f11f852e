"""Hardware counters (Nsight Compute) of named kernels: each target (``TARGETS``) is one fused kernel or its own GEMM
at a benchmark shape, built exactly as a sweep point is (the tiling entry of configs/tiling/*.yaml,
``normfuse.registry.kernel_function``, the technique's ``make_inputs`` / ``kernel_call``), checked against the fp32
reference, run once more to warm up, and then launched once inside ``cudaProfilerStart/Stop`` so that ``ncu
--profile-from-start off`` records that launch only. On the GPU host, from the repository root:

    source .gpubundle/env.sh
    export NORMFUSE_GIT_SHA=$(cat .normfuse_git_sha)  # the commit measured (a copied tree's .git may be stale)
    PYTHONPATH=$GPUBUNDLE_FBTRITON:$GPUBUNDLE_SITE:$PWD python3 -m tools.ncu_profile --out DIR --targets NAME ...

(``--rep-dir DIR2`` for the reports, ``--set`` for another ncu section set; one interpreter needs TLX *and*
pandas, pyarrow and omegaconf: the bundle's site has them, ``.venv-tlx`` has not; ``ncu`` on the PATH, allowed to
read the GPU's counters). On the CPU, the tables from ncu's CSV exports
(``ncu -i R.ncu-rep --page raw --csv --print-units base > CSVDIR/<target>.raw.csv`` and ``--page source --csv
--print-source sass > CSVDIR/<target>.sass.csv``):

    .venv/bin/python -m tools.ncu_profile --out DIR --from-csv CSVDIR

``ncu`` runs with ``--clock-control none`` (the clocks as
found: never locked or changed) and ``--cache-control none`` (caches not flushed between replay passes, as in the
benchmark's back-to-back launches). Writes DIR2/<target>.ncu-rep (not committed), DIR/metrics.parquet (every raw
metric of every target, long form: target, metric, unit, value), DIR/source_top.csv (per target the SASS lines with
the most warp-stall samples), DIR/opcodes.csv (executed instructions per SASS opcode), DIR/summary.md (counters and
warp-stall shares side by side) and DIR/meta.json.

The counters are read once per target; durations under the profiler are not timings (replay passes, no paired
rounds) and the table reports them only to relate the counters to each other."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL_REGEX = "regex:^_(multi_cta_norm|lazy_prenorm_ws)_kernel"


@dataclass(frozen=True)
class Target:
    """One kernel launch to profile: a tiling entry of ``tiling_file`` (TLX list) run as ``impl`` of
    ``technique`` (``variant``) at ``M x N x K``, bf16."""
    technique: str
    tiling_file: str
    tiling: str
    impl: str
    variant: str
    M: int
    N: int
    K: int


TARGETS = {
    # Lazy Pre-Norm cluster form, c2 + STORE_DEFER and its GEMM at K = 2048 / 512 (docs/results/lazy_prenorm.md,
    # "Where the statistic's time goes")
    "lazy_c2defer_K2048": Target("lazy_prenorm", "lazy_prenorm_h200.yaml", "cluster-c2-defer-128x256x64-s3",
                                 "fused", "rmsnorm", 262144, 512, 2048),
    "lazy_c2gemm_K2048": Target("lazy_prenorm", "lazy_prenorm_h200.yaml", "cluster-c2-128x256x64-s3",
                                "gemm", "rmsnorm", 262144, 512, 2048),
    "lazy_c2defer_K512": Target("lazy_prenorm", "lazy_prenorm_h200.yaml", "cluster-c2-defer-128x256x64-s3",
                                "fused", "rmsnorm", 262144, 512, 512),
    "lazy_c2gemm_K512": Target("lazy_prenorm", "lazy_prenorm_h200.yaml", "cluster-c2-128x256x64-s3",
                               "gemm", "rmsnorm", 262144, 512, 512),
    # ... with the statistic accumulated elementwise (STATS_ELEMENTWISE: no shuffles in the K loop)
    "lazy_c2elem_K2048": Target("lazy_prenorm", "lazy_prenorm_h200.yaml", "cluster-c2-defer-elem-128x256x64-s3",
                                "fused", "rmsnorm", 262144, 512, 2048),
    "lazy_wsgemm_K2048": Target("lazy_prenorm", "lazy_prenorm_h200.yaml", "ws-persistent-128x256x64-s3",
                                "gemm", "rmsnorm", 262144, 512, 2048),
    # Multi-CTA LayerNorm at N = 1024: the two-tile c2 kernel (best) and its GEMM; STORE_DIRECT vs STORE_DEFER
    "mcta_c2t2_ln_K1024": Target("multi_cta", "multi_cta_h200.yaml", "c2-t2-lnpack-persistent-s3",
                                 "fused", "layernorm", 262144, 1024, 1024),
    "mcta_c2t2gemm_K1024": Target("multi_cta", "multi_cta_h200.yaml", "gemm-cluster-c2-t2-128x256x64-s3",
                                  "gemm", "layernorm", 262144, 1024, 1024),
    "mcta_c4defer_ln_K1024": Target("multi_cta", "multi_cta_h200.yaml", "c4-defer-lnpack-persistent-s3",
                                    "fused", "layernorm", 262144, 1024, 1024),
    "mcta_c4direct_ln_K1024": Target("multi_cta", "multi_cta_h200.yaml", "c4-direct-lnpack-persistent-s3",
                                     "fused", "layernorm", 262144, 1024, 1024),
    # Lazy Pre-Norm LayerNorm's cluster form against the RMSNorm one and their GEMM, where the LayerNorm kernel lags
    # most (c4 at N = 1024, K = 512; c2 at N = 512, K = 1024)
    "lazyln_c4asm_K512": Target("lazy_prenorm", "lazy_prenorm_ln_h200.yaml", "ln-cluster-c4-defer-elem-asm-128x256x64-s3",
                                "fused", "layernorm", 262144, 1024, 512),
    "lazy_c4elem_K512": Target("lazy_prenorm", "lazy_prenorm_h200.yaml", "cluster-c4-defer-elem-128x256x64-s3",
                               "fused", "rmsnorm", 262144, 1024, 512),
    "lazy_c4gemm_K512": Target("lazy_prenorm", "lazy_prenorm_h200.yaml", "cluster-c4-128x256x64-s3",
                               "gemm", "rmsnorm", 262144, 1024, 512),
    "lazyln_c2asm_K1024": Target("lazy_prenorm", "lazy_prenorm_ln_h200.yaml",
                                 "ln-cluster-c2-defer-elem-asm-128x256x64-s3", "fused", "layernorm", 262144, 512, 1024),
    "lazy_c2asm_K1024": Target("lazy_prenorm", "lazy_prenorm_h200.yaml", "cluster-c2-defer-elem-asm-128x256x64-s3",
                               "fused", "rmsnorm", 262144, 512, 1024),
    # ... with the rank-1 correction as a wgmma and the shift prefetched (LN_RANK1_MMA, LN_SHIFT_PREFETCH)
    "lazyln_c4mma_K512": Target("lazy_prenorm", "lazy_prenorm_ln_h200.yaml",
                                "ln-cluster-c4-defer-elem-asm-mma-128x256x64-s3", "fused", "layernorm", 262144,
                                1024, 512),
    "lazyln_c4mmapf_K512": Target("lazy_prenorm", "lazy_prenorm_ln_h200.yaml",
                                  "ln-cluster-c4-defer-elem-asm-mma-pf-128x256x64-s3", "fused", "layernorm", 262144,
                                  1024, 512),
    # Lazy RMSNorm with the statistic in the producer warpgroup (STATS_IN_PRODUCER), c2 at (2048, 512)
    "lazy_c2prod_K2048": Target("lazy_prenorm", "lazy_prenorm_h200.yaml", "cluster-c2-defer-prod-asm-128x256x64-s3",
                                "fused", "rmsnorm", 262144, 512, 2048),
    "lazy_c2asm_K2048": Target("lazy_prenorm", "lazy_prenorm_h200.yaml", "cluster-c2-defer-elem-asm-128x256x64-s3",
                               "fused", "rmsnorm", 262144, 512, 2048),
    # ... or the shift read from the first A slice in shared memory (LN_SHIFT_SMEM)
    "lazyln_c4mmass_K512": Target("lazy_prenorm", "lazy_prenorm_ln_h200.yaml",
                                  "ln-cluster-c4-defer-elem-asm-mma-smemshift-128x256x64-s3", "fused", "layernorm",
                                  262144, 1024, 512),
}

# the counters summary.md shows (raw metric names; absent ones are left blank), then every warp-stall reason
SUMMARY_METRICS = {
    "gpu__time_duration.sum": "duration (ns, under the profiler)",
    "sm__cycles_elapsed.avg": "SM cycles elapsed (per SM)",
    "sm__cycles_elapsed.avg.per_second": "SM clock under the profiler (Hz)",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed": "tensor pipe active (% of elapsed)",
    "smsp__inst_executed.sum": "warp instructions",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue active (% of cycles)",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed":
        "LSU shared-memory pipe (% of peak)",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": "LSU shared-memory wavefronts",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": "shared-memory bank conflicts",
    "smsp__sass_inst_executed_op_shared_ld.sum": "shared loads (warp instr.)",
    "smsp__sass_inst_executed_op_shared_st.sum": "shared stores (warp instr.)",
    "smsp__sass_inst_executed_op_global_st.sum": "global stores (warp instr.)",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": "global store sectors",
    "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": "global store requests",
    "dram__bytes_read.sum": "DRAM read (B)",
    "dram__bytes_write.sum": "DRAM write (B)",
    "lts__t_bytes.sum": "L2 traffic (B)",
    "launch__registers_per_thread": "registers / thread (launch value; setmaxnreg may raise a task's)",
}
STALL_PREFIX = "smsp__pcsamp_warps_issue_stalled_"


def load_tiling(target: Target) -> dict:
    """The TLX tiling entry ``target.tiling`` of ``configs/tiling/<tiling_file>`` without its bookkeeping keys
    (name, impls); ValueError listing the names if it is not there."""
    from omegaconf import OmegaConf

    entries = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "tiling" / target.tiling_file))["tlx"]
    by_name = {e.get("name"): e for e in entries}
    if target.tiling not in by_name:
        raise ValueError(f"{target.tiling_file}: no tlx tiling named {target.tiling!r}; available: "
                         f"{', '.join(map(str, by_name))}")
    return {k: v for k, v in by_name[target.tiling].items() if k not in ("name", "impls")}


def technique_eps(technique: str) -> float:
    from omegaconf import OmegaConf

    return float(OmegaConf.load(ROOT / "configs" / "technique" / f"{technique}.yaml")["eps"])


def run_child(name: str) -> None:
    """Build, check and launch target ``name`` (in the process ncu profiles)."""
    import torch

    from normfuse.registry import get_technique, kernel_function

    t = TARGETS[name]
    spec = get_technique(t.technique)
    eps = technique_eps(t.technique)
    kw = {"variant": t.variant} if t.technique == "lazy_prenorm" else {}
    inp = spec.make_inputs(t.M, t.N, t.K, dtype="bf16", device="cuda", seed=t.M + t.N + t.K, **kw)
    fn = spec.kernel_call(kernel_function("tlx", t.technique, t.impl, t.variant), t.impl, inp, eps,
                          load_tiling(t), t.variant)
    res = spec.check(t.impl, fn(), inp, eps, t.variant)
    if not res["ok"]:
        raise SystemExit(f"{name}: failed its check against the fp32 reference: {res}")
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"{name}: checked ({res}) and profiled", flush=True)


def parse_raw_csv(text: str):
    """``ncu --page raw --csv --print-units base`` output (header row, units row, one row per kernel) -> long
    DataFrame (metric, unit, value) of the first kernel; values that are not numbers are kept as strings."""
    import pandas as pd

    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)  # (past ==WARNING== lines)
    if start is None:
        raise ValueError('ncu raw CSV has no header row (a line starting with "ID")')
    df = pd.read_csv(io.StringIO("\n".join(lines[start:])), dtype=str, keep_default_na=False)
    if len(df) < 2:
        raise ValueError("ncu raw CSV has no kernel row (was the launch profiled?)")
    units, row = df.iloc[0], df.iloc[1]
    out = []
    for col in df.columns:
        v = row[col].replace(",", "")
        try:
            val = float(v)
        except ValueError:
            val = row[col]
        out.append({"metric": col, "unit": units[col], "value": val})
    return pd.DataFrame(out)


def summarize(metrics) -> str:
    """Markdown table of ``SUMMARY_METRICS`` and the warp-stall samples (share of all samples, reasons with >= 1 %
    in any target) per target; ``metrics``: long DataFrame (target, metric, unit, value)."""
    import pandas as pd

    num = metrics[pd.to_numeric(metrics["value"], errors="coerce").notna()].copy()
    num["value"] = num["value"].astype(float)
    wide = num.pivot_table(index="metric", columns="target", values="value", aggfunc="first")
    targets = list(dict.fromkeys(metrics["target"]))
    wide = wide.reindex(columns=targets)
    lines = ["| counter | " + " | ".join(targets) + " |", "|---" * (len(targets) + 1) + "|"]
    for m, label in SUMMARY_METRICS.items():
        if m in wide.index:
            lines.append(f"| {label} | " + " | ".join(_fmt(wide.at[m, t]) for t in targets) + " |")
    stalls = wide[wide.index.str.startswith(STALL_PREFIX) & ~wide.index.str.endswith("_not_issued")]
    if len(stalls):
        share = 100 * stalls / stalls.sum()
        keep = share[(share >= 1).any(axis=1)].sort_values(targets[0], ascending=False)
        totals = " | ".join(_fmt(stalls[t].sum()) for t in targets)
        lines.append(f"| warp-state samples (all reasons, 'selected' = issuing) | {totals} |")
        for m in keep.index:
            reason = m[len(STALL_PREFIX):].split(".")[0]
            shares = " | ".join(f"{keep.at[m, t]:.1f}" for t in targets)
            lines.append(f"| warp state: {reason} (% of samples) | {shares} |")
    return "\n".join(lines) + "\n"


def _fmt(v) -> str:
    if v != v:  # NaN
        return ""
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.4e}"


def _source_frame(text: str):
    """The per-instruction table of an ``ncu --page source --csv --print-source sass`` export (its rows after the
    "Kernel Name" line), all columns as strings, or None when the export has none."""
    import pandas as pd

    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), None)
    if start is None:
        return None
    return pd.read_csv(io.StringIO("\n".join(lines[start:])), dtype=str, keep_default_na=False)


def parse_source_csv(text: str, n: int = 40):
    """``ncu --page source --csv --print-source sass`` output (a "Kernel Name" line, then one row per SASS
    instruction) -> the ``n`` instructions with the most warp-stall samples, or None without source counters."""
    import pandas as pd

    df = _source_frame(text)
    col = "Warp Stall Sampling (All Samples)"
    if df is None or col not in df.columns:
        return None
    df["samples"] = pd.to_numeric(df[col].str.replace(",", ""), errors="coerce").fillna(0)
    keep = [c for c in df.columns if c in ("Address", "Source", col, "Instructions Executed", "samples")
            or c.startswith("stall_") and "Not Issued" not in c]
    return df.sort_values("samples", ascending=False, kind="stable").head(n)[keep]


def opcode_counts(text: str):
    """Per SASS opcode (predicate and modifiers dropped: ``@!P0 IMAD.U32`` -> ``IMAD``) the instructions in the code
    (``lines``), the warp instructions executed (``inst``) and the warp-state samples, from an ``ncu --page source
    --csv --print-source sass`` export, or None."""
    import pandas as pd

    df = _source_frame(text)
    if df is None:
        return None
    op = df["Source"].str.strip().str.replace(r"^@!?U?P\w+\s+", "", regex=True).str.split().str[0].str.split(".").str[0]
    num = {c: pd.to_numeric(df[c].str.replace(",", ""), errors="coerce").fillna(0)
           for c in ("Instructions Executed", "Warp Stall Sampling (All Samples)")}
    return (pd.DataFrame({"opcode": op, "lines": 1, "inst": num["Instructions Executed"],
                          "samples": num["Warp Stall Sampling (All Samples)"]})
            .groupby("opcode", as_index=False).sum().sort_values("inst", ascending=False))


def summary_text(metrics) -> str:
    """summary.md: what each target is (``TARGETS``, where the name is one), the caveat on durations, then
    ``summarize``."""
    head = ["# Nsight Compute counters (tools/ncu_profile.py)", "",
            "One profiled launch per target, M x N x K, bf16; clocks and caches as found (`--clock-control none "
            "--cache-control none`). Durations under the profiler are not timings (replay passes, the SM clock "
            "differs between kernels): compare cycles and counts.", "",
            "| target | technique | tiling entry | impl | M x N x K |", "|---|---|---|---|---|"]
    for name in dict.fromkeys(metrics["target"]):
        t = TARGETS.get(name)
        head.append(f"| {name} | " + (f"{t.technique} ({t.variant}) | {t.tiling} | {t.impl} | {t.M} x {t.N} x {t.K} |"
                                      if t else "(not in TARGETS) | | | |"))
    return "\n".join(head) + "\n\n" + summarize(metrics)


def write_tables(out: Path, raw: dict, source: dict) -> None:
    """DIR/metrics.parquet, DIR/summary.md, DIR/source_top.csv and DIR/opcodes.csv from ncu's CSV pages: ``raw``
    and ``source`` map a target name to the text of its ``--page raw`` / ``--page source`` export (source may be
    empty). Tables of an earlier run in DIR are replaced (source_top / opcodes removed when no source page is
    given). ValueError naming the target whose raw export does not parse."""
    import pandas as pd

    frames = []
    for name, text in raw.items():
        try:
            frames.append(parse_raw_csv(text).assign(target=name))
        except (ValueError, pd.errors.ParserError) as e:
            raise ValueError(f"{name}: {e}") from e
    metrics = pd.concat(frames, ignore_index=True)
    metrics["value"] = metrics["value"].astype(str)
    metrics.to_parquet(out / "metrics.parquet", index=False)
    (out / "summary.md").write_text(summary_text(metrics))
    for stale in ("source_top.csv", "opcodes.csv"):
        (out / stale).unlink(missing_ok=True)
    tops = [t.assign(target=name) for name, text in source.items() if (t := parse_source_csv(text)) is not None]
    if tops:
        pd.concat(tops, ignore_index=True).to_csv(out / "source_top.csv", index=False)
    ops = [t.assign(target=name) for name, text in source.items() if (t := opcode_counts(text)) is not None]
    if ops:
        pd.concat(ops, ignore_index=True).to_csv(out / "opcodes.csv", index=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="folder for the reports and tables")
    ap.add_argument("--targets", nargs="+", choices=sorted(TARGETS), default=list(TARGETS), metavar="NAME",
                    help="targets to profile (default: all): " + ", ".join(TARGETS))
    ap.add_argument("--rep-dir", help="folder for the .ncu-rep reports (default: --out)")
    ap.add_argument("--set", default="full", help="ncu section set (default: full)")
    ap.add_argument("--from-csv", metavar="DIR", help="no profiling: rebuild the tables in --out from ncu CSV exports "
                    "DIR/<target>.raw.csv (and <target>.sass.csv), e.g. of reports profiled earlier")
    ap.add_argument("--child", choices=sorted(TARGETS), metavar="NAME",
                    help="no profiler: check and launch one target (what ncu runs; warms the Triton cache)")
    args = ap.parse_args(argv)
    if args.child:
        run_child(args.child)
        return 0
    if not args.out:
        ap.error("--out is required")
    if args.from_csv:
        src = Path(args.from_csv)
        if not src.is_dir():
            ap.error(f"--from-csv {src}: not a folder")
        raw = {p.name[:-len(".raw.csv")]: p.read_text() for p in sorted(src.glob("*.raw.csv"))}
        if not raw:
            ap.error(f"--from-csv {src}: no <target>.raw.csv files")
        source = {n: (src / f"{n}.sass.csv").read_text() if (src / f"{n}.sass.csv").exists() else "" for n in raw}
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        try:
            write_tables(out, raw, source)
        except ValueError as e:
            ap.error(f"--from-csv {src}: {e}")
        meta = {"tool": "tools.ncu_profile", "argv": sys.argv[1:] if argv is None else list(argv),
                "from_csv": str(src), "targets": {n: asdict(TARGETS[n]) if n in TARGETS else None for n in raw}}
        (out / "meta_from_csv.json").write_text(json.dumps(meta, indent=1))
        print((out / "summary.md").read_text())
        return 0
    ncu = shutil.which("ncu") or next((str(p) for p in sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"))),
                                      None)
    if ncu is None:
        ap.error("ncu (Nsight Compute) not found on PATH or under /opt/nvidia/nsight-compute")
    out = Path(args.out)
    rep_dir = Path(args.rep_dir or out)
    for d in (out, rep_dir):
        d.mkdir(parents=True, exist_ok=True)
    flags = ["--clock-control", "none", "--cache-control", "none", "--profile-from-start", "off", "--set", args.set,
             "--import-source", "no", "-k", KERNEL_REGEX, "-c", "1"]
    raw, source, status = {}, {}, {}
    for name in args.targets:
        rep = rep_dir / name
        cmd = [ncu, *flags, "-f", "-o", str(rep), sys.executable, "-m", "tools.ncu_profile", "--child", name]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=os.environ)
        (out / f"{name}.log").write_text(p.stdout + p.stderr)
        rep_file = rep.with_suffix(".ncu-rep")
        if p.returncode or not rep_file.exists():
            status[name] = f"failed (rc {p.returncode}; {name}.log)"
            print(f"{name}: {status[name]}", flush=True)
            continue
        page = {pg: subprocess.run([ncu, "-i", str(rep_file), "--page", pg, "--csv"] + extra, capture_output=True,
                                   text=True).stdout
                for pg, extra in (("raw", ["--print-units", "base"]), ("source", ["--print-source", "sass"]))}
        try:
            parse_raw_csv(page["raw"])
        except ValueError as e:
            status[name] = f"no metrics ({e})"
            continue
        raw[name], source[name] = page["raw"], page["source"]
        status[name] = "ok"
        print(f"{name}: ok", flush=True)
    meta = {"tool": "tools.ncu_profile", "argv": sys.argv[1:], "status": status, "kernel_regex": KERNEL_REGEX,
            "ncu": ncu, "ncu_version": subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout,
            "targets": {n: asdict(TARGETS[n]) for n in args.targets},
            "ncu_flags": " ".join(flags),
            "checked": "every target against the fp32 reference at its shape before the profiled launch"}
    try:
        from normfuse import hardware
        from normfuse.sweep import git_info

        meta.update(git_info())
        meta["gpu"] = hardware.read_gpu()
    except Exception as e:  # noqa: BLE001 - metadata is best effort; the counters are the result
        meta["meta_error"] = repr(e)
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    if raw:
        write_tables(out, raw, source)
        print((out / "summary.md").read_text())
    return 0 if all(s == "ok" for s in status.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
