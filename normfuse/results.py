"""Tidy results: one row per measured thing, appended to ``results.jsonl`` as it comes (nothing is lost on a
crash), then written as ``results.parquet`` and ``results.csv`` with the derived metrics.

Columns (at least): run_id, experiment, technique, variant, dsl, impl, env, M, N, K, dtype, config (JSON),
status (ok|incorrect|error|timeout|unsupported|compile_only), error, max_abs_err, rel_err, tol, p20_ms,
p50_ms, p80_ms, n_samples, compile_s, tflops, gbps, hidden_dsl, hidden_best, speedup, gpu_name, power_limit_w,
sm_clock_mhz, git_sha, timestamp, mode (gpu|interpret|ref|compile_only), stage (sweep: one point per config;
paired: the participants of a paired-timing window, their times over its rounds), replicate.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

KEY_FIELDS = ("technique", "variant", "dsl", "impl", "M", "N", "K", "dtype", "eps", "config_name", "mode", "options",
              "stage")
STATUSES = ("ok", "incorrect", "error", "timeout", "unsupported", "compile_only")
COLUMNS = ("run_id", "experiment", "technique", "variant", "dsl", "impl", "env", "M", "N", "K", "shape_label",
           "dtype", "eps", "options", "config_name", "config", "status", "error", "max_abs_err", "rel_err", "tol",
           "p20_ms", "p50_ms", "p80_ms", "mean_ms", "n_samples", "timing", "compile_s", "tflops", "gbps",
           "hidden_dsl", "hidden_best", "speedup", "frac_cublas", "gpu_name", "power_limit_w", "sm_clock_mhz",
           "hardware", "git_sha", "timestamp", "mode", "seed", "details", "stage", "replicate")


def point_key(row: dict) -> tuple:
    """The identity of a sweep point, used to resume a run (a missing or empty ``options`` equals ``{}``)."""
    def norm(f):
        v = row.get(f)
        if f == "options":
            return json.dumps(v or {}, sort_keys=True)
        if f == "stage":  # rows from before paired timing have none: they are sweep rows
            return v if isinstance(v, str) and v else "sweep"
        if f == "K" and v is not None and v == v:  # K is None for [M, N] techniques; NaN after a DataFrame
            return str(int(v))
        return str(None if f == "K" and v != v else v)
    return tuple(norm(f) for f in KEY_FIELDS)


class ResultsStore:
    """Append-only ``results.jsonl`` of a run folder."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "results.jsonl"

    def rows(self) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:  # a torn last line after a hard kill: skip it
                    continue
        return out

    def done_keys(self, retry_statuses: tuple = ()) -> set[tuple]:
        """Keys of points already recorded (except those whose status is in ``retry_statuses``)."""
        return {point_key(r) for r in self.rows() if r.get("status") not in retry_statuses}

    def append(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")

    def dataframe(self) -> pd.DataFrame:
        """Rows as a DataFrame; the last record of a key wins (a retried point replaces its failure)."""
        rows = self.rows()
        df = pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(COLUMNS))
        for c in COLUMNS:
            if c not in df.columns:
                df[c] = None
        if len(df):
            df["_key"] = [point_key(r) for r in df.to_dict("records")]
            df = df.drop_duplicates("_key", keep="last").drop(columns="_key")
        return df.reset_index(drop=True)


def write_tables(df: pd.DataFrame, run_dir: Path) -> None:
    """Write ``results.parquet`` and ``results.csv`` (tidy; nested fields as JSON strings)."""
    out = df.copy()
    for c in ("config", "details", "options"):
        out[c] = out[c].map(lambda v: v if v is None or isinstance(v, str) else json.dumps(v, sort_keys=True))
    cols = [c for c in COLUMNS if c in out.columns] + [c for c in out.columns if c not in COLUMNS]
    out = out[cols]
    out.to_parquet(Path(run_dir) / "results.parquet", index=False)
    out.to_csv(Path(run_dir) / "results.csv", index=False)
