"""fna_llm technique spec: inputs, validation, the fp32 reference against independent math, cost model, metrics."""

import math

import pandas as pd
import pytest
import torch

from normfuse.techniques import fna_llm as T


def _naive(q, k, v, qw, kw, ow, eps, causal):
    """Independent reference: expand KV heads, full score matrix in float64."""
    D = q.shape[-1]
    rms = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w  # noqa: E731
    q, k, v = q.double(), k.double(), v.double()
    G = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(G, dim=1)
    v = v.repeat_interleave(G, dim=1)
    qn, kn = rms(q, qw.double()), rms(k, kw.double())
    s = qn @ kn.transpose(-1, -2) / math.sqrt(D)
    if causal:
        S = q.shape[2]
        s = s.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool), 1), float("-inf"))
    o = torch.softmax(s, -1) @ v
    return rms(o, ow.double()) if ow is not None else o


@pytest.mark.parametrize("variant", T.VARIANTS)
@pytest.mark.parametrize("o_norm", [False, True])
def test_reference_matches_naive_math(variant, o_norm):
    inp = T.make_inputs(37, 2, 6, dtype="fp32", kv_heads=2, head_dim=32, o_norm=o_norm, seed=1)
    ref = T.reference(variant, inp, 1e-6)
    want = _naive(inp["q"], inp["k"], inp["v"], inp["q_weight"], inp["k_weight"], inp["o_weight"], 1e-6,
                  variant == "causal")
    assert ref.shape == inp["q"].shape and ref.dtype == torch.float32
    assert torch.allclose(ref.double(), want, atol=1e-5, rtol=1e-5)
    # the chunked path (query chunks smaller than S) gives the same result
    small = T._attention_fp32(T.rmsnorm(inp["q"], inp["q_weight"], 1e-6), T.rmsnorm(inp["k"], inp["k_weight"], 1e-6),
                              inp["v"], variant == "causal", chunk=8)
    if not o_norm:
        assert torch.allclose(small, ref, atol=1e-6)


def test_reference_without_norms_is_sdpa():
    inp = T.make_inputs(20, 1, 4, dtype="fp32", kv_heads=4, head_dim=16)
    for variant in T.VARIANTS:
        sd = torch.nn.functional.scaled_dot_product_attention(inp["q"], inp["k"], inp["v"],
                                                              is_causal=variant == "causal")
        assert torch.allclose(T.reference(variant, inp, 1e-6, norms=False), sd, atol=1e-5)


def test_check_accepts_baselines_and_rejects_wrong_outputs():
    inp = T.make_inputs(50, 2, 4, dtype="fp16", kv_heads=2, head_dim=32, o_norm=True)
    for impl in T.BASELINES:
        out = T.baseline(impl, inp, 1e-6, "causal")()
        assert T.check(impl, out, inp, 1e-6, "causal")["ok"], impl
    # SDPA without the norms is not the fused op; the non-causal result is not the causal one
    assert not T.check("fused", T.baseline("sdpa", inp, 1e-6, "causal")(), inp, 1e-6, "causal")["ok"]
    good = T.baseline("sdpa_plus_norms", inp, 1e-6, "noncausal")()
    assert not T.check("fused", good, inp, 1e-6, "causal")["ok"]
    bad = good.clone()
    bad[1, 0, 3, 0] = float("nan")
    assert not T.check("fused", bad, inp, 1e-6, "noncausal")["ok"]


def test_make_inputs_shapes_and_seed():
    inp = T.make_inputs(10, 3, 8, dtype="bf16", kv_heads=2, head_dim=64, o_norm=True, seed=4)
    assert inp["q"].shape == (3, 8, 10, 64) and inp["k"].shape == (3, 2, 10, 64) == inp["v"].shape
    assert all(inp[n].shape == (64,) and inp[n].dtype == torch.bfloat16 for n in ("q_weight", "k_weight", "o_weight"))
    assert not torch.equal(inp["q_weight"], torch.ones(64, dtype=torch.bfloat16))
    assert torch.equal(inp["q"], T.make_inputs(10, 3, 8, dtype="bf16", kv_heads=2, head_dim=64, seed=4)["q"])
    assert T.make_inputs(4, 1, 2, kv_heads=1)["o_weight"] is None
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        T.make_inputs(4, 1, 3, kv_heads=2)
    with pytest.raises(ValueError, match="head_dim"):
        T.make_inputs(4, 1, 2, kv_heads=1, head_dim=48)


@pytest.mark.parametrize("mutate, exc, match", [
    (lambda d: d.update(q=d["q"].float()), TypeError, "one dtype"),
    (lambda d: d.update(q=d["q"][0]), ValueError, "4-D"),
    (lambda d: d.update(k=d["k"][:, :, :5].contiguous(), v=d["v"][:, :, :5].contiguous()), ValueError, "S="),
    (lambda d: d.update(v=d["v"][:, :1].contiguous()), ValueError, "same shape"),
    (lambda d: d.update(q=d["q"][:, :3].contiguous()), ValueError, "multiple of KV heads"),
    (lambda d: d.update(q=d["q"].transpose(1, 2)), ValueError, "contiguous|S="),
    (lambda d: d.update(q_weight=d["q_weight"][:8]), ValueError, r"\[D\]"),
    (lambda d: d.update(k_weight=d["k_weight"].float()), TypeError, "dtype"),
    (lambda d: d.update(q_weight=[1.0]), TypeError, "q_weight"),
])
def test_check_inputs_errors(mutate, exc, match):
    d = T.make_inputs(6, 2, 4, dtype="fp16", kv_heads=2, head_dim=16)
    mutate(d)
    with pytest.raises(exc, match=match):
        T.check_inputs(d["q"], d["k"], d["v"], d["q_weight"], d["k_weight"])


def test_check_inputs_eps_and_head_dim():
    d = T.make_inputs(6, 1, 2, dtype="fp16", kv_heads=1, head_dim=16)
    assert T.check_inputs(d["q"], d["k"], d["v"], eps=1e-6) == (1, 2, 1, 6, 16)
    for eps in (0.0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="eps"):
            T.check_inputs(d["q"], d["k"], d["v"], eps=eps)
    q = torch.randn(1, 1, 4, 48, dtype=torch.float16)
    with pytest.raises(ValueError, match="head dim"):
        T.check_inputs(q, q, q)


def test_cost_model_and_names():
    f = T.flops("fused", 1024, 8, 32)
    assert f == 4.0 * 8 * 32 * 1024 ** 2 * 128
    assert T.flops("sdpa", 1024, 8, 32, variant="causal") == f / 2
    assert T.flops("attention", 1024, 8, 32, variant="noncausal") == f
    assert T.bytes_moved("sdpa_plus_norms", 1024, 8, 32) > T.bytes_moved("fused", 1024, 8, 32)
    assert T.kernel_function_name("fused") == "qknorm_attention"
    assert T.kernel_function_name("attention") == "attention"
    with pytest.raises(ValueError, match="choices"):
        T.kernel_function_name("sdpa")
    with pytest.raises(ValueError, match="variant"):
        T.kernel_call(lambda *a, **k: None, "fused", T.make_inputs(4, 1, 2, kv_heads=1), 1e-6, {}, "both")
    with pytest.raises(ValueError, match="positive"):
        T.check_shape(0, 1, 1)


def test_metrics_pass_the_variant_to_flops():
    from normfuse import metrics

    rows = [dict(technique="fna_llm", variant=v, M=1024, N=1, K=32, dtype="bf16", impl=i, dsl=d, p50_ms=t,
                 status="ok") for v in T.VARIANTS
            for i, d, t in (("sdpa", "torch", 1.0), ("sdpa_plus_norms", "torch", 1.25), ("fused", "triton", 1.1))]
    df = metrics.add_technique_metrics(metrics.add_rates(pd.DataFrame(rows)))
    tf = df.set_index(["variant", "impl"])["tflops"]
    assert tf[("causal", "sdpa")] == pytest.approx(tf[("noncausal", "sdpa")] / 2)
    frac = df.set_index(["variant", "impl"])["sdpa_fraction"]
    assert frac[("causal", "fused")] == pytest.approx(1 / 1.1)
    assert df.set_index(["variant", "impl"])["speedup_vs_unfused"][("causal", "fused")] == pytest.approx(1.25 / 1.1)
    assert "fused" in T.summary_table(df)


def test_check_subset_at_large_shapes(monkeypatch):
    """Above CHECK_FULL_MAX the check compares a (batch, head) subset with its own KV heads, and still fails on
    a wrong head inside the subset or a NaN anywhere."""
    inp = T.make_inputs(24, 4, 8, dtype="fp16", kv_heads=2, head_dim=16, o_norm=True, seed=3)
    good = T.baseline("sdpa_plus_norms", inp, 1e-6, "causal")()
    assert T.check_subset(4, 8, 24) is None and T.check("fused", good, inp, 1e-6, "causal")["ok"]
    monkeypatch.setattr(T, "CHECK_FULL_MAX", 100)
    assert T.check_subset(4, 8, 24) == ([0, 2, 3], [0, 1, 4, 7])
    assert T.check("fused", good, inp, 1e-6, "causal")["ok"]
    wrong = good.clone()
    wrong[2, 4] = good[2, 5]  # head 4 (in the subset, KV head 1) replaced by head 5
    assert not T.check("fused", wrong, inp, 1e-6, "causal")["ok"]
    nan = good.clone()
    nan[1, 2, 0, 0] = float("nan")  # outside the subset
    assert not T.check("fused", nan, inp, 1e-6, "causal")["ok"]


def test_replicates_report_the_primary_metric(tmp_path):
    """experiments.report --replicates on fna_llm runs tabulates % of SDPA (the technique's PRIMARY_METRIC) of the
    fastest fused config per run; a shape missing from one run (a replicate cut) reads "–"."""
    import pandas as pd

    from normfuse import report

    def rows(frac, shapes):
        out = []
        for M in shapes:
            for cfg, p50, f in (("a", 1.0, frac), ("b", 2.0, frac / 2)):  # the fastest config carries `frac`
                out.append(dict(technique="fna_llm", variant="causal", M=M, N=8, K=32, dtype="bf16", dsl="tlx",
                                impl="fused", config_name=cfg, status="ok", p50_ms=p50, sdpa_fraction=f,
                                hidden_dsl=float("nan")))
        return pd.DataFrame(out)

    dirs = []
    for i, (frac, shapes) in enumerate(((0.90, (4096, 16384)), (0.80, (16384,)))):
        d = tmp_path / f"r{i}"
        d.mkdir()
        rows(frac, shapes).to_parquet(d / "results.parquet")
        dirs.append(d)
    text = report.replicates(dirs)
    assert "tlx sdpa_fraction % (runs)" in text
    assert "| 90.0 / 80.0" in text and "85" in text  # S = 16384: both runs and their mean
    assert "| 90.0 / –" in text  # S = 4096: only in the first run
