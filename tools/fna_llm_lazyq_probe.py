"""Probe of the TLX QK-norm attention's LAZY_Q slowdown with PINGPONG (results/fna_llm_lazyq/20261201_h200_overlapped,
where rstd_q was computed while the first QKᵀ ran in every config): at a few fna_llm cells, time paired
(``normfuse.timing.bench_graph_interleaved``) the plain attention on the raw inputs and on pre-normalized inputs
(the fused kernels' data regime), the normalize-and-store fused kernel and the LAZY_Q one, for the ping-pong,
cooperative and one-tile-per-CTA configs; then run each variant alone for ~0.5 s under NVML sampling (SM clock,
power). Every variant is checked first against the fp32 reference of the inputs it is given. ``fused_*_lazy``:
rstd_q computed while the tile's first QKᵀ runs (``LAZY_Q_EARLY`` forced off), ``fused_*_lazyearly``: before it
(forced on; the shipped configs take ``LAZY_Q_EARLY = PINGPONG``). GPU only:

    python -m tools.fna_llm_lazyq_probe --out DIR [--norm-attn] [--rounds 15]

from the repository root (the tiling YAML is read from ``configs/``), with the TLX environment on the path.
``--norm-attn`` adds the plain attention on pre-normalized inputs (``attn_*_norm``); ``--rounds``: paired rounds
per cell. The graphs are ``bench_graph_interleaved``'s default 60 ms per replay (the runner's paired windows use
3 ms), a sustained-power regime. Writes DIR/probe.json and prints a table (median ms, TFLOP/s, median SM MHz and W
per variant)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import yaml

from kernels_tlx import fna_llm as K
from normfuse import hardware, timing
from normfuse.techniques import fna_llm as T

CFGS = {c["name"]: {k: v for k, v in c.items() if k != "name"}
        for c in yaml.safe_load(Path("configs/tiling/fna_llm_h200.yaml").read_text())["tlx"]}
SHAPES = [(16384, 1, False), (16384, 1, True), (4096, 8, False), (1024, 1, False)]  # S, B, causal
BASES = {"pp": "bn128-buf2-pipe-pingpong-persist-mat", "coop": "bn128-buf2-pipe-coop-persist-mat",
         "lpt": "bn128-buf2-pipe-pingpong-lpt-mat"}


def _fused_lazy_at(inp, causal, cfg, early: bool):
    """``qknorm_attention`` with ``LAZY_Q`` and the kernel's ``LAZY_Q_EARLY`` forced to ``early`` (rstd_q before
    the tile's first QKᵀ, or while it runs; the shipped configs take ``LAZY_Q_EARLY = PINGPONG``)."""
    o, launches, kw, pre = K._prepare(inp["q"], inp["k"], inp["v"], inp["q_weight"], inp["k_weight"], None, causal,
                                      1e-6, cfg, True)
    K._launch(launches, {**kw, "LAZY_Q_EARLY": early}, pre)
    return o


def variants(inp, qn, kn, causal, with_norm_attn=True):
    out = {}
    for tag, name in BASES.items():
        cfg = CFGS[name]
        out[f"attn_{tag}_raw"] = lambda c=cfg: K.attention(inp["q"], inp["k"], inp["v"], causal=causal, config=c)
        if with_norm_attn:
            out[f"attn_{tag}_norm"] = lambda c=cfg: K.attention(qn, kn, inp["v"], causal=causal, config=c)
        out[f"fused_{tag}_store"] = lambda c=cfg: K.qknorm_attention(
            inp["q"], inp["k"], inp["v"], inp["q_weight"], inp["k_weight"], causal=causal, config=c)
        for early in (False, True):
            out[f"fused_{tag}_lazy{'early' if early else ''}"] = lambda c={**cfg, "LAZY_Q": True}, e=early: (
                _fused_lazy_at(inp, causal, c, e))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--norm-attn", action="store_true", help="also the plain attention on pre-normalized inputs")
    args = ap.parse_args()
    rows = []
    for S, B, causal in SHAPES:
        inp = T.make_inputs(S, B, 32, dtype="bf16", device="cuda", kv_heads=8, head_dim=128, seed=S + B)
        qn = T.rmsnorm(inp["q"], inp["q_weight"], 1e-6).to(torch.bfloat16)
        kn = T.rmsnorm(inp["k"], inp["k_weight"], 1e-6).to(torch.bfloat16)
        fns = variants(inp, qn, kn, causal, with_norm_attn=args.norm_attn)
        variant = "causal" if causal else "noncausal"
        ok = {}
        for name, fn in fns.items():  # correct before timed
            o = fn()
            if name.startswith("fused"):
                ok[name] = T.check("fused", o, inp, 1e-6, variant)["ok"]
            else:  # the plain attention against the fp32 reference of the inputs it was given
                given = inp if name.endswith("raw") else {**inp, "q": qn, "k": kn}
                ok[name] = T.check("attention", o, given, 1e-6, variant)["ok"]
        fns = {n: f for n, f in fns.items() if ok[n]}
        t = timing.bench_graph_interleaved(fns, rounds=args.rounds)
        flops = T.flops("attention", S, B, 32, variant=variant)
        for name, fn in fns.items():
            torch.cuda.synchronize()
            with hardware.Sampler(period_s=0.02) as smp:
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < 0.5:
                    for _ in range(4):
                        fn()
                    torch.cuda.synchronize()
            st = smp.stats()
            ms = statistics.median(t[name])
            rows.append(dict(S=S, B=B, variant=variant, name=name, ok=ok[name], ms=ms,
                             tflops=flops / ms / 1e9, mhz=st["sm_clock_mhz_median"],
                             watts=st["power_w_median"], samples=t[name]))
        for name in ok:
            if not ok[name]:
                rows.append(dict(S=S, B=B, variant=variant, name=name, ok=False))
        print(f"done S={S} B={B} {variant}", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe.json").write_text(json.dumps({"gpu": hardware.read_gpu(), "rows": rows}, indent=1,
                                                          default=str))
    for r in rows:
        if r.get("ok"):
            print(f"{r['variant']:9s} S={r['S']:5d} B={r['B']} {r['name']:18s} {r['ms']:8.3f} ms "
                  f"{r['tflops']:6.0f} TF/s {r['mhz'] or 0:6.0f} MHz {r['watts'] or 0:5.0f} W")
        else:
            print(f"{r['variant']:9s} S={r['S']:5d} B={r['B']} {r['name']:18s} FAILED CHECK")


if __name__ == "__main__":
    main()
