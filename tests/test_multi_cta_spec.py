"""CPU tests of the multi-CTA norm-fusion technique spec (``normfuse.techniques.multi_cta``): inputs, reference,
tolerance and statistics checks, validation, cost model, how the worker calls kernels and baselines, the per-variant
blog values, metrics, and the GPU-mode plots (per-variant heatmaps, cluster-size sweep) and summary."""

import json

import pandas as pd
import pytest
import torch

from normfuse import metrics, report
from normfuse.techniques import get_technique
from normfuse.techniques import multi_cta as T


def test_registered():
    assert get_technique("multi_cta") is T
    assert T.BASELINES == ("cublas", "torch_compile_norm", "torch_eager_norm", "liger_norm") and T.IMPLS == ("fused", "gemm")


def test_inputs_seeded_row_scaled_and_mean_shift():
    x1, x2 = T.make_inputs(16, 24, 32, seed=1), T.make_inputs(16, 24, 32, seed=1)
    assert torch.equal(x1["a"], x2["a"]) and torch.equal(x1["b"], x2["b"]) and x1["weight"] is None
    assert not torch.equal(x1["a"], T.make_inputs(16, 24, 32, seed=2)["a"])
    assert (x1["a"] != 0).float().mean() > 0.99
    c = x1["a"].float() @ x1["b"].float()
    rms = c.pow(2).mean(-1).sqrt()
    assert rms.max() / rms.min() > 1.5  # rows of C have different scales: a missing norm is visible
    aff = T.make_inputs(4, 24, 32, affine=True)
    assert aff["weight"].shape == aff["bias"].shape == (24,)
    s = T.make_inputs(64, 256, 64, dtype="fp32", seed=3, mean_shift=50.0)
    c = s["a"] @ s["b"]
    assert (c.mean(-1).abs() / c.std(-1)).median() > 10  # row means far larger than the spread


@pytest.mark.parametrize("variant", T.VARIANTS)
def test_reference_and_tolerance(variant):
    x = T.make_inputs(64, 48, 40, dtype="bf16", seed=0, affine=True, mean_shift=4.0)
    ref = T.reference(variant, x, 1e-5)
    assert set(ref) == {"y"} | set(T.STATS[variant]) and ref["y"].dtype == torch.float32
    same = T.same_dtype(variant, x, 1e-5)
    stats = tuple(ref[k] for k in T.STATS[variant])
    assert T.check("fused", (same, *stats), x, 1e-5, variant)["ok"]  # the unfused path passes
    c = (x["a"] @ x["b"])
    assert not T.check("fused", (c, *stats), x, 1e-5, variant)["ok"]  # forgot the norm
    wrong = same.clone()
    wrong[3, 5] += 1.0
    assert not T.check("fused", (wrong, *stats), x, 1e-5, variant)["ok"]
    bad_stats = tuple(s * 1.01 for s in stats)  # 1 % off
    r = T.check("fused", (same, *bad_stats), x, 1e-5, variant)
    assert not r["ok"] and r["rstd_rel_err"] > T.STAT_RTOL
    with pytest.raises(ValueError, match="must return"):
        T.check("fused", same, x, 1e-5, variant)


def test_mean_check_is_relative_to_the_row_scale():
    """A row mean near 0 must not fail on fp32 summation-order noise (errors are measured against |mean| + std)."""
    x = T.make_inputs(32, 64, 32, dtype="fp32", seed=5)
    ref = T.reference("layernorm", x, 1e-5)
    noisy_mean = ref["mean"] + 1e-6 / ref["rstd"]
    assert T.check_stats("layernorm", (noisy_mean, ref["rstd"]), ref)["stats_ok"]
    assert not T.check_stats("layernorm", (ref["mean"] + 1e-2 / ref["rstd"], ref["rstd"]), ref)["stats_ok"]
    assert not T.check_stats("layernorm", (ref["mean"].double(), ref["rstd"]), ref)["stats_ok"]  # dtype


def test_check_inputs():
    a, b = torch.randn(8, 16), torch.randn(16, 24)
    assert T.check_inputs(a, b) == (8, 24, 16)
    with pytest.raises(ValueError, match="multiple of 8"):
        T.check_inputs(torch.randn(8, 12), torch.randn(12, 24))
    with pytest.raises(ValueError, match="weight"):
        T.check_inputs(a, b, torch.ones(16))
    with pytest.raises(TypeError, match="bias"):
        T.check_inputs(a, b, None, torch.ones(24, dtype=torch.float16))
    with pytest.raises(ValueError, match="eps"):
        T.check_inputs(a, b, eps=float("nan"))
    with pytest.raises(ValueError, match="contiguous"):
        T.check_inputs(a.t().contiguous().t(), torch.randn(16, 24))


def test_cost_model_and_names():
    M, N, K = 262144, 1024, 512
    assert T.flops("gemm", M, N, K) == 2 * M * N * K < T.flops("fused", M, N, K)
    assert T.bytes_moved("torch_compile_norm", M, N, K) == 2 * 2 * M * N
    assert T.bytes_moved("fused", M, N, K) - T.bytes_moved("gemm", M, N, K) == 8 * M
    assert T.kernel_function_name("fused", "rmsnorm") == "matmul_rmsnorm"
    assert T.kernel_function_name("fused", "layernorm") == "matmul_layernorm"
    assert T.kernel_function_name("gemm", "layernorm") == "matmul"
    with pytest.raises(ValueError):
        T.kernel_function_name("fused", "batchnorm")
    with pytest.raises(ValueError):
        T.flops("nope", 1, 1, 1)
    assert set(T.BLOG_HIDDEN_B200) == set(T.VARIANTS)
    assert T.BLOG_HIDDEN_B200["layernorm"][(1024, 1024)] == 91.61
    assert all(len(v) == 9 for v in T.BLOG_HIDDEN_B200.values())


def test_kernel_call_and_baselines_on_cpu():
    x = T.make_inputs(16, 24, 32, dtype="fp32", affine=True)
    seen = {}

    def fake(*args, **kw):
        seen["args"], seen["kw"] = args, kw
        return "out"

    assert T.kernel_call(fake, "fused", x, 1e-5, {"c": 1}, "layernorm")() == "out"
    assert len(seen["args"]) == 4 and seen["kw"] == {"eps": 1e-5, "config": {"c": 1}}
    T.kernel_call(fake, "fused", x, 1e-5, {}, "rmsnorm")()
    assert len(seen["args"]) == 3
    T.kernel_call(fake, "gemm", x, 1e-5, {}, "rmsnorm")()
    assert len(seen["args"]) == 2
    c = T.baseline("cublas", x, 1e-5, "rmsnorm")()
    assert T.check("cublas", c, x, 1e-5, "rmsnorm")["ok"]
    with pytest.raises(ValueError):
        T.baseline("cudnn", x, 1e-5, "rmsnorm")


def test_norm_baseline_check_uses_its_own_input():
    """'torch_compile_norm' is checked against the norm of the bf16 GEMM output it normalizes (checked eagerly
    here: the compiled function computes the same)."""
    x = T.make_inputs(32, 48, 40, dtype="bf16", affine=True)
    c = T.gemm_output(x)
    assert T.gemm_output(x) is c
    y = T._torch_norm("layernorm", c, x["weight"], x["bias"], 1e-5)
    assert T.check("torch_compile_norm", y, x, 1e-5, "layernorm")["ok"]
    assert not T.check("torch_compile_norm", c, x, 1e-5, "layernorm")["ok"]


def _synthetic(tmp=None):
    rows = []
    for variant in T.VARIANTS:
        for K in (512, 1024):
            for N in (512, 1024):
                base = {"technique": "multi_cta", "variant": variant, "M": 262144, "N": N, "K": K, "dtype": "bf16",
                        "status": "ok", "experiment": "multi_cta_blog", "error": None}
                rows += [{**base, "dsl": "torch", "impl": "cublas", "p50_ms": 1.0, "config_name": "-", "config": {}},
                         {**base, "dsl": "torch", "impl": "torch_compile_norm", "p50_ms": 0.3, "config_name": "-",
                          "config": {}}]
                for d in ("triton", "helion", "tlx"):
                    rows.append({**base, "dsl": d, "impl": "gemm", "p50_ms": 1.1, "config_name": "g", "config": {}})
                for C, t in ((2, 1.2), (4, 1.15), (8, 1.18)):
                    rows.append({**base, "dsl": "tlx", "impl": "fused", "p50_ms": t, "config_name": f"c{C}",
                                 "config": json.dumps({"CLUSTER_SIZE": C}) if C == 8 else {"CLUSTER_SIZE": C}})
                rows.append({**base, "dsl": "triton", "impl": "fused", "p50_ms": 1.3, "config_name": "t",
                             "config": {"exchange": "last_cta"}})
    return metrics.add_hidden(metrics.add_rates(pd.DataFrame(rows)))


def test_metrics_per_variant():
    df = _synthetic()
    f = df[(df.impl == "fused") & (df.dsl == "tlx") & (df.config_name == "c4")]
    assert len(f) == 8 and (abs(f["hidden_dsl"] - (1.1 + 0.3 - 1.15) / 0.3) < 1e-9).all()
    assert df["tflops"].notna().any() and df["gbps"].notna().any()


def test_plots_and_summary_per_variant(tmp_path):
    df = _synthetic()
    paths = report.make_plots(df, tmp_path, "gpu", {"hardware_before": {"gpu_name": "NVIDIA H200",
                                                                        "power_limit_w": 700.0}})
    names = {p.name for p in paths}
    for v in T.VARIANTS:
        assert {f"hidden_heatmap_{v}.png", f"hidden_bars_{v}.pdf"} <= names
    assert {"cluster_sweep.png", "cluster_sweep.pdf"} <= names
    assert all(p.stat().st_size > 1000 for p in paths)
    text = report.summary(df, "gpu")
    assert "| rmsnorm" in text and "| layernorm" in text  # one block of rows per variant (variant column)
    assert "62.1" in text and "91.6" in text  # the blog's per-variant values (RMS 512x512, LN 1024x1024)
    assert "blog B200 %" in text and "83.3" in text  # hidden (1.1 + 0.3 - 1.15) / 0.3


def test_cluster_sweep_skips_without_cluster_configs(tmp_path):
    from normfuse import plots

    df = _synthetic()
    assert plots.cluster_sweep(df[df.dsl != "tlx"], tmp_path, "x") == []


@pytest.mark.slow
def test_multi_cta_smoke_end_to_end(repo_root, subprocess_env, tmp_path):
    """The multi-CTA technique through the whole CPU path (experiment=multi_cta_smoke): Triton interpreter (both
    exchanges), Helion ref mode, TLX sm_90 compile (2- and 4-CTA clusters), each DSL's GEMM, both variants."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "experiments.run", "experiment=multi_cta_smoke", f"results_dir={tmp_path}", "run_id=t",
           "hydra.run.dir=" + str(tmp_path / "hydra")]
    p = subprocess.run(cmd, cwd=repo_root, env=subprocess_env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    df = pd.read_parquet(tmp_path / "multi_cta_smoke" / "t" / "results.parquet")
    assert set(df["variant"]) == {"rmsnorm", "layernorm"} and set(df["technique"]) == {"multi_cta"}
    assert set(df["status"]) <= {"ok", "compile_only"}, df[["dsl", "config_name", "status", "error"]]
    assert (df[df.dsl == "tlx"]["status"] == "compile_only").all()
    assert len(df[(df.dsl == "triton") & (df.impl == "fused")]) == 2 * 2 * 2
    details = [json.loads(d) for d in df[(df.dsl == "tlx") & (df.impl == "fused")]["details"]]
    assert all(d["ptx_markers"]["mapa"] > 0 and d["cluster_dims"][0] in (2, 4) for d in details)
