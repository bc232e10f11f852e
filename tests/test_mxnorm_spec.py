"""The MXNorm technique spec (``normfuse.techniques.mxnorm``): math, inputs, the check (it must pass the PyTorch
implementations and fail perturbed outputs), the baselines (torch.compile on CPU), the sweep wiring."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from normfuse import mxfp8
from normfuse.techniques import get_technique
from normfuse.techniques import mxnorm as T

EPS = 1e-6


def _torch_out(variant, inp, eps=EPS):
    x, mode = inp["x"], inp["scale_mode"]
    if variant == "rmsnorm_cast":
        return T.torch_rmsnorm_cast(x, eps, mode)
    return T.torch_mxnorm_cast(x, T.P_OF[variant], eps, mode)


def test_registered():
    assert get_technique("mxnorm") is T


@pytest.mark.parametrize("p", [1, 2])
def test_rstd_is_c_over_pmean_of_block_absmax(p):
    """With eps -> 0, rstd = c(p, 32) / G^(p), G^(p) = (mean_k m_k^p)^(1/p) (the paper's estimator), fp64 here."""
    x = torch.randn(64, 4096, generator=torch.Generator().manual_seed(0)).double() * 3
    m = x.reshape(64, 128, 32).abs().amax(-1)
    G = m.pow(p).mean(-1).pow(1.0 / p)
    want = mxfp8.correction_constant(p, 32) / G
    got = T.reference_rstd(f"mxnorm_p{p}", x.float(), 1e-30).double()
    assert torch.allclose(got, want, rtol=3e-6)
    # and for Gaussian rows it estimates 1 / RMS to ~ the finite-K noise (techniques.md: +-1.3 % at D = 4096)
    rms_rstd = T.reference_rstd("rmsnorm_cast", x.float(), 1e-30).double()
    ratio = got / rms_rstd
    assert abs(ratio.mean().item() - 1) < 0.01 and ratio.std().item() < 0.03


def test_scales_from_input_absmax_equal_scales_of_y():
    """The MXNorm kernel's shortcut: the block absmax of y = x * rstd is fl(rstd * m) exactly, so the E8M0 scales
    follow from the input absmaxes without reducing y (random rows, the special rows, both modes)."""
    for seed in range(3):
        inp = T.make_inputs(512, 2048, dtype="bf16", seed=seed)
        x = inp["x"].float()
        for variant in ("mxnorm_p1", "mxnorm_p2", "rmsnorm_cast"):
            rstd = T.reference_rstd(variant, x, EPS)
            y = x * rstd[:, None]
            a_direct = mxfp8.block_amax(y)
            a_short = rstd[:, None] * mxfp8.block_amax(x)
            for mode in mxfp8.SCALE_MODES:
                assert torch.equal(mxfp8.scales_from_amax(a_short, mode), mxfp8.scales_from_amax(a_direct, mode))


@pytest.mark.parametrize("variant", T.VARIANTS)
@pytest.mark.parametrize("mode", mxfp8.SCALE_MODES)
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_check_passes_torch_implementation(variant, mode, dtype):
    inp = T.make_inputs(37, 320, dtype=dtype, seed=3, scale_mode=mode)
    r = T.check("norm_cast", _torch_out(variant, inp), inp, EPS, variant)
    assert r["ok"], r
    assert r["max_abs_err"] == 0 and r["scale_mismatch_rel_err"] == 0


@pytest.mark.parametrize("variant", T.VARIANTS)
def test_check_fails_perturbed_outputs(variant):
    inp = T.make_inputs(40, 256, dtype="bf16", seed=4)
    data, scales, rstd = _torch_out(variant, inp)
    assert T.check("norm_cast", (data, scales, rstd), inp, EPS, variant)["ok"]
    s2 = scales.clone()
    s2[20, 3] += 1
    assert not T.check("norm_cast", (data, s2, rstd), inp, EPS, variant)["ok"]
    d2 = data.view(torch.uint8).clone()
    d2[21, 7] = (d2[21, 7].int() + 2).clamp(max=0x7E).to(torch.uint8) if d2[21, 7] < 0x70 else d2[21, 7] - 2
    r = T.check("norm_cast", (d2.view(torch.float8_e4m3fn), scales, rstd), inp, EPS, variant)
    assert not r["ok"] and r["max_abs_err"] == 2
    d1 = data.view(torch.uint8).clone()
    d1[21, 7] ^= 1  # one code away: tolerated
    assert T.check("norm_cast", (d1.view(torch.float8_e4m3fn), scales, rstd), inp, EPS, variant)["ok"]
    r2 = rstd.clone()
    r2[9] *= 1 + 1e-4
    assert not T.check("norm_cast", (data, scales, r2), inp, EPS, variant)["ok"]
    r3 = rstd.clone()
    r3[2] = 1.0  # the NaN row must stay NaN
    assert not T.check("norm_cast", (data, scales, r3), inp, EPS, variant)["ok"]
    assert not T.check("norm_cast", (data[:, :128], scales, rstd), inp, EPS, variant)["ok"]


def test_wrong_variant_fails_check():
    """MXNorm's estimate differs from the true RMS by ~1 %: an rmsnorm output must not pass the MXNorm check."""
    inp = T.make_inputs(64, 1024, dtype="bf16", seed=5)
    assert not T.check("norm_cast", _torch_out("rmsnorm_cast", inp), inp, EPS, "mxnorm_p2")["ok"]
    assert not T.check("norm_cast", _torch_out("mxnorm_p1", inp), inp, EPS, "mxnorm_p2")["ok"]


def test_make_inputs_specials_and_determinism():
    a = T.make_inputs(16, 128, dtype="bf16", seed=7)
    b = T.make_inputs(16, 128, dtype="bf16", seed=7)
    x = a["x"]
    assert torch.equal(x.view(torch.int16), b["x"].view(torch.int16))
    assert (x[1, :32] == 0).all() and torch.isnan(x[2, 5]) and torch.isinf(x[3, -1]) and (x[5] == 0).all()
    assert x[4].float().abs().max().item() <= 4 * torch.finfo(torch.bfloat16).tiny
    assert x[6].float().abs().max().item() > 1e37
    assert (x[0] != 0).all() and (x[7:] != 0).any(-1).all()
    assert torch.isfinite(T.make_inputs(16, 128, specials=False)["x"]).all()
    assert T.make_inputs(4, 64)["scale_mode"] == "floor"


def test_distributions():
    g = torch.Generator().manual_seed(8)
    t = T.sample_rows(512, 1024, "student_t", generator=g, df=3.0)
    assert abs(t.abs().median().item() - 0.7649) < 0.01  # median |t_3| = 0.7649
    o = T.sample_rows(64, 1024, "outlier_channels", generator=g)
    col_rms = o.pow(2).mean(0).sqrt()
    assert (col_rms > 10).sum().item() == 8
    with pytest.raises(ValueError, match="choices"):
        T.sample_rows(4, 64, "laplace")


def test_validation():
    with pytest.raises(ValueError, match="multiple of the MX block size 32"):
        T.check_shape(4, 48)
    with pytest.raises(ValueError, match="positive"):
        T.check_shape(0, 64)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert T.check_inputs(x, 1e-6, 2, "rceil") == (4, 64)
    with pytest.raises(TypeError):
        T.check_inputs(x.to(torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        T.check_inputs(torch.randn(64, 8).t())
    with pytest.raises(ValueError, match="eps"):
        T.check_inputs(x, 0.0)
    with pytest.raises(ValueError, match="p must be 1 or 2"):
        T.check_inputs(x, 1e-6, 3)
    with pytest.raises(ValueError, match="choices"):
        T.check_inputs(x, 1e-6, 2, "even")
    with pytest.raises(ValueError, match="choices"):
        T.kernel_function_name("norm_cast", "layernorm")
    assert T.kernel_function_name("norm_cast", "mxnorm_p1") == "mxnorm_mxfp8"
    assert T.kernel_function_name("norm_cast", "rmsnorm_cast") == "rmsnorm_mxfp8"


def test_cost_model_and_constants():
    assert T.bytes_moved("norm_cast", 1024, 4096) == 1024 * 4096 * 3 + 1024 * 128 + 4096
    c1 = mxfp8.correction_constant(1, 32)
    assert T.mx_constant(1, 4096) == pytest.approx(1 / (128 * c1), rel=1e-7)
    assert T.mx_constant(2, 4096) == pytest.approx(1 / (128 * mxfp8.correction_constant(2, 32) ** 2), rel=1e-7)
    assert T.mx_constant(2, 4096) == torch.tensor(T.mx_constant(2, 4096), dtype=torch.float32).item()


def test_baselines_and_sweep_wiring():
    assert T.baseline_applies("torch_compile_rmsnorm_cast", "rmsnorm_cast")
    assert not T.baseline_applies("torch_compile_rmsnorm_cast", "mxnorm_p2")
    assert T.baseline_applies("torch_compile_mxnorm_cast", "mxnorm_p1")
    inp = T.make_inputs(8, 64)
    with pytest.raises(ValueError, match="measured with"):
        T.baseline("torch_compile_mxnorm_cast", inp, EPS, "rmsnorm_cast")
    with pytest.raises(ValueError, match="choices"):
        T.baseline("cublas", inp, EPS, "rmsnorm_cast")
    from normfuse import sweep

    cfg = {"technique": {"name": "mxnorm", "variants": list(T.VARIANTS), "eps": EPS, "impls": ["norm_cast"],
                         "options": {"scale_mode": "floor"}},
           "dsls": {"triton": {"env": "upstream", "cpu_mode": "interpret"}}, "tiling": {"triton": [{"name": "a"}]},
           "baselines": list(T.BASELINES), "shape": {"grid": {"M": [1024], "N": [4096]}}, "baseline_env": "upstream",
           "dtype": "bf16", "cpu_dtype": "fp16"}
    pts = sweep.expand_points(cfg, "gpu")
    base = sorted((p["variant"], p["impl"]) for p in pts if p["dsl"] == "torch")
    assert base == [("mxnorm_p1", "torch_compile_mxnorm_cast"), ("mxnorm_p2", "torch_compile_mxnorm_cast"),
                    ("rmsnorm_cast", "torch_compile_rmsnorm_cast")]
    assert len([p for p in pts if p["dsl"] == "triton"]) == 3


@pytest.mark.parametrize("variant,impl", [("rmsnorm_cast", "torch_compile_rmsnorm_cast"),
                                          ("mxnorm_p1", "torch_compile_mxnorm_cast")])
def test_torch_compile_baseline_cpu(variant, impl):
    inp = T.make_inputs(33, 512, dtype="bf16", seed=9, scale_mode="rceil")
    out = T.baseline(impl, inp, EPS, variant)()
    r = T.check("norm_cast", out, inp, EPS, variant)
    assert r["ok"], r


def test_speedups_table():
    rows = []
    for dsl, variant, impl, ms in [("torch", "rmsnorm_cast", "torch_compile_rmsnorm_cast", 2.0),
                                   ("torch", "mxnorm_p2", "torch_compile_mxnorm_cast", 1.5),
                                   ("triton", "rmsnorm_cast", "norm_cast", 1.1), ("triton", "mxnorm_p2", "norm_cast", 1.0),
                                   ("triton", "mxnorm_p2", "norm_cast", 1.2)]:
        rows.append({"M": 4096, "N": 4096, "dsl": dsl, "variant": variant, "impl": impl, "status": "ok", "p50_ms": ms})
    t = T.speedups(pd.DataFrame(rows))
    assert t["triton/mxnorm_p2 vs tc_rms_cast"].iloc[0] == pytest.approx(2.0)
    assert t["triton/mxnorm_p2 vs triton/rmsnorm_cast"].iloc[0] == pytest.approx(1.1)
    assert math.isclose(t["triton/mxnorm_p2 us"].iloc[0], 1000.0)
