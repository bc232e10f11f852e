"""CPU tests of the technique spec (reference, tolerance, validation), shapes, metrics and hardware checks."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from normfuse import hardware, metrics, shapes, timing
from normfuse.techniques import get_technique
from normfuse.techniques import lazy_prenorm as lp


def test_lazy_identity_matches_reference():
    """rstd ⊙ (A @ (γ·B)) equals (rmsnorm(A)·γ) @ B: the identity the technique rests on."""
    x = lp.make_inputs(33, 24, 40, dtype="fp32", seed=3)
    lazy = lp.rstd(x["a"], 1e-6)[:, None] * (x["a"] @ x["b_folded"])
    torch.testing.assert_close(lazy, lp.reference(x, 1e-6), rtol=1e-5, atol=1e-5)


def test_inputs_are_random_not_zero_and_seeded():
    x1 = lp.make_inputs(8, 16, 16, seed=1)
    x2 = lp.make_inputs(8, 16, 16, seed=1)
    x3 = lp.make_inputs(8, 16, 16, seed=2)
    assert torch.equal(x1["a"], x2["a"]) and not torch.equal(x1["a"], x3["a"])
    assert (x1["a"] != 0).float().mean() > 0.99
    norms = x1["a"].float().pow(2).mean(-1).sqrt()
    assert norms.max() / norms.min() > 1.5  # rows have different scales, so a missing rstd is visible


def test_tolerance_catches_wrong_output():
    x = lp.make_inputs(64, 32, 64, dtype="bf16", seed=0)
    ref, same = lp.references("fused", x, 1e-6)
    tol = lp.tolerance(ref, same)
    assert lp.compare(same, ref, tol)["ok"]
    no_rstd = (x["a"] @ x["b_folded"])  # forgot the norm
    assert not lp.compare(no_rstd, ref, tol)["ok"]
    wrong = same.clone()
    wrong[5, 7] += 0.5
    assert not lp.compare(wrong, ref, tol)["ok"]
    nan = same.clone()
    nan[0, 0] = float("nan")
    assert not lp.compare(nan, ref, tol)["ok"]


@pytest.mark.parametrize("impl", ["fused", "gemm", "cublas", "torch_compile_norm"])
def test_references_shapes(impl):
    x = lp.make_inputs(4, 16, 8, dtype="fp32")
    ref, same = lp.references(impl, x, 1e-6)
    assert ref.dtype == torch.float32 and ref.shape == same.shape


def test_cost_model():
    M, N, K = 262144, 1024, 512
    assert lp.flops("gemm", M, N, K) == 2 * M * N * K
    assert lp.bytes_moved("gemm", M, N, K) == 2 * (M * K + K * N + M * N)
    assert lp.bytes_moved("norm", M, N, K) == 2 * 2 * M * K
    with pytest.raises(ValueError):
        lp.flops("nope", 1, 1, 1)


@pytest.mark.parametrize(
    "a_shape,b_shape,dtypes,eps,err",
    [
        ((4, 16), (16, 8), (torch.bfloat16, torch.float16), 1e-6, TypeError),
        ((4, 16), (8, 8), (torch.bfloat16, torch.bfloat16), 1e-6, ValueError),
        ((4, 16), (16, 8), (torch.bfloat16, torch.bfloat16), 0.0, ValueError),
        ((4, 16), (16, 8), (torch.bfloat16, torch.bfloat16), -1.0, ValueError),
        ((4, 12), (12, 8), (torch.bfloat16, torch.bfloat16), 1e-6, ValueError),  # K not a multiple of 8
        ((4, 16, 1), (16, 8), (torch.bfloat16, torch.bfloat16), 1e-6, ValueError),
        ((4, 16), (16, 8), (torch.int32, torch.int32), 1e-6, TypeError),
    ],
)
def test_check_inputs_errors(a_shape, b_shape, dtypes, eps, err):
    a = torch.ones(a_shape).to(dtypes[0])
    b = torch.ones(b_shape).to(dtypes[1])
    with pytest.raises(err):
        lp.check_inputs(a, b, eps)


def test_check_inputs_noncontiguous():
    a = torch.ones(16, 8, dtype=torch.bfloat16).t()
    with pytest.raises(ValueError, match="contiguous"):
        lp.check_inputs(a, torch.ones(16, 8, dtype=torch.bfloat16), 1e-6)


def test_unknown_names_list_choices():
    with pytest.raises(ValueError, match="choices"):
        get_technique("flash_norm")
    with pytest.raises(ValueError, match="choices"):
        lp.torch_dtype("fp8")
    from normfuse import registry

    with pytest.raises(ValueError, match="choices"):
        registry.check_dsl("cuda")


def test_fc_mapping_and_presets():
    assert shapes.fc_to_gemm(8192, 4096, 14336, "fwd") == {"M": 8192, "N": 14336, "K": 4096}
    assert shapes.fc_to_gemm(8192, 4096, 14336, "dgrad") == {"M": 8192, "N": 4096, "K": 14336}
    assert shapes.fc_to_gemm(8192, 4096, 14336, "wgrad") == {"M": 4096, "N": 14336, "K": 8192}
    with pytest.raises(ValueError, match="choices"):
        shapes.fc_to_gemm(1, 1, 1, "bwd")
    pts = shapes.expand({"fc": {"model": "llama3_8b", "tokens": [8192], "phases": ["fwd"]}})
    assert {"M": 8192, "N": 6144, "K": 4096} in [{k: p[k] for k in "MNK"} for p in pts]
    grid = shapes.expand({"grid": {"M": [262144], "K": [512, 1024, 2048], "N": [512, 1024, 2048]}})
    assert len(grid) == 9
    with pytest.raises(ValueError):
        shapes.expand({})


def _rows():
    base = {"technique": "lazy_prenorm", "variant": "rmsnorm", "M": 1024, "N": 512, "K": 512, "dtype": "bf16",
            "status": "ok"}
    return pd.DataFrame([
        {**base, "dsl": "torch", "impl": "cublas", "p50_ms": 1.0},
        {**base, "dsl": "torch", "impl": "torch_compile_norm", "p50_ms": 0.5},
        {**base, "dsl": "triton", "impl": "gemm", "p50_ms": 1.2, "config_name": "a"},
        {**base, "dsl": "triton", "impl": "gemm", "p50_ms": 1.1, "config_name": "b"},
        {**base, "dsl": "triton", "impl": "fused", "p50_ms": 1.2, "config_name": "a"},
        {**base, "dsl": "triton", "impl": "fused", "p50_ms": 0.9, "config_name": "b", "status": "incorrect"},
    ])


def test_hidden_metrics():
    df = metrics.add_hidden(metrics.add_rates(_rows()))
    f = df[(df.impl == "fused") & (df.status == "ok")].iloc[0]
    # T_gemm_dsl = best DSL GEMM over the tiling list (1.1), T_norm = 0.5, T_fused = 1.2
    assert f.hidden_dsl == pytest.approx((1.1 + 0.5 - 1.2) / 0.5)
    assert f.hidden_best == pytest.approx((1.0 + 0.5 - 1.2) / 0.5)
    assert f.speedup == pytest.approx(1.6 / 1.2)
    assert np.isnan(df[df.status == "incorrect"].iloc[0].hidden_dsl)  # an incorrect point gets no metric
    g = df[(df.impl == "gemm") & (df.config_name == "b")].iloc[0]
    assert g.frac_cublas == pytest.approx(1.0 / 1.1)
    assert g.tflops == pytest.approx(2 * 1024 * 512 * 512 / 1.1e-3 / 1e12)
    best = metrics.best_fused(df)
    assert len(best) == 1 and best.iloc[0].config_name == "a"


def test_timing_summary():
    s = timing.summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s["p50_ms"] == 3.0 and s["p20_ms"] < s["p50_ms"] < s["p80_ms"] and s["n_samples"] == 5
    with pytest.raises(ValueError):
        timing.summarize([])


def test_hardware_compare_warns_and_strict():
    cfg = {"name": "h200", "gpu_name_contains": "H200", "sm_count": 132, "power_limit_w": 700}
    ok = {"available": True, "gpu_name": "NVIDIA H200", "sm_count": 132, "power_limit_w": 700.0}
    assert hardware.compare(cfg, ok) == []
    bad = {"available": True, "gpu_name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "power_limit_w": 700.0}
    with pytest.warns(UserWarning, match="hardware mismatch"):
        problems = hardware.compare(cfg, bad)
    assert problems and "H100" in problems[0]
    with pytest.raises(RuntimeError), pytest.warns(UserWarning):
        hardware.compare(cfg, bad, strict=True)
    with pytest.warns(UserWarning, match="no GPU"):
        assert hardware.compare(cfg, {"available": False})
    assert math.isfinite(len(hardware.read_gpu()))


def test_gpu_plots_and_summary_render(tmp_path):
    """The GPU-mode figures and the summary table render from tidy rows (synthetic timings)."""
    from normfuse import report

    rows = []
    for K in (512, 1024):
        for N in (512, 1024):
            base = {"technique": "lazy_prenorm", "variant": "rmsnorm", "M": 262144, "N": N, "K": K, "dtype": "bf16",
                    "status": "ok", "experiment": "x", "config_name": "c", "error": None}
            rows += [{**base, "dsl": "torch", "impl": "cublas", "p50_ms": 1.0},
                     {**base, "dsl": "torch", "impl": "torch_compile_norm", "p50_ms": 0.3}]
            for i, d in enumerate(("triton", "helion", "tlx")):
                rows += [{**base, "dsl": d, "impl": "gemm", "p50_ms": 1.1},
                         {**base, "dsl": d, "impl": "fused", "p50_ms": 1.15 + 0.05 * i}]
    df = metrics.add_hidden(metrics.add_rates(pd.DataFrame(rows)))
    paths = report.make_plots(df, tmp_path, "gpu", {"hardware_before": {"gpu_name": "NVIDIA H200",
                                                                        "power_limit_w": 700.0}})
    assert {p.name for p in paths} == {f"{n}{w}.{e}" for n in ("hidden_heatmap", "hidden_bars")
                                       for w in ("", "_1col") for e in ("png", "pdf")}  # full and one-column width
    assert all(p.stat().st_size > 1000 for p in paths)
    text = report.summary(df, "gpu")
    assert "blog B200 %" in text and "83.9" in text and "83.3" in text  # (1.1 + 0.3 - 1.15) / 0.3


def test_bandwidth_plot_and_summary_for_norms(tmp_path):
    """Memory-bound techniques get a GB/s-over-N plot with the copy ceiling and a bandwidth table."""
    from normfuse import report

    rows = []
    for N in (1024, 4096):
        for variant in ("rmsnorm", "layernorm"):
            base = {"technique": "norms", "variant": variant, "M": 4096, "N": N, "K": None, "dtype": "bf16",
                    "status": "ok", "experiment": "norms", "config_name": "c", "error": None}
            rows += [{**base, "dsl": "torch", "impl": "torch_compile_norm", "p50_ms": 0.02},
                     {**base, "dsl": "triton", "impl": "norm", "p50_ms": 0.018}]
    df = metrics.add_hidden(metrics.add_rates(pd.DataFrame(rows)))
    assert df["gbps"].notna().all() and df["hidden_dsl"].isna().all()
    paths = report.make_plots(df, tmp_path, "gpu", {"calibration": {"copy_tbps": 4.25}})
    assert {p.name for p in paths} == {"bandwidth.png", "bandwidth.pdf", "bandwidth_1col.png", "bandwidth_1col.pdf"}
    assert "best GB/s" in report.summary(df, "gpu")


def test_norms_compile_ratio_and_verdicts():
    """norms' technique metric ``compile_ratio = T_torch.compile / T`` (per shape and variant; NaN without a
    torch.compile row or for a failed point), and the report's verdict against its target 1.0 from intervals."""
    from normfuse import paired, report
    from normfuse.techniques import norms

    base = {"technique": "norms", "M": 4096, "K": None, "dtype": "bf16", "status": "ok", "config_name": "c"}
    rows = [{**base, "variant": "rmsnorm", "N": 512, "dsl": "torch", "impl": "torch_compile_norm", "p50_ms": 0.02},
            {**base, "variant": "rmsnorm", "N": 512, "dsl": "triton", "impl": "norm", "p50_ms": 0.025},
            {**base, "variant": "rmsnorm", "N": 512, "dsl": "tlx", "impl": "norm", "p50_ms": None,
             "status": "incorrect"},
            {**base, "variant": "layernorm", "N": 512, "dsl": "triton", "impl": "norm", "p50_ms": 0.01}]
    out = metrics.add_technique_metrics(pd.DataFrame(rows))
    assert out["compile_ratio"].tolist()[:2] == pytest.approx([1.0, 0.8])
    assert out["compile_ratio"].iloc[2:].isna().all()  # failed point; no torch.compile row for LayerNorm
    spec = norms
    assert report.primary_metric(spec) == "compile_ratio" and report.target(spec, "compile_ratio", "rmsnorm",
                                                                            4096, 512, None) == 1.0
    assert paired.verdict(0.95, 0.99, 1.0) == "missed" and paired.verdict(0.99, 1.01, 1.0) == "not resolved"
    assert paired.verdict(1.001, 1.01, 1.0) == "met"
