"""A Llama-3-8B decoder layer, forward + backward, with the ``normfuse.nn`` drop-ins against the same layer in plain
PyTorch, both under ``torch.compile``; and the layer's fully connected GEMMs per phase (fwd / dgrad / wgrad).

    python -m experiments.layer_bench [--tokens 8192 16384] [--seq 4096] [--qk-norm] [--out results/layer_bench]
    python -m experiments.layer_bench --smoke          # CPU: tiny layer, Triton interpreter, eager, no timings

The layer (``LLAMA3_8B``: hidden 4096, 32 query / 8 KV heads of 128, FFN 14336, RMSNorm eps 1e-5, RoPE theta 5e5,
bf16, no biases): ``h = x + Wo·attn(rope(q), rope(k), v)`` with ``q, k, v = Wqkv·RMSNorm(x)``, then ``out = h +
W2·(silu(g) * u)`` with ``g, u = W13·RMSNorm(h)``; causal attention with GQA through
``F.scaled_dot_product_attention`` (``enable_gqa``; PyTorch's default dispatch, cuDNN on the H200). With ``--qk-norm`` a second pair of layers
adds per-head RMSNorm of q and k (Qwen3 / OLMo2 style), applied *after* RoPE in both variants (the fused kernel
normalizes inside attention; rstd is rotation-invariant, gamma then acts on the rotated coordinates).

Variants, same weights and inputs, each compiled per shape (``torch.compile(dynamic=False)``, default mode):

* ``torch_compile``: the layer in PyTorch (``nn.RMSNorm`` + ``nn.Linear``: Inductor fuses the norms, cuBLAS the GEMMs);
* ``dropin``: RMSNorm + Wqkv and RMSNorm + W13 replaced by ``normfuse.nn.LazyRMSNormLinear`` (the fused Lazy
  Pre-Norm kernel of ``--dsl``, gamma folded into the weight on every step; backward: our Triton RMSNorm recompute
  and backward kernels + cuBLAS), and with ``--qk-norm`` the q/k norms + SDPA replaced by
  ``normfuse.nn.QKNormAttention`` (fused QK-norm flash attention forward; backward recomputes the attention with
  SDPA). Everything else (RoPE, residuals, SiLU, Wo, W2) is the same PyTorch code, compiled.

Correctness before timing: every variant's output and gradients (x and all parameters) are compared with the fp32
eager layer (TF32 off, KV heads expanded so that fp32 SDPA runs) by the repository's flash-attention rule, the
``torch_compile`` variant's bf16 error setting the tolerance; a variant that fails is not timed.

Timing (``normfuse.timing.bench_graph_interleaved``): each variant's training step (forward, then
``torch.autograd.grad`` of the output for x and every parameter) is captured in a CUDA graph (where the step cannot be
captured — on torch 2.11 the AccumulateGrad nodes kept from the check step live on the default stream — the rounds
run eagerly instead, CUDA events around each step; every row records ``timing`` = graph | eager) with an L2 flush before
it, and the variants' graphs are replayed round by round in rotating order (``--rounds``); per variant the median
over rounds with a 95 % bootstrap interval (``scipy.stats.bootstrap``, percentile), and per round the paired share
won ``(T_torch - T_dropin) / T_torch`` (median and interval). The same method times the FC GEMMs per phase
(``normfuse.shapes.fc_to_gemm``, ``llama3_8b`` preset: ``x @ W^T``, ``dy @ W``, ``x^T @ dy`` on cuBLAS), the
fused forward of each norm-fused projection against RMSNorm + cuBLAS, and the norms alone (compiled RMSNorm forward
and forward + backward at [tokens, 4096]; our Triton recompute and backward kernels; the gamma fold). The norms'
share of the layer = 2 x (RMSNorm fwd+bwd) [+ q/k norms] / T_layer(torch_compile) — an upper bound, since Inductor
fuses the norms with neighbouring pointwise ops inside the layer.

References for the expected size of the effect: the MXNorm paper reports +1.3 % (MXFP8) / +2.6 % (NVFP4) layer
speedups for Llama 3 8B on GB200 (arXiv 2603.13180); the PyTorch blog "Towards Free Normalization" motivates its
work with norms at ~20 % of training time.

Writes ``<out>/<run_id>/``: ``results.csv`` (+ ``results.parquet``), ``summary.md``, ``meta.json``; prints the short
table last. Without CUDA and without ``--smoke`` it exits with a message.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class LayerConfig:
    """Decoder-layer dimensions (``head_dim * n_heads`` need not equal ``hidden``)."""

    hidden: int = 4096
    n_heads: int = 32
    n_kv_heads: int = 8
    head_dim: int = 128
    ffn: int = 14336
    eps: float = 1e-5
    rope_theta: float = 500000.0
    qk_norm: bool = False

    @property
    def qkv_out(self) -> int:
        return (self.n_heads + 2 * self.n_kv_heads) * self.head_dim


LLAMA3_8B = LayerConfig()
SMOKE = LayerConfig(hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn=96, rope_theta=10000.0)
CANONICAL = ("x", "attn_norm", "wqkv", "wo", "ffn_norm", "w13", "w2", "q_norm", "k_norm")


def rope_tables(seq: int, head_dim: int, theta: float, device, dtype):
    """``(cos, sin)`` ``[seq, head_dim]`` of the rotate-half RoPE (Llama's layout), computed in fp32."""
    import torch

    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _apply_rope(x, cos, sin):
    import torch

    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _layer_class():
    import torch.nn.functional as F
    from torch import nn

    from normfuse.nn import LazyRMSNormLinear, QKNormAttention

    class DecoderLayer(nn.Module):
        """The Llama-style layer of this experiment (module docstring); ``dropin=True`` uses the normfuse.nn
        drop-ins, ``expand_kv=True`` repeats the KV heads instead of SDPA's ``enable_gqa`` (the fp32 reference)."""

        def __init__(self, cfg: LayerConfig, *, dropin: bool = False, dsl: str = "triton", config=None,
                     expand_kv: bool = False, device=None, dtype=None):
            super().__init__()
            kw = {"device": device, "dtype": dtype}
            self.cfg, self.dropin, self.expand_kv = cfg, dropin, expand_kv
            H, D = cfg.n_heads, cfg.head_dim
            if dropin:
                self.attn_in = LazyRMSNormLinear(cfg.hidden, cfg.qkv_out, eps=cfg.eps, dsl=dsl, config=config, **kw)
                self.mlp_in = LazyRMSNormLinear(cfg.hidden, 2 * cfg.ffn, eps=cfg.eps, dsl=dsl, config=config, **kw)
                if cfg.qk_norm:
                    self.attn = QKNormAttention(D, eps=cfg.eps, causal=True, dsl=dsl, **kw)
            else:
                self.attn_norm = nn.RMSNorm(cfg.hidden, eps=cfg.eps, **kw)
                self.wqkv = nn.Linear(cfg.hidden, cfg.qkv_out, bias=False, **kw)
                self.ffn_norm = nn.RMSNorm(cfg.hidden, eps=cfg.eps, **kw)
                self.w13 = nn.Linear(cfg.hidden, 2 * cfg.ffn, bias=False, **kw)
                if cfg.qk_norm:
                    self.q_norm = nn.RMSNorm(D, eps=cfg.eps, **kw)
                    self.k_norm = nn.RMSNorm(D, eps=cfg.eps, **kw)
            self.wo = nn.Linear(H * D, cfg.hidden, bias=False, **kw)
            self.w2 = nn.Linear(cfg.ffn, cfg.hidden, bias=False, **kw)

        def canonical(self) -> dict:
            """``{canonical name: parameter}`` (the same names in both variants; CANONICAL order)."""
            if self.dropin:
                p = {"attn_norm": self.attn_in.norm_weight, "wqkv": self.attn_in.weight,
                     "ffn_norm": self.mlp_in.norm_weight, "w13": self.mlp_in.weight}
                if self.cfg.qk_norm:
                    p.update(q_norm=self.attn.q_weight, k_norm=self.attn.k_weight)
            else:
                p = {"attn_norm": self.attn_norm.weight, "wqkv": self.wqkv.weight, "ffn_norm": self.ffn_norm.weight,
                     "w13": self.w13.weight}
                if self.cfg.qk_norm:
                    p.update(q_norm=self.q_norm.weight, k_norm=self.k_norm.weight)
            p.update(wo=self.wo.weight, w2=self.w2.weight)
            return {n: p[n] for n in CANONICAL if n in p}

        def _sdpa(self, q, k, v):
            if self.expand_kv:
                rep = self.cfg.n_heads // self.cfg.n_kv_heads
                k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                  enable_gqa=k.shape[1] != q.shape[1])

        def forward(self, x, cos, sin):
            cfg = self.cfg
            B, S, _ = x.shape
            H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
            qkv = self.attn_in(x) if self.dropin else self.wqkv(self.attn_norm(x))
            q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], -1)
            q = _apply_rope(q.view(B, S, H, D).transpose(1, 2), cos, sin)
            k = _apply_rope(k.view(B, S, Hkv, D).transpose(1, 2), cos, sin)
            v = v.view(B, S, Hkv, D).transpose(1, 2)
            if cfg.qk_norm and self.dropin:
                o = self.attn(q.contiguous(), k.contiguous(), v.contiguous())
            elif cfg.qk_norm:
                o = self._sdpa(self.q_norm(q), self.k_norm(k), v)
            else:
                o = self._sdpa(q, k, v)
            h = x + self.wo(o.transpose(1, 2).reshape(B, S, H * D))
            gu = self.mlp_in(h) if self.dropin else self.w13(self.ffn_norm(h))
            g, u = gu.chunk(2, -1)
            return h + self.w2(F.silu(g) * u)

    return DecoderLayer


def build_layers(cfg: LayerConfig, *, device, dtype, dsl: str = "triton", config=None, seed: int = 0) -> dict:
    """``{"torch": layer, "dropin": layer, "ref": fp32-or-fp64 reference layer}`` sharing one set of seeded weights
    (linears N(0, 0.02), norm weights 1 + 0.1 N(0, 1): a non-trivial gamma)."""
    import torch

    Layer = _layer_class()
    torch.manual_seed(seed)
    # built and initialized on the CPU, then moved: no draw from the CUDA default generator, which a failed graph
    # capture of an earlier step (the eager fallback of bench_graph_interleaved) can leave unusable ("Offset
    # increment outside graph capture encountered unexpectedly")
    target, device = device, "cpu"
    base = Layer(cfg, device=device, dtype=dtype)
    with torch.no_grad():
        for name, p in base.canonical().items():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.02 * torch.randn_like(p))
    drop = Layer(cfg, dropin=True, dsl=dsl, config=config, device=device, dtype=dtype)
    ref_dtype = torch.float64 if torch.device(target).type == "cpu" else torch.float32
    ref = Layer(cfg, expand_kv=True, device=device, dtype=ref_dtype)
    with torch.no_grad():
        for n, p in base.canonical().items():
            drop.canonical()[n].copy_(p)
            ref.canonical()[n].copy_(p)
    return {"torch": base.to(target), "dropin": drop.to(target), "ref": ref.to(target)}


def make_step(layer, x, cos, sin, dout, fn=None):
    """The training step of ``layer`` (``fn`` = its compiled forward, default the layer): forward, then
    ``torch.autograd.grad`` of the output for x and every canonical parameter; returns ``(out, grads)``."""
    import torch

    fn = layer if fn is None else fn
    params = list(layer.canonical().values())

    def step():
        out = fn(x, cos, sin)
        return out, torch.autograd.grad(out, [x, *params], dout)

    return step


def check_step(results: dict, ref: tuple, names) -> dict:
    """Per variant and tensor (``"out"`` and ``names``): the flash-attention rule of the repository against
    ``ref``, the ``"torch"`` variant's error setting the tolerance. Returns ``{variant: {"ok", "worst", rows}}``."""
    from normfuse.techniques.lazy_prenorm import compare, tolerance

    keys = ("out", *names)
    ref_t = dict(zip(keys, (ref[0], *ref[1])))
    same = dict(zip(keys, (results["torch"][0], *results["torch"][1])))
    report = {}
    for variant, (out, grads) in results.items():
        got = dict(zip(keys, (out, *grads)))
        rows = {k: compare(got[k], ref_t[k].double(), tolerance(ref_t[k].double(), same[k])) for k in keys}
        worst = max(keys, key=lambda k: rows[k]["max_abs_err"] / max(rows[k]["tol"], 1e-30))
        report[variant] = {"ok": all(r["ok"] for r in rows.values()), "worst": worst,
                           "worst_ratio": rows[worst]["max_abs_err"] / max(rows[worst]["tol"], 1e-30), "rows": rows}
    return report


def median_ci(samples) -> tuple[float, float, float]:
    """Median of ``samples`` and its 95 % bootstrap interval (``normfuse.paired.median_ci``: scipy.stats.bootstrap,
    percentile, 2000 resamples); ``(median, median, median)`` for fewer than 3 samples or all equal."""
    import numpy as np

    from normfuse.paired import median_ci as bootstrap_median_ci

    a = np.asarray(samples, dtype=float)
    med = float(np.median(a))
    if a.size < 3 or float(np.ptp(a)) == 0.0:
        return med, med, med
    return bootstrap_median_ci(a)[:3]


# ------------------------------------------------------------------------------------------------------------
# GPU run
# ------------------------------------------------------------------------------------------------------------
@dataclass
class Runtime:
    """Where and how the timed run executes: ``device``, ``dtype`` of the layer, ``bench`` (``{name: fn} ->
    {name: [ms per round]}``, default ``normfuse.timing.bench_graph_interleaved``), ``compile`` (module or function
    -> compiled callable; default ``torch.compile(dynamic=False)``). Tests drive the GPU code path on the CPU with
    fp16 (Triton interpreter), a stand-in ``bench`` and no compilation."""

    device: str = "cuda"
    dtype: object = None
    bench: object = None
    compile: object = None

    def __post_init__(self):
        import torch

        self.dtype = self.dtype or torch.bfloat16
        if self.bench is None:
            from normfuse.timing import bench_graph_interleaved

            self.bench = bench_graph_interleaved
        if self.compile is None:
            self.compile = lambda f: torch.compile(f, dynamic=False)

    def sync(self):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def reset(self):
        """Drop Dynamo's compiled code (a fresh start for the next group of compiled callables)."""
        import torch

        torch._dynamo.reset()

    def empty_cache(self):
        import torch

        if self.device == "cuda":
            torch.cuda.empty_cache()

    def randn(self, *shape, gen, scale: float = 1.0, shift: float = 0.0):
        import torch

        return (torch.randn(*shape, device=self.device, generator=gen) * scale + shift).to(self.dtype)


def projections(cfg: LayerConfig) -> dict[str, tuple[int, int]]:
    """``{projection: (in_features, out_features)}`` of the layer (for LLAMA3_8B: ``MODEL_PRESETS["llama3_8b"]``)."""
    return {"qkv": (cfg.hidden, cfg.qkv_out), "o": (cfg.n_heads * cfg.head_dim, cfg.hidden),
            "gate_up": (cfg.hidden, 2 * cfg.ffn), "down": (cfg.ffn, cfg.hidden)}


def _timing_rows(samples: dict, base: dict, *, reference: str | None = None) -> list[dict]:
    """One row per timed callable: median / interval / p20 / p80; with ``reference`` the paired share won."""
    import numpy as np

    rows = []
    method = getattr(samples, "method", None)  # 'graph' or 'eager' (normfuse.timing.Samples)
    for name, s in samples.items():
        med, lo, hi = median_ci(s)
        row = {**base, "name": name, "status": "ok", "p50_ms": med, "ci_lo_ms": lo, "ci_hi_ms": hi, "timing": method,
               "p20_ms": float(np.percentile(s, 20)), "p80_ms": float(np.percentile(s, 80)), "n_samples": len(s)}
        if reference is not None and name != reference and reference in samples:
            share = [(r - v) / r for r, v in zip(samples[reference], s)]
            row["share_won"], row["share_ci_lo"], row["share_ci_hi"] = median_ci(share)
        rows.append(row)
    return rows


def layer_rows(rt: Runtime, cfg: LayerConfig, tokens: int, seq: int, dsl: str, config, rounds: int,
               base: dict, *, time_incorrect: bool = False) -> list[dict]:
    """Check, then time, the training step of both variants at ``tokens = batch x seq`` (module docstring). A
    variant that fails the check is not timed, unless ``time_incorrect`` (diagnosis only: its rows then say
    ``status = incorrect`` next to the time)."""
    import torch

    batch = tokens // seq
    rt.reset()
    layers = build_layers(cfg, device=rt.device, dtype=rt.dtype, dsl=dsl, config=config, seed=tokens)
    g = torch.Generator(device=rt.device).manual_seed(tokens)
    x = torch.randn(batch, seq, cfg.hidden, device=rt.device, generator=g)
    dout = torch.randn(batch, seq, cfg.hidden, device=rt.device, generator=g)
    ref_dtype = next(layers["ref"].parameters()).dtype
    cos, sin = rope_tables(seq, cfg.head_dim, cfg.rope_theta, rt.device, ref_dtype)
    names = ("x", *layers["torch"].canonical())
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        xr = x.to(ref_dtype, copy=True).requires_grad_()
        out, grads = make_step(layers["ref"], xr, cos, sin, dout.to(ref_dtype))()
        ref = (out.detach(), [t.detach() for t in grads])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    del layers["ref"], out, grads, xr
    xb, db = x.to(rt.dtype, copy=True).requires_grad_(), dout.to(rt.dtype)
    cos, sin = cos.to(rt.dtype), sin.to(rt.dtype)
    steps, results, compile_s = {}, {}, {}
    for v in ("torch", "dropin"):
        steps[v] = make_step(layers[v], xb, cos, sin, db, rt.compile(layers[v]))
        t0 = time.perf_counter()
        out, grads = steps[v]()  # first call: compiles forward and backward
        rt.sync()
        compile_s[v] = time.perf_counter() - t0
        results[v] = (out.detach(), [t.detach() for t in grads])
        _log(f"tokens={tokens} qk_norm={cfg.qk_norm} {v}: first step (compile) {compile_s[v]:.1f} s")
    report = check_step(results, ref, names)
    for v, r in report.items():
        _log(f"tokens={tokens} qk_norm={cfg.qk_norm} {v}: check {'ok' if r['ok'] else 'FAILED'} (worst "
             f"{r['worst']}: error / tolerance = {r['worst_ratio']:.3g})")
    del results, ref
    label = {"torch": "torch_compile", "dropin": "dropin"}
    ok_steps = {label[v]: steps[v] for v in steps if report[v]["ok"] or time_incorrect}
    samples = rt.bench(ok_steps, rounds=rounds) if ok_steps else {}
    rows = _timing_rows(samples, {**base, "kind": "layer"}, reference="torch_compile")
    _log(f"tokens={tokens} qk_norm={cfg.qk_norm}: " + ", ".join(f"{r['name']} {r['p50_ms']:.3f} ms" for r in rows))
    for v in steps:
        r = report[v]
        extra = {"compile_s": compile_s[v], "check_ok": r["ok"], "worst_tensor": r["worst"],
                 "worst_err_over_tol": r["worst_ratio"]}
        hit = [row for row in rows if row["name"] == label[v]]
        if hit:
            hit[0].update(extra, status="ok" if r["ok"] else "incorrect")
        else:
            rows.append({**base, "kind": "layer", "name": label[v], "status": "incorrect", **extra})
    return rows


def phase_rows(rt: Runtime, cfg: LayerConfig, tokens: int, rounds: int, base: dict) -> list[dict]:
    """The layer's FC GEMMs per projection and phase (``normfuse.shapes.fc_to_gemm``) at ``tokens``, as autograd
    issues them on cuBLAS: fwd ``x @ W^T``, dgrad ``dy @ W``, wgrad ``x^T @ dy`` (W in nn.Linear layout)."""
    import torch

    from normfuse.shapes import fc_to_gemm

    fns, dims = {}, {}
    g = torch.Generator(device=rt.device).manual_seed(1)
    for proj, (fin, fout) in projections(cfg).items():
        x, w = rt.randn(tokens, fin, gen=g), rt.randn(fout, fin, gen=g, scale=0.02)
        dy = rt.randn(tokens, fout, gen=g)
        calls = {"fwd": lambda x=x, w=w: x @ w.t(), "dgrad": lambda dy=dy, w=w: dy @ w,
                 "wgrad": lambda x=x, dy=dy: x.t() @ dy}
        for phase, fn in calls.items():
            gemm = fc_to_gemm(tokens, fin, fout, phase)
            if tuple(fn().shape) != (gemm["M"], gemm["N"]):
                raise AssertionError(f"{proj}/{phase}: output {tuple(fn().shape)} is not [M, N] of {gemm}")
            fns[f"{proj}:{phase}"] = fn
            dims[f"{proj}:{phase}"] = {"projection": proj, "phase": phase, **gemm}
    samples = rt.bench(fns, rounds=rounds, graph_ms=30.0)
    rows = _timing_rows(samples, {**base, "kind": "gemm"})
    _log(f"tokens={tokens}: {len(rows)} FC GEMMs timed")
    for r in rows:
        d = dims[r["name"]]
        r.update(d, tflops=2 * d["M"] * d["N"] * d["K"] / (r["p50_ms"] * 1e-3) / 1e12)
    return rows


def norm_rows(rt: Runtime, cfg: LayerConfig, tokens: int, dsl: str, config, rounds: int, base: dict) -> list[dict]:
    """The norm pieces at [tokens, hidden] (and the q/k norms when ``cfg.qk_norm``): compiled RMSNorm forward and
    forward + backward; our Triton recompute and backward kernels; per norm-fused projection, the fused Lazy Pre-Norm
    forward (fold included) against compiled RMSNorm + cuBLAS, and the fold alone."""
    import torch
    import torch.nn.functional as F

    from normfuse.nn import lazy_prenorm, norm_ops
    from normfuse.nn._common import config_json
    from normfuse.techniques.lazy_prenorm import tolerance

    D, eps = cfg.hidden, cfg.eps
    g = torch.Generator(device=rt.device).manual_seed(2)
    x, dy = rt.randn(tokens, D, gen=g), rt.randn(tokens, D, gen=g)
    gamma = rt.randn(D, gen=g, scale=0.1, shift=1.0)
    xr, gr = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    rt.reset()  # one compiled entry per shape and grad mode below (4 at most): far from Dynamo's recompile limit
    norm = rt.compile(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps))
    _, rstd = norm_ops.rms_norm(x, gamma, eps)
    fns = {"rmsnorm_fwd:torch_compile": lambda: norm(x, gamma),
           "rmsnorm_fwd_bwd:torch_compile": lambda: torch.autograd.grad(norm(xr, gr), (xr, gr), dy),
           "rms_norm_recompute:triton": lambda: norm_ops.rms_norm(x, gamma, eps),
           "rms_norm_bwd:triton": lambda: norm_ops.rms_norm_bwd(dy, x, rstd, gamma, False)}
    if cfg.qk_norm:
        for name, heads in (("q", cfg.n_heads), ("k", cfg.n_kv_heads)):
            t = rt.randn(tokens * heads, cfg.head_dim, gen=g).requires_grad_()
            w = torch.ones(cfg.head_dim, device=rt.device, dtype=rt.dtype, requires_grad=True)
            fns[f"{name}_norm_fwd_bwd:torch_compile"] = (
                lambda t=t, w=w, d=torch.randn_like(t): torch.autograd.grad(norm(t, w), (t, w), d))
    rows = _timing_rows(rt.bench(fns, rounds=rounds, graph_ms=5.0), {**base, "kind": "norm"})
    cfg_json, fwd = config_json(config), {}
    for proj, n_out in (("qkv", cfg.qkv_out), ("gate_up", 2 * cfg.ffn)):
        w = rt.randn(n_out, D, gen=g, scale=0.02)
        fwd[f"{proj}:lazy_fused"] = lambda w=w: lazy_prenorm._lazy_op(x, gamma, w, eps, dsl, cfg_json)
        fwd[f"{proj}:rmsnorm+cublas"] = lambda w=w: norm(x, gamma) @ w.t()
        fwd[f"{proj}:fold"] = lambda w=w: lazy_prenorm.fold_weight(gamma, w, rt.dtype)
        ref = lazy_prenorm.reference(x.double(), gamma.double(), w.double(), eps=eps)
        err = (fwd[f"{proj}:lazy_fused"]().double() - ref).abs().max().item()
        tol = tolerance(ref, fwd[f"{proj}:rmsnorm+cublas"]())
        if not err <= tol:  # a wrong kernel is not timed
            raise AssertionError(f"lazy fused forward {proj}: max error {err:.3g} > tolerance {tol:.3g}")
    samples = rt.bench(fwd, rounds=rounds, graph_ms=30.0)
    _log(f"tokens={tokens}: norm pieces and fused forwards timed")
    for r in _timing_rows(samples, {**base, "kind": "fwd_phase"}):
        proj, what = r["name"].split(":")
        if what == "lazy_fused":
            share = [(a - b) / a for a, b in zip(samples[f"{proj}:rmsnorm+cublas"], samples[r["name"]])]
            r["share_won"], r["share_ci_lo"], r["share_ci_hi"] = median_ci(share)
        r["projection"] = proj
        rows.append(r)
    return rows


def run_gpu(args, rt: Runtime | None = None, cfg: LayerConfig = LLAMA3_8B) -> Path:
    """The timed run (module docstring) on ``rt`` (default: CUDA, bf16, CUDA-graph timing, torch.compile)."""
    from normfuse.shapes import MODEL_PRESETS

    rt = rt or Runtime()
    if cfg == LLAMA3_8B and projections(cfg) != MODEL_PRESETS["llama3_8b"]:
        raise AssertionError("LLAMA3_8B and normfuse.shapes.MODEL_PRESETS['llama3_8b'] disagree")
    run_id = args.run_id or f"{dt.datetime.now():%Y%m%d-%H%M%S}_{'gpu' if rt.device == 'cuda' else 'cpu'}"
    rows = []
    t_start = time.perf_counter()
    for tokens in args.tokens:
        if tokens % args.seq:
            raise SystemExit(f"--tokens {tokens} must be a multiple of --seq {args.seq}")
        for qk in ([False, True] if args.qk_norm else [False]):
            base = {"run_id": run_id, "tokens": tokens, "batch": tokens // args.seq, "seq": args.seq,
                    "qk_norm": qk, "dsl": args.dsl}
            rows += _run_guarded(lambda: layer_rows(rt, replace(cfg, qk_norm=qk), tokens, args.seq, args.dsl,
                                                    args.config, args.rounds, base,
                                                    time_incorrect=getattr(args, "time_incorrect", False)),
                                 {**base, "kind": "layer"})
            rt.empty_cache()
        base = {"run_id": run_id, "tokens": tokens, "dsl": args.dsl, "qk_norm": args.qk_norm}
        if not args.skip_phases:
            rows += _run_guarded(lambda: phase_rows(rt, cfg, tokens, args.rounds, base), {**base, "kind": "gemm"})
        rows += _run_guarded(lambda: norm_rows(rt, replace(cfg, qk_norm=args.qk_norm), tokens, args.dsl, args.config,
                                               args.rounds, base), {**base, "kind": "norm"})
        rt.empty_cache()
    return write(rows, args, run_id, cfg=cfg, wall_s=time.perf_counter() - t_start)


def _log(msg: str) -> None:
    print(f"[layer_bench] {msg}", flush=True)


def _run_guarded(fn, base) -> list[dict]:
    """``fn()``'s rows, or one ``error`` row (the run goes on: a failing piece must not hide the others)."""
    import traceback

    try:
        return fn()
    except Exception as e:  # noqa: BLE001 -- recorded in the results, printed, the run goes on
        traceback.print_exc()
        return [{**base, "name": "all", "status": "error", "error": f"{type(e).__name__}: {str(e)[:300]}"}]


# ------------------------------------------------------------------------------------------------------------
# CPU smoke
# ------------------------------------------------------------------------------------------------------------
def run_smoke(args) -> Path:
    """Tiny layer (``SMOKE``), fp16 on the CPU (Triton interpreter, eager), with and without QK-norm: the drop-in
    layer's output and gradients against the fp64 layer by the flash-attention rule (the fp16 PyTorch layer's
    error sets the tolerance). No timings."""
    import torch

    run_id = args.run_id or f"{dt.datetime.now():%Y%m%d-%H%M%S}_cpu"
    rows = []
    batch, seq = 2, 16
    for qk in (False, True):
        cfg = replace(SMOKE, qk_norm=qk)
        layers = build_layers(cfg, device="cpu", dtype=torch.float16, dsl=args.dsl, config=args.config, seed=1)
        g = torch.Generator().manual_seed(3)
        x = torch.randn(batch, seq, cfg.hidden, generator=g, dtype=torch.float64)
        dout = torch.randn(batch, seq, cfg.hidden, generator=g, dtype=torch.float64)
        cos, sin = rope_tables(seq, cfg.head_dim, cfg.rope_theta, "cpu", torch.float64)
        ref = make_step(layers["ref"], x.clone().requires_grad_(), cos, sin, dout)()
        xh, dh = x.half().requires_grad_(), dout.half()
        results = {v: make_step(layers[v], xh, cos.half(), sin.half(), dh)() for v in ("torch", "dropin")}
        names = ("x", *layers["torch"].canonical())
        report = check_step(results, ref, names)
        for v, r in report.items():
            rows.append({"run_id": run_id, "kind": "layer", "name": {"torch": "torch_eager", "dropin": "dropin"}[v],
                         "tokens": batch * seq, "batch": batch, "seq": seq, "qk_norm": qk, "dsl": args.dsl,
                         "status": "ok" if r["ok"] else "incorrect", "check_ok": r["ok"], "worst_tensor": r["worst"],
                         "worst_err_over_tol": r["worst_ratio"], "mode": "interpret"})
    return write(rows, args, run_id, cfg=SMOKE, wall_s=None, smoke=True)


# ------------------------------------------------------------------------------------------------------------
# output
# ------------------------------------------------------------------------------------------------------------
def summary_table(df) -> "object":
    """The short table: per (tokens, qk_norm) the layer time of each variant (median [95 % CI], ms), the paired share
    won, the share won without the two gamma folds (``share_ex_fold_%``: the fold's median subtracted, i.e. a fold
    amortized over many micro-batches of one optimizer step; derived, not measured as such), and the norms' share of
    the torch_compile layer (2 x compiled RMSNorm fwd+bwd [+ q/k norms], timed alone: an upper bound)."""
    import pandas as pd

    cols = ("kind", "name", "tokens", "qk_norm", "status", "p50_ms", "ci_lo_ms", "ci_hi_ms", "share_won",
            "share_ci_lo", "share_ci_hi")
    df = df.reindex(columns=list(dict.fromkeys([*df.columns, *cols])))
    lay = df[df["kind"] == "layer"]
    side = df[df["kind"].isin(["norm", "fwd_phase"])]

    def p50(frame, name):
        s = frame.loc[frame["name"] == name, "p50_ms"].dropna()
        return float(s.iloc[0]) if len(s) else math.nan

    out = []
    for (tokens, qk), g in lay.groupby(["tokens", "qk_norm"], sort=True):
        n = side[side["tokens"] == tokens]
        norms_ms = 2 * p50(n, "rmsnorm_fwd_bwd:torch_compile")
        if qk:
            norms_ms += p50(n, "q_norm_fwd_bwd:torch_compile") + p50(n, "k_norm_fwd_bwd:torch_compile")
        fold_ms = p50(n, "qkv:fold") + p50(n, "gate_up:fold")
        t_ref = p50(g, "torch_compile")
        for r in g.to_dict("records"):
            ref_row = r["name"] == "torch_compile"
            out.append({"tokens": tokens, "qk_norm": qk, "variant": r["name"], "status": r["status"],
                        "layer_ms": r["p50_ms"], "ci_ms": _ci(r, "ci_lo_ms", "ci_hi_ms"),
                        "share_won_%": 100 * r["share_won"], "share_ci_%": _ci(r, "share_ci_lo", "share_ci_hi", 100),
                        "share_ex_fold_%": math.nan if ref_row else 100 * (t_ref - r["p50_ms"] + fold_ms) / t_ref,
                        "norms_share_%": 100 * norms_ms / t_ref if ref_row else math.nan})
    return pd.DataFrame(out)


def _ci(r: dict, lo: str, hi: str, scale: float = 1.0) -> str:
    a, b = r.get(lo), r.get(hi)
    if a is None or b is None or not (a == a and b == b):
        return ""
    return f"[{scale * a:.4g}, {scale * b:.4g}]"


def write(rows, args, run_id: str, *, cfg: LayerConfig, wall_s, smoke: bool = False) -> Path:
    import pandas as pd
    import torch

    from normfuse import hardware
    from normfuse.sweep import git_info

    out = Path(args.out) / run_id
    out.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "results.csv", index=False)
    try:
        df.to_parquet(out / "results.parquet", index=False)
    except Exception:  # noqa: BLE001 -- parquet is optional (pyarrow)
        pass
    short = summary_table(df) if not smoke else df[["tokens", "qk_norm", "name", "status", "worst_tensor",
                                                      "worst_err_over_tol"]]
    meta = {"experiment": "layer_bench", "run_id": run_id, "mode": "cpu smoke (interpreter, no timings)" if smoke
            else "gpu", "layer": asdict(cfg), "tokens": list(args.tokens), "seq": args.seq,
            "qk_norm": args.qk_norm, "dsl": args.dsl, "config": args.config, "rounds": args.rounds,
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "wall_s": wall_s,
            "torch": torch.__version__, "hardware": hardware.read_gpu() if torch.cuda.is_available() else None,
            **git_info()}
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        pass
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    cols = [c for c in ("kind", "name", "tokens", "qk_norm", "projection", "phase", "M", "N", "K", "status", "p50_ms",
                        "ci_lo_ms", "ci_hi_ms", "share_won", "tflops", "compile_s", "check_ok", "worst_tensor",
                        "worst_err_over_tol", "error") if c in df]
    title = ("# Tiny Llama-style decoder layer (CPU smoke: correctness against fp64 only, no timings)" if smoke else
             "# Llama-3-8B decoder layer, forward + backward: normfuse.nn drop-ins vs torch.compile")
    text = (f"{title}\n\nrun {run_id}, commit {meta['git_sha']}, {meta['hardware'] and meta['hardware'].get('name')}"
            f"\n\n## Layer\n\n{short.to_markdown(index=False, floatfmt='.4g')}\n\n## All rows\n\n"
            f"{df[cols].to_markdown(index=False, floatfmt='.4g')}\n")
    (out / "summary.md").write_text(text)
    print(f"wrote {out}")
    print(short.to_string(index=False))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384], help="tokens per step (batch x seq)")
    ap.add_argument("--seq", type=int, default=4096, help="sequence length (batch = tokens / seq)")
    ap.add_argument("--qk-norm", action="store_true", help="also the layer pair with per-head QK-RMSNorm")
    ap.add_argument("--dsl", default="triton", choices=("triton", "helion", "tlx"), help="drop-ins' forward kernels")
    ap.add_argument("--config", type=json.loads, default=None,
                    help="Lazy Pre-Norm tiling of --dsl as JSON (default: the DSL's DEFAULT_CONFIG)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds per group")
    ap.add_argument("--skip-phases", action="store_true", help="skip the per-phase GEMM timings")
    ap.add_argument("--time-incorrect", action="store_true",
                    help="diagnosis: also time a variant that failed its check (its rows keep status=incorrect)")
    ap.add_argument("--smoke", action="store_true", help="CPU correctness smoke (tiny layer, interpreter, no timing)")
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--out", type=Path, default=REPO / "results" / "layer_bench")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
        return run_smoke(args)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("layer_bench times a GPU training step: no CUDA device is visible (use --smoke on a CPU)")
    return run_gpu(args)


if __name__ == "__main__":
    main()
