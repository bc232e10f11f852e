"""GPU correctness of every shipped kernel configuration, shared by the GPU tests of both environments.

``check_all(dsl, technique)`` runs each config of the technique's tiling list for ``dsl`` through the worker's
check (fresh random inputs, NaN-poisoned allocator, fp32 reference, flash-attention tolerance) at the odd shapes
below and returns the failures. A config that rejects a shape by design (ValueError, e.g. a TLX cluster too small
for the row) is skipped, as the sweep records it as ``unsupported``; but a check must check something: a shipped
config that every point skipped, or a check with no config at all, is a failure (``_uncovered``), and so is a
``normfuse.tiling.ConfigError`` (a shipped config with an unknown key or a bad value is a mistake, not a
shape the config does not serve). Sweep points are additionally checked at their benchmark shape before being
timed.
"""

from __future__ import annotations

from pathlib import Path

from normfuse.tiling import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "tiling"
# (M, N, K): M = 1, K and N not multiples of any block, a block-aligned shape, and more tiles than SMs
# with M, N and K tails (persistent kernels then reuse per-CTA state across tiles)
# (300, 2000, 264): the N that Lazy Pre-Norm's 8-CTA cluster form serves (c2: 264, c4: 1000 / 1024 above)
ODD_SHAPES = [(1, 1000, 1000), (257, 520, 1000), (1000, 264, 72), (4096, 1024, 512), (17793, 1000, 1000),
              (300, 2000, 264)]
CHECKS = {  # technique -> (tiling file, shapes, variants, eps)
    "lazy_prenorm": ("lazy_prenorm_h200.yaml", ODD_SHAPES, (None,), 1e-6),
    "norms": ("norms_h200.yaml", [(1, 1000, None), (4096, 4095, None), (1000, 16384, None), (17, 32768, None),
                                  (70000, 512, None)], ("rmsnorm", "layernorm"), 1e-6),
    "naive_fusion": ("naive_fusion_h200.yaml", [(1, 64, 64), (257, 128, 72), (1000, 256, 256), (17793, 512, 128)],
                     ("layernorm", "rmsnorm"), 1e-5),
    # Lazy Pre-Norm's LayerNorm variant: its own tiling list (technique lazy_prenorm, see CHECK_TECHNIQUE)
    "lazy_prenorm_ln": ("lazy_prenorm_ln_h200.yaml", ODD_SHAPES, ("layernorm",), 1e-5),
    # MXNorm / RMSNorm + MXFP8 cast: T = 1, ragged D (D/32 not a power of 2), benchmark shapes; both scale modes
    "mxnorm": ("mxnorm_h200.yaml", [(1, 32, None), (257, 1056, None), (4096, 4096, None), (1000, 16384, None),
                                    (131072, 1024, None), (16384, 16384, None)],
               ("rmsnorm_cast", "mxnorm_p1", "mxnorm_p2"), 1e-6),
    # multi_cta: N values that each TLX cluster size can serve (c2: 264/512, c4: 392/1000, c8: 1000/2000,
    # c16: 2000/4000), a last rank owning 8 columns, M = 1, K tails, more M-tiles than clusters
    "multi_cta": ("multi_cta_h200.yaml", [(1, 1000, 1000), (257, 264, 1000), (1000, 392, 72), (4096, 512, 512),
                                          (17793, 1000, 520), (300, 2000, 264), (129, 4000, 8)],
                  ("rmsnorm", "layernorm"), 1e-5),
    # FlashNormAttention gdpa (M = max Q length, N = H, K = D): all lengths 1 (M = 1, 2), lengths not multiples of
    # any BLOCK_M, H = 3; every option set has a length-1, a zero-length and a max_len-1 sequence (edge_cases)
    "fna": ("fna_h200.yaml", [(1, 2, 128), (2, 3, 128), (100, 3, 128), (1000, 4, 128), (3000, 2, 128),
                              (777, 3, 64)], ("gdpa",), 1e-5),
    # fna_llm (M = S, N = B, K = Hq; options below): S = 1, S not a multiple of any block, Hq = 3 with Hkv = 1,
    # a block-aligned S, and the benchmark head layout (Hq = 32, Hkv = 8) at S = 1000 / 4096 (fna_llm_gqa)
    "fna_llm": ("fna_llm_h200.yaml", [(1, 2, 3), (257, 2, 3), (1000, 1, 3), (1024, 2, 3)],
                ("causal", "noncausal"), 1e-6),
    "fna_llm_gqa": ("fna_llm_h200.yaml", [(1000, 2, 32), (4096, 1, 32)], ("causal", "noncausal"), 1e-6),
}
CHECK_TECHNIQUE = {"lazy_prenorm_ln": "lazy_prenorm", "fna_llm_gqa": "fna_llm"}  # check name -> technique
# make_inputs options per check, each set checked at every shape (default: one set, {}); the fused kernels also
# with mean-shifted inputs (one-pass statistics, epilogue cancellation) and, for naive fusion, an affine
CHECK_OPTIONS = {"lazy_prenorm_ln": ({}, {"mean_shift": 10.0}),
                 "naive_fusion": ({}, {"affine": True, "mean_shift": 10.0}),
                 "mxnorm": ({"scale_mode": "floor"}, {"scale_mode": "rceil"}),
                 "fna": ({"batch": 37, "edge_cases": True}, {"batch": 96, "edge_cases": True, "mean_shift": 10.0}),
                 "fna_llm": ({"kv_heads": 1}, {"kv_heads": 1, "o_norm": True}),
                 "fna_llm_gqa": ({"kv_heads": 8}, {"kv_heads": 8, "o_norm": True})}
GEMM_IMPLS = ("gemm",)  # the same for every variant: checked for the first variant only


def shipped_configs(dsl: str, technique: str = "lazy_prenorm") -> list[dict]:
    import yaml

    data = yaml.safe_load((CONFIG_DIR / CHECKS[technique][0]).read_text())
    return [dict(c) for c in data.get(dsl, [])]


def checkable_configs(dsl: str, check: str):
    """``(name, config, impls)`` of each shipped entry of ``dsl`` in the tiling file of ``check`` (a ``CHECKS``
    key): ``config`` without the ``name`` / ``impls`` / ``known_incorrect`` keys, ``impls`` the entry's list or None;
    entries marked ``known_incorrect`` (shipped to record a compiler bug; the sweep marks them incorrect) left out."""
    for cfg in shipped_configs(dsl, check):
        name = cfg.pop("name", "?")
        impls = cfg.pop("impls", None)
        if not cfg.pop("known_incorrect", False):
            yield name, cfg, impls


def _uncovered(what: str, checked: dict) -> list[str]:
    """Failures for a check that skipped everything it was meant to check: ``checked`` maps each shipped config
    name to the number of points actually checked (not skipped as unsupported). No config at all, or a config
    with 0 checked points, is a failure (a skip-everything check would otherwise pass silently)."""
    if not checked:
        return [f"{what}: no shipped config to check (nothing was checked)"]
    return [f"{what}/{name}: every point was skipped as unsupported (ValueError): the config served none of the "
            f"check's shapes, so nothing was checked" for name, n in checked.items() if n == 0]


def check_all(dsl: str, technique: str = "lazy_prenorm") -> list[str]:
    """Check every shipped config of ``dsl`` for ``technique`` (a ``CHECKS`` key: a technique, or a check name
    mapped to one by ``CHECK_TECHNIQUE``) at its odd shapes and input options; return failure descriptions."""
    from normfuse.techniques import get_technique
    from normfuse.worker import measure

    check, technique = technique, CHECK_TECHNIQUE.get(technique, technique)
    _, shapes, variants, eps = CHECKS[check]
    option_sets = CHECK_OPTIONS.get(check, ({},))
    impls_default = list(getattr(get_technique(technique), "IMPLS", ("fused", "gemm")))
    if technique == "lazy_prenorm":
        impls_default = ["fused", "gemm"]
    failures = []
    checked: dict = {}
    for name, cfg, impls in checkable_configs(dsl, check):
        checked[name] = 0
        for impl in impls or impls_default:
            for variant in (variants[:1] if impl in GEMM_IMPLS else variants):
                for seed, ((M, N, K), options) in enumerate((s, o) for o in option_sets for s in shapes):
                    if options and impl in GEMM_IMPLS:
                        continue  # the input options do not matter to the plain GEMM
                    req = {"technique": technique, "dsl": dsl, "impl": impl, "variant": variant, "M": M, "N": N,
                           "K": K, "dtype": "bf16", "eps": eps, "config": cfg, "mode": "gpu", "seed": 1000 + seed,
                           "check_only": True, "options": options}
                    try:
                        r = measure(req)
                    except ConfigError as e:  # a mistake in the shipped config, not an unsupported shape
                        r = {"status": "error", "error": f"ConfigError: {e}"}
                    except ValueError:  # the config does not serve this shape by design: 'unsupported'
                        continue
                    except Exception as e:  # noqa: BLE001
                        r = {"status": "error", "error": f"{type(e).__name__}: {e}"}
                    checked[name] += 1
                    if r["status"] != "ok":
                        failures.append(f"{dsl}/{technique}/{variant or ''}/{impl}/{name} at M={M} N={N} K={K}"
                                        + (f" {options}" if options else "") + f": {r['status']} {r.get('error', '')}")
    return failures + _uncovered(f"{dsl}/{check}", checked)


def check_norm_special_values(dsl: str, shapes=((300, 4095), (300, 1000)), eps: float = 1e-6) -> list[str]:
    """Standalone norms with special inputs, every shipped config of ``dsl``, both variants:

    * large |x| (rows scaled by 1e15: x^2 summed over N stays below the fp32 maximum) must match the fp32
      reference with the usual tolerance;
    * a NaN in row 7 must make row 7 NaN (or at least non-finite) and leave every other row equal to the
      output of the same kernel on the same input without the NaN (no leak through a shared reduction).
    Each config and variant is checked at the first of ``shapes`` ([(M, N)]) it serves (a narrow-row config such as
    one warp per row refuses N = 4095 by its register limit). Returns failure descriptions (empty when all pass)."""
    import torch

    from normfuse import registry
    from normfuse.techniques import norms

    failures = []
    checked: dict = {}
    for name, cfg, _ in checkable_configs(dsl, "norms"):
        checked[name] = 0
        done = set()  # variants checked at an earlier shape
        for variant, (M, N) in ((v, mn) for v in ("rmsnorm", "layernorm") for mn in shapes):
            if variant in done:
                continue
            fn = registry.kernel_function(dsl, "norms", "norm", variant)
            try:
                inputs = norms.make_inputs(M, N, dtype="bf16", device="cuda", seed=7, affine=True)
                call = lambda inp: norms.kernel_call(fn, "norm", inp, eps, cfg, variant)()  # noqa: E731
                big = dict(inputs, x=(inputs["x"].float() * 1e15).to(torch.bfloat16))
                res = norms.check("norm", call(big), big, eps, variant)
                if not res["ok"]:
                    failures.append(f"{dsl}/norms/{variant}/{name} large |x|: {res}")
                clean = call(inputs)[0].clone()
                nan_x = inputs["x"].clone()
                nan_x[7, N // 3] = float("nan")
                out = call(dict(inputs, x=nan_x))[0]
                others = torch.ones(M, dtype=torch.bool, device="cuda")
                others[7] = False
                if torch.isfinite(out[7].float()).all():
                    failures.append(f"{dsl}/norms/{variant}/{name}: NaN in row 7 did not reach row 7's output")
                if not torch.equal(out[others], clean[others]):
                    failures.append(f"{dsl}/norms/{variant}/{name}: NaN in row 7 changed other rows")
                checked[name] += 1
                done.add(variant)
            except ConfigError as e:
                failures.append(f"{dsl}/norms/{variant}/{name}: ConfigError: {e}")
            except ValueError:  # the config does not serve this shape by design
                continue
            except Exception as e:  # noqa: BLE001
                failures.append(f"{dsl}/norms/{variant}/{name}: {type(e).__name__}: {e}")
    return failures + _uncovered(f"{dsl}/norms special values", checked)


def check_fna_isolation(dsl: str, M: int = 300, H: int = 3, D: int = 128, B: int = 9, eps: float = 1e-5) -> list[str]:
    """FlashNormAttention gdpa, every shipped config of ``dsl``: a NaN in one token of sequence 4 makes that token's
    output non-finite and leaves every other token (other sequences and the rest of sequence 4: all statistics are
    per token) equal to the same kernel's output without the NaN; an Inf in sequence 2's K leaves the other
    sequences unchanged. Returns failure descriptions (empty when all pass)."""
    import torch

    from normfuse import registry
    from normfuse.techniques import fna

    failures = []
    checked: dict = {}
    fn = registry.kernel_function(dsl, "fna", "fused", "gdpa")
    for name, cfg, _ in checkable_configs(dsl, "fna"):
        checked[name] = 0
        try:
            inp = fna.make_inputs(M, H, D, dtype="bf16", device="cuda", seed=11, batch=B, edge_cases=True)
            call = lambda i: fna.kernel_call(fn, "fused", i, eps, cfg, "gdpa")()  # noqa: E731
            clean = call(inp).clone()
            o = inp["q_offsets"].long().cpu()
            if o[5] - o[4] < 2 or o[3] - o[2] < 1:
                failures.append(f"{dsl}/fna/{name}: test inputs lack sequences 2 and 4 (offsets {o.tolist()})")
                continue
            t = int(o[4]) + 1
            q = inp["q"].clone()
            q[t, 1, 5] = float("nan")
            out = call(dict(inp, q=q))
            others = torch.ones(q.shape[0], dtype=torch.bool, device="cuda")
            others[t] = False
            if torch.isfinite(out[t].float()).all():
                failures.append(f"{dsl}/fna/{name}: NaN in token {t} did not reach its output")
            if not torch.equal(out[others], clean[others]):
                failures.append(f"{dsl}/fna/{name}: NaN in token {t} changed other tokens")
            k = inp["k"].clone()
            k[2, 7, 0, 3] = float("inf")
            out = call(dict(inp, k=k))
            seq2 = torch.zeros(q.shape[0], dtype=torch.bool, device="cuda")
            seq2[int(o[2]):int(o[3])] = True
            if not torch.equal(out[~seq2], clean[~seq2]):
                failures.append(f"{dsl}/fna/{name}: Inf in sequence 2's K changed other sequences")
            checked[name] += 1
        except ConfigError as e:
            failures.append(f"{dsl}/fna/{name}: ConfigError: {e}")
        except ValueError:
            continue
        except Exception as e:  # noqa: BLE001
            failures.append(f"{dsl}/fna/{name}: {type(e).__name__}: {e}")
    return failures + _uncovered(f"{dsl}/fna isolation", checked)


def check_fna_llm_nan_isolation(dsl: str, S: int = 300, B: int = 3, H: int = 4, kv_heads: int = 2,
                                eps: float = 1e-6) -> list[str]:
    """fna_llm, every shipped config of ``dsl``, both variants, fused and plain attention: a NaN in q and an Inf in
    k and v of batch element 1 must make batch 1's output non-finite and leave batches 0 and 2 bitwise equal to
    the same kernel's output without them (no leak through a shared tile, a masked load or a reduction).
    Returns failure descriptions (empty when all pass)."""
    import torch

    from normfuse import registry
    from normfuse.techniques import fna_llm

    failures = []
    checked: dict = {}
    for name, cfg, _ in checkable_configs(dsl, "fna_llm"):
        checked[name] = 0
        for variant in fna_llm.VARIANTS:
            for impl in fna_llm.IMPLS:
                fn = registry.kernel_function(dsl, "fna_llm", impl, variant)
                try:
                    inputs = fna_llm.make_inputs(S, B, H, dtype="bf16", device="cuda", seed=3, kv_heads=kv_heads)
                    clean = fna_llm.kernel_call(fn, impl, inputs, eps, cfg, variant)().clone()
                    bad = dict(inputs, q=inputs["q"].clone(), k=inputs["k"].clone(), v=inputs["v"].clone())
                    bad["q"][1, 0, 0, 5] = float("nan")
                    bad["k"][1, 0, S - 1, 3] = float("inf")
                    bad["v"][1, 1, S // 2, 7] = float("nan")
                    out = fna_llm.kernel_call(fn, impl, bad, eps, cfg, variant)()
                    if torch.isfinite(out[1].float()).all():
                        failures.append(f"{dsl}/fna_llm/{variant}/{impl}/{name}: NaN/Inf in batch 1 did not reach it")
                    if not (torch.equal(out[0], clean[0]) and torch.equal(out[2], clean[2])):
                        failures.append(f"{dsl}/fna_llm/{variant}/{impl}/{name}: NaN/Inf in batch 1 changed batch 0/2")
                    checked[name] += 1
                except ConfigError as e:
                    failures.append(f"{dsl}/fna_llm/{variant}/{impl}/{name}: ConfigError: {e}")
                except ValueError:  # the config does not serve this shape by design
                    continue
                except Exception as e:  # noqa: BLE001
                    failures.append(f"{dsl}/fna_llm/{variant}/{impl}/{name}: {type(e).__name__}: {e}")
    return failures + _uncovered(f"{dsl}/fna_llm NaN isolation", checked)


def check_multi_cta_determinism(dsl: str, shapes=((4096, 1000, 520), (300, 2000, 264), (1000, 512, 264)),
                                repeats: int = 3, eps: float = 1e-5) -> list[str]:
    """Multi-CTA norm fusion, every shipped fused config of ``dsl``, both variants, with affine: ``repeats`` calls on
    the same inputs must give bitwise-identical y, mean and rstd (the cross-CTA exchange sums partials in a fixed
    order, never in arrival order). N = 512 is there for the 2-CTA cluster, which serves neither 1000 nor 2000
    (it was skipped entirely before). Returns failure descriptions (empty when all pass; a config checked at no
    shape is one)."""
    import torch

    from normfuse import registry
    from normfuse.techniques import multi_cta

    failures = []
    checked: dict = {}
    for name, cfg, impls in checkable_configs(dsl, "multi_cta"):
        if "fused" not in (impls or ["fused"]):
            continue
        checked[name] = 0
        for variant in multi_cta.VARIANTS:
            fn = registry.kernel_function(dsl, "multi_cta", "fused", variant)
            for M, N, K in shapes:
                try:
                    inputs = multi_cta.make_inputs(M, N, K, dtype="bf16", device="cuda", seed=M + N, affine=True)
                    call = multi_cta.kernel_call(fn, "fused", inputs, eps, cfg, variant)
                    first = [t.clone() for t in call()]
                    for _ in range(repeats - 1):
                        if not all(torch.equal(a, b) for a, b in zip(first, call())):
                            failures.append(f"{dsl}/multi_cta/{variant}/{name} at M={M} N={N} K={K}: not bitwise "
                                            "identical on a repeated call")
                            break
                    checked[name] += 1
                except ConfigError as e:
                    failures.append(f"{dsl}/multi_cta/{variant}/{name}: ConfigError: {e}")
                except ValueError:  # the config does not serve this shape by design
                    continue
                except Exception as e:  # noqa: BLE001
                    failures.append(f"{dsl}/multi_cta/{variant}/{name} at M={M} N={N} K={K}: {type(e).__name__}: {e}")
    return failures + _uncovered(f"{dsl}/multi_cta determinism", checked)


# ------------------------------------------------------------------------------------------------------------
# Bad input and edge shapes (issue 15), shared by tests/test_bad_inputs_gemm.py and tests/tlx/.
# ------------------------------------------------------------------------------------------------------------
# technique -> (M, N, K) shapes whose output (norms: x and y) has more than 2^31 elements, in the order tried: the
# first one the DSL's default config serves is checked. 262144 x 8200 is the shape of issue 15 (Helion's
# multi-CTA kernel raised IndexOffsetOutOfRangeForInt32); N = 1024 is what TLX's default 4-CTA cluster covers.
LARGE_SHAPES = {
    "norms": [(131073, 16384, None)],
    "naive_fusion": [(2**23 + 64, 256, 64)],
    "multi_cta": [(262144, 8200, 64), (2**21 + 64, 1024, 64)],
    "lazy_prenorm": [(2**21 + 64, 1024, 64)],
}
LARGE_IMPL = {"norms": "norm", "naive_fusion": "fused", "multi_cta": "fused", "lazy_prenorm": "fused"}


def _rows_of(technique: str, inputs: dict, sl: slice) -> dict:
    """The inputs of rows ``sl`` only (rows are independent in every technique here): x or a sliced, the rest
    shared (a cached GEMM output ``c`` is dropped, it is recomputed for the rows)."""
    key = "x" if technique == "norms" else "a"
    part = {k: v for k, v in inputs.items() if k != "c"}
    part[key] = inputs[key][sl]
    return part


def check_large_output(dsl: str, technique: str, variant: str, rows: int = 256, eps: float = 1e-5) -> list[str]:
    """``technique``'s fused kernel (norms: the norm) of ``dsl`` with its default config on an output past 2^31
    elements (``LARGE_SHAPES``; element offsets overflow int32 there): no error, and its first 64 and last ``rows``
    rows (whose offsets lie beyond 2^31) pass the technique's check against the fp32 reference. Returns failure
    descriptions; a DSL whose default config serves none of the shapes is one."""
    import torch

    from normfuse import registry
    from normfuse.techniques import get_technique

    spec = get_technique(technique)
    impl = LARGE_IMPL[technique]
    fn = registry.kernel_function(dsl, technique, impl, variant)
    for M, N, K in LARGE_SHAPES[technique]:
        where = f"{dsl}/{technique}/{variant} at M={M} N={N} K={K}"
        opts = {"variant": variant} if technique == "lazy_prenorm" else {}
        inputs = out = None
        try:
            inputs = spec.make_inputs(M, N, K, dtype="bf16", device="cuda", seed=5, **opts)
            out = spec.kernel_call(fn, impl, inputs, eps, {}, variant)()
            torch.cuda.synchronize()
        except ConfigError as e:
            return [f"{where}: ConfigError: {e}"]
        except ValueError:  # the default config does not serve this shape: try the next one
            del inputs, out
            torch.cuda.empty_cache()
            continue
        except Exception as e:  # noqa: BLE001
            return [f"{where}: {type(e).__name__}: {e}"]
        outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        failures = []
        if outs[0].numel() <= 2**31:
            failures.append(f"{where}: the output has only {outs[0].numel()} elements (not past 2^31)")
        for sl in (slice(0, 64), slice(M - rows, M)):
            part_out = outs[0][sl] if len(outs) == 1 else tuple(t[sl] for t in outs)
            res = spec.check(impl, part_out, _rows_of(technique, inputs, sl), eps, variant)
            if not res["ok"]:
                failures.append(f"{where}, rows {sl.start}..{sl.stop}: {res}")
        del inputs, out, outs
        torch.cuda.empty_cache()
        return failures
    return [f"{dsl}/{technique}/{variant}: the default config served none of {LARGE_SHAPES[technique]}: nothing "
            "was checked"]


# check -> (shapes tried in order until the config serves one, make_inputs options besides mean_shift, shifts).
# Every LayerNorm path: standalone (whole-row and looped), naive-fusion epilogue, Multi-CTA (full row and the
# cross-tile merges), and Lazy LayerNorm within its documented limit (|mean| <= 100 std, lazy_prenorm docstring).
MEAN_SHIFT_CHECKS = {
    "norms": ([(64, 16392, None), (300, 4095, None), (300, 1000, None)], {"affine": True}, (10.0, 1000.0)),
    "naive_fusion": ([(1000, 256, 128), (257, 72, 64)], {"affine": True}, (10.0, 1000.0)),
    "multi_cta": ([(300, 1000, 264), (257, 512, 72), (129, 200, 64)], {"affine": True}, (10.0, 1000.0)),
    "lazy_prenorm_ln": ([(1000, 264, 520), (4096, 1024, 512)], {"variant": "layernorm"}, (10.0, 100.0)),
}
_LN_IMPL = {"norms": "norm", "naive_fusion": "fused", "multi_cta": "fused", "lazy_prenorm": "fused"}
# TLX Multi-CTA entries with LN_ONEPASS (one-pass per-tile statistics, kernels_tlx/multi_cta.py; an ablation) are
# checked within their range instead: |mean| = 10 std (at the self-check's 30, whose extreme rows reach ~120 std, their
# rstd error exceeded the 1e-3 bound on the H100: results/gpu_tests/20261206_h100_onepass)
ONEPASS_MEAN_SHIFTS = (10.0,)


def check_mean_shifted(dsl: str, check: str, name: str, eps: float = 1e-5) -> list[str]:
    """The LayerNorm variant of the shipped config ``name`` (tiling file of ``check``, a ``MEAN_SHIFT_CHECKS``
    key) on rows whose mean is many standard deviations (``mean_shift`` of the technique's ``make_inputs``: up to
    1000 for the post-norm paths, 100 for Lazy LayerNorm, 10 for LN_ONEPASS entries), bf16, checked by the
    technique's spec against the fp32 reference with the flash-attention (3-way) tolerance, statistics included.
    The first of the check's shapes that the config serves is used. Returns failure descriptions; a config that
    serves none is one."""
    import torch

    from normfuse import registry
    from normfuse.techniques import get_technique

    technique = CHECK_TECHNIQUE.get(check, check)
    spec = get_technique(technique)
    impl = _LN_IMPL[technique]
    shapes, options, shifts = MEAN_SHIFT_CHECKS[check]
    cfg = {n: c for n, c, _ in checkable_configs(dsl, check)}.get(name)
    if cfg is None:
        return [f"{dsl}/{check}: no shipped config named {name!r}"]
    if cfg.get("LN_ONEPASS"):
        shifts = ONEPASS_MEAN_SHIFTS
    fn = registry.kernel_function(dsl, technique, impl, "layernorm")
    for M, N, K in shapes:
        failures = []
        try:
            for shift in shifts:
                inputs = spec.make_inputs(M, N, K, dtype="bf16", device="cuda", seed=int(shift) + 17,
                                          mean_shift=shift, **options)
                out = spec.kernel_call(fn, impl, inputs, eps, cfg, "layernorm")()
                res = spec.check(impl, out, inputs, eps, "layernorm")
                if not res["ok"]:
                    failures.append(f"{dsl}/{check}/{name} at M={M} N={N} K={K}, mean_shift={shift}: {res}")
            torch.cuda.synchronize()
        except ConfigError as e:
            return [f"{dsl}/{check}/{name}: ConfigError: {e}"]
        except ValueError:  # the config does not serve this shape by design: try the next one
            continue
        except Exception as e:  # noqa: BLE001
            return [f"{dsl}/{check}/{name} at M={M} N={N} K={K}: {type(e).__name__}: {e}"]
        return failures
    return [f"{dsl}/{check}/{name}: served none of {shapes}: nothing was checked"]


def mean_shift_params(dsls=("triton", "helion")) -> list[tuple[str, str, str]]:
    """``(dsl, check, config name)`` of every shipped LayerNorm-capable config of ``MEAN_SHIFT_CHECKS`` (reads the
    tiling files only: usable at test collection)."""
    out = []
    for dsl in dsls:
        for check in MEAN_SHIFT_CHECKS:
            for name, _, impls in checkable_configs(dsl, check):
                if "gemm" not in (impls or []) or "fused" in (impls or []):
                    out.append((dsl, check, name))
    return out
