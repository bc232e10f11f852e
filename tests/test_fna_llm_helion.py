"""fna_llm in Helion (kernels_helion/fna_llm.py):

1. ref mode (``HELION_INTERPRET=1``, eager PyTorch on whole tensors; subprocess): fp16/fp32/bf16, odd S, S = 1,
   GQA, Hq = 3 with Hkv = 1, causal and not, output norm, the fused op in all three K_NORM modes (prepass and
   materialize each agreeing with inloop); NaN/Inf isolation between batch elements (all modes);
2. generated Triton: 2-D tiles, the causal KV loop bounded by the Q tile's end (clamped to S), GQA KV-head index,
   K_NORM = inloop: the K norm inside the KV loop; prepass: no rsqrt in the KV loop, the rstd_k vector loaded
   there; materialize: the KV loop of plain attention (no rsqrt, no rstd load; identical up to SSA names), Q
   scaled by q_weight only, a pre-pass storing a [rows, D] tensor; sm_90 compile of every shipped config with
   wgmma (and of the K pre-pass for prepass / materialize configs);
3. bad inputs and configs (a bad K_NORM raises ValueError).
"""

import os
import re

import pytest
import torch

from normfuse.testing import run_python_json

km = pytest.importorskip("kernels_helion.fna_llm")
IN_REF_MODE = os.environ.get("HELION_INTERPRET") == "1"

_REF = r"""
import json, torch
from normfuse.techniques import fna_llm as T
from kernels_helion import fna_llm as K
assert K.ref_mode()

def run(impl, inp, variant, cfg=None):
    return T.kernel_call(getattr(K, T.kernel_function_name(impl)), impl, inp, 1e-6, cfg, variant)()

rows, agree = [], []
for dtype in ("fp16", "fp32", "bf16"):
    for S, B, Hq, Hkv, D in ((70, 2, 4, 2, 32), (70, 1, 3, 1, 32), (1, 2, 2, 1, 16), (130, 1, 4, 4, 64)):
        for o_norm in (False, True):
            inp = T.make_inputs(S, B, Hq, dtype=dtype, kv_heads=Hkv, head_dim=D, o_norm=o_norm, seed=S)
            for variant in T.VARIANTS:
                for impl in T.IMPLS:
                    if impl == "attention" and o_norm:
                        continue
                    outs = {}
                    for k_norm in (("prepass", "inloop", "materialize") if impl == "fused" else ("prepass",)):
                        out = run(impl, inp, variant, {"block_sizes": [32, 16], "K_NORM": k_norm})
                        outs[k_norm] = out
                        r = T.check(impl, out, inp, 1e-6, variant)
                        rows.append(dict(dtype=dtype, S=S, variant=variant, impl=impl, k_norm=k_norm, ok=r["ok"],
                                         err=r["max_abs_err"], tol=r["tol"],
                                         shape_ok=out.shape == inp["q"].shape and out.dtype == inp["q"].dtype))
                    if impl == "fused":
                        for mode in ("prepass", "materialize"):
                            diff = (outs[mode].float() - outs["inloop"].float()).abs().max().item()
                            agree.append(dict(dtype=dtype, S=S, variant=variant, mode=mode, diff=diff, tol=r["tol"]))
nan = []
for variant in T.VARIANTS:
    for k_norm in ("prepass", "inloop", "materialize"):
        cfg = {"K_NORM": k_norm}
        inp = T.make_inputs(40, 3, 2, dtype="fp32", kv_heads=1, head_dim=16, seed=2)
        clean = run("fused", inp, variant, cfg)
        bad = dict(inp, q=inp["q"].clone(), k=inp["k"].clone())
        bad["q"][1, 1, 0, 0] = float("nan")
        bad["k"][1, 0, 39, 0] = float("inf")
        out = run("fused", bad, variant, cfg)
        nan.append(dict(k_norm=k_norm, own=not bool(torch.isfinite(out[1]).all()),
                        others=bool(torch.equal(out[0], clean[0]) and torch.equal(out[2], clean[2]))))
print(json.dumps({"rows": rows, "agree": agree, "nan": nan}))
"""


def test_ref_mode_matches_reference():
    res = run_python_json(_REF, env={"HELION_INTERPRET": "1"}, timeout=600)
    bad = [r for r in res["rows"] if not (r["ok"] and r["shape_ok"])]
    assert not bad, bad
    assert len(res["rows"]) == 3 * 4 * 14  # fused: 3 K_NORM modes x 2 o_norm x 2 variants; attention: 2 variants
    assert {r["k_norm"] for r in res["rows"] if r["impl"] == "fused"} == {"prepass", "inloop", "materialize"}
    assert len(res["nan"]) == 2 * 3 and all(r["own"] and r["others"] for r in res["nan"]), res["nan"]
    # prepass / materialize vs inloop: the same math, within the check's tolerance (fp32: exact up to rounding)
    assert len(res["agree"]) == 3 * 4 * 2 * 2 * 2
    for r in res["agree"]:
        assert r["diff"] <= r["tol"] and (r["dtype"] != "fp32" or r["diff"] < 1e-4), r


def _inputs(S=200, B=2, Hq=4, Hkv=2, D=128):
    q = torch.randn(B, Hq, S, D, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, dtype=torch.bfloat16)
    w = torch.ones(D, dtype=torch.bfloat16)
    return q, k, k.clone(), w, w.clone()


@pytest.mark.skipif(IN_REF_MODE, reason="code generation needs Helion's compiler (not ref mode)")
def test_generated_code_structure():
    q, k, v, qw, kw = _inputs()
    code = km.triton_code("qknorm_attention", q, k, v, qw, kw, causal=True,
                          config={"block_sizes": [128, 64], "K_NORM": "inloop"})
    assert "tl.minimum(offset_1 + _BLOCK_SIZE_1, 200)" in code  # causal: KV loop ends at the Q tile's end (<= S)
    assert "tl.range(0, tl.cast(tile_end" in code
    assert "div_floor_integer(offset_0, 4)" in code  # GQA: KV head from the (batch x query head) index
    assert code.count("tl.dot(") == 2
    loop = code[code.index("for offset_3"):]
    assert "rsqrt" in loop and "tl.load(k_rstd" not in code  # inloop: K normalized inside the KV loop, once per K tile
    pre = km.triton_code("qknorm_attention", q, k, v, qw, kw, causal=True, config={"block_sizes": [128, 64]})
    loop = pre[pre.index("for offset_3"):]
    assert "rsqrt" not in loop and "tl.load(k_rstd" in loop  # prepass: raw K in the dot, rstd_k vector per tile
    assert "rsqrt" in pre[:pre.index("for offset_3")] and pre.count("tl.dot(") == 2  # the Q norm, once
    plain = km.triton_code("attention", q, k, v, causal=False, config={"block_sizes": [128, 64]})
    assert "rsqrt" not in plain and "tile_end" not in plain


def _canonical_names(code: str) -> str:
    """``code`` without Helion's ``# src[...]`` comments and with its numbered SSA temporaries (``v_12``, ``load_3``,
    ``subscript_1``) renumbered in order of first appearance, so two kernels can be compared up to naming."""
    code = "\n".join(ln for ln in code.splitlines() if not ln.strip().startswith("# src["))
    names: dict = {}
    return re.sub(r"\b(v|load|subscript)_\d+", lambda m: names.setdefault(m.group(0), f"{m.group(1)}_#{len(names)}"),
                  code)


@pytest.mark.skipif(IN_REF_MODE, reason="code generation needs Helion's compiler (not ref mode)")
def test_generated_code_materialize():
    q, k, v, qw, kw = _inputs(S=201)
    for causal in (True, False):
        cfg = {"block_sizes": [128, 64], "K_NORM": "materialize"}
        code = km.triton_code("qknorm_attention", q, k, v, qw, kw, causal=causal, config=cfg)
        code = code[:code.index("\ndef _fna_kernel(")]  # the device kernel, without the host wrapper
        head, loop = code[:code.index("for offset_3")], code[code.index("for offset_3"):]
        assert "rsqrt" not in loop and "k_rstd" not in code and "k_weight" not in code  # no K work in the KV loop
        assert "rsqrt" in head and "tl.load(q_weight" in head and code.count("tl.dot(") == 2  # the Q norm, γq only
        plain = km.triton_code("attention", q, k, v, causal=causal, config={"block_sizes": [128, 64]})
        plain_loop = plain[plain.index("for offset_3"):plain.index("\ndef _fna_kernel(")]
        assert _canonical_names(loop) == _canonical_names(plain_loop)  # the KV loop of plain attention
        pre = km.triton_code("qknorm_attention", q, k, v, qw, kw, causal=causal, config=cfg, prepass=True)
        # the pre-pass: K rows [B*Hkv*S = 804 (masked), D = 128] -> normalized, scaled by k_weight, stored [.., D]
        assert "def _helion__k_norm_kernel(k2, k_weight, k_n, eps" in pre and "rsqrt" in pre
        assert re.search(r"tl\.store\(k_n \+ \(indices_0\[:, None\] \* 128 \+ \(0 \+ indices_1\)\[None, :\] \* 1\), "
                         r"v_\d+, mask_0\[:, None\]\)", pre), pre
        assert "tl.load(k_weight" in pre and "tl.cast(v_" in pre and "tl.bfloat16)" in pre  # rounded to K's dtype
    pre_rstd = km.triton_code("qknorm_attention", q, k, v, qw, kw, causal=True, config={"K_NORM": "prepass"},
                              prepass=True)
    assert "_helion__k_rstd_kernel" in pre_rstd
    for op, cfg in (("qknorm_attention", {"K_NORM": "inloop"}), ("attention", {"K_NORM": "materialize"})):
        with pytest.raises(ValueError, match="no K pre-pass"):
            km.triton_code(op, q, k, v, qw, kw, causal=True, config=cfg, prepass=True)


@pytest.mark.skipif(IN_REF_MODE, reason="compile-only needs Helion's compiler (not ref mode)")
def test_shipped_configs_compile_for_sm90_with_wgmma():
    code = r"""
    import json, yaml
    from normfuse import compile_only
    compile_only.install(90)
    from normfuse.techniques import fna_llm as T
    from kernels_helion import fna_llm as K
    out = []
    for c in yaml.safe_load(open("configs/tiling/fna_llm_h200.yaml"))["helion"]:
        c = dict(c); name = c.pop("name")
        for op in ("qknorm_attention", "attention"):
            for causal in (True, False):
                r = K.compile_sm90(op, *T.compile_inputs(1000, 2, 32, "bf16"), config=c, causal=causal,
                                   o_norm=not causal)
                pre = [key for key in ("k_rstd", "k_norm") if key in r]
                out.append(dict(name=name, op=op, wgmma=r["ptx_markers"]["wgmma"], smem_ok=r["smem_ok"],
                                k_norm=c.get("K_NORM", "prepass"), pre=pre,
                                prepass_ok=all(r[key]["smem_ok"] for key in pre)))
    print(json.dumps(out))
    """
    out = run_python_json(code, timeout=900)
    assert len(out) == 5 * 4
    assert {r["k_norm"] for r in out} == {"prepass", "inloop", "materialize"}
    expect = {"prepass": ["k_rstd"], "materialize": ["k_norm"], "inloop": []}  # the K pre-pass compiled, if any
    for r in out:
        assert r["wgmma"] > 0 and r["smem_ok"], r
        assert r["pre"] == (expect[r["k_norm"]] if r["op"] == "qknorm_attention" else []), r
        assert r["prepass_ok"], r


def test_bad_inputs_and_configs():
    q, k, v, qw, kw = _inputs(S=8, D=16)
    with pytest.raises(TypeError, match="causal"):
        km.attention(q, k, v, causal="yes")
    with pytest.raises(ValueError, match="q_weight and k_weight"):
        km.qknorm_attention(q, k, v, qw, None, causal=True)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        km.attention(q[:, :3].contiguous(), k, v, causal=True)
    with pytest.raises(ValueError, match="powers of two"):
        km.TilingConfig(block_sizes=(128, 48))
    with pytest.raises(ValueError, match="num_warps"):
        km.TilingConfig(num_warps=3)
    with pytest.raises(ValueError, match="K_NORM"):
        km.TilingConfig(K_NORM="both")
    with pytest.raises(ValueError, match="materialize"):  # the message lists the modes
        km.TilingConfig(K_NORM="materialise")
    assert km.TilingConfig(K_NORM="materialize").K_NORM == "materialize"
    with pytest.raises(ValueError, match="K_NORM"):
        km.qknorm_attention(q, k, v, qw, kw, causal=True, config={"K_NORM": "in-loop"})
    assert km.TilingConfig().K_NORM == "prepass"
    if not IN_REF_MODE:
        with pytest.raises(ValueError, match="CUDA"):
            km.qknorm_attention(q, k, v, qw, kw, causal=True)
