"""Paired timing statistics (normfuse.paired) on synthetic run folders of exactly the runner's data contract:
per-round metrics by normfuse.metrics, bootstrap intervals, verdicts, replicate merging and the criteria."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from normfuse import metrics, paired

# ----------------------------------------------------------------------------------------------------------------
# synthetic run folders (the runner's contract: results.jsonl with stage sweep/paired rows, paired_rounds.jsonl,
# paired_windows.jsonl, meta.json; replicates as rep<k>/ folders)
# ----------------------------------------------------------------------------------------------------------------
GEMM_CELLS = ((512, 512), (1024, 2048), (2048, 1024))  # (K, N)
HIDDEN = {"triton": 0.60, "helion": 0.30, "tlx": 0.75}  # true hidden_dsl of each DSL's fused kernel


def gemm_times(K: int, N: int, hidden: dict = HIDDEN) -> dict:
    """Noise-free times (ms) of the lazy_prenorm participants at one cell: T_fused = T_gemm + (1 - h) T_norm, so
    hidden_dsl = h exactly; every DSL GEMM is 5 % slower than cuBLAS."""
    t_cublas, t_norm = 0.25 * (K / 512) * (N / 512), 0.13 * (K / 512)
    t = {("torch", "cublas", "-"): t_cublas, ("torch", "torch_compile_norm", "-"): t_norm}
    for d, h in hidden.items():
        t[(d, "gemm", f"{d}-g")] = 1.05 * t_cublas
        t[(d, "fused", f"{d}-f")] = 1.05 * t_cublas + (1 - h) * t_norm
    return t


def llm_times(S: int, B: int, frac: dict) -> dict:
    """fna_llm participants at (S, B): SDPA 1 ms, SDPA + norms 1.1 ms, fused = T_sdpa / frac (sdpa_fraction)."""
    t = {("torch", "sdpa", "-"): 1.0, ("torch", "sdpa_plus_norms", "-"): 1.1}
    for d, f in frac.items():
        t[(d, "fused", f"{d}-f")] = 1.0 / f
        t[(d, "attention", f"{d}-a")] = 0.95 / f
    return t


@pytest.fixture(autouse=True)
def fewer_resamples(request, monkeypatch):
    """400 bootstrap resamples (fast) except where the interval itself is under test."""
    if "covers_a_known_median" not in request.node.name:
        monkeypatch.setattr(paired, "N_RESAMPLES", 400)


def make_run(run_dir: Path, *, technique="lazy_prenorm", variant="rmsnorm", M=262144, cells=GEMM_CELLS,
             times=gemm_times, replicate=0, rounds=120, clock_sd=0.05, noise_sd=0.002, seed=0, shuffle=False,
             nvml=True) -> Path:
    """Write a run folder: per cell one window of ``rounds`` rounds; each round's times are the true times times a
    clock factor common to the round (lognormal, ``clock_sd``) times independent noise (``noise_sd``).
    ``shuffle`` breaks the pairing (each participant's times permuted across rounds: what timing the participants
    minutes apart gives)."""
    rng = np.random.default_rng(seed)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rounds_out, windows_out, rows = [], [], []
    for w, (K, N) in enumerate(cells):
        shape = dict(technique=technique, variant=variant, M=M, N=N, K=K, dtype="bf16")
        truth = times(K, N)
        per = {p: [] for p in truth}
        for r in range(rounds):
            c = float(np.exp(rng.normal(0, clock_sd)))
            for p, t in truth.items():
                per[p].append(t * c * float(np.exp(rng.normal(0, noise_sd))))
        if shuffle:
            per = {p: list(rng.permutation(v)) for p, v in per.items()}
        for r in range(rounds):
            for (dsl, impl, cfg), ms in per.items():
                rounds_out.append({**shape, "replicate": replicate, "window": w, "round": r, "dsl": dsl,
                                   "impl": impl, "config_name": cfg, "ms": ms[r]})
        clock = dict(sm_clock_mhz_min=1500, sm_clock_mhz_median=1830, sm_clock_mhz_max=1980, temperature_c_min=40,
                     temperature_c_median=52, temperature_c_max=61, power_w_min=300, power_w_median=610,
                     power_w_max=700) if nvml else {k: None for k in paired.WINDOW_STATS}
        windows_out.append({**shape, "replicate": replicate, "window": w, "n_rounds": rounds,
                            "participants": ["/".join(p) for p in truth], "seconds": 3.0,
                            "gpu_uuid": "GPU-synthetic" if nvml else None, **clock})
        for (dsl, impl, cfg), t in truth.items():
            base = {**shape, "dsl": dsl, "impl": impl, "config_name": cfg, "status": "ok", "mode": "gpu",
                    "experiment": f"{technique}_synthetic", "replicate": replicate, "error": None, "eps": 1e-6,
                    "options": {}, "config": {}}
            rows.append({**base, "stage": "sweep", "p20_ms": t * 0.99, "p50_ms": t, "p80_ms": t * 1.01,
                         "n_samples": 100, "timing": "cudagraph_flush"})
            v = np.array(per[(dsl, impl, cfg)])
            rows.append({**base, "stage": "paired", "p20_ms": float(np.quantile(v, 0.2)),
                         "p50_ms": float(np.median(v)), "p80_ms": float(np.quantile(v, 0.8)),
                         "n_samples": rounds, "timing": "paired"})
    for name, data in ((paired.ROUNDS_FILE, rounds_out), (paired.WINDOWS_FILE, windows_out), ("results.jsonl", rows)):
        (run_dir / name).write_text("".join(json.dumps(x) + "\n" for x in data))
    (run_dir / "meta.json").write_text(json.dumps({"mode": "gpu", "run_id": run_dir.name, "replicate": replicate,
                                                   "hardware_before": {"gpu_name": "NVIDIA H200",
                                                                       "power_limit_w": 700.0}}))
    return run_dir


def make_replicated(top: Path, n: int = 3, **kw) -> list[Path]:
    """``top/rep0``, ``top/rep1``, ...: ``n`` replicates (different seeds) of ``make_run``."""
    return [make_run(Path(top) / f"rep{k}", replicate=k, seed=100 + k, **kw) for k in range(n)]


def _cell(table, dsl="tlx", metric="hidden_dsl", K=1024, N=2048, impl="fused"):
    r = table[(table.dsl == dsl) & (table.metric == metric) & (table.K == K) & (table.N == N) & (table.impl == impl)]
    assert len(r) == 1, r
    return r.iloc[0]


# ----------------------------------------------------------------------------------------------------------------
# intervals
# ----------------------------------------------------------------------------------------------------------------
def test_bootstrap_interval_covers_a_known_median():
    """The 95 % percentile-bootstrap interval of the median covers the true median of the distribution in about 95 %
    of samples (40 samples of 150 draws of a skewed distribution: at least 34 covered), is reproducible, and
    brackets the sample median."""
    true_median = float(np.exp(0.0))  # lognormal(0, 0.5): median exp(0) = 1, mean 1.13
    covered = 0
    for s in range(40):
        x = np.random.default_rng(s).lognormal(0.0, 0.5, size=150)
        med, lo, hi, n = paired.median_ci(x)
        assert n == 150 and lo <= med <= hi and med == pytest.approx(np.median(x))
        covered += lo <= true_median <= hi
    assert 34 <= covered <= 40
    x = np.random.default_rng(7).lognormal(0.0, 0.5, size=150)
    assert paired.median_ci(x) == paired.median_ci(x)  # fixed seed
    assert np.isnan(paired.median_ci([1.0])[1]) and paired.median_ci([])[3] == 0
    assert paired.median_ci([2.0, np.nan, 2.0])[:3] == (2.0, 2.0, 2.0)  # NaN dropped; equal values: lo = hi


def test_pooled_interval_is_stratified_and_narrower():
    rng = np.random.default_rng(3)
    a, b, c = (rng.normal(m, 1.0, 100) for m in (0.0, 0.1, -0.1))
    med, lo, hi, n = paired.pooled_median_ci([a, b, c])
    assert n == 300 and med == pytest.approx(np.median(np.concatenate([a, b, c])))
    one = paired.median_ci(a)
    assert lo <= med <= hi and (hi - lo) < (one[2] - one[1])  # three times the rounds: a narrower interval
    assert np.isnan(paired.pooled_median_ci([[1.0], [2.0]])[1])  # no replicate with 2 values: no interval


# ----------------------------------------------------------------------------------------------------------------
# one run
# ----------------------------------------------------------------------------------------------------------------
def test_write_computes_metrics_per_round_with_the_metrics_module(tmp_path):
    run = make_run(tmp_path / "run", clock_sd=0.0, noise_sd=0.0, rounds=5)
    table = paired.write(run)
    assert (run / paired.OUT_FILE).exists()
    assert list(pd.read_parquet(run / paired.OUT_FILE).columns) == list(table.columns)
    need = {*metrics.SHAPE, "replicate", "dsl", "config_name", "metric", "median", "ci_lo", "ci_hi", "n_rounds",
            *paired.WINDOW_STATS}
    assert need <= set(table.columns)
    # noise-free: every round gives the true value, and it is what metrics.add_hidden gives on the sweep rows
    for (K, N) in GEMM_CELLS:
        for d, h in HIDDEN.items():
            r = _cell(table, d, "hidden_dsl", K, N)
            assert r["median"] == pytest.approx(h) and r.ci_lo == pytest.approx(h) and r.ci_hi == pytest.approx(h)
            assert r.n_rounds == 5 and r.config_name == f"{d}-f" and r.sm_clock_mhz_max == 1980
    sweep = pd.DataFrame([json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()])
    sweep = metrics.add_hidden(metrics.add_rates(sweep[sweep.stage == "sweep"]))
    s = sweep[(sweep.impl == "fused") & (sweep.dsl == "tlx") & (sweep.K == 1024)].iloc[0]
    r = _cell(table, "tlx", "hidden_best")
    assert r["median"] == pytest.approx(s.hidden_best)
    assert _cell(table, "tlx", "frac_cublas", impl="gemm")["median"] == pytest.approx(1 / 1.05)
    assert {"tflops", "gbps", "speedup"} <= set(table.metric)


def test_no_rounds_means_none_and_no_file(tmp_path):
    (tmp_path / "results.jsonl").write_text("")
    assert paired.write(tmp_path) is None and not (tmp_path / paired.OUT_FILE).exists()
    assert paired.load(tmp_path) is None


def test_nvml_may_be_missing_and_out_dir_is_respected(tmp_path):
    run = make_run(tmp_path / "run", rounds=10, nvml=False)
    (run / paired.WINDOWS_FILE).unlink()
    table = paired.write(run, out_dir=tmp_path / "elsewhere")
    assert not (run / paired.OUT_FILE).exists() and (tmp_path / "elsewhere" / paired.OUT_FILE).exists()
    assert table["sm_clock_mhz_median"].isna().all()


@pytest.mark.parametrize("edit, match", [
    (lambda r: r.pop("window"), "null values in the identity columns"),
    (lambda r: r.update(ms="fast"), "ms must be a time in milliseconds"),
    (lambda r: r.update(M="big"), "M and N must be integers"),
])
def test_malformed_rounds_raise(tmp_path, edit, match):
    run = make_run(tmp_path / "run", rounds=3)
    lines = (run / paired.ROUNDS_FILE).read_text().splitlines()
    first = json.loads(lines[0])
    edit(first)
    (run / paired.ROUNDS_FILE).write_text("\n".join([json.dumps(first)] + lines[1:]) + "\n")
    with pytest.raises(ValueError, match=match):
        paired.write(run)


def test_rounds_without_a_column_raise(tmp_path):
    run = make_run(tmp_path / "run", rounds=3)
    rows = [json.loads(x) for x in (run / paired.ROUNDS_FILE).read_text().splitlines()]
    (run / paired.ROUNDS_FILE).write_text("".join(json.dumps({k: v for k, v in r.items() if k != "config_name"})
                                                  + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"lack the columns \['config_name'\]"):
        paired.write(run)


def test_duplicate_participant_in_a_round_raises(tmp_path):
    run = make_run(tmp_path / "run", rounds=3)
    lines = (run / paired.ROUNDS_FILE).read_text().splitlines()
    (run / paired.ROUNDS_FILE).write_text("\n".join(lines + [lines[0]]) + "\n")
    with pytest.raises(ValueError, match="appears twice"):
        paired.write(run)


def test_missing_time_in_a_round_drops_only_that_rounds_metrics(tmp_path):
    run = make_run(tmp_path / "run", rounds=6, clock_sd=0.0, noise_sd=0.0)
    rows = [json.loads(x) for x in (run / paired.ROUNDS_FILE).read_text().splitlines()]
    for r in rows:
        if r["window"] == 1 and r["round"] == 2 and r["dsl"] == "tlx" and r["impl"] == "gemm":
            r["ms"] = None
    (run / paired.ROUNDS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = paired.compute(run)
    assert _cell(table, "tlx", "hidden_dsl").n_rounds == 5  # hidden_dsl needs the GEMM: 1 round lost
    assert _cell(table, "tlx", "hidden_best").n_rounds == 6  # min(cuBLAS, GEMM): still defined
    assert _cell(table, "triton", "hidden_dsl").n_rounds == 6


def test_pairing_cancels_a_common_clock_factor(tmp_path):
    """A 5 % per-round clock factor common to all participants: the paired per-round hidden_dsl has a far narrower
    interval than the same times with the pairing broken (each participant's rounds shuffled), and it covers the
    true value."""
    pair = paired.compute(make_run(tmp_path / "paired", rounds=150, clock_sd=0.05, seed=1))
    unpaired = paired.compute(make_run(tmp_path / "unpaired", rounds=150, clock_sd=0.05, seed=1, shuffle=True))
    for (K, N) in GEMM_CELLS:
        p, u = _cell(pair, "tlx", "hidden_dsl", K, N), _cell(unpaired, "tlx", "hidden_dsl", K, N)
        assert p.ci_lo - 0.005 <= HIDDEN["tlx"] <= p.ci_hi + 0.005
        assert (p.ci_hi - p.ci_lo) * 5 < (u.ci_hi - u.ci_lo)
        assert (p.ci_hi - p.ci_lo) / 2 < 0.05  # the 5-point half-width
    # the per-participant times themselves carry the clock noise either way (medians of ms, not of ratios)
    t = _cell(pair, "tlx", "tflops")
    assert (t.ci_hi - t.ci_lo) / t["median"] > 0.005


# ----------------------------------------------------------------------------------------------------------------
# verdicts
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lo, hi, target, want", [
    (0.80, 0.90, 0.75, "met"), (0.75, 0.90, 0.75, "met"),        # whole interval at or above the target
    (0.60, 0.70, 0.75, "missed"),                                # whole interval below
    (0.70, 0.80, 0.75, "not resolved"),                          # straddles: never met/missed from the median
    (np.nan, np.nan, 0.75, "not resolved"),                      # no interval (one round)
    (0.70, 0.80, None, None), (0.70, 0.80, np.nan, None),        # no target
])
def test_verdict(lo, hi, target, want):
    assert paired.verdict(lo, hi, target) == want


def test_verdict_resolution_widens_narrow_intervals():
    # 1.004 [1.002, 1.005] is "met" by the bootstrap interval alone, not with a ±0.5 % timing resolution
    assert paired.verdict(1.002, 1.005, 1.0) == "met"
    assert paired.verdict(1.002, 1.005, 1.0, median=1.004, resolution=0.005) == "not resolved"
    assert paired.verdict(0.990, 0.993, 1.0, median=0.991, resolution=0.005) == "missed"  # 0.991 * 1.005 < 1
    assert paired.verdict(1.017, 1.023, 1.0, median=1.019, resolution=0.005) == "met"      # wide of the floor
    assert paired.verdict(0.9, 1.1, 1.0, median=1.0, resolution=0.005) == "not resolved"   # never narrowed
    assert paired.verdict(1.002, 1.005, None, median=1.004, resolution=0.005) is None
    for bad in (-0.01, np.nan, np.inf, "0.5"):
        with pytest.raises(ValueError, match="resolution"):
            paired.verdict(1.002, 1.005, 1.0, median=1.004, resolution=bad)
    with pytest.raises(ValueError, match="median"):
        paired.verdict(1.002, 1.005, 1.0, resolution=0.005)
    assert set(paired.RATIO_METRICS) >= {"compile_ratio", "speedup_vs_unfused", "sdpa_fraction"}


# ----------------------------------------------------------------------------------------------------------------
# replicates
# ----------------------------------------------------------------------------------------------------------------
def test_merge_replicates_agree_and_criteria_hold(tmp_path):
    """Replicates with per-round clock noise but no noise within a round: the per-round metrics are exact, the
    replicates agree, the criteria hold."""
    reps = make_replicated(tmp_path / "run", rounds=80, clock_sd=0.05, noise_sd=0.0)
    assert paired.replicate_dirs(tmp_path / "run") == reps
    m = paired.merge_replicates(reps)
    r = _cell(m, "tlx", "hidden_dsl")
    assert r.runs == ["rep0", "rep1", "rep2"] and r.n_replicates == 3 and r.n_rounds == 240
    assert r["median"] == pytest.approx(HIDDEN["tlx"]) and r.ci_lo == pytest.approx(r.ci_hi)
    assert bool(r.agree) and bool(r.overlap) and r.spread < 1e-9 and r.configs == ["tlx-f"] * 3
    crit = paired.check_criteria(m)
    assert len(crit) == len(GEMM_CELLS) and (crit.best_dsl == "tlx").all()
    assert crit.holds.all() and crit.half_width_ok.all() and crit.agree_ok.isna().all() and crit.spread_ok.all()
    assert set(crit.half_width_limit) == {0.05, 0.10}  # K <= 1024: 5 points; K = 2048: 10


def test_merge_replicates_pools_noisy_rounds(tmp_path):
    reps = make_replicated(tmp_path / "run", rounds=150)
    m = paired.merge_replicates(reps)
    r = _cell(m, "tlx", "hidden_dsl")
    assert r.n_rounds == 450 and len(r.rep_median) == 3
    assert all(lo <= med <= hi for lo, med, hi in zip(r.rep_ci_lo, r.rep_median, r.rep_ci_hi))
    assert r["median"] == pytest.approx(HIDDEN["tlx"], abs=0.005) and r.ci_lo <= r["median"] <= r.ci_hi
    assert r.half_width < r.rep_half_width_max  # three replicates' rounds: a narrower pooled interval
    f = m[(m.metric == "hidden_dsl") & (m.impl == "fused")]
    assert f.overlap.all() and (f.spread < 0.02).all()  # unbiased replicates: the intervals overlap


def test_merge_flags_disagreeing_replicates(tmp_path):
    reps = make_replicated(tmp_path / "run", n=2, rounds=100)
    shifted = dict(HIDDEN, tlx=0.55)  # the third replicate's TLX kernel hides 20 points less
    reps.append(make_run(tmp_path / "run" / "rep2", replicate=2, seed=9, rounds=100,
                         times=lambda K, N: gemm_times(K, N, shifted)))
    m = paired.merge_replicates(reps)
    r = _cell(m, "tlx", "hidden_dsl")
    assert not bool(r.agree) and r.spread == pytest.approx(0.20, abs=0.02)
    assert bool(_cell(m, "triton", "hidden_dsl").agree)  # the other DSLs are unchanged
    crit = paired.check_criteria(m)
    assert not crit.holds.any() and not crit.spread_ok.any()


def test_noisy_replicates_miss_the_half_width_criterion(tmp_path):
    reps = make_replicated(tmp_path / "run", n=2, rounds=20, clock_sd=0.05, noise_sd=0.05)
    crit = paired.check_criteria(paired.merge_replicates(reps))
    k2048 = crit[crit.K == 2048].iloc[0]
    assert not k2048.half_width_ok and k2048.rep_half_width_max > 0.10 and not k2048.holds


def test_fna_llm_spread_criterion(tmp_path):
    cells = ((32, 1), (32, 8))  # (K = Hq, N = B); M = S
    kw = dict(technique="fna_llm", variant="causal", M=4096, cells=cells, rounds=30)
    reps = [make_run(tmp_path / f"rep{k}", replicate=k, seed=k,
                     times=lambda K, N, f=f: llm_times(4096, N, {"tlx": f, "triton": 0.7}), **kw)
            for k, f in enumerate((0.90, 0.91, 0.935))]
    m = paired.merge_replicates(reps)
    assert _cell(m, "tlx", "sdpa_fraction", K=32, N=1)["median"] == pytest.approx(0.91, abs=0.005)
    assert "speedup_vs_unfused" in set(m.metric)
    crit = paired.check_criteria(m)
    assert set(crit.metric) == {"sdpa_fraction"} and (crit.best_dsl == "tlx").all()
    assert (crit.spread > 0.02).all() and not crit.spread_ok.any() and crit.half_width_ok.isna().all()
    ok = paired.check_criteria(paired.merge_replicates(reps[:2]))
    assert ok.spread_ok.all() and ok.holds.all()


def test_merge_needs_rounds(tmp_path):
    (tmp_path / "old").mkdir()
    with pytest.raises(ValueError, match="no paired_rounds"):
        paired.merge_replicates([tmp_path / "old"])
    with pytest.raises(ValueError, match="at least one"):
        paired.merge_replicates([])


def _runner_rounds(run_dir, rep, times, rounds=30, seed=0):
    """A rep folder as the runner writes it (gzip-appended rounds), lazy_prenorm at one shape; ``times``:
    {(dsl, impl, config_name): ms}, each round scaled by a common clock factor."""
    import gzip

    import numpy as np

    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True)
    with gzip.open(run_dir / paired.ROUNDS_FILE_GZ, "wt") as f:
        for r in range(rounds):
            clock = 1 + 0.2 * rng.random()
            for (dsl, impl, cfg), ms in times.items():
                f.write(json.dumps({"technique": "lazy_prenorm", "variant": "rmsnorm", "M": 262144, "N": 512,
                                    "K": 512, "dtype": "bf16", "replicate": rep, "window": 0, "round": r, "dsl": dsl,
                                    "impl": impl, "config_name": cfg, "ms": ms * clock}) + "\n")


def test_merge_keeps_the_best_config_and_needs_two_replicates_to_judge_agreement(tmp_path):
    times = {("torch", "cublas", "-"): 0.21, ("torch", "torch_compile_norm", "-"): 0.128,
             ("tlx", "gemm", "g"): 0.227, ("tlx", "fused", "c2"): 0.237, ("tlx", "fused", "c4"): 0.375}
    for k in (0, 1):
        _runner_rounds(tmp_path / "run" / f"rep{k}", k, times, seed=k)
    m = paired.merge_replicates(paired.replicate_dirs(tmp_path / "run"))
    r = m[(m.dsl == "tlx") & (m.impl == "fused") & (m.metric == "hidden_dsl")]
    assert len(r) == 1 and r.iloc[0]["configs"] == ["c2", "c2"]  # the better config, not a mixture of both
    assert r.iloc[0]["median"] == pytest.approx((0.227 + 0.128 - 0.237) / 0.128, rel=1e-6)
    assert bool(paired.check_criteria(m)["holds"].iloc[0])
    one = paired.merge_replicates([tmp_path / "run" / "rep0"])
    assert paired.check_criteria(one)["holds"].isna().all()  # one replicate: agreement not judged


def test_nonpositive_samples_are_missing_with_a_warning(tmp_path):
    """A cudagraph_flush sample of a few-us kernel can read <= 0 (a difference of two noisy replays): it must not
    enter a ratio metric, and the reader must say so."""
    run = make_run(tmp_path / "run", rounds=5)
    lines = (run / paired.ROUNDS_FILE).read_text().splitlines()
    first = json.loads(lines[0])
    first["ms"] = -0.003
    (run / paired.ROUNDS_FILE).write_text("\n".join([json.dumps(first)] + lines[1:]) + "\n")
    with pytest.warns(UserWarning, match="1 samples <= 0 ms"):
        rounds = paired.read_rounds(run)
    assert rounds["ms"].isna().sum() == 1 and (rounds["ms"].dropna() > 0).all()


def test_fna_llm_norm_latency_hidden_per_round_and_sparse_cells(tmp_path):
    """fna_llm's hidden_dsl / hidden_best come out of the paired rounds like the GEMM techniques' (T_norms =
    T_sdpa_plus_norms - T_sdpa, the DSL's attention as the unfused kernel); the report words them for attention,
    and a cell where the metric is defined in fewer than 90 % of the rounds (here SDPA + norms mostly faster than
    SDPA: T_norms <= 0) shows "–" with a note, not a median of the rounds left."""
    from normfuse import report

    def times(K, N):
        t = llm_times(4096, N, {"tlx": 0.9})
        if N == 8:  # SDPA + norms faster than SDPA alone (seen at power-limited cells): T_norms < 0 in most rounds
            t[("torch", "sdpa_plus_norms", "-")] = 0.998
        return t

    run = make_run(tmp_path / "run", technique="fna_llm", variant="causal", M=4096, cells=((32, 1), (32, 8)),
                   times=times, rounds=40, clock_sd=0.0, noise_sd=0.002)
    p = paired.compute(run)
    h = _cell(p, "tlx", "hidden_dsl", K=32, N=1)
    assert h["median"] == pytest.approx((0.95 / 0.9 + 0.1 - 1 / 0.9) / 0.1, abs=0.05)  # 0.44
    assert _cell(p, "tlx", "hidden_best", K=32, N=1)["median"] == pytest.approx((1.0 + 0.1 - 1 / 0.9) / 0.1, abs=0.05)
    text = "\n".join(report.paired_lines(p))
    assert "% of norm latency hidden (vs the same DSL's attention) (hidden_dsl, %)" in text
    assert "GEMM" not in text
    assert "– in 1 cell(s): hidden_dsl was defined in fewer than 90% of the cell's rounds" in text
    assert "Paired timing: 40 interleaved rounds per shape" in text  # the primary metric's rounds
