r"""How the fused LayerNorm kernels' error grows with the mean of the activation rows (CPU only, no timings).

Lazy Pre-Norm for LayerNorm (``normfuse.techniques.lazy_prenorm``, variant ``layernorm``) computes

    C = rstd ⊙ (A @ W') - (rstd * mean) ⊗ colsum(W') + beta @ B

from one-pass statistics. Two cancellations grow with |mean| / std of a row:

* the variance: the naive ``E[a^2] - E[a]^2`` loses about log2((mean/std)^2) bits; the kernels' shifted sums
  (shift = the row's first element) remove most of that;
* the epilogue: ``acc = A @ W'`` carries ``mean * colsum``, which the correction subtracts again; fp32 rounding of
  that large term gives an output error that grows about linearly with |mean| / std. Nothing in a one-pass fusion
  removes it (the activation would have to be centred before the MMA).

For each dtype and ``mean_shift`` (added to every element of A), the table lists the relative (Frobenius) output
error against the fp32 two-pass reference and ``max|err| / tol`` (the sweep's pass criterion: <= 1 passes) of

* ``torch``: unfused PyTorch in the input dtype (``F.layer_norm`` then ``@``), the tolerance's yardstick;
* ``shifted/fp32-epi``: the kernels' statistics with the broadcast epilogue (Helion; Triton's flattened rowblock);
* ``shifted/mma-epi``: the kernels' statistics with the extra-MMA epilogue (Triton tile/nested, TLX default);
* ``naive``: unshifted one-pass statistics (what the kernels would do without the shift);

plus the worst relative error of rstd (one-pass vs two-pass). The rows come from the torch emulation in
``normfuse.techniques.lazy_prenorm`` (fp32 accumulation of input-dtype products; the GPU's wgmma accumulates in a
different order, so GPU errors differ in detail, not in growth). With ``--interpret`` the Triton kernels
themselves run in the Triton interpreter at fp16/fp32 (its bf16 dot is wrong) on a smaller shape.

Asserts (exit code 1 if violated): the shifted kernels pass the tolerance for |shift| <= 100 in every dtype; at
fp32 their relative error stays below 1e-6 * (1 + shift) (linear growth); at shift >= 100 the naive statistics are
at least 10x worse than the shifted ones at fp32.

Usage: ``python -m experiments.lazy_ln_cancellation [--quick] [--interpret]``.
"""

from __future__ import annotations

import argparse
import os
import sys

SHIFTS = (0.0, 1.0, 10.0, 100.0, 1000.0)


def _rows(M, N, K, dtypes, shifts, eps, seed=0):
    import torch

    from normfuse.techniques import lazy_prenorm as T

    rows = []
    for dtype in dtypes:
        for shift in shifts:
            inp = T.make_inputs(M, N, K, dtype=dtype, seed=seed, variant="layernorm", mean_shift=shift)
            a = inp["a"]
            ref = T.reference(inp, eps, "layernorm")
            same = T.unfused_torch(inp, eps, "layernorm")
            tol = T.tolerance(ref, same)
            _, rstd_ref = T.layernorm_stats(a, eps)
            row = {"dtype": dtype, "shift": shift, "tol": tol}
            row["torch"] = T.compare(same, ref, tol)
            for name, kw in (("shifted/fp32-epi", {}), ("shifted/mma-epi", {"epilogue": "mma"}),
                             ("naive", {"shift": False})):
                out = T.lazy_layernorm_emulated(a, inp["b_folded"], inp["colsum"], inp["beta_b"], eps, **kw)
                row[name] = T.compare(out.to(a.dtype), ref, tol)
                row[name]["rel_err_fp32"] = T.compare(out, ref, tol)["rel_err"]  # before the output rounding
            for name, shift_stats in (("shifted", True), ("naive", False)):
                _, rs, _, _ = T.layernorm_stats_onepass(a, eps, shift=shift_stats)
                row[f"rstd_err_{name}"] = ((rs - rstd_ref).abs() / rstd_ref).max().item()
            rows.append(row)
            del inp, ref, same, a
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return rows


def _interpreter_rows(M, N, K, shifts, eps):
    """The Triton kernels themselves, in the interpreter (TRITON_INTERPRET=1 must be set before triton is imported)."""
    from kernels_triton.lazy_prenorm import lazy_layernorm_matmul
    from normfuse.techniques import lazy_prenorm as T

    small = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=2)
    rows = []
    for dtype in ("fp16", "fp32"):
        for shift in shifts:
            inp = T.make_inputs(M, N, K, dtype=dtype, seed=1, variant="layernorm", mean_shift=shift)
            ref = T.reference(inp, eps, "layernorm")
            tol = T.tolerance(ref, T.unfused_torch(inp, eps, "layernorm"))
            row = {"dtype": dtype, "shift": shift}
            for name, cfg in (("tile/reload (mma-epi)", dict(small, sumsq="reload")),
                              ("rowblock/prepass (fp32-epi)", dict(small, sumsq="prepass", schedule="rowblock"))):
                out = lazy_layernorm_matmul(inp["a"], inp["b_folded"], inp["colsum"], inp["beta_b"], eps=eps,
                                            config=cfg)
                row[name] = T.compare(out, ref, tol)
            rows.append(row)
    return rows


def _fmt(r):
    return f"{r['rel_err']:.1e} ({r['max_abs_err'] / r['tol']:.2f})"


def table(rows) -> str:
    cols = ["torch", "shifted/fp32-epi", "shifted/mma-epi", "naive"]
    head = ("| dtype | mean shift | " + " | ".join(f"{c}: rel err (err/tol)" for c in cols)
            + " | rstd rel err shifted | rstd rel err naive |")
    lines = [head, "|" + "---|" * (len(cols) + 4)]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['shift']:g} | " + " | ".join(_fmt(r[c]) for c in cols)
                     + f" | {r['rstd_err_shifted']:.1e} | {r['rstd_err_naive']:.1e} |")
    return "\n".join(lines)


def interpreter_table(rows) -> str:
    cols = [c for c in rows[0] if c not in ("dtype", "shift")]
    lines = ["| dtype | mean shift | " + " | ".join(f"{c}: rel err (err/tol)" for c in cols) + " |",
             "|" + "---|" * (len(cols) + 2)]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['shift']:g} | " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def check(rows, interp_rows=()) -> list[str]:
    """The asserted bounds (module docstring); returns the violations."""
    bad = []
    for r in rows:
        for name in ("shifted/fp32-epi", "shifted/mma-epi"):
            if abs(r["shift"]) <= 100 and not r[name]["ok"]:
                bad.append(f"{name} fails the tolerance at {r['dtype']}, shift {r['shift']:g}: {_fmt(r[name])}")
            if r["dtype"] == "fp32" and r[name]["rel_err_fp32"] > 1e-6 * (1 + abs(r["shift"])):
                bad.append(f"{name} fp32 rel err {r[name]['rel_err_fp32']:.2e} > 1e-6 * (1 + {r['shift']:g})")
        if r["dtype"] == "fp32" and abs(r["shift"]) >= 100:
            if r["naive"]["rel_err_fp32"] < 10 * r["shifted/fp32-epi"]["rel_err_fp32"]:
                bad.append(f"naive statistics not 10x worse than shifted at shift {r['shift']:g}: "
                           f"{r['naive']['rel_err_fp32']:.2e} vs {r['shifted/fp32-epi']['rel_err_fp32']:.2e}")
    for r in interp_rows:
        for name, res in r.items():
            if name in ("dtype", "shift") or abs(r["shift"]) > 100:
                continue
            if not res["ok"]:
                bad.append(f"interpreter {name} fails at {r['dtype']}, shift {r['shift']:g}: {_fmt(res)}")
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller shapes (M=128, N=64, K=512)")
    p.add_argument("--interpret", action="store_true",
                   help="also run the Triton kernels in the Triton interpreter (fp16/fp32)")
    p.add_argument("--eps", type=float, default=1e-5)
    args = p.parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (kernels_triton imports it)
    M, N, K = (128, 64, 512) if args.quick else (512, 256, 1024)
    rows = _rows(M, N, K, ("bf16", "fp16", "fp32"), SHIFTS, args.eps)
    print(f"## Lazy LayerNorm: error vs mean shift (torch emulation, M={M} N={N} K={K}, rows scaled 0.25..4, "
          f"eps={args.eps:g})\n")
    print(table(rows))
    interp = []
    if args.interpret:
        Mi, Ni, Ki = 64, 64, 256 if args.quick else 512
        interp = _interpreter_rows(Mi, Ni, Ki, (0.0, 10.0, 100.0, 1000.0), args.eps)
        print(f"\n## Triton kernels in the interpreter (M={Mi} N={Ni} K={Ki}, 32x32x32 tiles)\n")
        print(interpreter_table(interp))
    bad = check(rows, interp)
    print("\n" + ("all bounds hold" if not bad else "VIOLATED:\n" + "\n".join(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
