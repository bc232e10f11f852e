"""The MXNorm accuracy study script runs on CPU, writes its tables, plots and meta.json, and its numbers are sane."""

import json

import pandas as pd

from experiments import mxnorm_accuracy


def test_accuracy_study_small(tmp_path):
    out = mxnorm_accuracy.main(["--rows", "256", "--out", str(tmp_path)])
    rows = pd.read_parquet(out / "rows.parquet")
    summary = pd.read_parquet(out / "summary.parquet")
    assert len(rows) == 3 * 3 * 2 * 256 and len(summary) == 3 * 3 * 2 * 2
    assert json.loads((out / "meta.json").read_text())["rows"] == 256
    for name in ("ratio", "output_error"):
        assert (out / "plots" / f"{name}.png").stat().st_size > 10000
    g = summary[summary.distribution == "gaussian"]
    assert (abs(g.ratio_mean - 1) < 0.01).all()  # c(p, 32) is the Gaussian constant: unbiased there
    assert (g.groupby("D").ratio_cv.mean().diff().dropna() < 0).all()  # the spread shrinks with D (more blocks)
    # removing the per-row scale leaves quantization only: about the RMSNorm + cast error
    assert ((summary.out_rel_err_mxnorm_rescaled / summary.out_rel_err_rmsnorm_cast - 1).abs() < 0.1).all()
    assert (summary.out_rel_err_mxnorm_cast >= summary.out_rel_err_mxnorm_rescaled * 0.99).all()


def test_mxnorm_report_on_synthetic_run(tmp_path):
    """experiments.mxnorm_report on a hand-made run: speedups, % of copy bandwidth, the targets, the plot."""
    from experiments import mxnorm_report
    from normfuse.techniques import mxnorm as T

    rows = []
    for M in (4096, 16384):
        for N in (1024, 4096):
            nb = T.bytes_moved("norm_cast", M, N)
            for dsl, variant, impl, tbps in [("torch", "rmsnorm_cast", "torch_compile_rmsnorm_cast", 2.0),
                                             ("torch", "mxnorm_p2", "torch_compile_mxnorm_cast", 2.5),
                                             ("triton", "rmsnorm_cast", "norm_cast", 3.8),
                                             ("triton", "mxnorm_p2", "norm_cast", 4.0),
                                             ("tlx", "mxnorm_p1", "norm_cast", 3.0)]:
                rows.append({"M": M, "N": N, "dsl": dsl, "variant": variant, "impl": impl, "status": "ok",
                             "p50_ms": nb / (tbps * 1e12) * 1e3})
    pd.DataFrame(rows).to_parquet(tmp_path / "results.parquet")
    (tmp_path / "meta.json").write_text(json.dumps({"calibration": {"copy_tbps": 4.25}}))
    mxnorm_report.main([str(tmp_path)])
    text = (tmp_path / "mxnorm_summary.md").read_text()
    assert "triton/mxnorm_p2 vs tc_rms_cast" in text and (tmp_path / "plots" / "mxnorm_speedup.png").exists()
    t = mxnorm_report.tables(pd.read_parquet(tmp_path / "results.parquet"), 4.25)["targets"]
    assert (abs(t["mxnorm vs tc_rms_cast"] - 2.0) < 1e-9).all() and (abs(t["mxnorm % copy"] - 100 * 4 / 4.25) < 1e-6).all()
    assert t[t["T"] >= 16384]["target 90% copy"].all() and t["target >= rmsnorm_cast"].all()
