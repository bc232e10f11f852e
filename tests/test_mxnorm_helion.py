"""Tests of ``kernels_helion.mxnorm`` (RMSNorm / MXNorm fused with the MXFP8 cast) on a CPU-only machine.

1. Ref mode (``HELION_INTERPRET=1``, eager PyTorch: torch's E4M3 cast is exact there, so bf16 is checked too):
   both kernels x p x FLOOR/RCEIL x bf16/fp16/fp32 against ``normfuse.techniques.mxnorm.check`` (bit-exact data
   and scales expected) at T = 1, ragged D and the corner-case rows.
2. Generated Triton (CPU tensors, no compile): one load of x (one pass), the NaN-propagating integer block max,
   no log2 / division in MXNorm, one constexpr-specialized kernel per (op, scale mode).
3. Compile-only for sm_90: every H200 candidate at D in {1K, 4K, 16K} where it serves D: the hardware cast
   ``cvt.rn.satfinite.e4m3x2.f32``, no ptxas spills, shared memory within the limit; every shipped config, op, p
   and scale mode at D = 1056 and D = 32 (D/32 not a power of two / 1: Helion's tracing of the row reshape failed
   there on the GPU: ``shape '[u0, 33, 32]' is invalid``); and config validation.
"""

from __future__ import annotations

import pytest
import torch

from kernels_helion import mxnorm as hm
from normfuse.testing import run_python_json

_REF = r"""
import json, torch
from normfuse.techniques import mxnorm as T
from kernels_helion import mxnorm as hm
assert hm.ref_mode()
rows = []
for dtype in ("bf16", "fp16", "fp32"):
    for M, D in ((1, 32), (37, 320), (16, 2080), (5, 1056)):  # D/32 = 1, 10, 65, 33: the blocked 3-D input
        for mode in ("floor", "rceil"):
            inp = T.make_inputs(M, D, dtype=dtype, seed=M + D, scale_mode=mode)
            for variant in T.VARIANTS:
                if variant == "rmsnorm_cast":
                    out = hm.rmsnorm_mxfp8(inp["x"], eps=1e-6, scale_mode=mode, config={"block_sizes": [4]})
                else:
                    out = hm.mxnorm_mxfp8(inp["x"], p=T.P_OF[variant], eps=1e-6, scale_mode=mode)
                r = T.check("norm_cast", out, inp, 1e-6, variant)
                rows.append(dict(dtype=dtype, M=M, D=D, mode=mode, variant=variant, ok=r["ok"],
                                 codes=r["code_mismatches"], scale_bad=r["scale_mismatch_rel_err"]))
print(json.dumps(rows))
"""


def test_ref_mode_bit_exact():
    rows = run_python_json(_REF, env={"HELION_INTERPRET": "1"}, timeout=900)
    assert len(rows) == 3 * 4 * 2 * 3
    bad = [r for r in rows if not r["ok"] or r["codes"] or r["scale_bad"]]
    assert not bad, bad[:5]


_CODEGEN = r"""
import json, re, torch
from kernels_helion import mxnorm as hm
out = {}
for op in hm.OPS:
    for mode in ("floor", "rceil"):
        code = hm.triton_code(op, torch.empty(4096, 4096, dtype=torch.bfloat16), config={"block_sizes": [2]}, p=1,
                              scale_mode=mode)
        out[f"{op}/{mode}"] = dict(loads=len(re.findall(r"tl\.load\(x \+", code)), nanmax=code.count("max_propagate_nan"),
                                   log2=code.count("log2"), div=len(re.findall(r"[^/]/ ", code)),
                                   cast=code.count("tl.float8e4nv"), nan_const=code.count("float('nan')"),
                                   kernels=len(re.findall(r"^def _helion_", code, flags=re.M)))
print(json.dumps(out))
"""


def test_generated_code():
    out = run_python_json(_CODEGEN, timeout=600)
    for key, r in out.items():
        op, mode = key.split("/")
        assert r["loads"] == 1, key  # x read once
        assert r["kernels"] == 1 and r["cast"] >= 1 and r["log2"] == 0, key
        assert r["nanmax"] == 1, key  # one block max: of |y| (RMSNorm, after the row sum) or of |x| (MXNorm)
        assert r["nan_const"] == (1 if mode == "rceil" else 0), key  # RCEIL: NaN multiplier for NaN blocks
        if op == "mxnorm_mxfp8":
            assert r["div"] == 0, key


_COMPILE = r"""
import json, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_helion import mxnorm as hm
out = {}
for D in (1024, 4096, 16384):
    for op in hm.OPS:
        for name, cfg in hm.H200_CANDIDATES.items():
            x = torch.empty(8192, D, dtype=torch.bfloat16)
            try:
                ck = hm.compile_sm90_kernel(op, x, config=cfg, p=2, scale_mode="floor")
            except ValueError as e:
                out[f"{op}/{D}/{name}"] = {"unsupported": str(e)}
                continue
            u = hm.ptxas_usage(ck)
            out[f"{op}/{D}/{name}"] = dict(cvt=ck.asm["ptx"].count("cvt.rn.satfinite.e4m3x2.f32"),
                                           shared=int(ck.metadata.shared), spills=u["spill_store_bytes"],
                                           regs=u["registers"])
print(json.dumps(out))
"""


def test_compile_sm90():
    out = run_python_json(_COMPILE, timeout=900)
    served = {k: r for k, r in out.items() if "unsupported" not in r}
    assert len(served) >= 2 * 9
    for key, r in served.items():
        assert r["cvt"] > 0 and r["spills"] == 0 and r["shared"] <= 232448, (key, r)
    # every D has at least one candidate for each op
    for D in ("1024", "4096", "16384"):
        for op in hm.OPS:
            assert any(k.startswith(f"{op}/{D}/") for k in served), (op, D)
    assert "elements per thread" in out["mxnorm_mxfp8/16384/r4-w8"]["unsupported"]  # 128 per thread: refused


_COMPILE_RAGGED = r"""
import json, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_helion import mxnorm as hm
from normfuse.gpu_checks import shipped_configs
out = {}
for cfg in shipped_configs("helion", "mxnorm"):
    cfg = {k: v for k, v in cfg.items() if k not in ("name", "impls")}
    for D in (1056, 32):
        x = torch.empty(257, D, dtype=torch.bfloat16)
        for op, p in (("rmsnorm_mxfp8", 2), ("mxnorm_mxfp8", 1), ("mxnorm_mxfp8", 2)):
            for mode in (("floor", "rceil") if D == 1056 else ("rceil",)):
                key = f"{op}/p{p}/{D}/{mode}/{cfg}"
                code = hm.triton_code(op, x, config=cfg, p=p, scale_mode=mode)
                ck = hm.compile_sm90_kernel(op, x, config=cfg, p=p, scale_mode=mode)
                out[key] = dict(cvt=ck.asm["ptx"].count("cvt.rn.satfinite.e4m3x2.f32"),
                                spills=hm.ptxas_usage(ck)["spill_store_bytes"],
                                block_mask=code.count(f"< {D // 32}"), loads=code.count("tl.load(x +"))
print(json.dumps(out))
"""


def test_compile_sm90_ragged_block_count():
    out = run_python_json(_COMPILE_RAGGED, timeout=900)
    assert len(out) >= 3 * 3 * 3  # >= 3 shipped configs x 3 (op, p) x (2 modes at 1056 + 1 at 32)
    for key, r in out.items():
        assert r["cvt"] > 0 and r["spills"] == 0 and r["loads"] == 1, (key, r)
        if "/1056/" in key:  # the padded block dimension (64 for 33 blocks) is masked
            assert r["block_mask"] >= 1, (key, r)


def test_padded_width():
    assert [hm.padded_width(D) for D in (32, 1024, 1056, 2080, 3072, 16384)] == [32, 1024, 2048, 4096, 4096, 16384]
    cfg = {"block_sizes": [1], "num_warps": 2}
    assert hm._config(cfg, 4096)  # 64 elements per thread: the limit
    with pytest.raises(ValueError, match="padded to 8192"):  # D = 4128: 129 blocks held as 256 (128 per thread)
        hm._config(cfg, 4128)

def test_config_validation():
    with pytest.raises(ValueError, match="reduction_loops"):
        hm.TilingConfig.from_dict({"reduction_loops": [1024]})
    with pytest.raises(ValueError, match="power of two"):
        hm.TilingConfig.from_dict({"block_sizes": [3]})
    with pytest.raises(ValueError, match="elements per"):
        hm._config({"block_sizes": [4], "num_warps": 4}, 16384)
    assert hm._config(None, 4096) == hm.DEFAULT_CONFIG
    for D in (32, 1024, 2048, 2080, 3072, 4096, 8192, 16384, 65536):  # config=None serves every D
        cfg = hm._config(None, D)
        assert cfg.block_sizes[0] * D // (32 * cfg.num_warps) <= hm.MAX_ELEMS_PER_THREAD
    assert "reduction_loops" not in dict(hm.TilingConfig().to_helion())


def test_bad_inputs():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of the MX block size"):
        hm.mxnorm_mxfp8(torch.randn(4, 48), p=2)
    with pytest.raises(ValueError, match="p must be 1 or 2"):
        hm.mxnorm_mxfp8(x, p=0)
    with pytest.raises(ValueError, match="choices"):
        hm.rmsnorm_mxfp8(x, scale_mode="even")
    with pytest.raises(TypeError):
        hm.rmsnorm_mxfp8(x.to(torch.int64))
    if not hm.ref_mode():
        with pytest.raises(ValueError, match="CUDA"):
            hm.rmsnorm_mxfp8(x)
