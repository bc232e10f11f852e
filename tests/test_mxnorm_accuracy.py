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
