"""Shared GPU check of the TLX QK-norm attention tests (test_fna_llm_fa3_tlx, test_fna_llm_persistent_tlx): one
config at one shape, fused and plain attention, against the fp32 reference. Imported after the test module has
set up (or not) the compile-only fake driver."""

from kernels_tlx import fna_llm as K
from normfuse.techniques import fna_llm as T


def check_config(cfg, S, B, Hq, Hkv, D, causal, o_norm=False, seed=0) -> list[str]:
    """Failure descriptions (empty when both ops match) for ``cfg`` at S, B, Hq query / Hkv key-value heads of
    head_dim D, bf16, eps 1e-6, with the output RMSNorm when ``o_norm``."""
    inp = T.make_inputs(S, B, Hq, dtype="bf16", device="cuda", kv_heads=Hkv, head_dim=D, o_norm=o_norm, seed=seed)
    variant = "causal" if causal else "noncausal"
    bad = []
    for impl in ("fused", "attention"):
        if impl == "fused":
            out = K.qknorm_attention(inp["q"], inp["k"], inp["v"], inp["q_weight"], inp["k_weight"], causal=causal,
                                     eps=1e-6, o_weight=inp.get("o_weight"), config=cfg)
        else:
            out = K.attention(inp["q"], inp["k"], inp["v"], causal=causal, config=cfg)
        r = T.check(impl, out, inp, 1e-6, variant)
        if not r["ok"]:
            bad.append(f"{impl} S={S} B={B} Hq={Hq} D={D} {variant}: {r}")
    return bad
