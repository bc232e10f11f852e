"""Shared GPU checks of the TLX QK-norm attention tests (test_fna_llm_fa3_tlx, test_fna_llm_persistent_tlx):
fused and plain attention against the fp32 reference. Imported after the test module has set up (or not) the
compile-only fake driver."""

import torch

from kernels_tlx import fna_llm as K
from normfuse.techniques import fna_llm as T
from normfuse.testing import fna_llm_int64_inputs


def run(impl, inp, causal, cfg, eps=1e-6):
    """``impl`` ('fused' = qknorm_attention, 'attention') of ``inp`` (``T.make_inputs``' dict) with ``cfg``."""
    if impl == "fused":
        return K.qknorm_attention(inp["q"], inp["k"], inp["v"], inp["q_weight"], inp["k_weight"], causal=causal,
                                  eps=eps, o_weight=inp.get("o_weight"), config=cfg)
    return K.attention(inp["q"], inp["k"], inp["v"], causal=causal, config=cfg)


def capture(fn):
    """``(graph, out)``: ``fn`` run once (compiled, and any lazily made state allocated, outside the capture), then
    captured in a CUDA graph whose replays rewrite ``out``."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def check_config(cfg, S, B, Hq, Hkv, D, causal, o_norm=False, seed=0) -> list[str]:
    """Failure descriptions (empty when both ops match) for ``cfg`` at S, B, Hq query / Hkv key-value heads of
    head_dim D, bf16, eps 1e-6, with the output RMSNorm when ``o_norm``."""
    inp = T.make_inputs(S, B, Hq, dtype="bf16", device="cuda", kv_heads=Hkv, head_dim=D, o_norm=o_norm, seed=seed)
    variant = "causal" if causal else "noncausal"
    bad = []
    for impl in ("fused", "attention"):
        r = T.check(impl, run(impl, inp, causal, cfg), inp, 1e-6, variant)
        if not r["ok"]:
            bad.append(f"{impl} S={S} B={B} Hq={Hq} D={D} {variant}: {r}")
    return bad


def check_odd_shapes(cfg) -> list[str]:
    """Failure descriptions of ``cfg`` (both ops) at the benchmark head layout (GQA 32 / 8, D = 128) with several
    work tiles per CTA, S = 1, ragged S (333, 4097; o_norm at 333), causal and not; and D = 64 with GQA 4 / 1 and
    Hq = Hkv = 3."""
    bad = []
    for S, B, causal in ((2048, 2, True), (2048, 1, False), (1, 3, True), (333, 2, True), (4097, 1, False),
                         (4097, 1, True), (333, 1, False)):
        bad += check_config(cfg, S, B, 32, 8, 128, causal, o_norm=S == 333)
    return bad + check_config(cfg, 1000, 1, 4, 1, 64, True) + check_config(cfg, 257, 2, 3, 3, 64, False)


def check_batch_slices(name, cfg, causal, slices) -> list[str]:
    """B·Hq = 65536 (B = 2048, Hq = 32, Hkv = 8, S = 16, D = 64), both ops; the batches ``[(b0, b1), ...]``
    checked against the reference. Failure descriptions."""
    inp = T.make_inputs(16, 2048, 32, dtype="bf16", device="cuda", kv_heads=8, head_dim=64, seed=2)
    variant = "causal" if causal else "noncausal"
    bad = []
    for impl in ("fused", "attention"):
        out = run(impl, inp, causal, cfg)
        for b0, b1 in slices:
            sub = {**inp, "q": inp["q"][b0:b1], "k": inp["k"][b0:b1], "v": inp["v"][b0:b1]}
            r = T.check(impl, out[b0:b1], sub, 1e-6, variant)
            if not r["ok"]:
                bad.append(f"{name} {impl} batches [{b0}, {b1}): {r}")
    return bad


def check_int64(cfg):
    """q of more than 2^31 elements (B = 2049, Hq = 16, Hkv = 8, S = 512, D = 128), causal, fused: the first and
    the last batch element against the reference (asserts)."""
    B = 2049
    inp = fna_llm_int64_inputs(B)
    out = run("fused", inp, True, cfg)
    for b in (0, B - 1):
        sub = {**inp, "q": inp["q"][b:b + 1], "k": inp["k"][b:b + 1], "v": inp["v"][b:b + 1]}
        r = T.check("fused", out[b:b + 1], sub, 1e-6, "causal")
        assert r["ok"], (b, r)
