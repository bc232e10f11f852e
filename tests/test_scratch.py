"""``normfuse.scratch``: scratch tensors start as NaN within ``poisoned_scratch()`` (the worker's check run), are
plain ``torch.empty`` outside it, and the fused ops' pre-pass buffers (k_n, rstd_k of ``kernels_triton.fna_llm``,
which the TLX kernels share) are made through it."""

import torch

from kernels_triton import fna_llm
from normfuse.scratch import poisoned_scratch, scratch_like


def test_scratch_is_nan_only_inside_the_block():
    like = torch.zeros(3, 4, dtype=torch.bfloat16)
    with poisoned_scratch():
        with poisoned_scratch():  # nests
            assert scratch_like(like).isnan().all()
        out = scratch_like(like, (5,), torch.float32)
        assert out.shape == (5,) and out.dtype == torch.float32 and out.isnan().all()
        assert scratch_like(like, dtype=torch.int32).dtype == torch.int32  # integer scratch: not filled
    torch.manual_seed(0)
    plain = [scratch_like(like, (1 << 16,), torch.float32) for _ in range(4)]  # empty: no fill kernel, no NaN set
    assert not all(p.isnan().all() for p in plain)


def test_k_prepass_buffers_are_scratch():
    k = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    w = torch.ones(64, dtype=torch.bfloat16)
    with poisoned_scratch():
        _, _, k_n = fna_llm.k_prepass(k, w, 1e-6, "materialize")
        _, rstd_k, _ = fna_llm.k_prepass(k, w, 1e-6, "prepass")
    assert k_n.shape == k.shape and k_n.isnan().all()
    assert rstd_k.shape == (16,) and rstd_k.isnan().all()
