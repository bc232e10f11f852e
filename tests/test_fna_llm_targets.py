"""tools.fna_llm_targets: verdicts and tallies from a synthetic paired_replicates table."""

import pandas as pd
import pytest

from tools import fna_llm_targets as ft


def _row(variant, S, impl, metric, median, lo, hi, dsl="tlx", configs=("cfg-a",)):
    return dict(technique="fna_llm", variant=variant, M=S, N=1, K=32, dsl=dsl, impl=impl, metric=metric,
                median=median, ci_lo=lo, ci_hi=hi, configs=list(configs))


def _table():
    rows = []
    # cell 1: every target met
    rows += [_row("causal", 1024, "attention", "sdpa_fraction", 1.05, 1.02, 1.07),
             _row("causal", 1024, "fused", "sdpa_fraction", 0.97, 0.96, 0.98),
             _row("causal", 1024, "fused", "speedup_vs_unfused", 1.10, 1.05, 1.12, configs=("b", "a")),
             _row("causal", 1024, "fused", "tflops", 500, 490, 510),
             _row("causal", 1024, "attention", "tflops", 540, 530, 550),
             _row("causal", 1024, "sdpa", "tflops", 510, 500, 520, dsl="torch"),
             _row("causal", 1024, "sdpa_cudnn", "tflops", 515, 505, 525, dsl="torch")]
    # cell 2: attention straddles 100 %, fused missed 95 %, speedup exactly 1.0 at ci_lo -> not met
    rows += [_row("noncausal", 2048, "attention", "sdpa_fraction", 1.00, 0.99, 1.01),
             _row("noncausal", 2048, "fused", "sdpa_fraction", 0.90, 0.89, 0.94),
             _row("noncausal", 2048, "fused", "speedup_vs_unfused", 1.01, 1.0, 1.02),
             _row("noncausal", 2048, "triton", "tflops", 1, 1, 1, dsl="triton")]  # other DSLs are ignored
    return pd.DataFrame(rows)


def test_targets_verdicts_and_counts():
    d = _table()
    t = ft.targets(d[d["dsl"].isin(["tlx", "torch"])])
    assert list(t["variant"]) == ["causal", "noncausal"]
    a, f, s = ft.TARGETS
    assert list(t[f"{a}|verdict"]) == ["met", "not resolved"]
    assert list(t[f"{f}|verdict"]) == ["met", "missed"]
    assert list(t[f"{s}|verdict"]) == ["met", "not resolved"]  # "faster than" is strict: ci_lo = 1.0 does not count
    assert t.loc[0, "tflops_sdpa"] == 515 and t.loc[0, "configs"] == "a, b"
    c = ft.counts(t)
    assert c[a] == {"met": 1, "missed": 0, "not resolved": 1} and c[f]["missed"] == 1
    md = ft.markdown(t, t)
    assert "**105.0 [102.0, 107.0]** (105.0)" in md and "met 1, missed 1, not resolved 0 of 2" in md


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="paired_replicates.parquet"):
        ft.load(tmp_path)
    _table().assign(technique="norms").to_parquet(tmp_path / "paired_replicates.parquet")
    with pytest.raises(ValueError, match="no fna_llm rows"):
        ft.load(tmp_path)
    with pytest.raises(SystemExit, match="error:"):
        ft.main([str(tmp_path)])


def test_resolution_and_bad_arguments(tmp_path, capsys):
    d = _table()
    d.to_parquet(tmp_path / "paired_replicates.parquet")
    ft.main([str(tmp_path), "--resolution", "0.005"])
    out = capsys.readouterr().out
    assert "timing resolution of ±0.5 %" in out
    t = ft.targets(ft.load(tmp_path), resolution=0.06)  # cell 1's 0.97 [0.96, 0.98] widened to [0.912, ...]
    assert t.loc[0, f"{list(ft.TARGETS)[1]}|verdict"] == "not resolved"
    for bad in ("2", "-0.1", "nan"):
        with pytest.raises(SystemExit):
            ft.main([str(tmp_path), "--resolution", bad])
        assert "--resolution must be a fraction" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="dsl='foo'"):  # torch baseline rows alone are not a table
        ft.main([str(tmp_path), "--dsl", "foo"])


def test_single_run_paired_parquet(tmp_path):
    """Without paired_replicates.parquet the run's paired.parquet is read: best config per cell, dsl, impl, metric."""
    d = _table().drop(columns=["configs"])
    d = d.assign(config_name=["cfg-a"] * len(d))
    worse = d[(d["impl"] == "fused") & (d["metric"] == "speedup_vs_unfused")].assign(
        config_name="cfg-slow", median=0.5, ci_lo=0.4, ci_hi=0.6)
    pd.concat([d, worse]).to_parquet(tmp_path / "paired.parquet")
    t = ft.targets(ft.load(tmp_path))
    s = list(ft.TARGETS)[2]
    assert list(t[f"{s}|verdict"]) == ["met", "not resolved"] and t.loc[0, "configs"] == "cfg-a"
