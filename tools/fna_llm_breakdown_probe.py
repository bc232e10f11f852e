"""Where the fused QK-norm attention's time goes at the fna_llm cells it loses: time paired
(``normfuse.timing.bench_graph_interleaved``, 3 ms graphs like the runner's paired windows) the parts of the fused
path separately. Fused (TLX, one ``LAZY_Q`` config): ``prepass`` (the K pre-pass kernel alone, ``_k_norm_kernel``
with γq folded), ``fused_attn`` (the attention kernel of the fused op alone, on a k_n written once before),
``fused`` (both: ``qknorm_attention``); ``attn`` (the same config without norms); ``sdpa`` (default dispatch) and
the two RMSNorms in eager PyTorch (``norm_q_eager`` / ``norm_k_eager``, ``F.rms_norm``) for scale. The compiled
norms of the runner's unfused baseline cannot run here: Inductor finds no GPU backend under the TLX Triton, so the
norms' share comes from the runner's paired runs (``T(sdpa_plus_norms) − T(sdpa)``). The fused op is checked
against the fp32 reference first.

``--ablations`` (``PERSISTENT`` ``LAZY_Q`` configs without ``RSTD_Q_PRODUCER``, whose producer-side rstd_q would
override the ablation) adds variants of the fused op's attention kernel that isolate its extra time
(the kernel's ``PROBE_RSTD_Q`` constexpr, never set by the library): ``attn_kn`` (the plain attention kernel on the
fused kernel's data, raw q and k_n: the input effect), ``fused_attn_norstd`` (the fused kernel with no rstd_q, a
per-row scale of 1: attention of q against k_n, checked as such), ``fused_attn_rstdload`` (rstd_q read from a
[B·Hq, S] fp32 vector computed beforehand instead of from the Q tile in shared memory; checked as the fused op) and
``rstd_q_prepass`` (that vector's pre-pass kernel, ``_k_rstd_kernel`` over q). Every variant's output is checked
before it is timed; each cell's NVML clock / power samples are recorded.

``--kprod`` (a ``-prodq`` config whose ``-kprod`` twin, ``K_NORM_PRODUCER``, is shipped) adds that twin, which has
no pre-pass: ``kprod_fused`` (its one kernel; checked as the fused op) and ``kprod_sums`` (the same kernel with the
``PROBE_KPROD`` constexpr, never set by the library: the producer computes every K tile's sums of squares and
rstd_k but leaves the tile raw, so the kernel computes attention of ``rmsnorm(q)·γq·γk`` against the raw k, checked
as such): how much of the in-place K scale's cost is the statistic alone; and, where the ``-krstd`` twin
(``K_RSTD_PRODUCER``) is shipped, ``krstd_fused`` (its one kernel, checked as the fused op). GPU only:

    python -m tools.fna_llm_breakdown_probe --out DIR [--config NAME] [--rounds 20] [--ablations] [--kprod]

from the repository root, TLX environment on the path; set ``NORMFUSE_GIT_SHA=$(cat .normfuse_git_sha)`` on a GPU
host whose copy of the tree carries a stale ``.git`` (``tools/device_run.sh`` does that for the sweeps), else
meta.json records that ``.git``'s commit. Writes DIR/probe.json (every sample) and DIR/meta.json (commit,
versions, GPU, config), prints a table (median µs)."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from kernels_tlx import fna_llm as K
from kernels_triton.fna_llm import k_prepass
from normfuse import hardware, timing
from normfuse.gpu_checks import shipped_configs
from normfuse.worker import versions
from normfuse.techniques import fna_llm as T

CFGS = {c["name"]: {k: v for k, v in c.items() if k != "name"} for c in shipped_configs("tlx", "fna_llm")}
SHAPES = [(1024, 1, False), (2048, 1, False), (4096, 1, False), (4096, 8, True)]  # S, B, causal


def parts(inp, causal: bool, cfg: dict) -> tuple[tuple, dict]:
    """The fused op's launch plan (``K._prepare``'s ``(o, launches, kwargs, pre-pass)``, its k_n written once, for
    ``ablations``) and zero-argument callables of every part (see the module docstring)."""
    q, k, v, qw, kw = inp["q"], inp["k"], inp["v"], inp["q_weight"], inp["k_weight"]
    plan = _, launches, kwc, pre = K._prepare(q, k, v, qw, kw, None, causal, 1e-6, cfg, True)
    pre_kernel, pre_args, pre_grid, pre_kw = pre
    pre_kernel[pre_grid](*pre_args, **pre_kw)  # k_n written once: fused_attn then reads it

    def prepass():
        pre_kernel[pre_grid](*pre_args, **pre_kw)

    def fused_attn():
        K._launch(launches, kwc, None)

    D = q.shape[-1]
    eager = lambda x, w: torch.nn.functional.rms_norm(x, (D,), w, 1e-6)  # noqa: E731
    return plan, {"prepass": prepass, "fused_attn": fused_attn,
                  "fused": lambda: K.qknorm_attention(q, k, v, qw, kw, causal=causal, config=cfg),
                  "attn": lambda: K.attention(q, k, v, causal=causal, config=cfg),
                  "sdpa": T.baseline("sdpa", inp, 1e-6, "causal" if causal else "noncausal"),
                  "norm_q_eager": lambda: eager(q, qw), "norm_k_eager": lambda: eager(k, kw)}


def ablations(inp, causal: bool, cfg: dict, plan: tuple) -> tuple[dict, dict]:
    """``(callables, checks)`` of the ``--ablations`` variants (module docstring) on ``parts``' launch plan: each
    callable returns its output; ``checks[name] = (impl for T.check, inputs)`` says what it must equal."""
    q, v = inp["q"], inp["v"]
    o, launches, kwc, pre = plan
    k_n = pre[1][2]  # the pre-pass's output (_k_norm_kernel's args: k, k_weight, k_n, ...), written by parts
    (args, grid), = launches  # PERSISTENT: one launch; RSTD_K (index 7) is unused with K_NORM = materialize
    rq_pre, rstd_q, _ = k_prepass(q, None, 1e-6, "prepass")
    rq_kernel, rq_args, rq_grid, rq_kw = rq_pre
    rq_kernel[rq_grid](*rq_args, **rq_kw)
    args_rq = args[:7] + (rstd_q,) + args[8:]

    def run(a, mode):
        def f():
            K._fna_llm_ws_kernel[grid](*a, **kwc, PROBE_RSTD_Q=mode)
            return o
        return f

    def rq():
        rq_kernel[rq_grid](*rq_args, **rq_kw)
        return rstd_q

    fns = {"attn_kn": lambda: K.attention(q, k_n, v, causal=causal, config=cfg),
           "fused_attn_norstd": run(args, 1), "fused_attn_rstdload": run(args_rq, 2), "rstd_q_prepass": rq}
    on_kn = {**inp, "k": k_n}
    checks = {"attn_kn": ("attention", on_kn), "fused_attn_norstd": ("attention", on_kn),
              "fused_attn_rstdload": ("fused", inp)}
    return fns, checks


def kprod(inp, causal: bool, kcfg: dict, rcfg: dict | None = None) -> tuple[dict, dict]:
    """``(callables, checks)`` of the ``--kprod`` variants (module docstring) for the ``-kprod`` config ``kcfg``
    and, if given, the ``-krstd`` config ``rcfg``."""
    q, k, v, qw, kw = inp["q"], inp["k"], inp["v"], inp["q_weight"], inp["k_weight"]
    o, launches, kwc, pre = K._prepare(q, k, v, qw, kw, None, causal, 1e-6, kcfg, True)
    assert pre is None, "K_NORM_PRODUCER has no pre-pass"

    def sums():
        K._launch(launches, {**kwc, "PROBE_KPROD": 1}, None)
        return o

    def check_sums(out) -> dict:  # what the kernel computes: the raw k against the weighted Q tile (rounded to
        # q's dtype in shared memory), its rows scaled by rstd_q in fp32; the tolerance of plain attention on it
        variant = "causal" if causal else "noncausal"
        q_w = (q.float() * (qw.float() * kw.float())).to(q.dtype).float()
        q_eff = q_w * torch.rsqrt(q.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        ref = T.reference(variant, {**inp, "q": q_eff}, 1e-6, norms=False)
        tol = T.tolerance(ref, T.same_dtype(variant, {**inp, "q": q_eff.to(q.dtype)}, 1e-6, norms=False))
        return T.compare(out, ref, tol)

    fns = {"kprod_fused": lambda: K.qknorm_attention(q, k, v, qw, kw, causal=causal, config=kcfg), "kprod_sums": sums}
    checks = {"kprod_fused": ("fused", inp), "kprod_sums": (check_sums, None)}
    if rcfg is not None:
        fns["krstd_fused"] = lambda: K.qknorm_attention(q, k, v, qw, kw, causal=causal, config=rcfg)
        checks["krstd_fused"] = ("fused", inp)
    return fns, checks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for probe.json and meta.json")
    ap.add_argument("--config", default="bn128-buf2-pipe-pingpong-persist-mat-lazyq",
                    help="a TLX entry of configs/tiling/fna_llm_h200.yaml")
    ap.add_argument("--rounds", type=int, default=20, help="paired rounds per cell")
    ap.add_argument("--ablations", action="store_true",
                    help="add the PROBE_RSTD_Q variants (PERSISTENT LAZY_Q configs without RSTD_Q_PRODUCER)")
    ap.add_argument("--kprod", action="store_true",
                    help="add the config's K_NORM_PRODUCER twin (NAME-kprod), its PROBE_KPROD variant and, where "
                         "shipped, the K_RSTD_PRODUCER twin (NAME-krstd)")
    args = ap.parse_args()
    if args.config not in CFGS:
        ap.error(f"--config {args.config!r} is not a TLX entry of configs/tiling/fna_llm_h200.yaml")
    cfg = CFGS[args.config]
    if args.ablations and (not (cfg.get("LAZY_Q") and cfg.get("PERSISTENT")) or cfg.get("RSTD_Q_PRODUCER")):
        ap.error("--ablations needs a PERSISTENT LAZY_Q config without RSTD_Q_PRODUCER (PROBE_RSTD_Q replaces the "
                 "consumers' rstd_q; RSTD_Q_PRODUCER would take precedence over it)")
    if args.kprod and f"{args.config}-kprod" not in CFGS:
        ap.error(f"--kprod needs a config with a shipped K_NORM_PRODUCER twin ({args.config}-kprod)")
    if not torch.cuda.is_available():
        ap.error("GPU only: the probe times TLX kernels on a CUDA device")
    rows = []
    for S, B, causal in SHAPES:
        variant = "causal" if causal else "noncausal"
        inp = T.make_inputs(S, B, 32, dtype="bf16", device="cuda", kv_heads=8, head_dim=128, seed=S + B)
        plan, fns = parts(inp, causal, cfg)
        checks = {"fused": ("fused", inp), "attn": ("attention", inp)}
        if args.ablations:
            extra, extra_checks = ablations(inp, causal, cfg, plan)
            fns.update(extra)
            checks.update(extra_checks)
        if args.kprod:
            extra, extra_checks = kprod(inp, causal, CFGS[f"{args.config}-kprod"], CFGS.get(f"{args.config}-krstd"))
            fns.update(extra)
            checks.update(extra_checks)
        for name, (impl, ref_inp) in checks.items():  # correct before timed (impl: a T.check impl or a check)
            res = impl(fns[name]()) if callable(impl) else T.check(impl, fns[name](), ref_inp, 1e-6, variant)
            if not res["ok"]:
                raise SystemExit(f"{name} failed its check at S={S} B={B} {variant}: {res}")
        if args.ablations:  # the pre-pass's rstd_q against torch
            ref = torch.rsqrt(inp["q"].float().pow(2).mean(-1) + 1e-6).flatten()
            torch.testing.assert_close(fns["rstd_q_prepass"](), ref, rtol=1e-5, atol=0)
        with hardware.Sampler() as sampler:
            t = timing.bench_graph_interleaved(fns, rounds=args.rounds, graph_ms=3.0)
        nvml = sampler.stats()
        for name, s in t.items():
            rows.append(dict(S=S, B=B, variant=variant, name=name, us=1e3 * statistics.median(s),
                             samples=s, **nvml))
        print(f"done S={S} B={B} {variant}: SM clock {nvml['sm_clock_mhz_min']}-{nvml['sm_clock_mhz_max']} MHz, "
              f"power median {nvml['power_w_median']} W", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = hardware.read_gpu()
    (out / "probe.json").write_text(json.dumps({"gpu": gpu, "config": args.config, "rows": rows}, indent=1,
                                               default=str))
    from normfuse.sweep import git_info  # pandas: the GPU host's python has it, the CPU TLX venv not

    meta = {"tool": "tools.fna_llm_breakdown_probe", "argv": vars(args), **git_info(), "versions": versions(),
            "gpu": gpu, "config": cfg, "shapes": SHAPES, "ablations": args.ablations, "kprod": args.kprod,
            "checked": "every timed variant's output against the fp32 reference first (ablations: see the docstring)"}
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    names = list(dict.fromkeys(r["name"] for r in rows))
    print(f"{'cell':22s}" + "".join(f"{n:>16s}" for n in names) + "   (median µs)")
    for S, B, causal in SHAPES:
        v = "causal" if causal else "noncausal"
        us = {r["name"]: r["us"] for r in rows if (r["S"], r["B"], r["variant"]) == (S, B, v)}
        print(f"{v:9s} S={S:5d} B={B:<2d}  " + "".join(f"{us[n]:16.2f}" for n in names))


if __name__ == "__main__":
    main()
