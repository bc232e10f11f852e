"""CPU tests of Lazy Pre-Norm's LayerNorm variant at the spec level: inputs, reference, the kernels' arithmetic
(emulated in torch), its cancellation with mean-shifted rows, the worker/sweep/GPU-check wiring, and the
experiments/lazy_ln_cancellation.py bounds. The kernels themselves are tested per DSL (test_kernels_triton.py,
test_kernels_helion.py, tlx/test_kernels_tlx.py)."""

from __future__ import annotations

import math

import pytest
import torch

from normfuse.techniques import lazy_prenorm as T

EPS = 1e-5


def _ln(M=33, N=24, K=40, dtype="fp32", seed=3, shift=0.0):
    return T.make_inputs(M, N, K, dtype=dtype, seed=seed, variant="layernorm", mean_shift=shift)


def test_variants_and_names():
    assert T.VARIANTS == ("rmsnorm", "layernorm")
    assert T.kernel_function_name("fused", "layernorm") == "lazy_layernorm_matmul"
    assert T.kernel_function_name("fused", "rmsnorm") == T.kernel_function_name("fused") == "lazy_rmsnorm_matmul"
    assert T.kernel_function_name("gemm", "layernorm") == "matmul"
    with pytest.raises(ValueError, match="choices"):
        T.kernel_function_name("fused", "groupnorm")
    with pytest.raises(ValueError, match="choices"):
        T.make_inputs(8, 8, 8, variant="groupnorm")
    for bad in (float("nan"), float("inf"), "10", True):
        with pytest.raises(ValueError, match="mean_shift"):
            T.make_inputs(8, 8, 8, mean_shift=bad)


def test_layernorm_inputs():
    x = _ln(M=64, N=32, K=48)
    r = T.make_inputs(64, 32, 48, dtype="fp32", seed=3)
    assert set(x) == {"a", "gamma", "b", "b_folded", "beta", "colsum", "beta_b"}
    assert set(r) == {"a", "gamma", "b", "b_folded"}  # rmsnorm inputs are unchanged
    for k in ("gamma", "b", "b_folded"):
        assert torch.equal(x[k], r[k])
    assert x["colsum"].dtype == x["beta_b"].dtype == torch.float32 and x["colsum"].shape == (32,)
    torch.testing.assert_close(x["colsum"], x["b_folded"].double().sum(0).float())
    torch.testing.assert_close(x["beta_b"], (x["beta"].double() @ x["b"].double()).float())
    # every row has its own mean (so a missing mean correction is visible), of the order of its std
    mean, std = x["a"].mean(-1), x["a"].std(-1)
    assert (mean.abs() > 0.05 * std).float().mean() > 0.8
    shifted = _ln(M=64, N=32, K=48, shift=100.0)
    torch.testing.assert_close(shifted["a"], x["a"] + 100.0)
    assert torch.equal(shifted["colsum"], x["colsum"])


def test_rank1_identity_matches_reference():
    """rstd ⊙ (A @ W') - (rstd·mean) ⊗ colsum(W') + β@B equals (LN(A)·γ + β) @ B: the identity of the variant."""
    x = _ln()
    mean, rstd = T.layernorm_stats(x["a"], EPS)
    lazy = (rstd[:, None] * (x["a"] @ x["b_folded"]) - (rstd * mean)[:, None] * x["colsum"][None, :]
            + x["beta_b"][None, :])
    torch.testing.assert_close(lazy, T.reference(x, EPS, "layernorm"), rtol=1e-5, atol=1e-5)
    # the reference against torch's own LayerNorm
    ln = torch.nn.functional.layer_norm(x["a"], (x["a"].shape[1],), x["gamma"], x["beta"], EPS)
    torch.testing.assert_close(T.reference(x, EPS, "layernorm"), ln @ x["b"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("epilogue", ["fp32", "mma"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("shift", [0.0, 10.0, 100.0])
def test_emulated_kernel_passes_with_mean_shift(dtype, shift, epilogue):
    x = _ln(M=96, N=64, K=200, dtype=dtype, shift=shift)
    ref, same = T.references("fused", x, EPS, "layernorm")
    out = T.lazy_layernorm_emulated(x["a"], x["b_folded"], x["colsum"], x["beta_b"], EPS, block_k=64,
                                    epilogue=epilogue).to(x["a"].dtype)
    res = T.compare(out, ref, T.tolerance(ref, same))
    assert res["ok"], res


def test_shift_removes_the_variance_cancellation():
    # fp32, |mean| / std up to 400: the naive one-pass variance loses ~17 bits, the shifted one keeps fp32 accuracy
    x = _ln(M=128, N=16, K=512, shift=100.0)
    _, rstd_ref = T.layernorm_stats(x["a"], EPS)
    err = {}
    for shift in (True, False):
        _, rs, _, _ = T.layernorm_stats_onepass(x["a"], EPS, shift=shift)
        err[shift] = ((rs - rstd_ref).abs() / rstd_ref).max().item()
    assert err[True] < 1e-5 < 1e-3 < err[False], err


def test_split3_and_ext_operands():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(1000, generator=g) * 37.0
    for dt, bits in ((torch.bfloat16, 22), (torch.float16, 20)):  # fp16: its third part is subnormal here
        parts = T.split3(v, dt)
        assert all(p.dtype == dt for p in parts)
        recon = sum(p.float() for p in parts)
        assert ((recon - v).abs() / v.abs()).max().item() < 2.0 ** -bits
    c = (torch.randn(7, generator=g) + 100.0).to(torch.bfloat16).float()  # elements of A: exact in bf16
    d, rstd = torch.randn(7, generator=g), torch.rand(7, generator=g) + 0.5
    cs, bb = torch.randn(5, generator=g), torch.randn(5, generator=g)
    a_ext, b_ext = T.layernorm_ext_operands(c, d, rstd, cs, bb, torch.bfloat16)
    assert a_ext.shape == (7, 16) and b_ext.shape == (16, 5) and not a_ext[:, 9:].any() and not b_ext[9:].any()
    got = a_ext.double() @ b_ext.double()
    want = -(c + d).double()[:, None] * cs.double()[None, :] + (1 / rstd).double()[:, None] * bb.double()[None, :]
    # the shift term (c ~ 100) to ~24 bits, the O(1) terms to ~16 bits
    assert (got - want).abs().max().item() < 100 * 2.0 ** -22 + 2.0 ** -14


def test_negative_controls():
    """The check catches the likely LayerNorm bugs: no mean correction, no beta, naive statistics at a large shift,
    and the padding of a K tail counted into the shifted sums."""
    x = _ln(M=64, N=48, K=200, dtype="bf16", shift=10.0)
    ref, same = T.references("fused", x, EPS, "layernorm")
    tol = T.tolerance(ref, same)
    a, bf, cs, bb = x["a"], x["b_folded"], x["colsum"], x["beta_b"]
    mean, rstd = T.layernorm_stats(a, EPS)
    acc = a.float() @ bf.float()
    assert T.compare((acc * rstd[:, None] + bb).to(a.dtype), ref, tol)["ok"] is False  # no mean correction
    assert T.compare((acc * rstd[:, None] - (rstd * mean)[:, None] * cs).to(a.dtype), ref, tol)["ok"] is False
    x100 = _ln(M=64, N=48, K=200, dtype="fp32", shift=300.0)
    ref, same = T.references("fused", x100, EPS, "layernorm")
    naive = T.lazy_layernorm_emulated(x100["a"], x100["b_folded"], x100["colsum"], x100["beta_b"], EPS, shift=False)
    assert T.compare(naive, ref, T.tolerance(ref, same))["ok"] is False
    # K tail: zero padding of the last K tile, shifted without a mask, adds -c per padded column
    pad = torch.nn.functional.pad(x["a"].float(), (0, 56))  # K = 200 -> 256 (as a 64-wide tile loop would read)
    _, rs_bad, _, _ = T.layernorm_stats_onepass(pad, EPS)  # statistics over the padded width...
    assert (rs_bad - rstd).abs().max().item() > 1e-2  # ...are wrong: the kernels must mask


def test_references_by_variant():
    x = _ln(M=8, N=16, K=24)
    for impl in T.IMPLS:
        ref, same = T.references(impl, x, EPS, "layernorm")
        assert ref.dtype == torch.float32 and ref.shape == same.shape
    ref, same = T.references("torch_compile_norm", x, EPS, "layernorm")
    torch.testing.assert_close(ref.mean(-1), torch.zeros(8), atol=1e-5, rtol=0)  # LayerNorm: zero-mean rows
    torch.testing.assert_close(ref, torch.nn.functional.layer_norm(x["a"], (24,), eps=EPS))
    gemm_ln, _ = T.references("gemm", x, EPS, "layernorm")
    gemm_rms, _ = T.references("gemm", x, EPS, "rmsnorm")
    assert torch.equal(gemm_ln, gemm_rms)  # the GEMM does not depend on the variant


def test_kernel_call_and_baselines():
    x = _ln(M=8, N=16, K=24)
    seen = {}

    def fake(*args, **kw):
        seen["args"], seen["kw"] = args, kw
        return "out"

    assert T.kernel_call(fake, "fused", x, EPS, {"k": 1}, "layernorm")() == "out"
    a, bf, cs, bb = seen["args"]
    assert a is x["a"] and bf is x["b_folded"] and cs is x["colsum"] and bb is x["beta_b"]
    assert seen["kw"] == {"eps": EPS, "config": {"k": 1}}
    T.kernel_call(fake, "fused", T.make_inputs(8, 16, 24), EPS, {}, "rmsnorm")()
    assert len(seen["args"]) == 2
    torch.testing.assert_close(T.baseline("cublas", x, EPS, "layernorm")(), x["a"] @ x["b_folded"])


def test_torch_compile_norm_baseline_is_layernorm(monkeypatch):
    x = _ln(M=8, N=16, K=24)
    monkeypatch.setattr(torch, "compile", lambda fn, dynamic=None: fn)  # no C++ toolchain needed on the CPU
    out = T.baseline("torch_compile_norm", x, EPS, "layernorm")()
    torch.testing.assert_close(out, torch.nn.functional.layer_norm(x["a"], (24,), eps=EPS))
    rms = T.baseline("torch_compile_norm", x, EPS, "rmsnorm")()
    torch.testing.assert_close(rms, T.rmsnorm(x["a"], EPS))


def test_check_layernorm_vectors():
    ok = torch.zeros(16)
    T.check_layernorm_vectors(ok, ok, 16, ok.device)
    for cs, err, match in [(ok.numpy(), TypeError, "colsum"), (ok.half(), TypeError, "float32"),
                           (torch.zeros(15), ValueError, r"\[N\] = \[16\]"), (torch.zeros(16, 1), ValueError, "shape"),
                           (torch.zeros(32)[::2], ValueError, "contiguous")]:
        with pytest.raises(err, match=match):
            T.check_layernorm_vectors(cs, ok, 16, ok.device)
        with pytest.raises(err):
            T.check_layernorm_vectors(ok, cs, 16, ok.device)
    with pytest.raises(ValueError, match="beta_b"):
        T.check_layernorm_vectors(ok, torch.zeros(8), 16, ok.device)


def test_worker_measures_the_layernorm_variant():
    """The worker builds LayerNorm inputs (beta, colsum, beta_b) when the request names the variant."""
    from normfuse.worker import measure

    req = {"technique": "lazy_prenorm", "dsl": "torch", "impl": "cublas", "variant": "layernorm", "M": 16, "N": 24,
           "K": 32, "dtype": "fp32", "eps": EPS, "mode": "cpu", "seed": 1, "options": {"mean_shift": 10.0}}
    r = measure(req)
    assert r["status"] == "ok", r


def test_gpu_checks_cover_layernorm(monkeypatch):
    import normfuse.worker
    from normfuse import gpu_checks

    assert gpu_checks.CHECKS["lazy_prenorm_ln"][0] == "lazy_prenorm_ln_h200.yaml"
    reqs = []
    monkeypatch.setattr(normfuse.worker, "measure", lambda req: reqs.append(req) or {"status": "ok"})
    for dsl in ("triton", "helion", "tlx"):
        assert gpu_checks.check_all(dsl, "lazy_prenorm_ln") == []
        cfgs = gpu_checks.shipped_configs(dsl, "lazy_prenorm_ln")
        assert len(cfgs) >= 2 and not any(c.get("known_incorrect") for c in cfgs)
        assert all(c.get("sumsq") != "shared_tile" for c in cfgs)
    assert {r["technique"] for r in reqs} == {"lazy_prenorm"} and {r["variant"] for r in reqs} == {"layernorm"}
    assert {r["eps"] for r in reqs} == {1e-5}
    shifted = [r for r in reqs if r["options"]]
    assert shifted and all(r["impl"] == "fused" and r["options"] == {"mean_shift": 10.0} for r in shifted)
    n_shapes = len(gpu_checks.ODD_SHAPES)
    fused = [r for r in reqs if r["impl"] == "fused"]
    assert len(fused) == 2 * n_shapes * sum(len(gpu_checks.shipped_configs(d, "lazy_prenorm_ln"))
                                            for d in ("triton", "helion", "tlx"))
    # the RMSNorm check is unchanged: no variant, no options
    reqs.clear()
    gpu_checks.check_all("triton", "lazy_prenorm")
    assert {r["variant"] for r in reqs} == {None} and not any(r["options"] for r in reqs)


def test_tlx_ln_tiling_matches_the_shipped_configs():
    """configs/tiling/lazy_prenorm_ln_h200.yaml lists exactly kernels_tlx' SHIPPED_LN_CONFIGS (which the TLX
    self-check and GPU test run); read as plain dicts here (fbtriton is not importable in this environment)."""
    import ast
    from pathlib import Path

    from normfuse import gpu_checks

    src = (Path(__file__).resolve().parents[1] / "kernels_tlx" / "lazy_prenorm.py").read_text()
    node = next(n for n in ast.parse(src).body if isinstance(n, ast.AnnAssign)
                and getattr(n.target, "id", "") == "SHIPPED_LN_CONFIGS")
    shipped = [{kw.arg: ast.literal_eval(kw.value) for kw in call.keywords} for call in node.value.values]
    defaults = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, NUM_STAGES=3, NUM_CONSUMERS=2, PERSISTENT=True)
    yaml_cfgs = [{k: v for k, v in c.items() if k not in ("name", "impls")}  # (impls: which ops the sweep times)
                 for c in gpu_checks.shipped_configs("tlx", "lazy_prenorm_ln")]
    assert [{**defaults, **s} for s in shipped] == [{**defaults, **y} for y in yaml_cfgs]


def test_cancellation_experiment_bounds():
    """experiments/lazy_ln_cancellation.py (quick, emulation only) prints the table and its asserted bounds hold."""
    from experiments import lazy_ln_cancellation as X

    rows = X._rows(96, 48, 256, ("bf16", "fp32"), (0.0, 10.0, 100.0, 1000.0), EPS)
    assert X.check(rows) == []
    text = X.table(rows)
    assert text.count("\n") == 1 + len(rows)
    fp32 = {r["shift"]: r["shifted/fp32-epi"]["rel_err_fp32"] for r in rows if r["dtype"] == "fp32"}
    # the epilogue cancellation grows about linearly with the shift (and is the only thing that grows)
    assert fp32[1000.0] > 30 * fp32[10.0] and fp32[1000.0] < 1e-6 * 1001
    assert math.isfinite(rows[-1]["naive"]["rel_err"])


@pytest.mark.slow
def test_layernorm_sweep_end_to_end_on_cpu(repo_root, subprocess_env, tmp_path):
    """experiment=lazy_prenorm_ln through the whole CPU path (runner -> workers): the variant reaches make_inputs,
    kernel_call and compile_only (Triton interpreter at fp16, Helion ref mode, TLX compiled for sm_90)."""
    import subprocess
    import sys

    import pandas as pd

    cmd = [sys.executable, "-m", "experiments.run", "experiment=lazy_prenorm_ln", "shape=smoke",
           f"results_dir={tmp_path}", "run_id=t", "hydra.run.dir=" + str(tmp_path / "hydra"), "baselines=[cublas]",
           "+technique.options={mean_shift: 10.0}",
           "tiling.triton=[{name: b32, BLOCK_M: 32, BLOCK_N: 32, BLOCK_K: 32, GROUP_M: 4, num_warps: 4, num_stages: 2,"
           " sumsq: reload, schedule: rowblock_nested}]",
           "tiling.helion=[{name: ref-mode, sumsq: rowblock}]",
           "tiling.tlx=[{name: ln-sub, EPILOGUE_SUBTILE: true, REUSE_RSTD: true}]"]
    p = subprocess.run(cmd, cwd=repo_root, env=subprocess_env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    df = pd.read_parquet(tmp_path / "lazy_prenorm_ln" / "t" / "results.parquet")
    assert set(df["variant"]) == {"layernorm"} and set(df["dsl"]) == {"torch", "triton", "helion", "tlx"}
    assert set(df["status"]) <= {"ok", "compile_only"}, df[["dsl", "impl", "M", "status", "error"]].to_string()
    assert (df[df.dsl == "tlx"]["status"] == "compile_only").all()
    assert len(df[(df.impl == "fused") & (df.status == "ok")]) == 2 * 3  # triton + helion, 3 smoke shapes


def test_summary_has_no_blog_column_for_layernorm():
    """The blog's B200 numbers are RMSNorm's: the LayerNorm summary must not show them as its reference."""
    import pandas as pd

    from normfuse import metrics, report

    rows = []
    for variant in ("layernorm", "rmsnorm"):
        base = {"technique": "lazy_prenorm", "variant": variant, "M": 262144, "N": 512, "K": 512, "dtype": "bf16",
                "status": "ok", "experiment": "x", "config_name": "c", "error": None}
        rows.append([{**base, "dsl": "torch", "impl": "cublas", "p50_ms": 1.0},
                     {**base, "dsl": "torch", "impl": "torch_compile_norm", "p50_ms": 0.3},
                     {**base, "dsl": "tlx", "impl": "gemm", "p50_ms": 1.1},
                     {**base, "dsl": "tlx", "impl": "fused", "p50_ms": 1.2}])
    ln, rms = (report.summary(metrics.add_hidden(metrics.add_rates(pd.DataFrame(r))), "gpu") for r in rows)
    assert "blog B200 %" not in ln and "blog B200 %" in rms
