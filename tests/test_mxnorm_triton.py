"""Tests of ``kernels_triton.mxnorm`` (RMSNorm / MXNorm fused with the MXFP8 cast) on a CPU-only machine.

1. Interpreter (``TRITON_INTERPRET=1``, fp32/fp16; bf16 is not checked there: the interpreter mis-converts bf16
   subnormals): both kernels x p x FLOOR/RCEIL against ``normfuse.techniques.mxnorm.check`` (rstd to 1e-5, scales
   bit-exact, data within one code - in practice identical, the interpreter path uses the software E4M3 cast) at
   T = 1, ragged D (D / 32 not a power of two), several rows per program with a partial last tile, a persistent
   grid that loops, and the corner-case rows (zero / -0 block, NaN, Inf, subnormals, zero row, x^2 overflow).
   Also the device helpers (E8M0 byte, multiplier, software cast) on every bf16 value and the RCEIL edge values
   against ``normfuse.mxfp8``.
2. Compile-only for sm_90: ``cvt.rn.satfinite.e4m3x2.f32`` (hardware cast; none with SOFT_CAST), 16-byte loads and
   stores of x / data, no division in the MXNorm kernel, no ptxas spills, shared memory within the limit.
3. Config and input validation (in-process).

The hardware cast's bits and every speed need the GPU (``normfuse.gpu_checks``, ``experiment=mxnorm_kernels``).
"""

from __future__ import annotations

import pytest
import torch

from kernels_triton import mxnorm as km
from kernels_triton.mxnorm import TilingConfig, launch_params
from normfuse.testing import run_python_json

_INTERP = r"""
import json
import torch
from normfuse import mxfp8 as mx
from normfuse.techniques import mxnorm as T
from kernels_triton import mxnorm as km

km._DEFAULT_NUM_SMS = 1  # persistent grid smaller than the tile count: the tile loop runs
EPS = 1e-6
CASES = [  # (label, T, D, config)
    ("T=1", 1, 32, {}),
    ("ragged", 37, 320, {}),  # K = 10 blocks, BLOCK_K = 16 (masked)
    ("rows4-partial", 9, 1024, {"ROWS": 4}),
    ("odd-K", 8, 2080, {"num_warps": 4}),  # K = 65
    ("persistent", 21, 256, {"PERSISTENT": True, "ROWS": 2}),
    ("hw-cast-flag", 8, 64, {"SOFT_CAST": False}),  # forced soft under the interpreter anyway
]
rows = []
for dtype in ("fp32", "fp16"):
    for label, M, D, cfg in CASES:
        for mode in ("floor", "rceil"):
            inp = T.make_inputs(M, D, dtype=dtype, seed=M + D, scale_mode=mode)
            for variant in T.VARIANTS:
                if variant == "rmsnorm_cast":
                    out = km.rmsnorm_mxfp8(inp["x"], eps=EPS, scale_mode=mode, config=cfg)
                else:
                    out = km.mxnorm_mxfp8(inp["x"], p=T.P_OF[variant], eps=EPS, scale_mode=mode, config=cfg)
                r = T.check("norm_cast", out, inp, EPS, variant)
                rows.append(dict(label=label, dtype=dtype, mode=mode, variant=variant, ok=r["ok"],
                                 codes=r["code_mismatches"], scale_bad=r["scale_mismatch_rel_err"],
                                 rstd_err=r["rstd_rel_err"], nan_rows=int(torch.isnan(out[2]).sum()),
                                 data_dtype=str(out[0].dtype), scales_dtype=str(out[1].dtype)))

# device helpers on every bf16 value (as amax and as element) and on the RCEIL edge values
bf = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
e = torch.arange(0, 256, dtype=torch.int32)[:, None]
m = torch.tensor([0, 1, 0x5FFFFF, 0x600000, 0x600001, 0x600002, 0x7FFFFF], dtype=torch.int32)[None, :]
edges = ((e << 23) | m).reshape(-1).view(torch.float32)
helpers = {}
for mode in ("floor", "rceil"):
    for name, a in (("bf16", bf), ("edges", edges)):
        v = a if name == "bf16" else torch.cat([a, -a])[: a.numel()]
        s, mult, codes = km.device_helpers(a.abs(), v, mode)
        want = mx.scales_from_amax(a.abs(), mode)
        helpers[f"{mode}/{name}"] = dict(
            scales=bool(torch.equal(s, want.int())),
            mult=bool(torch.equal(mult.nan_to_num(-1.0), mx.data_multiplier(want, mode).nan_to_num(-1.0))),
            codes=bool(torch.equal(codes, mx.e4m3_rne_codes(v))))
print(json.dumps({"rows": rows, "helpers": helpers}))
"""


@pytest.fixture(scope="module")
def interp():
    return run_python_json(_INTERP, env={"TRITON_INTERPRET": "1"}, timeout=900)


def test_interpreter_kernels_bit_exact(interp):
    rows = interp["rows"]
    assert len(rows) == 2 * 6 * 2 * 3
    bad = [r for r in rows if not r["ok"] or r["codes"] or r["scale_bad"]]
    assert not bad, bad[:5]
    assert all(r["data_dtype"] == "torch.float8_e4m3fn" and r["scales_dtype"] == "torch.uint8" for r in rows)
    # the NaN row (row 2 of the special rows) gives a NaN rstd in every case with T >= 8
    assert all(r["nan_rows"] == 1 for r in rows if r["label"] not in ("T=1",))


def test_interpreter_device_helpers(interp):
    for key, r in interp["helpers"].items():
        assert r == {"scales": True, "mult": True, "codes": True}, key


# --------------------------------------------------------------------------------------------------------
# compile-only for sm_90
# --------------------------------------------------------------------------------------------------------
_COMPILE = r"""
import json, re, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_triton import mxnorm as km
from normfuse.codestats import ptxas_info


def ptxas(ptx):
    return ptxas_info(ptx, timeout_s=120)["spill_stores"]


out = {}
for D in (1024, 4096, 16384, 1056):
    for op in km.OPS:
        for name, cfg in [(t["name"], {k: v for k, v in t.items() if k != "name"}) for t in km.PROPOSED_TILINGS] + \
                [("soft", {"SOFT_CAST": True})]:
            if D == 1056 and name != "row-auto":
                continue
            for mode in (("floor", "rceil") if name == "row-auto" else ("floor",)):
                ck = km.compile_sm90_kernel(op, torch.empty(8192, D, dtype=torch.bfloat16), config=cfg, p=1,
                                            scale_mode=mode)
                ptx = ck.asm["ptx"]
                out[f"{op}/{D}/{name}/{mode}"] = dict(
                    cvt=ptx.count("cvt.rn.satfinite.e4m3x2.f32"),
                    ld_v4=len(re.findall(r"ld\.global[^\n]*\.v4\.b32", ptx)),
                    st_v4=len(re.findall(r"st\.global[^\n]*\.v4\.b32", ptx)),
                    div=len(re.findall(r"\bdiv\.", ptx)), shared=int(ck.metadata.shared),
                    warps=int(ck.metadata.num_warps), spills=ptxas(ptx))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled():
    return run_python_json(_COMPILE, timeout=900)


def test_compile_sm90(compiled):
    assert len(compiled) == 2 * (3 * (4 + 1 + 1) + 1) + 2  # D x tilings x modes, plus the ragged D
    for key, r in compiled.items():
        op, D, name, mode = key.split("/")
        assert r["spills"] == 0, key
        assert r["shared"] <= 232448, key
        if name == "soft":
            assert r["cvt"] == 0, key  # software cast: no cvt.e4m3
        else:
            assert r["cvt"] > 0, key
        if D != "1056":  # D / 32 a power of two: 16-byte vector loads of x and stores of the E4M3 data
            assert r["ld_v4"] > 0 and r["st_v4"] > 0, key
        if op == "mxnorm_mxfp8":
            assert r["div"] == 0, key  # no division: constants are precomputed, scales from bit arithmetic


# --------------------------------------------------------------------------------------------------------
# config and input validation
# --------------------------------------------------------------------------------------------------------
def test_launch_params():
    p = launch_params(4096, 1024, torch.bfloat16)
    assert p["BLOCK_K"] == 32 and p["ROWS"] == 8 and p["num_warps"] == 8 and p["grid"] == (512,)
    p = launch_params(4096, 16384, torch.bfloat16)
    assert p["ROWS"] == 1 and p["num_warps"] == 16
    p = launch_params(3, 1056, torch.bfloat16)
    assert p["BLOCK_K"] == 64 and p["ROWS"] == 4 and p["grid"] == (1,)
    p = launch_params(100000, 4096, torch.bfloat16, {"PERSISTENT": True}, num_sms=132)
    assert p["grid"] == (132 * 4,)
    with pytest.raises(ValueError, match="multiple of the MX block size 32"):
        launch_params(4, 48, torch.bfloat16)
    with pytest.raises(ValueError, match="registers"):
        launch_params(4, 65536 * 2, torch.bfloat16)


@pytest.mark.parametrize("bad", [{"ROWS": 3}, {"num_warps": 64}, {"TILE_BYTES": 100}, {"PERSISTENT": 1},
                                 {"SOFT_CAST": "yes"}, {"BLOCK_N": 128}])
def test_bad_configs(bad):
    with pytest.raises(ValueError):
        TilingConfig.from_dict(bad)


def test_bad_inputs():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of the MX block size"):
        km.mxnorm_mxfp8(torch.randn(4, 48), p=2)
    with pytest.raises(TypeError):
        km.rmsnorm_mxfp8(x.to(torch.int32))
    with pytest.raises(ValueError, match="2-D"):
        km.rmsnorm_mxfp8(x[None])
    with pytest.raises(ValueError, match="contiguous"):
        km.rmsnorm_mxfp8(torch.randn(64, 64, dtype=torch.bfloat16)[:, ::2])
    with pytest.raises(ValueError, match="p must be 1 or 2"):
        km.mxnorm_mxfp8(x, p=3)
    with pytest.raises(ValueError, match="choices"):
        km.mxnorm_mxfp8(x, p=2, scale_mode="ceil")
    with pytest.raises(ValueError, match="eps"):
        km.rmsnorm_mxfp8(x, eps=-1.0)
    with pytest.raises(ValueError, match="CUDA"):
        km.rmsnorm_mxfp8(x)  # CPU tensor outside the interpreter
    with pytest.raises(TypeError):
        km.rmsnorm_mxfp8(x, config=[1, 2])
