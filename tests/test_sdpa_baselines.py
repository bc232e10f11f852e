"""fna_llm's SDPA baselines: default dispatch with the backend recorded, forced backends, and sdpa_fraction against
the fastest SDPA backend."""

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


@pytest.mark.gpu
def test_forced_sdpa_backends_run_on_gpu():
    inp = T.make_inputs(1024, 2, 32, dtype="bf16", device="cuda", seed=1, kv_heads=8)
    for impl in T.SDPA_BASELINES:
        out = T.baseline(impl, inp, 1e-6, "causal")()
        torch.cuda.synchronize()
        assert T.check(impl, out, inp, 1e-6, "causal")["ok"], impl
    assert T.baseline_details("sdpa", inp, "causal")["sdpa_backend"] in ("CUDNN_ATTENTION", "FLASH_ATTENTION",
                                                                         "EFFICIENT_ATTENTION")
