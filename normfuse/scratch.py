"""Scratch tensors of the fused ops (a pre-pass's normalized copy k_n or its rstd_k), optionally NaN-filled.

A kernel that reads its scratch before writing it (a missing pre-pass, a barrier that does not wait) can pass a
correctness check by luck: the caching allocator hands the next call the block an earlier call freed, which still
holds the right values. Within ``poisoned_scratch()`` every ``scratch_like`` tensor starts as NaN instead, so a
read of a value never written shows as NaN in the output (a read that races a write shows only when the race
happens). Used for fna_llm's pre-pass buffers (k_n, rstd_k) and the TLX ``K_RSTD_PRODUCER`` scratch; the sweep
worker's check run and the GPU tests turn it on; timed calls never do.
"""

from __future__ import annotations

import contextlib

import torch

_POISON = [False]


@contextlib.contextmanager
def poisoned_scratch():
    """Within the block, ``scratch_like`` fills what it returns with NaN (nests; restores the previous state)."""
    previous = _POISON[0]
    _POISON[0] = True
    try:
        yield
    finally:
        _POISON[0] = previous


def scratch_like(t: torch.Tensor, shape=None, dtype=None) -> torch.Tensor:
    """``torch.empty`` of ``shape`` (default ``t.shape``) and ``dtype`` (default ``t.dtype``) on ``t``'s device;
    NaN-filled (floating dtypes) within ``poisoned_scratch()``."""
    out = torch.empty(t.shape if shape is None else shape, dtype=t.dtype if dtype is None else dtype, device=t.device)
    if _POISON[0] and out.is_floating_point():
        out.fill_(float("nan"))
    return out
