"""Test helpers shared by the three DSLs' CPU tests (importable in both environments: torch + pytest only)."""

from __future__ import annotations

import pytest
import torch


def assert_rejects_bad_inputs(fn, dtype: torch.dtype, bad_config: dict) -> None:
    """Every kernel entry point (``fn(a, b, config=...)``) must reject bad inputs with a TypeError/ValueError
    naming the constraint: mixed or unsupported dtypes, non-tensors, wrong rank, mismatched K, non-contiguous
    inputs, K or N not a multiple of 8, and an invalid tiling ``bad_config`` (a power-of-2 violation)."""
    a, b = torch.randn(16, 16).to(dtype), torch.randn(16, 16).to(dtype)
    with pytest.raises(TypeError):  # mixed dtypes
        fn(a, b.to(torch.float32 if dtype != torch.float32 else torch.float16))
    with pytest.raises(TypeError):  # unsupported dtype
        fn(a.to(torch.int32), b.to(torch.int32))
    with pytest.raises(TypeError):  # not a tensor
        fn(a.float().numpy(), b)
    with pytest.raises(ValueError):  # rank
        fn(a[None], b)
    with pytest.raises(ValueError, match="inner dimensions"):
        fn(a, torch.randn(24, 16).to(dtype))
    with pytest.raises(ValueError, match="contiguous"):
        fn(torch.randn(32, 16).to(dtype)[::2], b)
    with pytest.raises(ValueError, match="multiple of 8"):  # K (16-byte TMA rows)
        fn(torch.randn(16, 12).to(dtype), torch.randn(12, 16).to(dtype))
    with pytest.raises(ValueError, match="multiple of 8"):  # N
        fn(a, torch.randn(16, 20).to(dtype))
    with pytest.raises(ValueError, match="power(s)? of (2|two)"):  # bad tiling through the public function
        fn(a, b, config=bad_config)
