"""GPU correctness of every shipped kernel configuration, shared by the GPU tests of both environments.

``check_all(dsl)`` runs each config of ``configs/tiling/*.yaml`` for ``dsl`` through the worker's check (fresh
random inputs, NaN-poisoned allocator, fp32 reference, flash-attention tolerance) at the odd shapes below and
returns the failures. Sweep points are additionally checked at their benchmark shape before being timed.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "tiling"
# (M, N, K): M = 1, K and N not multiples of any block, a block-aligned shape, and more tiles than SMs
# with M, N and K tails (persistent kernels then reuse per-CTA state across tiles)
ODD_SHAPES = [(1, 1000, 1000), (257, 520, 1000), (1000, 264, 72), (4096, 1024, 512), (17793, 1000, 1000)]
SHIPPED_TILINGS = ("lazy_prenorm_h200.yaml",)


def shipped_configs(dsl: str) -> list[dict]:
    import yaml

    out = []
    for name in SHIPPED_TILINGS:
        data = yaml.safe_load((CONFIG_DIR / name).read_text())
        out += [dict(c) for c in data.get(dsl, [])]
    return out


def check_all(dsl: str, technique: str = "lazy_prenorm", shapes=ODD_SHAPES, eps: float = 1e-6) -> list[str]:
    """Check every shipped config of ``dsl`` at ``shapes``; return a list of failure descriptions."""
    from normfuse.worker import measure

    failures = []
    for cfg in shipped_configs(dsl):
        cfg = dict(cfg)
        name = cfg.pop("name", "?")
        impls = cfg.pop("impls", None) or ["fused", "gemm"]
        if cfg.pop("known_incorrect", False):  # shipped to record a compiler bug; the sweep marks it incorrect
            continue
        for impl in impls:
            for seed, (M, N, K) in enumerate(shapes):
                req = {"technique": technique, "dsl": dsl, "impl": impl, "M": M, "N": N, "K": K, "dtype": "bf16",
                       "eps": eps, "config": cfg, "mode": "gpu", "seed": 1000 + seed, "check_only": True}
                try:
                    r = measure(req)
                except Exception as e:  # noqa: BLE001
                    r = {"status": "error", "error": f"{type(e).__name__}: {e}"}
                if r["status"] != "ok":
                    failures.append(f"{dsl}/{impl}/{name} at M={M} N={N} K={K}: {r['status']} {r.get('error', '')}")
    return failures
