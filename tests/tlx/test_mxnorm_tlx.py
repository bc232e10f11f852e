"""Tests of ``kernels_tlx.mxnorm`` (TLX venv: ``.venv-tlx/bin/python -m pytest tests/tlx/test_mxnorm_tlx.py``).

1. Compile-only for sm_90 (TLX has no interpreter), in a subprocess: every shipped config x both ops x FLOOR/RCEIL
   at D in {1024, 4096, 16384} and the ragged D = 1056 (plain only; the pipelined configs must refuse it). Asserts
   shared memory within 227 KB, no ptxas spills, the hardware E4M3 cast (none with SOFT_CAST), and for the pipelined
   kernel the protocol in the PTX: mbarrier init, then a CTA barrier, then the first ``expect_tx`` with exactly
   the tile's bytes and the 1-D bulk copy global -> smem (both predicated to one thread), the phase wait
   (``try_wait.parity``) in the loop, ``fence.proxy.async`` then a CTA barrier before the bulk store smem ->
   global, a bulk-group commit, ``wait_group.read 1`` in the loop and ``wait_group.read 0`` after the last store.
2. Interpreter (``TRITON_INTERPRET=1``, fp32/fp16, software E4M3 cast): the plain kernel, and the pipelined
   kernel's math (``_blocks_math``, the same device function) plus its tail path through ``emulate_pipelined``
   (data movement by ``tl.load`` instead of bulk copies), bit-exact against ``normfuse.techniques.mxnorm.check`` with
   full tiles, a tail after them, and a tail only (T < ROWS), and the corner-case rows.
3. Config and input validation (in-process).
4. GPU (marker ``gpu``): every shipped config through ``normfuse.gpu_checks`` (odd and benchmark shapes, both
   scale modes). ``python -m kernels_tlx.mxnorm`` is the fuller self-check (soft vs hardware cast, timing).

Compile-only does not catch barrier-phase bugs, races, deadlocks or numerics.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from kernels_tlx import mxnorm as tm  # noqa: E402
from kernels_tlx.mxnorm import SHIPPED_CONFIGS, TilingConfig  # noqa: E402
from normfuse.testing import run_python_json  # noqa: E402

_COMPILE = r"""
import json, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import mxnorm as tm
out = {}
cfgs = dict(tm.SHIPPED_CONFIGS)
cfgs["bulk3_soft"] = tm.TilingConfig(STAGES=3, SOFT_CAST=True)
cfgs["plain_persistent"] = tm.TilingConfig(PERSISTENT=True)
for D in (1024, 4096, 16384, 1056):
    for op in tm.OPS:
        for name, cfg in cfgs.items():
            for mode in ("floor", "rceil"):
                key = f"{op}/{D}/{name}/{mode}"
                try:
                    r = tm.compile_sm90(op, torch.empty(4099, D, dtype=torch.bfloat16), config=cfg, p=2, scale_mode=mode)
                except ValueError as e:
                    out[key] = {"unsupported": str(e)}
                    continue
                out[key] = {k: r[k] for k in ("shared_bytes", "num_warps", "ptx_extra", "ptxas", "params")}
print(json.dumps(out))
"""

_PTX = r"""
import json, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import mxnorm as tm
out = {}
for op in tm.OPS:
    _, ck, prm = tm._launch(op, torch.empty(4099, 4096, dtype=torch.bfloat16), 1 if op == "mxnorm_mxfp8" else None,
                            1e-6, "rceil", tm.SHIPPED_CONFIGS["bulk3"], need_cuda=False, compile_only=True)
    out[op] = {"ptx": ck.asm["ptx"], "tile_bytes": prm["ROWS"] * 4096 * 2}
print(json.dumps(out))
"""


_INTERP = r"""
import json, torch
from normfuse.techniques import mxnorm as T
from kernels_tlx import mxnorm as tm
rows = []
for dtype in ("fp32", "fp16"):
    for M, D, name in ((37, 1024, "bulk3"), (8, 256, "bulk3"), (19, 512, "bulk4_32k"), (37, 320, "plain"),
                       (1, 32, "plain")):
        cfg = tm.SHIPPED_CONFIGS[name]
        for mode in ("floor", "rceil"):
            inp = T.make_inputs(M, D, dtype=dtype, seed=M + D, scale_mode=mode)
            for variant in T.VARIANTS:
                op, p = T.KERNEL_FUNCTIONS[variant], T.P_OF.get(variant)
                if cfg.STAGES:
                    out = tm.emulate_pipelined(op, inp["x"], p=p, eps=1e-6, scale_mode=mode, config=cfg)
                    n_full = M // cfg.resolve(M, D, inp["x"].element_size())["ROWS"]
                elif p is None:
                    out, n_full = tm.rmsnorm_mxfp8(inp["x"], eps=1e-6, scale_mode=mode, config=cfg), 0
                else:
                    out, n_full = tm.mxnorm_mxfp8(inp["x"], p=p, eps=1e-6, scale_mode=mode, config=cfg), 0
                r = T.check("norm_cast", out, inp, 1e-6, variant)
                rows.append(dict(dtype=dtype, M=M, D=D, name=name, mode=mode, variant=variant, ok=r["ok"],
                                 codes=r["code_mismatches"], scale_bad=r["scale_mismatch_rel_err"], n_full=n_full))
try:
    tm.rmsnorm_mxfp8(torch.randn(8, 1024), config=tm.SHIPPED_CONFIGS["bulk3"])
    refused = False
except ValueError as e:
    refused = "emulate_pipelined" in str(e)
print(json.dumps({"rows": rows, "refused": refused}))
"""


def test_interpreter_plain_and_pipelined_math():
    out = run_python_json(_INTERP, env={"TRITON_INTERPRET": "1"}, timeout=900)
    rows = out["rows"]
    assert len(rows) == 2 * 5 * 2 * 3
    bad = [r for r in rows if not r["ok"] or r["codes"] or r["scale_bad"]]
    assert not bad, bad[:5]
    # the cases cover full tiles followed by a tail, and a tail only
    assert {(r["M"], r["n_full"] > 0) for r in rows if r["name"] != "plain"} >= {(37, True), (8, False)}
    assert out["refused"]  # the real pipelined kernel (TLX ops) is refused by the interpreter, with a pointer


@pytest.fixture(scope="module")
def compiled():
    return run_python_json(_COMPILE, timeout=900)


def test_compile_all_shipped_configs(compiled):
    assert len(compiled) == 4 * 2 * 5 * 2
    for key, r in compiled.items():
        op, D, name, mode = key.split("/")
        pipelined = name.startswith("bulk")
        if "unsupported" in r:
            assert D == "1056" and pipelined, (key, r)  # only the bulk kernel refuses D that is not a power of 2
            assert "power of two" in r["unsupported"]
            continue
        assert not (D == "1056" and pipelined), key
        x = r["ptx_extra"]
        assert r["shared_bytes"] <= 232448 and r["ptxas"]["spill_stores"] == 0, (key, r)
        assert (x["cvt_e4m3"] == 0) if name.endswith("soft") else (x["cvt_e4m3"] > 0), key
        if pipelined:
            assert x["bulk_load"] >= 2 and x["bulk_store"] == 1 and x["expect_tx"] == x["bulk_load"], key
            assert x["try_wait"] >= 1 and x["fence_proxy_async"] == 1 and x["bulk_commit"] >= 1, key
            assert x["bulk_wait"] == 2, key
            assert r["shared_bytes"] >= r["params"]["smem"] - 64, key  # the ring and the output buffers
        else:
            assert x["bulk_load"] == x["bulk_store"] == x["expect_tx"] == x["try_wait"] == 0, key


def test_pipelined_protocol_in_ptx():
    out = run_python_json(_PTX, timeout=600)
    for op, r in out.items():
        ptx, tile = r["ptx"], r["tile_bytes"]
        lines = [ln.strip() for ln in ptx.splitlines()]

        def first(pat, start=0):
            for i in range(start, len(lines)):
                if re.search(pat, lines[i]):
                    return i
            raise AssertionError(f"{op}: {pat!r} not found after line {start}")

        init = first(r"mbarrier\.init")
        sync = first(r"^bar\.sync", init)
        expect = first(r"mbarrier\.arrive\.expect_tx", init)
        assert init < sync < expect, op  # barriers initialized and published before the first arm
        assert re.search(rf"expect_tx\.shared::cta\.b64 _, \[%r\d+\], {tile};", lines[expect]), lines[expect]
        for ln in lines:
            if "cp.async.bulk.shared::cta.global" in ln or "expect_tx" in ln or "cp.async.bulk.global.shared" in ln:
                assert ln.startswith("@%p"), (op, ln)  # issued by one thread
        loop_wait = first(r"mbarrier\.try_wait\.parity", expect)
        assert first(r"cp\.async\.bulk\.wait_group\.read\s+1", loop_wait)
        fence = first(r"fence\.proxy\.async\.shared::cta")
        store = first(r"cp\.async\.bulk\.global\.shared::cta\.bulk_group")
        assert fence < first(r"^bar\.sync", fence) < store, op  # all warps' smem writes fenced and joined first
        first(r"cp\.async\.bulk\.commit_group", store)
        last_wait = max(i for i, ln in enumerate(lines) if re.search(r"wait_group\.read\s+0", ln))
        assert last_wait > store, op


def test_config_resolution():
    p = TilingConfig().resolve(4096, 1024, 2)
    assert p == {"ROWS": 8, "BLOCK_K": 32, "num_warps": 8, "smem": 0}
    p = TilingConfig(STAGES=3).resolve(5, 16384, 2)
    assert p["ROWS"] == 1 and p["num_warps"] == 16 and p["smem"] == 3 * 32768 + 2 * 16384 + 24
    assert TilingConfig().resolve(3, 1024, 2)["ROWS"] == 4  # plain: at most next_pow2(T) rows
    assert TilingConfig(STAGES=2).resolve(3, 1024, 2)["ROWS"] == 8  # pipelined: the tail code handles T < ROWS
    with pytest.raises(ValueError, match="power of two"):
        TilingConfig(STAGES=2).resolve(64, 1056, 2)
    with pytest.raises(ValueError, match="shared memory"):
        TilingConfig(STAGES=8, TILE_BYTES=65536).resolve(64, 16384, 2)
    with pytest.raises(ValueError, match="elements of x per thread"):
        TilingConfig(ROWS=8, num_warps=4).resolve(64, 4096, 2)
    with pytest.raises(ValueError, match="multiple of the MX block size"):
        TilingConfig().resolve(4, 48, 2)


@pytest.mark.parametrize("bad", [{"STAGES": 1}, {"STAGES": 9}, {"ROWS": 3}, {"TILE_BYTES": 512}, {"num_warps": 48},
                                 {"CTAS_PER_SM": 0}, {"PERSISTENT": True, "STAGES": 2}, {"SOFT_CAST": 1},
                                 {"CLUSTER_SIZE": 2}])
def test_bad_configs(bad):
    with pytest.raises(ValueError):
        TilingConfig.from_dict(bad)


def test_shipped_configs_valid():
    assert set(SHIPPED_CONFIGS) == {"plain", "bulk3", "bulk4_32k"}
    for cfg in SHIPPED_CONFIGS.values():
        for D in (1024, 2048, 4096, 8192, 16384):  # every shipped config serves every D of the sweep
            cfg.resolve(131072, D, 2)


def test_bad_inputs():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of the MX block size"):
        tm.mxnorm_mxfp8(torch.randn(4, 48), p=2)
    with pytest.raises(ValueError, match="p must be 1 or 2"):
        tm.mxnorm_mxfp8(x, p=4)
    with pytest.raises(ValueError, match="choices"):
        tm.rmsnorm_mxfp8(x, scale_mode="ceil")
    with pytest.raises(TypeError):
        tm.rmsnorm_mxfp8(x.to(torch.int32))
    with pytest.raises(ValueError, match="CUDA"):
        tm.rmsnorm_mxfp8(x)
    with pytest.raises(TypeError):
        tm.rmsnorm_mxfp8(x, config="bulk3")


@pytest.mark.gpu
def test_shipped_mxnorm_configs_correct_on_gpu():
    """Every config of configs/tiling/mxnorm_h200.yaml for TLX at the shapes of normfuse.gpu_checks (both modes)."""
    from normfuse.gpu_checks import check_all

    failures = check_all("tlx", "mxnorm")
    assert not failures, "\n".join(failures)
