r"""Paired, interleaved timing: per-round derived metrics, bootstrap intervals, replicate merging and verdicts.

The runner's paired stage times, per *window* (one shape group of one replicate), every participant of the shape
(the torch baselines and, per DSL, the best config of each DSL impl) once per *round*, in a seeded random order
(``timing.paired.order``: ``shuffled``; the runs before it used one cyclic order, ``rotated``), for many rounds;
all participants of a round see the same GPU state (clock, temperature). A derived metric is a ratio of times, so
computing it **within** a round cancels the state common to the round, and its spread over rounds is far smaller
than the spread of unpaired medians taken minutes apart.

Files of a run folder (written by the runner, read here)::

    paired_rounds.jsonl   one line per (window, round, participant):
                          technique, variant, M, N, K, dtype, replicate, window, round, dsl, impl, config_name, ms,
                          position (the place in the round's order), settled (replayed once untimed first: the
                          previous replay ran in another worker); both absent in runs before the shuffled order
    paired_windows.jsonl  one line per window: ..., n_rounds, participants, seconds, gpu_uuid and the NVML samples
                          taken during the window: sm_clock_mhz_, temperature_c_, power_w_ {min, median, max}

Written here: ``paired.parquet`` (``write``): per (shape, replicate, dsl, impl, config_name, metric) the median over
rounds and its 95 % percentile-bootstrap interval, with the window's clock / temperature / power statistics.
Metrics are fractions (0.85 = 85 %) or ratios, as in ``normfuse.metrics``, which computes them: for each round the
participants' ``ms`` become ``p50_ms`` of a small tidy frame run through ``add_rates``, ``add_hidden``,
``add_saving`` and ``add_technique_metrics`` (one call for all rounds: the metrics group by round,
``metrics.COMPARISON_KEYS``), so a metric is defined in one place.

``merge_replicates`` pools replicate runs: per cell and DSL each replicate's median [interval], a pooled median
with an interval from a bootstrap over rounds stratified by replicate, the half-widths, the spread of the
replicate medians and whether they agree (every replicate's median inside every other's interval).
``CRITERIA`` holds the acceptance criteria of issue 12 as data, ``check_criteria`` evaluates them, and ``verdict``
turns an interval and a target into "met" / "missed" / "not resolved" (never from a median alone).
Method: Efron & Tibshirani, "An Introduction to the Bootstrap" (1993), ch. 13 (percentile intervals);
``scipy.stats.bootstrap``.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from normfuse import metrics

ROUNDS_FILE = "paired_rounds.jsonl"
ROUNDS_FILE_GZ = "paired_rounds.jsonl.gz"  # what the runner writes: gzip members appended window by window
WINDOWS_FILE = "paired_windows.jsonl"


def rounds_path(run_dir: Path) -> Path | None:
    """The run's rounds file (``paired_rounds.jsonl.gz`` as the runner writes it, or a plain ``.jsonl``), or
    None when the run has no paired timing."""
    for name in (ROUNDS_FILE_GZ, ROUNDS_FILE):
        if (Path(run_dir) / name).exists():
            return Path(run_dir) / name
    return None
OUT_FILE = "paired.parquet"
SHAPE = metrics.SHAPE
PARTICIPANT = ["dsl", "impl", "config_name"]
ROUND_COLUMNS = [*SHAPE, "replicate", "window", "round", *PARTICIPANT, "ms"]
WINDOW_STATS = [f"{q}_{s}" for q in ("sm_clock_mhz", "temperature_c", "power_w") for s in ("min", "median", "max")]
CONFIDENCE = 0.95
N_RESAMPLES = 2000
SEED = 0  # every interval is drawn with a fresh generator of this seed: the same data give the same interval
ROUNDING = 1e-9  # metrics are O(1) ratios: comparisons of medians with interval ends allow this much float rounding
NOT_METRICS = {"p50_ms", "status"}  # columns the per-round frame gets besides the metrics


# ----------------------------------------------------------------------------------------------- reading
def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file (gzip-appended when it ends in .gz); a torn last line is skipped."""
    import gzip

    rows = []
    path = Path(path)
    text = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a torn last line after a hard kill: skip it, as ResultsStore does
                continue
    return rows


def _frame(path: Path | None) -> pd.DataFrame | None:
    """A JSON-lines file as a DataFrame with an integer ``replicate`` column (0 where missing); None for no file or
    no rows."""
    rows = read_jsonl(path) if path is not None else []
    if not rows:
        return None
    df = pd.DataFrame(rows)
    df["replicate"] = (df["replicate"] if "replicate" in df else pd.Series(0, index=df.index)).fillna(0).astype(int)
    return df


def _numeric_shape(df: pd.DataFrame) -> pd.DataFrame:
    """M, N, K as numbers (K None, for [M, N] techniques, becomes NaN), so that rounds and windows join."""
    for c in ("M", "N", "K"):
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def read_rounds(run_dir: Path) -> pd.DataFrame | None:
    """The run's ``paired_rounds.jsonl`` as a DataFrame (``ROUND_COLUMNS``; ``ms`` float, milliseconds), or None
    when the file is missing or empty. A missing ``replicate`` is 0.

    Raises ValueError naming the file for missing columns, null identity columns, M or N that are not integers,
    a ``ms`` that is not a number (NaN / null is allowed: that participant's time is missing in that round,
    and so are the metrics that need it), or a participant recorded twice in one round. A number <= 0 is a sample
    below the resolution of the difference method (``cudagraph_flush``: (t_flush+fn - t_flush) / n, whose noise is
    ~1-2 us: kernels of a few us can read <= 0): it is treated as missing, with a ``UserWarning`` giving the count
    and the participants, so that no ratio metric divides by it."""
    path = rounds_path(run_dir)
    df = _frame(path)
    if df is None:
        return None
    missing = [c for c in ROUND_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: rows lack the columns {missing} (need {ROUND_COLUMNS})")
    null = [c for c in ROUND_COLUMNS if c not in ("ms", "K") and df[c].isna().any()]  # K: None for [M, N] techniques
    if null:
        raise ValueError(f"{path}: null values in the identity columns {null} (only ms may be null)")
    ms = pd.to_numeric(df["ms"], errors="coerce")
    bad = df["ms"].notna() & ms.isna()
    if bad.any():
        raise ValueError(f"{path}: ms must be a time in milliseconds (a number) or null; got "
                         f"{df.loc[bad, 'ms'].iloc[0]!r} in {int(bad.sum())} rows")
    low = ms.notna() & ~(ms > 0)
    if low.any():
        who = sorted({f"{r.dsl}/{r.impl}/{r.config_name} at {r.M}x{r.N}" for r in df[low].itertuples()})
        warnings.warn(f"{path}: {int(low.sum())} samples <= 0 ms (below the timing method's resolution) treated as "
                      f"missing: {', '.join(who)}", UserWarning, stacklevel=2)
        ms = ms.where(~low)
    df["ms"] = ms.astype(float)
    _numeric_shape(df)
    if df[["M", "N"]].isna().any().any():
        raise ValueError(f"{path}: M and N must be integers")
    key = ["replicate", "window", "round", *PARTICIPANT]
    dup = df.duplicated(key)
    if dup.any():
        r = df[dup].iloc[0]
        raise ValueError(f"{path}: participant {r['dsl']}/{r['impl']}/{r['config_name']} appears twice in round "
                         f"{r['round']} of window {r['window']} (replicate {r['replicate']})")
    return df


def read_windows(run_dir: Path) -> pd.DataFrame | None:
    """The run's ``paired_windows.jsonl`` (one row per window; the NVML columns may be null), or None."""
    path = Path(run_dir) / WINDOWS_FILE
    df = _frame(path if path.exists() else None)
    if df is None:
        return None
    for c in WINDOW_STATS:
        df[c] = pd.to_numeric(df[c], errors="coerce") if c in df else np.nan
    if "gpu_uuid" not in df:
        df["gpu_uuid"] = None
    return _numeric_shape(df)


# ----------------------------------------------------------------------------------------------- per round
def round_metrics(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per-round derived metrics, long: one row per (round, participant, metric) with its ``value``.

    ``rounds``: ``read_rounds``'s frame (several replicates may be concatenated). Each round's participants become a
    tidy frame with ``p50_ms = ms`` and ``status = "ok"`` and go through ``normfuse.metrics`` (``add_rates``,
    ``add_hidden``, ``add_saving``, ``add_technique_metrics``), grouped by (shape, replicate, window, round); every
    column those functions add is a metric (``tflops``, ``gbps``, ``hidden_dsl``, ``hidden_best``, ``speedup``,
    ``frac_cublas``, ``saving``, the technique's own, e.g. fna_llm's ``sdpa_fraction``). NaN values (a metric that
    does not apply to a participant, or a missing time) are dropped."""
    frame = rounds.assign(p50_ms=rounds["ms"], status="ok")
    out = metrics.add_technique_metrics(metrics.add_saving(metrics.add_hidden(metrics.add_rates(frame))))
    names = [c for c in out.columns if c not in frame.columns and c not in NOT_METRICS]
    idx = [*SHAPE, "replicate", "window", "round", *PARTICIPANT]
    long = out[idx + names].melt(id_vars=idx, value_vars=names, var_name="metric", value_name="value")
    long["value"] = pd.to_numeric(long["value"], errors="coerce")
    return long[np.isfinite(long["value"])].reset_index(drop=True)


# ----------------------------------------------------------------------------------------------- intervals
def median_ci(values, confidence: float = CONFIDENCE) -> tuple[float, float, float, int]:
    """``(median, lo, hi, n)`` of the finite ``values``: the median and its percentile-bootstrap interval
    (``N_RESAMPLES`` resamples, generator seeded with ``SEED``). ``lo``/``hi`` are NaN with fewer than 2 values."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return np.nan, np.nan, np.nan, 0
    if len(x) < 2:
        return float(x[0]), np.nan, np.nan, 1
    res = stats.bootstrap((x,), np.median, n_resamples=N_RESAMPLES, method="percentile",
                          confidence_level=confidence, vectorized=True, axis=-1, rng=np.random.default_rng(SEED))
    return float(np.median(x)), float(res.confidence_interval.low), float(res.confidence_interval.high), len(x)


def pooled_median_ci(samples: list, confidence: float = CONFIDENCE) -> tuple[float, float, float, int]:
    """``(median, lo, hi, n)`` of several replicates' values pooled: the median of all finite values and a
    percentile-bootstrap interval that resamples each replicate's values within that replicate (stratified: every
    resample keeps each replicate's number of rounds). Replicates with fewer than 2 values are left out of the
    interval (NaN when none is left)."""
    xs = [np.asarray(s, dtype=float) for s in samples]
    xs = [x[np.isfinite(x)] for x in xs]
    allx = np.concatenate(xs) if xs else np.array([])
    if len(allx) == 0:
        return np.nan, np.nan, np.nan, 0
    strata = [x for x in xs if len(x) >= 2]
    if not strata:
        return float(np.median(allx)), np.nan, np.nan, len(allx)

    def pooled(*parts, axis=-1):
        return np.median(np.concatenate(parts, axis=axis), axis=axis)

    res = stats.bootstrap(tuple(strata), pooled, n_resamples=N_RESAMPLES, method="percentile",
                          confidence_level=confidence, vectorized=True, axis=-1, rng=np.random.default_rng(SEED))
    return float(np.median(allx)), float(res.confidence_interval.low), float(res.confidence_interval.high), len(allx)


def summarize(long: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group of ``by``: ``median``, ``ci_lo``, ``ci_hi`` (``median_ci`` of ``value``) and ``n_rounds``."""
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=stats.DegenerateDataWarning)  # all rounds equal: lo = hi
        for key, g in long.groupby(by, dropna=False, sort=True):
            med, lo, hi, n = median_ci(g["value"].to_numpy())
            rows.append({**dict(zip(by, key)), "median": med, "ci_lo": lo, "ci_hi": hi, "n_rounds": n})
    return pd.DataFrame(rows, columns=[*by, "median", "ci_lo", "ci_hi", "n_rounds"])


# ----------------------------------------------------------------------------------------------- one run
def compute(run_dir: Path) -> pd.DataFrame | None:
    """The ``paired.parquet`` table of a run folder (see ``write``) without writing it; None without rounds."""
    rounds = read_rounds(run_dir)
    if rounds is None:
        return None
    by = [*SHAPE, "replicate", "window", "dsl", "impl", "config_name", "metric"]
    out = summarize(round_metrics(rounds), by)
    windows = read_windows(run_dir)
    if windows is not None:
        w = windows[[*SHAPE, "replicate", "window", "gpu_uuid", *WINDOW_STATS]].drop_duplicates(
            [*SHAPE, "replicate", "window"], keep="last")
        out = out.merge(w, on=[*SHAPE, "replicate", "window"], how="left")
    else:
        out["gpu_uuid"] = None
        for c in WINDOW_STATS:
            out[c] = np.nan
    return out


def write(run_dir: Path, out_dir: Path | None = None) -> pd.DataFrame | None:
    """Compute the run's paired metrics from ``<run_dir>/paired_rounds.jsonl`` and write ``paired.parquet`` into
    ``out_dir`` (default: ``run_dir``). Returns the table, or None (nothing written) when the run has no rounds.

    Columns: technique, variant, M, N, K, dtype, replicate, window, dsl, impl, config_name, metric, median, ci_lo,
    ci_hi (the 95 % percentile-bootstrap interval of the median over rounds; NaN with < 2 rounds), n_rounds,
    gpu_uuid and the window's sm_clock_mhz_/temperature_c_/power_w_ min/median/max (NaN without NVML).
    Raises ValueError for malformed round files (``read_rounds``)."""
    out = compute(run_dir)
    if out is None:
        return None
    target = Path(out_dir) if out_dir is not None else Path(run_dir)
    target.mkdir(parents=True, exist_ok=True)
    out.to_parquet(target / OUT_FILE, index=False)
    return out


def load(run_dir: Path) -> pd.DataFrame | None:
    """``paired.parquet`` of a run folder if it exists, else computed from its rounds (``compute``), else None."""
    p = Path(run_dir) / OUT_FILE
    if p.exists():
        return pd.read_parquet(p)
    return compute(run_dir)


# ----------------------------------------------------------------------------------------------- replicates
def replicate_dirs(top: Path) -> list[Path]:
    """The ``rep<k>/`` run folders of a replicated run, in the order of k ([] when there are none)."""
    reps = [d for d in Path(top).glob("rep*") if d.is_dir() and d.name[3:].isdigit()]
    return sorted(reps, key=lambda d: int(d.name[3:]))


def merge_replicates(rep_dirs: list[Path]) -> pd.DataFrame:
    """Merge the paired rounds of replicate runs: one row per (shape, dsl, impl, metric).

    Replicates are numbered by their position in ``rep_dirs`` (their names in ``runs``). Where a (dsl, impl) has
    several configs in the rounds (runs with ``timing.paired.only``), each config is pooled on its own and the one
    with the highest pooled median is kept (the metrics are higher-is-better). Columns: the shape,
    dsl, impl, metric; ``runs``, ``configs`` (each replicate's config_name), ``rep_median``, ``rep_ci_lo``,
    ``rep_ci_hi``, ``rep_n_rounds`` (lists in replicate order; NaN where a replicate lacks the cell);
    ``n_replicates``; the pooled ``median`` [``ci_lo``, ``ci_hi``] (``pooled_median_ci``: bootstrap over rounds
    stratified by replicate) and ``half_width`` = (ci_hi − ci_lo) / 2; ``rep_half_width_max``, the largest
    replicate half-width; ``spread`` = max − min of the replicate medians; ``agree``: every replicate's median
    lies inside every other replicate's interval; ``overlap``: all replicate intervals share a point (both NA
    with fewer than two replicates holding the cell); ``n_rounds`` in all.

    ``agree`` is strict: for replicates that measure the same thing without any bias it holds only when the range
    of the medians is below one interval half-width (about 1.96 standard errors), i.e. in about 65 % of cells
    with three replicates (``overlap``, ranges up to two half-widths: about 98 %).

    Raises ValueError when ``rep_dirs`` is empty or a folder has no ``paired_rounds.jsonl``."""
    if not rep_dirs:
        raise ValueError("merge_replicates needs at least one run folder")
    parts = []
    for k, d in enumerate(rep_dirs):
        r = read_rounds(d)
        if r is None:
            raise ValueError(f"{d} has no {ROUNDS_FILE}: not a run with paired timing")
        parts.append(r.assign(replicate=k))
    names = [Path(d).name for d in rep_dirs]
    long = round_metrics(pd.concat(parts, ignore_index=True))
    cell = [*SHAPE, "dsl", "impl", "metric"]
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=stats.DegenerateDataWarning)
        for key, g in long.groupby([*cell, "config_name"], dropna=False, sort=True):
            key = key[:-1]
            reps = [g[g["replicate"] == k] for k in range(len(rep_dirs))]
            per = [median_ci(x["value"].to_numpy()) if len(x) else (np.nan, np.nan, np.nan, 0) for x in reps]
            med, lo, hi, n = pooled_median_ci([x["value"].to_numpy() for x in reps if len(x)])
            meds = np.array([p[0] for p in per])
            los, his = np.array([p[1] for p in per]), np.array([p[2] for p in per])
            have = np.isfinite(meds)
            rows.append({
                **dict(zip(cell, key)), "runs": names,
                "configs": [str(x["config_name"].iloc[0]) if len(x) else None for x in reps],
                "rep_median": meds.tolist(), "rep_ci_lo": los.tolist(), "rep_ci_hi": his.tolist(),
                "rep_n_rounds": [p[3] for p in per], "n_replicates": int(have.sum()),
                "median": med, "ci_lo": lo, "ci_hi": hi, "half_width": (hi - lo) / 2,
                "rep_half_width_max": float(np.max((his - los)[have]) / 2) if have.any() else np.nan,
                "spread": float(np.ptp(meds[have])) if have.any() else np.nan,
                "agree": _agree(meds[have], los[have], his[have]),
                "overlap": _overlap(los[have], his[have]), "n_rounds": n})
    out = pd.DataFrame(rows)
    if len(out):  # several configs of one (dsl, impl) in a window (paired.only): the one with the best pooled median
        best = out.assign(_m=out["median"].fillna(-np.inf)).groupby(cell, dropna=False)["_m"].idxmax()
        out = out.loc[best.to_numpy()].reset_index(drop=True)
    for c in ("agree", "overlap"):
        if c in out:
            out[c] = out[c].astype("boolean")
    return out


def _agree(meds, los, his):
    """Every median inside every other replicate's interval (a missing interval never agrees); NA if < 2."""
    if len(meds) < 2:
        return pd.NA
    for i in range(len(meds)):
        for j in range(len(meds)):
            if i != j and not (los[j] - ROUNDING <= meds[i] <= his[j] + ROUNDING):
                return False
    return True


def _overlap(los, his):
    """Every two replicates' intervals overlap (a missing interval never does); NA with fewer than 2."""
    if len(los) < 2:
        return pd.NA
    if not (np.isfinite(los).all() and np.isfinite(his).all()):
        return False
    return bool(np.max(los) <= np.min(his) + ROUNDING)


# ----------------------------------------------------------------------------------------------- verdicts
VERDICTS = ("met", "missed", "not resolved")
# metrics proportional to t_reference / t_x (or to 1 / t_x): a relative timing resolution r is a relative r of them
RATIO_METRICS = ("compile_ratio", "speedup_vs_unfused", "sdpa_fraction", "frac_cublas", "gbps", "tflops")


def check_resolution(resolution, name: str = "resolution") -> float:
    """``resolution`` as a float when it is a relative timing resolution: a number in [0, 1) (0.005 = ±0.5 %;
    nan and infinities refused); else ValueError "<name> must be a fraction in [0, 1) ...". The one rule for
    ``verdict`` and the ``--resolution`` options of ``experiments.report`` and ``tools.fna_llm_targets``."""
    if not (isinstance(resolution, (int, float)) and 0 <= resolution < 1):  # nan fails the comparison
        raise ValueError(f"{name} must be a fraction in [0, 1) (0.005 = ±0.5 %), got {resolution!r}")
    return float(resolution)


def verdict(ci_lo: float, ci_hi: float, target: float | None, median: float | None = None,
            resolution: float = 0.0) -> str | None:
    """"met" when the whole interval is at or above ``target`` (``ci_lo >= target``), "missed" when it is below
    (``ci_hi < target``), else "not resolved" (the interval straddles the target, or there is no interval);
    None without a target. Never decided from a median alone. Units: those of the metric (fractions).

    ``resolution`` (a fraction, e.g. 0.005; needs ``median``) is the harness's relative resolution for a ratio of
    two times: the interval is widened to at least ``median * (1 ± resolution)`` first, so a bootstrap interval
    narrower than what timing the same kernel twice can tell apart (an A/A twin: docs/measurement.md, "The order
    within a round") decides nothing. Only meaningful for metrics proportional to a ratio of times (``RATIO_METRICS``).
    Raises ValueError for a ``resolution`` outside [0, 1) (``check_resolution``), or a positive one without a
    finite median."""
    check_resolution(resolution)
    if target is None or not np.isfinite(target):
        return None
    if ci_lo is None or ci_hi is None or not (np.isfinite(ci_lo) and np.isfinite(ci_hi)):
        return "not resolved"
    if resolution > 0:
        if median is None or not np.isfinite(median):
            raise ValueError("verdict with a resolution needs the finite median it is relative to")
        ci_lo, ci_hi = min(ci_lo, median * (1 - resolution)), max(ci_hi, median * (1 + resolution))
    if ci_lo >= target:
        return "met"
    if ci_hi < target:
        return "missed"
    return "not resolved"


@dataclass(frozen=True)
class Criterion:
    """An acceptance criterion for replicated paired measurements of one technique (issue 12's "done when").

    ``metric``: the metric judged (None: the spec's ``PRIMARY_METRIC``, ``hidden_dsl`` if it has none), on the best
    DSL per cell (highest pooled median of the fused rows). ``half_width``: ((K_max, limit), ...): a cell with
    K <= K_max (first match) needs every replicate's interval half-width <= limit; cells beyond the last K_max
    have no half-width limit. ``agree``: the name of ``merge_replicates``' flag that must hold (``"agree"``: each
    median inside every other replicate's interval; ``"overlap"``: the intervals overlap), None for no such
    requirement. ``max_spread``: max − min of the replicate medians <= this; ``spread_within_half_width``: max −
    min of the replicate medians <= the cell's half-width limit (the replicates agree to the precision asked of
    each). Units: fractions (0.05 = 5 points)."""
    metric: str | None = None
    half_width: tuple[tuple[int, float], ...] = ()
    agree: str | None = None
    max_spread: float | None = None
    spread_within_half_width: bool = False
    source: str = ""

    def half_width_limit(self, K) -> float | None:
        for k_max, limit in self.half_width:
            if K is not None and np.isfinite(K) and K <= k_max:
                return limit
        return None


# "the three replicate medians agree within those intervals": the replicate medians lie within the required
# interval width of each other (spread <= the cell's half-width limit). Stricter readings are reported beside it,
# not required: "agree" (each median inside every other replicate's interval) fails in about 35 % of cells even
# for unbiased replicates (see merge_replicates), and both it and "overlap" fail for intervals far narrower than
# the limit (±0.2 points) once runs differ systematically by a few tenths of a point.
_GEMM_RULE = Criterion(half_width=((1024, 0.05), (2048, 0.10)), spread_within_half_width=True,
                       source="issue 12: half-width <= 5 points at K <= 1024, <= 10 at K = 2048; replicate medians "
                              "within that width of each other")
CRITERIA = {
    "lazy_prenorm": _GEMM_RULE,
    "multi_cta": _GEMM_RULE,
    "fna_llm": Criterion(metric="sdpa_fraction", max_spread=0.02,
                         source="issue 12: fraction of SDPA agrees within 2 points across replicates"),
}


def check_criteria(merged: pd.DataFrame, criteria: dict | None = None) -> pd.DataFrame:
    """Evaluate ``CRITERIA`` (or ``criteria``) on ``merge_replicates``' table: one row per cell (shape) of the
    techniques that have a criterion, for the best DSL (highest pooled median of the criterion's metric among the
    fused rows): ``best_dsl``, ``median``, ``ci_lo``, ``ci_hi``, ``rep_half_width_max``, ``half_width_limit``,
    ``spread``, ``agree``, ``overlap``, and the booleans ``half_width_ok``, ``agree_ok``, ``spread_ok`` (NA where
    the criterion sets no such limit) and ``holds`` (all set limits hold)."""
    from normfuse.techniques import get_technique

    criteria = CRITERIA if criteria is None else criteria
    rows = []
    for tech, g in merged.groupby("technique"):
        crit = criteria.get(tech)
        if crit is None:
            continue
        metric = crit.metric or getattr(get_technique(tech), "PRIMARY_METRIC", "hidden_dsl")
        f = g[(g["impl"] == "fused") & (g["metric"] == metric) & (g["dsl"] != "torch") & g["median"].notna()]
        for key, c in f.groupby(SHAPE, dropna=False):
            b = c.loc[c["median"].idxmax()]
            limit = crit.half_width_limit(b["K"])
            hw_ok = pd.NA if limit is None else bool(b["rep_half_width_max"] <= limit)
            agree_ok = pd.NA if not crit.agree else (False if pd.isna(b[crit.agree]) else bool(b[crit.agree]))
            max_spread = limit if crit.spread_within_half_width else crit.max_spread
            spread_ok = pd.NA if max_spread is None else bool(b["spread"] <= max_spread + 1e-12)
            if b["n_replicates"] < 2:  # agreement across replicates needs two of them: not judged
                agree_ok = spread_ok = pd.NA
            checks = [x for x in (hw_ok, agree_ok, spread_ok) if x is not pd.NA]
            if b["n_replicates"] < 2 and (crit.agree or max_spread is not None):
                checks = []  # a replicate criterion on one replicate: neither holds nor fails
            rows.append({**dict(zip(SHAPE, key)), "metric": metric, "best_dsl": b["dsl"], "median": b["median"],
                         "ci_lo": b["ci_lo"], "ci_hi": b["ci_hi"], "rep_half_width_max": b["rep_half_width_max"],
                         "half_width_limit": limit, "spread": b["spread"], "max_spread": max_spread,
                         "agree": b["agree"], "overlap": b["overlap"], "half_width_ok": hw_ok,
                         "agree_ok": agree_ok, "spread_ok": spread_ok,
                         "holds": bool(all(checks)) if checks else pd.NA, "criterion": crit.source})
    out = pd.DataFrame(rows)
    for c in ("half_width_ok", "agree_ok", "spread_ok", "holds"):
        if c in out:
            out[c] = out[c].astype("boolean")
    return out
