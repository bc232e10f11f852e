"""The naive-fusion technique spec (``normfuse.techniques.naive_fusion``) and its place in the harness, on the CPU:
reference math, inputs, tolerance and statistics checks (with negative controls), input validation, the cost model,
how the worker calls kernels and baselines, metrics / report / plots per variant with the blog's values, the GPU
check expansion, and the runner end to end (Triton interpreter, both variants, cuBLAS / torch.compile baselines)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from normfuse import metrics
from normfuse.techniques import get_technique
from normfuse.techniques import naive_fusion as nf

EPS = 1e-5


def _ln(x, eps, w=None, b=None):
    x = x.double()
    m = x.mean(-1, keepdim=True)
    r = torch.rsqrt(((x - m) ** 2).mean(-1, keepdim=True) + eps)
    y = (x - m) * r
    y = y * w.double() if w is not None else y
    return y + b.double() if b is not None else y, m[:, 0], r[:, 0]


def _rms(x, eps, w=None):
    x = x.double()
    r = torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    y = x * r
    return (y * w.double() if w is not None else y), r[:, 0]


# --------------------------------------------------------------------------------------------------------
# math, inputs, tolerance
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("affine", [False, True])
def test_reference_math(affine):
    inp = nf.make_inputs(33, 72, 40, dtype="fp32", affine=affine, seed=3)
    c = inp["a"].double() @ inp["b"].double()
    ref = nf.reference("layernorm", inp, EPS)
    y, m, r = _ln(c, EPS, inp["weight"], inp["bias"])
    torch.testing.assert_close(ref["y"].double(), y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref["mean"].double(), m, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ref["rstd"].double(), r, rtol=1e-5, atol=0)
    ref = nf.reference("rmsnorm", inp, EPS)
    y, r = _rms(c, EPS, inp["weight"])
    torch.testing.assert_close(ref["y"].double(), y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref["rstd"].double(), r, rtol=1e-5, atol=0)
    assert set(ref) == {"y", "rstd"}
    if affine:  # RMSNorm has no bias: the reference ignores it
        no_bias = nf.reference("rmsnorm", {**inp, "bias": None}, EPS)
        torch.testing.assert_close(no_bias["y"], ref["y"])


def test_inputs_random_seeded_and_mean_shift():
    x1, x2 = nf.make_inputs(64, 64, 64, dtype="fp32", seed=1), nf.make_inputs(64, 64, 64, dtype="fp32", seed=1)
    x3 = nf.make_inputs(64, 64, 64, dtype="fp32", seed=2)
    assert torch.equal(x1["a"], x2["a"]) and not torch.equal(x1["a"], x3["a"])
    assert x1["weight"] is None and x1["bias"] is None
    assert (x1["a"] != 0).float().mean() > 0.99 and (x1["b"] != 0).float().mean() > 0.99
    c = x1["a"] @ x1["b"]
    std = c.std(-1)
    assert std.max() / std.min() > 2  # rows have different scales, so a wrong rstd is visible
    assert c.mean(-1).abs().max() < 3 * std.max()
    s = nf.make_inputs(64, 64, 64, dtype="fp32", seed=1, mean_shift=10.0, affine=True)
    cs = s["a"] @ s["b"]
    assert (cs.mean(-1).abs() / cs.std(-1)).min() > 5  # |mean| ~ 10 std on every row
    assert s["weight"].shape == (64,) and s["bias"].shape == (64,)
    assert nf.make_inputs(4, 16, 8, dtype="bf16")["a"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="multiple of 8"):
        nf.make_inputs(4, 20, 8)
    with pytest.raises(ValueError, match="dtype"):
        nf.make_inputs(4, 16, 8, dtype="fp8")


def test_gemm_output_is_cached_once():
    inp = nf.make_inputs(8, 16, 16, dtype="fp32")
    c = nf.gemm_output(inp)
    assert nf.gemm_output(inp) is c and inp["c"] is c
    torch.testing.assert_close(c, inp["a"] @ inp["b"])


@pytest.mark.parametrize("variant", nf.VARIANTS)
def test_check_accepts_correct_and_rejects_wrong(variant):
    inp = nf.make_inputs(37, 72, 40, dtype="fp16", affine=True, seed=5, mean_shift=2.0)
    ref = nf.reference(variant, inp, EPS)
    stats = (ref["mean"], ref["rstd"]) if variant == "layernorm" else (ref["rstd"],)
    good = nf.check("fused", (ref["y"].half(), *stats), inp, EPS, variant)
    assert good["ok"], good
    # the unfused same-dtype path is within its own tolerance (its error sets it)
    assert nf.check("fused", (nf.same_dtype(variant, inp, EPS), *stats), inp, EPS, variant)["ok"]
    wrong = {
        "unnormalized": (nf.gemm_output(inp), *stats),
        "rstd 1.2x": (ref["y"] * 1.2, *stats),
        "nan": (torch.full_like(ref["y"], float("nan")), *stats),
        "eps 0.5": ((nf.reference(variant, inp, 0.5)["y"]), *stats),
        "no statistics": ref["y"],
        "rstd stat 1%": (ref["y"], *stats[:-1], stats[-1] * 1.01),
        "rstd stat missing": (ref["y"], *stats[:-1]),
    }
    if variant == "layernorm":
        c = nf._fp32_matmul(inp["a"], inp["b"])
        wrong["not centred"] = (c * ref["rstd"][:, None] * inp["weight"].float() + inp["bias"].float(), *stats)
        wrong["mean stat 1% of std"] = (ref["y"], ref["mean"] + 0.01 / ref["rstd"], ref["rstd"])
        wrong["no bias"] = (ref["y"] - inp["bias"].float(), *stats)
    else:
        wrong["no weight"] = (ref["y"] / inp["weight"].float(), *stats)
    for name, out in wrong.items():
        r = nf.check("fused", out, inp, EPS, variant)
        assert not r["ok"], (name, r)


def test_check_one_pass_variance_fails_for_shifted_rows():
    """fp32 rows with |mean| ~ 3000 std: E[x^2] - mean^2 in fp32 cancels and fails; the two-pass reference passes."""
    inp = nf.make_inputs(45, 136, 48, dtype="fp32", seed=6, mean_shift=3000.0)
    acc = inp["a"] @ inp["b"]
    m = acc.mean(-1)
    r1 = torch.rsqrt(((acc * acc).mean(-1) - m * m).clamp_min(0) + EPS)
    assert not nf.check("fused", ((acc - m[:, None]) * r1[:, None], m, r1), inp, EPS, "layernorm")["ok"]
    r2 = torch.rsqrt(((acc - m[:, None]) ** 2).mean(-1) + EPS)
    assert nf.check("fused", ((acc - m[:, None]) * r2[:, None], m, r2), inp, EPS, "layernorm")["ok"]


def test_check_mean_error_is_relative_to_the_row_std():
    """A row whose mean is ~0 must not fail on a tiny absolute mean error (a relative error would blow up)."""
    inp = nf.make_inputs(16, 64, 64, dtype="fp32", seed=7)
    ref = nf.reference("layernorm", inp, EPS)
    mean = ref["mean"].clone()
    mean[3] = 1e-9
    ref_mean0 = {**ref, "mean": mean}
    err = nf._stats_errors("layernorm", (mean + 1e-6, ref["rstd"]), ref_mean0)
    assert err["stats_ok"] and err["mean_rel_err"] < 1e-4


def test_check_gemm_and_norm_baselines():
    inp = nf.make_inputs(33, 64, 48, dtype="fp16", seed=8, affine=True)
    assert nf.check("gemm", inp["a"] @ inp["b"], inp, EPS)["ok"]
    assert nf.check("cublas", inp["a"] @ inp["b"], inp, EPS)["ok"]
    assert not nf.check("gemm", (inp["a"] @ inp["b"]) * 1.05, inp, EPS)["ok"]
    for variant in nf.VARIANTS:
        c = nf.gemm_output(inp)
        eager = (torch.nn.functional.layer_norm(c, (64,), inp["weight"], inp["bias"], EPS) if variant == "layernorm"
                 else torch.nn.functional.rms_norm(c, (64,), inp["weight"], EPS))
        assert nf.check("torch_compile_norm", eager, inp, EPS, variant)["ok"]
        assert not nf.check("torch_compile_norm", c, inp, EPS, variant)["ok"]
    with pytest.raises(ValueError, match="choices"):
        nf.check("norm", inp["a"], inp, EPS, "layernorm")
    with pytest.raises(ValueError, match="choices"):
        nf.check("fused", (inp["a"],), inp, EPS, "groupnorm")


# --------------------------------------------------------------------------------------------------------
# validation, names, cost model
# --------------------------------------------------------------------------------------------------------
def test_check_inputs_errors():
    a, b = torch.randn(16, 32).half(), torch.randn(32, 64).half()
    assert nf.check_inputs(a, b, torch.ones(64).half(), torch.zeros(64).half(), eps=1e-5) == (16, 64, 32)
    cases = [
        ((a, b.float()), {}, TypeError, "dtype"),
        ((a, torch.randn(16, 64).half()), {}, ValueError, "inner dimensions"),
        ((a[None], b), {}, ValueError, "2-D"),
        ((a, torch.randn(32, 20).half()), {}, ValueError, "multiple of 8"),
        ((a, b, torch.ones(63).half()), {}, ValueError, r"shape \[N\]"),
        ((a, b, None, torch.ones(65).half()), {}, ValueError, r"shape \[N\]"),
        ((a, b, torch.ones(64, dtype=torch.int32)), {}, TypeError, "weight"),
        ((a, b, [1.0] * 64), {}, TypeError, "weight"),
        ((a, b, None, torch.zeros(64)), {}, TypeError, "bias must have a's dtype"),  # one dtype rule, every DSL
        ((a, b), {"eps": 0.0}, ValueError, "eps"),
        ((a, b), {"eps": True}, ValueError, "eps"),
        ((a, b), {"eps": float("nan")}, ValueError, "eps"),
    ]
    for args, kw, err, match in cases:
        with pytest.raises(err, match=match):
            nf.check_inputs(*args, **kw)


def test_names_and_registry():
    assert get_technique("naive_fusion") is nf
    assert nf.VARIANTS == ("layernorm", "rmsnorm") and nf.IMPLS == ("fused", "gemm")
    assert nf.BASELINES == ("cublas", "torch_compile_norm", "torch_eager_norm", "liger_norm")
    assert nf.kernel_function_name("fused", "layernorm") == "matmul_layernorm"
    assert nf.kernel_function_name("fused", "rmsnorm") == "matmul_rmsnorm"
    assert nf.kernel_function_name("gemm", "rmsnorm") == "matmul"
    with pytest.raises(ValueError, match="choices"):
        nf.kernel_function_name("norm", "layernorm")
    with pytest.raises(ValueError, match="choices"):
        nf.kernel_function_name("fused", None)
    with pytest.raises(ValueError, match="choices"):
        nf.baseline("cudnn", nf.make_inputs(8, 16, 16), EPS, "layernorm")
    a, b = nf.compile_inputs(262144, 512, 64, "bf16")
    assert a.shape == (262144, 64) and b.shape == (64, 512) and a.dtype == torch.bfloat16


def test_kernel_call_and_cublas_baseline():
    calls = []

    def fake(*args, **kw):
        calls.append((len(args), sorted(kw)))
        return "out"

    inp = nf.make_inputs(8, 16, 16, dtype="fp32", affine=True)
    assert nf.kernel_call(fake, "gemm", inp, EPS, {"x": 1}, "layernorm")() == "out"
    nf.kernel_call(fake, "fused", inp, EPS, {}, "layernorm")()
    nf.kernel_call(fake, "fused", inp, EPS, {}, "rmsnorm")()
    assert calls == [(2, ["config"]), (4, ["config", "eps"]), (3, ["config", "eps"])]
    with pytest.raises(ValueError, match="choices"):
        nf.kernel_call(fake, "cublas", inp, EPS, {}, "layernorm")
    torch.testing.assert_close(nf.baseline("cublas", inp, EPS, "layernorm")(), inp["a"] @ inp["b"])


def test_cost_model():
    M, N, K = 262144, 128, 64
    assert nf.flops("gemm", M, N, K) == nf.flops("cublas", M, N, K) == 2 * M * N * K
    assert nf.flops("fused", M, N, K) == 2 * M * N * K + 4 * M * N
    assert nf.flops("torch_compile_norm", M, N, K) == 4 * M * N
    assert nf.bytes_moved("fused", M, N, K) == nf.bytes_moved("gemm", M, N, K) == 2 * (M * K + K * N + M * N)
    # the unfused pair moves exactly the C round trip more than the fused kernel
    unfused = nf.bytes_moved("gemm", M, N, K) + nf.bytes_moved("torch_compile_norm", M, N, K)
    assert unfused - nf.bytes_moved("fused", M, N, K) == 2 * M * N * 2
    for fn in (nf.flops, nf.bytes_moved):
        with pytest.raises(ValueError):
            fn("norm", M, N, K)


def test_blog_values():
    assert nf.BLOG_HIDDEN_B200 == {(64, 64): 25.63, (64, 128): 28.11, (128, 64): 17.24, (128, 128): 32.20,
                                   (128, 256): -2.46, (256, 128): -2.90, (256, 256): -64.38}
    assert nf.BLOG_VARIANT == "layernorm"


# --------------------------------------------------------------------------------------------------------
# metrics, report and plots (synthetic GPU timings), per variant
# --------------------------------------------------------------------------------------------------------
def _gpu_rows():
    rows = []
    for K in (64, 128):
        for N in (64, 128, 512):
            for variant, t_norm in (("layernorm", 0.05), ("rmsnorm", 0.04)):
                base = {"technique": "naive_fusion", "variant": variant, "M": 262144, "N": N, "K": K,
                        "dtype": "bf16", "status": "ok", "experiment": "naive_fusion_blog", "config_name": "c",
                        "error": None}
                rows += [{**base, "dsl": "torch", "impl": "cublas", "p50_ms": 0.03},
                         {**base, "dsl": "torch", "impl": "torch_compile_norm", "p50_ms": t_norm},
                         {**base, "dsl": "triton", "impl": "gemm", "p50_ms": 0.035}]
                if N == 512 and K == 128:
                    rows.append({**base, "dsl": "triton", "impl": "fused", "p50_ms": None, "status": "unsupported",
                                 "error": "ValueError: registers"})
                else:
                    rows.append({**base, "dsl": "triton", "impl": "fused", "p50_ms": 0.06})
    return pd.DataFrame(rows)


def test_metrics_per_variant():
    df = metrics.add_hidden(metrics.add_rates(_gpu_rows()))
    f = df[(df.impl == "fused") & (df.status == "ok")]
    ln = f[f.variant == "layernorm"].iloc[0]
    rms = f[f.variant == "rmsnorm"].iloc[0]
    assert ln.hidden_dsl == pytest.approx((0.035 + 0.05 - 0.06) / 0.05)
    assert rms.hidden_dsl == pytest.approx((0.035 + 0.04 - 0.06) / 0.04)
    assert ln.hidden_best == pytest.approx((0.03 + 0.05 - 0.06) / 0.05)
    assert np.isfinite(f["tflops"]).all() and np.isfinite(f["gbps"]).all()
    best = metrics.best_fused(df)
    assert len(best) == 2 * (2 * 3 - 1)


def test_report_and_plots_per_variant(tmp_path):
    from normfuse import report

    df = metrics.add_hidden(metrics.add_rates(_gpu_rows()))
    paths = report.make_plots(df, tmp_path, "gpu", {"hardware_before": {"gpu_name": "NVIDIA H200",
                                                                        "power_limit_w": 700.0}})
    assert {p.name for p in paths} == {f"{k}_{v}{w}.{e}" for k in ("hidden_heatmap", "hidden_bars")
                                       for v in ("layernorm", "rmsnorm") for w in ("", "_1col") for e in ("png", "pdf")}
    assert all(p.stat().st_size > 1000 for p in paths)
    text = report.summary(df, "gpu")
    table = [[c.strip() for c in x.strip("|").split("|")] for x in text.splitlines() if x.startswith("| ")]
    header = next(r for r in table if r[0] == "variant" and "blog B200 %" in r)
    cells = {tuple(r[:4]): dict(zip(header, r)) for r in table if r[0] in nf.VARIANTS and len(r) == len(header)}
    col = f"triton {nf.PRIMARY_METRIC} %"  # naive fusion reports hidden_best per DSL (its DSL GEMMs are weak)
    best = metrics.best_fused(df)

    def expected(variant):
        r = best[(best.dsl == "triton") & (best.variant == variant) & (best.K == 64) & (best.N == 64)]
        return f"{100 * r[nf.PRIMARY_METRIC].iloc[0]:.1f}"

    ln = cells[("layernorm", "262144", "64", "64")]
    assert ln[col] == expected("layernorm") and ln["blog B200 %"] == "25.6"
    rms = cells[("rmsnorm", "262144", "64", "64")]
    assert rms[col] == expected("rmsnorm") and rms["blog B200 %"] == "–"  # the blog measured LayerNorm only
    assert cells[("layernorm", "262144", "64", "512")]["blog B200 %"] == "–"
    assert cells[("layernorm", "262144", "128", "512")][col] == "–"  # unsupported: no metric
    assert "unsupported" in text and "nan" not in text
    # one variant: the unsuffixed file names of the other techniques, with the blog panel
    one = df[df.variant == "layernorm"]
    paths = report.make_plots(one, tmp_path / "one", "gpu", {})
    assert {p.name for p in paths} == {f"{n}{w}.{e}" for n in ("hidden_heatmap", "hidden_bars")
                                       for w in ("", "_1col") for e in ("png", "pdf")}
    assert "blog B200 %" in report.summary(one, "gpu")
    assert report._blog(one, "layernorm") is nf.BLOG_HIDDEN_B200 and report._blog(one, "rmsnorm") is None


def test_replicates_per_variant(tmp_path):
    from normfuse import report

    dirs = []
    for i in range(2):
        df = _gpu_rows()
        df.loc[df.impl == "fused", "p50_ms"] *= 1 + 0.01 * i
        df = metrics.add_hidden(metrics.add_rates(df))
        d = tmp_path / f"r{i}"
        d.mkdir()
        df.to_parquet(d / "results.parquet")
        dirs.append(d)
    text = report.replicates(dirs)
    assert "| layernorm" in text and "| rmsnorm" in text and "25.6" in text and "Slowest / fastest" in text


# --------------------------------------------------------------------------------------------------------
# GPU check expansion (the measurement itself needs the GPU)
# --------------------------------------------------------------------------------------------------------
def test_gpu_check_expansion(monkeypatch):
    from normfuse import gpu_checks, worker

    seen = []

    def fake_measure(req):
        seen.append(req)
        if req["impl"] == "fused" and req["config"].get("BLOCK_M") == 128 and req["N"] == 512:
            raise ValueError("registers")  # a config that cannot serve the shape is skipped, not a failure
        return {"status": "ok"}

    monkeypatch.setattr(worker, "measure", fake_measure)
    assert gpu_checks.check_all("triton", "naive_fusion") == []
    entries = gpu_checks.shipped_configs("triton", "naive_fusion")
    fused = [e for e in entries if e["impls"] == ["fused"]]
    gemm = [e for e in entries if e["impls"] == ["gemm"]]
    _, shapes, variants, eps = gpu_checks.CHECKS["naive_fusion"]
    n_opts = len(gpu_checks.CHECK_OPTIONS["naive_fusion"])  # {} and the affine + mean-shifted set: fused only
    assert len(seen) == (len(fused) * len(variants) * n_opts + len(gemm)) * len(shapes)
    assert {r["variant"] for r in seen if r["impl"] == "gemm"} == {variants[0]}  # the GEMM once, not per variant
    assert {json.dumps(r["options"], sort_keys=True) for r in seen} == {"{}", json.dumps(
        {"affine": True, "mean_shift": 10.0}, sort_keys=True)}
    assert all(r["dtype"] == "bf16" and r["mode"] == "gpu" and r["eps"] == eps and "name" not in r["config"]
               and "impls" not in r["config"] for r in seen)
    # a failing point is reported with its options
    monkeypatch.setattr(worker, "measure", lambda req: {"status": "incorrect", "error": "x"})
    fails = gpu_checks.check_all("triton", "naive_fusion")
    assert fails and any("mean_shift" in f for f in fails)


# --------------------------------------------------------------------------------------------------------
# the runner end to end on the CPU
# --------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_naive_fusion_smoke_end_to_end(repo_root, subprocess_env, tmp_path):
    """Triton interpreter (tile and persistent schedules, both variants, the DSL GEMM), cuBLAS and torch.compile
    baselines on CPU, through worker, sweep, results, report and the CPU check map."""
    cmd = [sys.executable, "-m", "experiments.run", "experiment=naive_fusion_smoke", f"results_dir={tmp_path}",
           "run_id=t", "hydra.run.dir=" + str(tmp_path / "hydra"), "dsl=[triton]"]
    p = subprocess.run(cmd, cwd=repo_root, env=subprocess_env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    run_dir = tmp_path / "naive_fusion_smoke" / "t"
    df = pd.read_parquet(run_dir / "results.parquet")
    assert set(df["variant"]) == {"layernorm", "rmsnorm"}
    assert set(df["status"]) == {"ok"}, df[["dsl", "impl", "config_name", "status", "error"]]
    assert set(zip(df["dsl"], df["impl"])) == {("torch", "cublas"), ("torch", "torch_compile_norm"),
                                                ("triton", "fused"), ("triton", "gemm")}
    assert (df[df.dsl == "triton"]["mode"] == "interpret").all()
    assert "p50_ms" not in df or df["p50_ms"].isna().all()  # CPU mode makes no timing claims
    assert (df["max_abs_err"] <= df["tol"]).all()
    assert (run_dir / "plots" / "check_heatmap.png").exists() and (run_dir / "summary.md").exists()
