"""Reports and figures: paired tables with intervals and verdicts, the replicate report, figure conventions (one
legend, colour bars, error bars, both widths) for runs with and without paired timing, and experiments.report
writing nothing into a run folder unless asked (--write)."""

import hashlib
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from test_paired import GEMM_CELLS, gemm_times, llm_times, make_replicated, make_run

from normfuse import metrics, paired, plots, report
from normfuse.techniques import lazy_prenorm as lp

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fewer_resamples(monkeypatch):
    monkeypatch.setattr(paired, "N_RESAMPLES", 400)  # the interval method is tested in test_paired


@pytest.fixture
def figures(monkeypatch):
    """Every figure saved through plots._save, by file stem, checked before it is closed."""
    seen = {}
    save = plots._save

    def spy(fig, out_dir, name):
        seen[name] = {
            "legends": len(fig.legends) + sum(ax.get_legend() is not None for ax in fig.axes),
            "colorbars": sum(ax.get_label() == "<colorbar>" for ax in fig.axes),
            "errorbars": sum(len([c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"])
                             for ax in fig.axes),
            "width": fig.get_size_inches()[0],
            "ylabels": [ax.get_ylabel() for ax in fig.axes if ax.get_visible()],
            "ylim": [ax.get_ylim() for ax in fig.axes if ax.get_visible()],
        }
        return save(fig, out_dir, name)

    monkeypatch.setattr(plots, "_save", spy)
    return seen


# a cell each: TLX clearly below the blog (512, 512: 83.9), clearly above (1024, 2048: 41.5), and at the blog's value
# with noisy rounds (2048, 1024: 89.1): missed, met, not resolved
VERDICT_HIDDEN = {(512, 512): 0.75, (1024, 2048): 0.75, (2048, 1024): 0.8913}


def _verdict_times(K, N):
    return gemm_times(K, N, {"triton": 0.6, "tlx": VERDICT_HIDDEN[(K, N)]})


def _table(text: str, first: str) -> list[dict]:
    """The markdown table of ``text`` whose header starts with ``first``, as dicts."""
    lines = text.splitlines()
    i = next(i for i, x in enumerate(lines) if x.startswith("| ") and x.strip("| ").split("|")[0].strip() == first)
    header = [c.strip() for c in lines[i].strip().strip("|").split("|")]
    out = []
    for x in lines[i + 2:]:
        if not x.startswith("|"):
            break
        out.append(dict(zip(header, [c.strip() for c in x.strip().strip("|").split("|")])))
    return out


# ----------------------------------------------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------------------------------------------
def test_summary_shows_intervals_best_dsl_and_verdicts(tmp_path):
    run = make_run(tmp_path / "run", times=_verdict_times, rounds=150, clock_sd=0.05, noise_sd=0.03)
    df, text = report.derive(run)
    rows = {(r["K"], r["N"]): r for r in _table(text, "M")}  # the first table: the primary metric, paired
    assert rows[("512", "512")]["verdict"] == "missed" and rows[("512", "512")]["target"] == "83.9"
    assert rows[("1024", "2048")]["verdict"] == "met"
    assert rows[("2048", "1024")]["verdict"] == "not resolved"
    best = rows[("512", "512")]["best"]
    assert best.startswith("TLX ") and "[" in best and "," in best
    med, lo, hi = (float(x) for x in best[4:].replace("[", "").replace("]", "").replace(",", "").split())
    assert lo <= med <= hi and abs(med - 75.0) < 2
    assert rows[("512", "512")]["SM MHz min/med/max"] == "1500/1830/1980" and rows[("512", "512")]["max °C"] == "61"
    assert "met 1, missed 1, not resolved 1" in text
    assert "hidden_best" in text and "frac_cublas" in text  # secondary metrics, with intervals
    assert "Sweep stage" in text and "blog B200 %" in text  # the sweep-stage table follows
    assert "nan" not in text


def test_summary_of_a_run_without_rounds_is_unchanged(tmp_path):
    """A committed run from before paired timing renders exactly its committed summary.md."""
    run = ROOT / "results" / "fna_llm_rep" / "20261130_h200_rep2"
    df, text = report.derive(run)
    assert text + "\n" == (run / "summary.md").read_text()
    assert "Paired timing" not in text


def test_fna_llm_paired_fraction_of_sdpa_with_target(tmp_path):
    cells = ((32, 1), (32, 8))
    run = make_run(tmp_path / "run", technique="fna_llm", variant="causal", M=4096, cells=cells, rounds=80,
                   times=lambda K, N: llm_times(4096, N, {"tlx": 0.95 if N == 1 else 0.8, "triton": 0.7}))
    df, text = report.derive(run, out_dir=tmp_path / "out")
    rows = {r["B"]: r for r in _table(text, "S")}
    assert rows["1"]["target"] == "90.0" and rows["1"]["verdict"] == "met" and rows["8"]["verdict"] == "missed"
    assert "speedup_vs_unfused" in text
    assert {"tflops_bars.png", "sdpa_fraction_bars.png", "sdpa_fraction_bars_1col.pdf"} <= {
        p.name for p in (tmp_path / "out" / "plots").iterdir()}


def test_resolution_turns_a_narrow_win_into_not_resolved(tmp_path):
    """fraction of SDPA 0.903 against the 0.90 target: met by a tight bootstrap interval (low noise), not resolved
    once the interval is widened to ±0.5 % of the median (0.903 × 0.995 < 0.90); the tally says so."""
    run = make_run(tmp_path / "run", technique="fna_llm", variant="causal", M=4096, cells=((32, 1),), rounds=80,
                   clock_sd=0.0, noise_sd=0.0005, times=lambda K, N: llm_times(4096, N, {"tlx": 0.903}))
    _, text = report.derive(run)
    assert {r["verdict"] for r in _table(text, "S")} == {"met"}
    _, text = report.derive(run, resolution=0.005)
    assert {r["verdict"] for r in _table(text, "S")} == {"not resolved"}
    assert "timing resolution of ±0.5 %" in text
    lazy = make_run(tmp_path / "lazy", rounds=20)  # hidden_dsl: not a ratio of times, so the note says so
    _, text = report.derive(lazy, resolution=0.005)
    assert "is not applied here: hidden_dsl is not a ratio of times" in text


def test_memory_bound_paired_run_reports_bandwidth(tmp_path):
    """A technique without a fused kernel (standalone norms, K = None): the paired table shows GB/s per DSL."""
    run = make_run(tmp_path / "run", technique="norms", M=4096, cells=((None, 1024), (None, 4096)), rounds=30,
                   times=lambda K, N: {("torch", "torch_compile_norm", "-"): 0.004 * N / 1024,
                                       ("triton", "norm", "t"): 0.0036 * N / 1024})
    df, text = report.derive(run)
    rows = _table(text, "M")
    assert len(rows) == 2 and rows[0]["best"].startswith("Triton ") and "GB/s" in text
    table = paired.compute(run)
    assert table["K"].isna().all() and table["sm_clock_mhz_max"].eq(1980).all()  # windows joined on K = None


def test_targets():
    from normfuse.techniques import fna, fna_llm, multi_cta

    assert report.target(lp, "hidden_dsl", "rmsnorm", 262144, 512, 512) == pytest.approx(0.8393)
    assert report.target(lp, "hidden_dsl", "layernorm", 262144, 512, 512) is None  # the blog measured RMSNorm
    assert report.target(lp, "hidden_dsl", "rmsnorm", 4096, 512, 512) is None  # not the blog's M
    assert report.target(lp, "frac_cublas", "rmsnorm", 4096, 512, 512) == 0.85
    assert report.target(multi_cta, "hidden_dsl", "layernorm", 262144, 1024, 1024) == pytest.approx(0.9161)
    assert report.target(fna, "saving", "gdpa", 3000, 2, 128) == pytest.approx(0.3539)  # keyed (max_len, H)
    assert report.target(fna_llm, "sdpa_fraction", "causal", 4096, 1, 32) == 0.90
    assert report.target(fna_llm, "tflops", "causal", 4096, 1, 32) is None


def test_replicate_report_and_merged_outputs(tmp_path):
    reps = make_replicated(tmp_path / "top", rounds=60, clock_sd=0.05, noise_sd=0.0)
    text = report.write_replicates(reps, tmp_path / "top")
    rows = _table(text, "M")
    assert len(rows) == len(GEMM_CELLS) and all(r["criterion"] == "holds" for r in rows)
    assert {"rep0", "rep1", "rep2", "pooled", "max ± (rep)", "± limit", "agree", "overlap"} <= set(rows[0])
    assert {r["± limit"] for r in rows} == {"5", "10"} and all(r["best"] == "TLX" for r in rows)
    assert "Criterion holds in 3 of 3 cells" in text
    for f in ("replicates.md", "paired_replicates.parquet", "replicate_criteria.parquet",
              "plots/hidden_bars_pooled.png", "plots/hidden_bars_pooled_1col.pdf"):
        assert (tmp_path / "top" / f).exists(), f
    m = pd.read_parquet(tmp_path / "top" / "paired_replicates.parquet")
    assert list(m["rep_median"].iloc[0]) and m["agree"].notna().all()


# ----------------------------------------------------------------------------------------------------------------
# figures
# ----------------------------------------------------------------------------------------------------------------
def _sweep_rows(hidden_tlx=1.15):
    rows = []
    for K in (512, 1024):
        for N in (512, 1024):
            base = {"technique": "lazy_prenorm", "variant": "rmsnorm", "M": 262144, "N": N, "K": K, "dtype": "bf16",
                    "status": "ok", "experiment": "x", "config_name": "c", "error": None}
            rows += [{**base, "dsl": "torch", "impl": "cublas", "p50_ms": 1.0},
                     {**base, "dsl": "torch", "impl": "torch_compile_norm", "p50_ms": 0.3}]
            for i, d in enumerate(("triton", "helion", "tlx")):
                fused = hidden_tlx if d == "tlx" and (K, N) == (1024, 1024) else 1.15 + 0.05 * i
                rows += [{**base, "dsl": d, "impl": "gemm", "p50_ms": 1.1},
                         {**base, "dsl": d, "impl": "fused", "p50_ms": fused}]
    return metrics.add_hidden(metrics.add_rates(pd.DataFrame(rows)))


def test_figures_of_a_run_without_rounds(tmp_path, figures):
    df = _sweep_rows(hidden_tlx=11.1)  # TLX at (1024, 1024): (1.1 + 0.3 - 11.1) / 0.3 = -3233 %: an outlier
    paths = report.make_plots(df, tmp_path, "gpu", {"hardware_before": {"gpu_name": "NVIDIA H200"}})
    assert {p.name for p in paths} == {f"{n}{w}.{e}" for n in ("hidden_heatmap", "hidden_bars")
                                       for w in ("", "_1col") for e in ("png", "pdf")}
    assert all(p.stat().st_size > 1000 for p in paths)
    for name, f in figures.items():
        assert f["width"] == pytest.approx(3.5 if name.endswith("_1col") else 7.0)
    for name in ("hidden_heatmap", "hidden_heatmap_1col"):
        assert figures[name]["colorbars"] == 1 and figures[name]["legends"] == 0
    for name in ("hidden_bars", "hidden_bars_1col"):
        f = figures[name]
        assert f["legends"] == 1 and f["errorbars"] == 0  # one best value per cell: no interval to draw
        assert "% of norm latency hidden" in f["ylabels"][0]
        assert f["ylim"][0][0] >= plots.PCT_RANGE[0]  # the outlier is clipped, not a -3000 % axis


def test_figures_of_a_paired_run_have_error_bars(tmp_path, figures):
    run = make_run(tmp_path / "run", rounds=40)
    report.derive(run, out_dir=tmp_path / "out")
    assert (tmp_path / "out" / "paired.parquet").exists() and (tmp_path / "out" / "summary.md").exists()
    names = {p.name for p in (tmp_path / "out" / "plots").iterdir()}
    assert {"hidden_heatmap.png", "hidden_heatmap_1col.png", "hidden_bars.pdf", "hidden_bars_1col.pdf"} <= names
    assert figures["hidden_bars"]["errorbars"] == 3 and figures["hidden_bars"]["legends"] == 1  # one per DSL
    assert figures["hidden_heatmap_1col"]["colorbars"] == 1


def test_other_figures_follow_the_conventions(tmp_path, figures):
    """tflops bars (fna_llm), bandwidth (norms), cluster sweep (multi-CTA), CPU check map: one legend (or a colour
    bar for maps), the metric named on the axis."""
    run = make_run(tmp_path / "run", technique="fna_llm", variant="causal", M=4096, cells=((32, 1), (32, 8)),
                   rounds=30, times=lambda K, N: llm_times(4096, N, {"tlx": 0.9, "triton": 0.7}))
    report.derive(run, out_dir=tmp_path / "out")
    assert figures["tflops_bars"]["legends"] == 1 and figures["tflops_bars"]["errorbars"] >= 4
    assert "TFLOP/s" in figures["tflops_bars"]["ylabels"][0]
    bw = pd.DataFrame([{"technique": "norms", "variant": "rmsnorm", "M": 4096, "N": n, "K": None, "dtype": "bf16",
                        "dsl": d, "impl": i, "gbps": g, "status": "ok", "p50_ms": 1.0, "config_name": "c"}
                       for n in (1024, 4096) for d, i, g in (("torch", "torch_compile_norm", 2000),
                                                             ("triton", "norm", 3000))])
    plots.bandwidth_lines(bw, 4.25, tmp_path / "bw", "norms")
    assert figures["bandwidth"]["legends"] == 1 and "GB/s" in figures["bandwidth"]["ylabels"][0]
    cl = _sweep_rows()
    cl["config"] = [{"CLUSTER_SIZE": 2} if r.dsl == "tlx" else {} for r in cl.itertuples()]
    assert plots.cluster_sweep(cl, tmp_path / "cl", "x")
    assert figures["cluster_sweep"]["legends"] == 1 and figures["cluster_sweep_1col"]["legends"] == 1
    cpu = cl.assign(mode="interpret", max_abs_err=0.01, tol=0.02)
    plots.check_heatmap(cpu, tmp_path / "cpu", "x")
    assert figures["check_heatmap"]["colorbars"] == 1


def test_palette_and_labels_cover_every_baseline():
    """One colour per DSL and per baseline of every technique, all distinct among the DSLs; readable names."""
    from normfuse.techniques import TECHNIQUES, get_technique

    for t in TECHNIQUES:
        for b in getattr(get_technique(t), "BASELINES", ()):
            assert b in plots.PALETTE and b in plots.LABELS, (t, b)
    assert len({plots.color(d) for d in plots.DSL_ORDER}) == 3
    assert [plots.label(d) for d in plots.DSL_ORDER] == ["Triton", "Helion", "TLX"]
    plt.close("all")


# ----------------------------------------------------------------------------------------------------------------
# experiments.report writes nothing unless asked
# ----------------------------------------------------------------------------------------------------------------
def _hashes(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_report_does_not_modify_a_run_without_write(tmp_path, capsys):
    from experiments.report import main

    run = make_run(tmp_path / "exp" / "run", rounds=20)
    top = tmp_path / "exp" / "top"
    make_replicated(top, n=2, rounds=20)
    old = tmp_path / "exp" / "old"
    shutil.copytree(ROOT / "results" / "fna_llm_rep" / "20261130_h200_rep2", old)
    before = {d: _hashes(d) for d in (run, top, old)}
    main([str(run)])
    main([str(old)])
    main([str(top)])
    main([str(run), "--out", str(tmp_path / "derived")])
    main(["--replicates", str(top / "rep0"), str(top / "rep1")])
    assert "Paired timing" in capsys.readouterr().out
    assert {d: _hashes(d) for d in (run, top, old)} == before
    assert (tmp_path / "derived" / "summary.md").exists() and (tmp_path / "derived" / "plots").is_dir()
    main([str(run), "--write"])  # asked: derived files regenerated in place; results.jsonl and meta.json untouched
    after = _hashes(run)
    assert {"results.parquet", "results.csv", "paired.parquet", "summary.md"} <= set(after)
    assert all(after[f] == before[run][f] for f in ("results.jsonl", "meta.json", paired.ROUNDS_FILE))
    main([str(top), "--write"])
    assert (top / "replicates.md").exists() and (top / "rep0" / "summary.md").exists()


def test_report_resolution_option(tmp_path, capsys):
    """--resolution reaches the verdicts (and says so under the tally); a value outside [0, 1) is refused."""
    from experiments.report import main

    run = make_run(tmp_path / "exp" / "run", rounds=20)
    main([str(run), "--resolution", "0.005"])
    out = capsys.readouterr().out
    assert "Paired timing" in out
    with pytest.raises(SystemExit):
        main([str(run), "--resolution", "-0.1"])
    assert "--resolution must be a fraction" in capsys.readouterr().err


def test_report_rejects_a_folder_without_runs(tmp_path):
    from experiments.report import main

    with pytest.raises(SystemExit, match="no results.jsonl and no rep"):
        main([str(tmp_path)])
