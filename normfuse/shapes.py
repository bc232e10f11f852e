"""Shapes of a sweep: plain GEMM grids, or fully-connected layers mapped to GEMM (M, N, K).

A linear layer ``y[tokens, out] = x[tokens, in] @ W[in, out]`` (row-major) gives three GEMMs per training step:

=======  =========  =========  =========
phase    M          N          K
=======  =========  =========  =========
fwd      tokens     out        in
dgrad    tokens     in         out        (dx = dy @ Wᵀ)
wgrad    in         out        tokens     (dW = xᵀ @ dy)
=======  =========  =========  =========

Model presets give the (in_features, out_features) of each projection; Llama 3 dims are from the released
configs (hidden 4096 / 8192, intermediate 14336 / 28672, 32 / 64 query heads and 8 KV heads of 128).
"""

from __future__ import annotations

from itertools import product
from typing import Iterable

PHASES = ("fwd", "dgrad", "wgrad")

# (in_features, out_features) per projection; qkv is fused (q + k + v heads), gate_up is fused (2 x intermediate)
MODEL_PRESETS: dict[str, dict[str, tuple[int, int]]] = {
    "llama3_8b": {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)},
    "llama3_70b": {"qkv": (8192, 10240), "o": (8192, 8192), "gate_up": (8192, 57344), "down": (28672, 8192)},
}


def fc_to_gemm(tokens: int, in_features: int, out_features: int, phase: str = "fwd") -> dict:
    """Map a linear layer (tokens, in_features, out_features) and a phase to GEMM dims {M, N, K}.

    Raises ValueError for an unknown phase or non-positive dims.
    """
    for name, v in (("tokens", tokens), ("in_features", in_features), ("out_features", out_features)):
        if int(v) < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if phase == "fwd":
        return {"M": tokens, "N": out_features, "K": in_features}
    if phase == "dgrad":
        return {"M": tokens, "N": in_features, "K": out_features}
    if phase == "wgrad":
        return {"M": in_features, "N": out_features, "K": tokens}
    raise ValueError(f"unknown phase {phase!r}; choices: {', '.join(PHASES)}")


def expand(shape_cfg) -> list[dict]:
    """Expand a ``shape`` config into a list of points {M, N, K, shape_label}.

    Accepted forms:
      ``grid: {M: [...], N: [...], K: [...]}`` — the Cartesian product (K may be absent: K = None);
      ``fc: {tokens: [...], phases: [...], layers: {name: [in, out]}, model: <preset>}`` — linear layers
      (grid and fc concatenated when both are given);
      ``points: [{M:, N:, K:}, ...]`` — explicit points; when non-empty they replace grid and fc, so that
      ``shape.points=[...]`` on the command line measures just those points whatever the experiment's grid.
    Raises ValueError for an unknown preset or an empty result.
    """
    out: list[dict] = []
    if shape_cfg.get("points"):
        shape_cfg = {k: v for k, v in shape_cfg.items() if k not in ("grid", "fc")}
    grid = shape_cfg.get("grid")
    if grid:  # K may be absent (techniques on [M, N] tensors, e.g. standalone norms)
        for M, N, K in product(_as_list(grid["M"]), _as_list(grid["N"]), _as_list(grid.get("K", [None]))):
            out.append({"M": int(M), "N": int(N), "K": _int_or_none(K), "shape_label": _label(M, N, K)})
    for p in shape_cfg.get("points") or []:
        K = _int_or_none(p.get("K"))
        out.append({"M": int(p["M"]), "N": int(p["N"]), "K": K, "shape_label": p.get("label", _label(p["M"], p["N"], K))})
    fc = shape_cfg.get("fc")
    if fc:
        layers = dict(fc.get("layers") or {})
        if fc.get("model"):
            if fc["model"] not in MODEL_PRESETS:
                raise ValueError(f"unknown model preset {fc['model']!r}; choices: {', '.join(MODEL_PRESETS)}")
            layers = {**MODEL_PRESETS[fc["model"]], **layers}
        for tokens, phase, (name, (fin, fout)) in product(_as_list(fc["tokens"]), _as_list(fc.get("phases", ["fwd"])),
                                                         layers.items()):
            g = fc_to_gemm(int(tokens), int(fin), int(fout), phase)
            out.append({**g, "shape_label": f"{fc.get('model') or 'fc'}:{name}:{phase}:t{tokens}"})
    if not out:
        raise ValueError("the shape config expands to no points (give grid, points or fc)")
    return out


def _int_or_none(v):
    return None if v is None else int(v)


def _label(M, N, K) -> str:
    return f"{M}x{N}" if K is None else f"{M}x{N}x{K}"


def _as_list(v) -> list:
    if isinstance(v, (str, int)):
        return [v]
    return list(v) if isinstance(v, Iterable) else [v]
