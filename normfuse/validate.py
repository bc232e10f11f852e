"""Input checks shared by every technique spec and every DSL wrapper (torch only; no triton import).

Each check raises ``TypeError`` (wrong kind of object or dtype) or ``ValueError`` (a violated constraint) with a
message naming the argument and the constraint, before anything is compiled or launched: a bad input must never
reach a kernel, where it would be a compiler error, a wrong answer or a lost CUDA context.
"""

from __future__ import annotations

import math

import torch

# CUDA launch limits (all NVIDIA GPUs since sm_30): grid.x < 2**31, grid.y and grid.z <= 65535
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535
# a pointer offset computed in int32 overflows past this many elements
INT32_MAX = 2**31 - 1


def check_eps(eps, name: str = "eps") -> float:
    """``eps`` as a float; ValueError unless it is a finite real number > 0 (None, bools and strings included)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {eps!r}")
    return float(eps)


def check_aligned(t: torch.Tensor, name: str, nbytes: int = 16) -> None:
    """ValueError unless ``t``'s data pointer is a multiple of ``nbytes`` (TMA descriptors and vectorized 16-byte
    accesses need it; a view with a storage offset can break it). Empty tensors pass."""
    if t.numel() and t.data_ptr() % nbytes:
        raise ValueError(f"{name} must start at a {nbytes}-byte aligned address (data_ptr % {nbytes} = "
                         f"{t.data_ptr() % nbytes}; a view with a storage offset?): pass {name}.clone()")


def needs_int64(*tensors: torch.Tensor) -> bool:
    """True when an element offset into any of ``tensors`` can exceed int32 (kernels then index in int64)."""
    return any(t is not None and t.numel() > INT32_MAX for t in tensors)


def check_forward_only(op: str, **tensors) -> None:
    """NotImplementedError when autograd would record through ``op``, a forward-only kernel wrapper: grad mode is on
    and one of the named ``tensors`` requires grad. Silently returning an output without a gradient would be a wrong
    answer for training; the autograd drop-ins (``normfuse.nn``) call these wrappers with grad mode off."""
    if not torch.is_grad_enabled():
        return
    needing = [name for name, t in tensors.items() if isinstance(t, torch.Tensor) and t.requires_grad]
    if needing:
        raise NotImplementedError(
            f"{op} is forward-only (no backward), but {', '.join(needing)} require(s) grad: use the autograd "
            f"drop-in in normfuse.nn, or call it under torch.no_grad() / with detached inputs")


def is_aligned(t: torch.Tensor, nbytes: int = 16) -> bool:
    """True when ``t``'s data pointer is a multiple of ``nbytes`` (or ``t`` is empty): ``check_aligned`` without
    the error."""
    return not t.numel() or t.data_ptr() % nbytes == 0


def aligned(t: torch.Tensor, nbytes: int = 16) -> torch.Tensor:
    """``t`` itself when its data pointer is a multiple of ``nbytes``, else a fresh contiguous copy (PyTorch's
    allocators return blocks aligned to at least 64 bytes). For kernels that hand a tensor to TMA or bulk copies
    (``cp.async.bulk``), which need 16-byte aligned global addresses: a view with a storage offset (e.g. ``x[1:]``
    of a bf16 buffer) would otherwise fault the CUDA context ("misaligned address"). The copy costs one extra
    read and write of ``t``; aligned inputs pass through untouched."""
    return t if is_aligned(t, nbytes) else t.clone(memory_format=torch.contiguous_format)


def chunks(n: int, limit: int = MAX_GRID_YZ) -> list[tuple[int, int]]:
    """Half-open ranges ``[(0, limit), (limit, 2 limit), ..., (.., n)]`` covering ``range(n)`` with at most
    ``limit`` items each (``[(0, n)]`` when ``n <= limit``; ``[]`` for ``n == 0``). For launching a kernel whose
    grid axis y or z would exceed ``MAX_GRID_YZ`` once per slice of that axis (e.g. per slice of the batch)."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    return [(i, min(i + limit, n)) for i in range(0, n, limit)]


def numel_needs_int64(*numels: int) -> bool:
    """``needs_int64`` for tensors that do not exist yet (a kernel's outputs, allocated inside it): True when any
    of the element counts ``numels`` exceeds int32, so that an element offset into it can overflow."""
    return any(int(n) > INT32_MAX for n in numels)


def check_affine(name: str, v, N: int, like: torch.Tensor, like_name: str = "x") -> None:
    """Validate an optional affine vector (a norm's ``weight`` or ``bias``): None passes; else a contiguous tensor
    of shape ``[N]`` with ``like``'s dtype on ``like``'s device. The dtype rule is the one contract of every DSL:
    the output is returned in the input dtype, and the unfused PyTorch path the tolerance is measured against
    (``F.layer_norm`` / ``F.rms_norm``) takes one dtype; cast an fp32 weight with ``.to(x.dtype)``.
    Raises TypeError (not a tensor, another dtype) or ValueError (shape, device, layout), naming ``name``."""
    if v is None:
        return
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(v).__name__}")
    if v.dtype != like.dtype:
        raise TypeError(f"{name} must have {like_name}'s dtype {like.dtype}, got {v.dtype} "
                        f"(cast it: {name}.to({like_name}.dtype))")
    if tuple(v.shape) != (N,):
        raise ValueError(f"{name} must have shape [N] = [{N}], got {tuple(v.shape)}")
    if v.device != like.device:
        raise ValueError(f"{name} is on {v.device}, {like_name} on {like.device}")
    if not v.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous())")
