"""CPU checks of ``kernels_tlx.multi_cta``'s STORE_DIRECT option (TLX venv: ``.venv-tlx/bin/python -m pytest
tests/tlx/test_multi_cta_direct_tlx.py``): the normalized output written from registers by 32-bit ``st.global`` in
the wgmma accumulator layout, with no shared-memory staging tile and no TMA store.

- Config validation: not with PINGPONG / MULTICAST_A / EPILOGUE_SUBTILE / STORE_DEFER / EPILOGUE_OVERLAP; Lazy Pre-Norm rejects
  it; the one-tile shared-memory estimate drops the staging tile (room for a 4-stage ring).
- Launch flags: DIRECT and the output pointer reach the kernel only for STORE_DIRECT configs.
- Compile-only for sm_90a at the benchmark N: no TMA store, no convert_layout of the accumulator (a plain tl.store
  would get one, through shared memory), one 32-bit st.global per adjacent-column pair, the same DSMEM stores as the
  staged kernel, no spills.

Compile-only cannot see misaligned or misplaced stores: ``python -m kernels_tlx.multi_cta --quick --no-bench
--config c1_direct --config c4_direct_lnpack --config c4_direct_s4_lnpack --config c8_direct_s4_lnpack --config
c2_t2_direct_lnpack`` on the H200 is the correctness test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from kernels_tlx import multi_cta as km  # noqa: E402
from kernels_tlx.multi_cta import SHIPPED_CONFIGS, TilingConfig  # noqa: E402
from normfuse.compile_only import SMEM_LIMIT_BYTES  # noqa: E402
from normfuse.testing import run_python_json_parallel  # noqa: E402

DIRECT = {"STORE_DIRECT": True}


@pytest.mark.parametrize("bad, match", [
    ({"PINGPONG": True}, "STORE_DIRECT=True with PINGPONG=True: not implemented"),
    ({"CLUSTER_SIZE": 4, "MULTICAST_A": True}, "STORE_DIRECT=True with MULTICAST_A=True: not implemented"),
    ({"EPILOGUE_SUBTILE": True}, "STORE_DIRECT=True with EPILOGUE_SUBTILE=True"),
    ({"STORE_DEFER": True}, "STORE_DIRECT=True with STORE_DEFER=True: not applicable"),
    ({"EPILOGUE_OVERLAP": True, "LN_PACKED": True}, "STORE_DIRECT=True with EPILOGUE_OVERLAP=True"),
])
def test_config_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        TilingConfig.from_dict({**DIRECT, **bad})


def test_shared_memory_and_launch_flags():
    one, staged = TilingConfig(CLUSTER_SIZE=4, **DIRECT), TilingConfig(CLUSTER_SIZE=4, STORE_DEFER=True)
    assert staged.smem_bytes(256) - one.smem_bytes(256) == 128 * 256 * 2 - 1024  # the staging tile, less scratch
    assert SHIPPED_CONFIGS["c4_direct_s4_lnpack"].block_n(1024) == 256  # a 4th stage fits in its place
    with pytest.raises(ValueError, match="shared memory"):
        TilingConfig(CLUSTER_SIZE=4, NUM_STAGES=4, STORE_DEFER=True).block_n(1024)
    two = SHIPPED_CONFIGS["c2_t2_direct_lnpack"]  # the parked buffer stays
    assert two.smem_bytes(256) == TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=2).smem_bytes(256) + 1024
    a = torch.empty(256, 64, dtype=torch.bfloat16)
    b = torch.empty(64, 1024, dtype=torch.bfloat16)
    for norm in ("rms", "layer", "none"):
        _, _, (y, *_), _, kw = km._prepare(a, b, None, None, 1e-5, norm, two, need_cuda=False)
        assert kw["DIRECT"] is True and kw["c_ptr"] is y, (norm, kw)
        *_, kw = km._prepare(a, b, None, None, 1e-5, norm, SHIPPED_CONFIGS["c2_t2_lnpack"], need_cuda=False)
        assert "DIRECT" not in kw and "c_ptr" not in kw  # the kernel's defaults: an unchanged build
    for norm in ("lazy_rms", "lazy_layer"):
        with pytest.raises(ValueError, match="STORE_DIRECT=True is not supported"):
            km._prepare(a, b, None, None, 1e-5, norm, SHIPPED_CONFIGS["c4_direct_lnpack"], need_cuda=False)


_SCRIPT = r"""
import json, re, sys
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import multi_cta as km
from normfuse.testing import compile_multi_cta_pairs


def layout_counts(cfg, op, a, b):
    norm = {"matmul_rmsnorm": "rms", "matmul_layernorm": "layer"}[op]
    *_, args, kw = km._prepare(a, b, None, None, 1e-5, norm, cfg, need_cuda=False)
    c = km._multi_cta_norm_kernel.warmup(*args, grid=(cfg.CLUSTER_SIZE,), **kw)
    ptx, ttgir = c.asm["ptx"], c.asm["ttgir"]
    return {"st_global_b32_asm": len(re.findall(r"@p st\.global\.b32", ptx)),
            "st_global_v": len(re.findall(r"st\.global\.v\d", ptx)),
            "convert_from_mma": len(re.findall(r"convert_layout [^\n]*#mma[^\n]*-> ", ttgir))}


print(json.dumps(compile_multi_cta_pairs(json.loads(sys.argv[1]), ("direct", "base"), layout_counts)))
"""


@pytest.fixture(scope="module")
def compiled():
    jobs = [("c4_direct_lnpack", "c4_defer_lnpack", 1024, op) for op in ("matmul_rmsnorm", "matmul_layernorm")]
    jobs += [("c2_t2_direct_lnpack", "c2_t2_lnpack", 1024, "matmul_layernorm")]
    return run_python_json_parallel(_SCRIPT, jobs, timeout=400)


def test_compile_benchmark_n(compiled):
    assert len(compiled) == 3
    for key, r in compiled.items():
        d, base = r["direct"], r["base"]
        cfg = SHIPPED_CONFIGS[key.split("/")[0]]
        assert d["ptxas"]["spill_stores"] == 0 == d["ptxas"]["spill_loads"], (key, d["ptxas"])
        assert d["smem"] <= min(SMEM_LIMIT_BYTES, d["est"]), (key, d["smem"], d["est"])
        assert d["extra"]["tma_store"] == 0 < base["extra"]["tma_store"], (key, d["extra"], base["extra"])
        assert d["convert_from_mma"] == 0, key  # the register tile is stored in the accumulator layout
        # one bf16x2 word per adjacent-column pair: 64 x 256 / 128 threads / 2 per consumer (replicated code)
        assert d["st_global_b32_asm"] == cfg.NUM_CONSUMERS * 64 * 256 // 128 // 2, (key, d["st_global_b32_asm"])
        assert d["extra"]["st_async"] == base["extra"]["st_async"] > 0, (key, d["extra"], base["extra"])
        if cfg.TILES_PER_CTA == 1:
            assert base["smem"] - d["smem"] >= 60 * 1024, (key, base["smem"], d["smem"])  # no staging tile
        else:  # the parked tile's chunks: coalesced vector stores from the registers they are normalized in
            assert d["st_global_v"] > 0 and d["smem"] >= base["smem"] - 1024, (key, d)
