"""Shared plumbing of the autograd drop-ins: forward-kernel dispatch by DSL, configs through custom-op schemas, and
the fp64-reference gradient check used by the tests and the GPU checks.

Nothing here imports triton, helion or TLX at import time: the kernel module of a DSL is imported on first use.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping

import torch

DSLS = ("triton", "helion", "tlx")


def check_dsl(dsl) -> str:
    """``dsl`` if it names a forward-kernel folder (``kernels_<dsl>/``); ValueError otherwise."""
    if dsl not in DSLS:
        raise ValueError(f"unknown dsl {dsl!r}; choices: {', '.join(DSLS)}")
    return dsl


def kernel_module(dsl: str, technique: str):
    """Import ``kernels_<dsl>.<technique>``. RuntimeError, naming the environment, when the DSL cannot be imported
    here (TLX needs the fbtriton environment, ``.venv-tlx``; upstream triton has no ``triton.language.extra.tlx``)."""
    check_dsl(dsl)
    try:
        return importlib.import_module(f"kernels_{dsl}.{technique}")
    except ImportError as e:
        env = "the TLX environment (.venv-tlx: fbtriton 3.7.4)" if dsl == "tlx" else "the upstream environment (.venv)"
        raise RuntimeError(f"dsl={dsl!r} is not available in this Python ({e}); its kernels run in {env}") from e


def config_json(config) -> str:
    """A tiling config (None, a mapping, or a DSL's ``TilingConfig``) as the JSON string the custom ops take
    ("" for the DSL's default): custom-op schemas have no dict type. TypeError for anything else."""
    if config is None:
        return ""
    if isinstance(config, Mapping):
        return json.dumps(dict(config), sort_keys=True)
    to_dict = getattr(config, "to_dict", None)  # normfuse.tiling.TilingConfigBase
    if callable(to_dict):
        return json.dumps(to_dict(), sort_keys=True)
    import dataclasses

    if dataclasses.is_dataclass(config):
        return json.dumps(dataclasses.asdict(config), sort_keys=True)
    raise TypeError(f"config must be None, a mapping or a TilingConfig, got {type(config).__name__}")


def config_from_json(s: str):
    """Inverse of ``config_json``: None for "", else the dict the kernel wrappers accept."""
    return json.loads(s) if s else None


def dense(t: torch.Tensor, nbytes: int = 16) -> torch.Tensor:
    """``t`` itself when row-major contiguous and ``nbytes``-aligned (TMA descriptors, 16-byte vector accesses),
    else a fresh contiguous copy: the custom ops may receive views (e.g. from ``torch.compile``'s buffer reuse)."""
    if t.is_contiguous() and (t.numel() == 0 or t.data_ptr() % nbytes == 0):
        return t
    return t.contiguous() if not t.is_contiguous() else t.clone()


def needs_grad(*tensors) -> bool:
    """True when autograd would record an op on ``tensors`` (grad mode on and one of them requires grad)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def check_eps(eps) -> float:
    from normfuse.validate import check_eps as _check

    return _check(eps)


# --------------------------------------------------------------------------------------------------------------
# gradient check against an fp64 reference (the flash-attention tolerance rule of this repo)
# --------------------------------------------------------------------------------------------------------------
def grads(fn: Callable, inputs: dict, names, grad_out) -> dict:
    """``{name: d(sum(fn(**inputs) * grad_out))/d inputs[name]}`` for the tensors named in ``names`` (fresh leaf
    copies; ``inputs`` is not modified), plus ``"out"``: the output itself (detached). ``grad_out``: a tensor, or a
    callable building it from the output (shape, device)."""
    leaves = {k: (v.detach().clone().requires_grad_(k in names) if isinstance(v, torch.Tensor) and
                  v.is_floating_point() else v) for k, v in inputs.items()}
    out = fn(**leaves)
    go = grad_out(out) if callable(grad_out) else grad_out
    got = torch.autograd.grad(out, [leaves[n] for n in names], go.to(out.dtype))
    return {"out": out.detach(), "grad_out": go, **{n: g for n, g in zip(names, got)}}


def check_grads(fn: Callable, reference: Callable, inputs: dict, names, *, grad_out: torch.Tensor | None = None,
                seed: int = 0, atol_rel: float = 1e-3) -> dict:
    """Compare the output and input gradients of ``fn`` (the drop-in, inputs in their own dtype) with those of
    ``reference`` on fp64 copies of the inputs (torch autograd), using the flash-attention rule of this repo: for each
    tensor, ``max|ours - ref64| <= 2 max|torch_same_dtype - ref64| + atol_rel max|ref64|`` where torch_same_dtype is
    ``reference`` run by autograd in the inputs' own dtype (``normfuse.techniques.lazy_prenorm.tolerance``); a
    gradient of the wrong shape or dtype, or a NaN, fails.

    ``inputs``: keyword arguments of both callables (non-float entries are passed through unchanged); ``names``:
    the float inputs to differentiate. ``grad_out``: the output cotangent (default: seeded N(0, 1) of the output's
    shape, in fp64). Returns ``{name: {"max_abs_err", "rel_err", "tol", "ok"}}`` for ``"out"`` and every name."""
    from normfuse.techniques.lazy_prenorm import compare, tolerance

    def seeded(out):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.device)

    inputs64 = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                for k, v in inputs.items()}
    ref = grads(reference, inputs64, names, grad_out if grad_out is not None else seeded)
    go = ref["grad_out"]
    same = grads(reference, inputs, names, go)
    ours = grads(fn, inputs, names, go)
    report = {}
    for n in ("out", *names):
        want_dtype = inputs[n].dtype if n in inputs else same["out"].dtype
        r = compare(ours[n], ref[n], tolerance(ref[n], same[n], atol_rel=atol_rel))
        r["ok"] = bool(r["ok"] and ours[n].shape == ref[n].shape and ours[n].dtype == want_dtype)
        report[n] = r
    return report
