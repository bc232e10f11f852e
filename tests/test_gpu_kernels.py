"""GPU: every shipped Triton and Helion config against the fp32 reference at odd and benchmark shapes."""

import pytest

from normfuse.gpu_checks import check_all


@pytest.mark.gpu
@pytest.mark.parametrize("technique", ["lazy_prenorm", "norms", "naive_fusion", "lazy_prenorm_ln", "mxnorm", "multi_cta",
                                       "fna", "fna_llm", "fna_llm_gqa"])
@pytest.mark.parametrize("dsl", ["triton", "helion"])
def test_shipped_configs_correct(dsl, technique):
    failures = check_all(dsl, technique)
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("dsl", ["triton", "helion"])
def test_norms_special_values(dsl):
    """Large |x| matches the reference; a NaN stays in its own row (every shipped norms config)."""
    from normfuse.gpu_checks import check_norm_special_values

    failures = check_norm_special_values(dsl)
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("dsl", ["triton", "helion"])
def test_fna_nan_isolation(dsl):
    """FlashNormAttention: a NaN token / an Inf in one sequence's K stays where it is (every shipped config)."""
    from normfuse.gpu_checks import check_fna_isolation

    failures = check_fna_isolation(dsl)
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("dsl", ["triton", "helion"])
def test_fna_llm_nan_isolation(dsl):
    """A NaN/Inf in one batch element of q, k, v never reaches another (every shipped fna_llm config)."""
    from normfuse.gpu_checks import check_fna_llm_nan_isolation

    failures = check_fna_llm_nan_isolation(dsl)
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("dsl", ["triton", "helion"])
def test_multi_cta_deterministic(dsl):
    """Multi-CTA norm fusion: repeated calls give bitwise-identical outputs (every shipped fused config)."""
    from normfuse.gpu_checks import check_multi_cta_determinism

    failures = check_multi_cta_determinism(dsl)
    assert not failures, "\n".join(failures)
