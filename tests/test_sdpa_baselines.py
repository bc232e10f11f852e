"""fna_llm's SDPA baselines: default dispatch with the backend recorded, forced backends, and sdpa_fraction against
the fastest SDPA backend."""

import numpy as np
import pandas as pd
import pytest
import torch

from normfuse.techniques import fna_llm as T


def test_every_sdpa_baseline_is_correct_and_described_on_cpu():
    inp = T.make_inputs(64, 1, 4, dtype="fp32", device="cpu", seed=3, kv_heads=2)
    for impl in T.SDPA_BASELINES:
        out = T.baseline(impl, inp, 1e-6, "causal")()
        assert T.check(impl, out, inp, 1e-6, "causal")["ok"], impl
        details = T.baseline_details(impl, inp, "causal")
        assert details["sdpa_backend"] in ("MATH", "FLASH_ATTENTION", "CUDNN_ATTENTION"), details
    assert T.baseline_details("sdpa_cudnn", inp, "causal") == {"sdpa_backend": "CUDNN_ATTENTION", "expanded_kv": False}
    with pytest.raises(ValueError, match="unknown baseline"):
        T.baseline("sdpa_math", inp, 1e-6, "causal")


def test_sdpa_fraction_is_against_the_fastest_sdpa_backend():
    rows = [{"technique": "fna_llm", "variant": "causal", "M": 1024, "N": 8, "K": 32, "dtype": "bf16", "status": "ok",
             "dsl": d, "impl": i, "p50_ms": t}
            for d, i, t in (("torch", "sdpa", 1.0), ("torch", "sdpa_flash", 1.7), ("torch", "sdpa_cudnn", 0.9),
                            ("torch", "sdpa_plus_norms", 1.1), ("tlx", "fused", 1.2))]
    df = T.add_metrics(pd.DataFrame(rows)).set_index("impl")
    assert df.loc["fused", "sdpa_fraction"] == pytest.approx(0.9 / 1.2)
    assert df.loc["fused", "speedup_vs_unfused"] == pytest.approx(1.1 / 1.2)
    assert df.loc["sdpa_cudnn", "sdpa_fraction"] == pytest.approx(1.0)


def test_norm_latency_hidden_against_own_and_fastest_attention():
    """hidden_dsl / hidden_best on the fused rows: T_norms = T_sdpa_plus_norms - T_sdpa (default dispatch), the
    same DSL's attention best over its configs; other DSLs' attention and the other rows untouched."""
    base = {"technique": "fna_llm", "variant": "noncausal", "M": 1024, "N": 1, "K": 32, "dtype": "bf16", "status": "ok"}
    rows = [{**base, "dsl": d, "impl": i, "config_name": c, "p50_ms": t}
            for d, i, c, t in (("torch", "sdpa", "-", 1.0), ("torch", "sdpa_cudnn", "-", 0.9),
                               ("torch", "sdpa_plus_norms", "-", 1.1), ("tlx", "attention", "a", 1.15),
                               ("tlx", "attention", "b", 1.05), ("triton", "attention", "a", 0.5),
                               ("tlx", "fused", "f", 1.12), ("triton", "fused", "f", 1.3))]
    df = T.add_metrics(pd.DataFrame(rows)).set_index(["dsl", "impl", "config_name"])
    assert df.loc[("tlx", "fused", "f"), "hidden_dsl"] == pytest.approx((1.05 + 0.1 - 1.12) / 0.1)  # 0.3
    assert df.loc[("tlx", "fused", "f"), "hidden_best"] == pytest.approx((0.9 + 0.1 - 1.12) / 0.1)  # -1.2
    assert df.loc[("triton", "fused", "f"), "hidden_dsl"] == pytest.approx((0.5 + 0.1 - 1.3) / 0.1)
    assert df.loc[("triton", "fused", "f"), "hidden_best"] == pytest.approx((0.5 + 0.1 - 1.3) / 0.1)
    assert df.loc[[("tlx", "attention", "a"), ("torch", "sdpa", "-")], ["hidden_dsl", "hidden_best"]].isna().all().all()
    no_unfused = T.add_metrics(pd.DataFrame([r for r in rows if r["impl"] != "sdpa_plus_norms"]))
    assert no_unfused["hidden_dsl"].isna().all() and no_unfused["hidden_best"].isna().all()
    faster = T.add_metrics(pd.DataFrame([{**r, "p50_ms": 0.95} if r["impl"] == "sdpa_plus_norms" else r for r in rows]))
    assert faster["hidden_dsl"].isna().all()  # T_norms <= 0: undefined, not a huge ratio


@pytest.mark.gpu
def test_forced_sdpa_backends_run_on_gpu():
    inp = T.make_inputs(1024, 2, 32, dtype="bf16", device="cuda", seed=1, kv_heads=8)
    for impl in T.SDPA_BASELINES:
        out = T.baseline(impl, inp, 1e-6, "causal")()
        torch.cuda.synchronize()
        assert T.check(impl, out, inp, 1e-6, "causal")["ok"], impl
    assert T.baseline_details("sdpa", inp, "causal")["sdpa_backend"] in ("CUDNN_ATTENTION", "FLASH_ATTENTION",
                                                                         "EFFICIENT_ATTENTION")


def test_hidden_of_other_techniques_left_alone():
    """A frame mixing fna_llm with a GEMM technique (whose hidden_dsl normfuse.metrics.add_hidden filled): fna_llm's
    add_metrics resets and fills its own rows only."""
    llm = {"technique": "fna_llm", "variant": "causal", "M": 1024, "N": 1, "K": 32, "dtype": "bf16", "status": "ok"}
    rows = [{**llm, "dsl": d, "impl": i, "p50_ms": t, "hidden_dsl": np.nan, "hidden_best": np.nan}
            for d, i, t in (("torch", "sdpa", 1.0), ("torch", "sdpa_plus_norms", 1.1), ("tlx", "attention", 1.0),
                            ("tlx", "fused", 1.05))]
    rows.append({"technique": "naive_fusion", "variant": "rmsnorm", "M": 4096, "N": 512, "K": 512, "dtype": "bf16",
                 "status": "ok", "dsl": "tlx", "impl": "fused", "p50_ms": 0.1, "hidden_dsl": 0.75, "hidden_best": 0.5})
    df = T.add_metrics(pd.DataFrame(rows))
    assert df.iloc[-1][["hidden_dsl", "hidden_best"]].tolist() == [0.75, 0.5]
    assert df.iloc[3]["hidden_dsl"] == pytest.approx(0.5)
