"""CPU checks of ``kernels_tlx.multi_cta``'s EPILOGUE_OVERLAP option (TLX venv: ``.venv-tlx/bin/python -m pytest
tests/tlx/test_multi_cta_overlap_tlx.py``): each M-tile's tiles parked un-normalized, the exchange wait, the
normalization and the TMA stores deferred into the next M-tile's first mainloop.

- Config validation: not with PINGPONG / MULTICAST_A / EPILOGUE_SUBTILE / STORE_DEFER, needs LN_PACKED; two tiles
  per CTA need the shallower BLOCK_K = 32 ring (shared memory, ``block_n``); Lazy Pre-Norm rejects it.
- Launch flags: OVERLAP reaches the kernel for RMSNorm / LayerNorm only; ``matmul_cluster`` of a one-tile overlap
  config runs the STORE_DEFER GEMM (the fused kernel's own schedule), of a two-tile one the two-tile GEMM.
- Compile-only for sm_90a at the benchmark N: no spills, shared memory under 227 KB and as estimated, the same
  DSMEM stores as the kernel without the overlap, and three TMA store sites per parked tile (in the next mainloop,
  after a short one, after the walk).

Compile-only cannot see deadlocks or numerics: ``python -m kernels_tlx.multi_cta --quick --no-bench --config c1_ovl
--config c4_ovl_lnpack --config c8_ovl_lnpack --config c2_t2_ovl_lnpack`` on the H200 is the correctness test.
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

OVL = {"EPILOGUE_OVERLAP": True, "LN_PACKED": True}


@pytest.mark.parametrize("bad, match", [
    ({"PINGPONG": True}, "EPILOGUE_OVERLAP=True with PINGPONG=True: not implemented"),
    ({"CLUSTER_SIZE": 8, "MULTICAST_A": True}, "EPILOGUE_OVERLAP=True with MULTICAST_A=True"),
    ({"EPILOGUE_SUBTILE": True}, "EPILOGUE_OVERLAP=True with EPILOGUE_SUBTILE=True"),
    ({"STORE_DEFER": True}, "EPILOGUE_OVERLAP=True with STORE_DEFER=True: implied"),
    ({"LN_PACKED": False}, "EPILOGUE_OVERLAP=True needs LN_PACKED=True"),
])
def test_config_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        TilingConfig.from_dict({**OVL, **bad})


def test_shared_memory_fit():
    one = TilingConfig(CLUSTER_SIZE=4, **OVL)
    assert one.smem_bytes(256, 2) == TilingConfig(CLUSTER_SIZE=4, LN_PACKED=True, STORE_DEFER=True).smem_bytes(256, 2)
    assert one.block_n(1024) == 256
    # two parked tiles per consumer (128 KB) beside the 3-stage BLOCK_K = 64 ring (144 KB) do not fit in 227 KB
    with pytest.raises(ValueError, match="shared memory: estimated.*use BLOCK_K=32 with NUM_STAGES=3"):
        TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=2, **OVL).block_n(1024)
    two = SHIPPED_CONFIGS["c2_t2_ovl_lnpack"]
    assert two.BLOCK_K == 32 and two.block_n(1024) == 256
    assert two.smem_bytes(256) - TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=2, BLOCK_K=32).smem_bytes(256) == 128 * 256 * 2


def test_launch_flags_and_rejects():
    a = torch.empty(256, 64, dtype=torch.bfloat16)
    b = torch.empty(64, 1024, dtype=torch.bfloat16)
    for name, T in (("c4_ovl_lnpack", 1), ("c2_t2_ovl_lnpack", 2)):
        cfg = SHIPPED_CONFIGS[name]
        for norm in ("rms", "layer"):
            *_, kw = km._prepare(a, b, None, None, 1e-5, norm, cfg, need_cuda=False)
            assert kw["OVERLAP"] is True and "STORE_DEFER" not in kw, (name, norm, kw)
        *_, kw = km._prepare(a, b, None, None, 1e-5, "none", cfg, need_cuda=False)
        assert "OVERLAP" not in kw and kw.get("STORE_DEFER", False) is (T == 1), (name, kw)
        for norm in ("lazy_rms", "lazy_layer"):
            with pytest.raises(ValueError, match="EPILOGUE_OVERLAP=True is not supported"):
                km._prepare(a, b, None, None, 1e-5, norm, cfg, need_cuda=False)
    *_, kw = km._prepare(a, b, None, None, 1e-5, "layer", SHIPPED_CONFIGS["c4_defer_lnpack"], need_cuda=False)
    assert "OVERLAP" not in kw  # the kernel's default constexpr: an unchanged build


_SCRIPT = r"""
import json, sys
from normfuse import compile_only
compile_only.install(90)
from normfuse.testing import compile_multi_cta_pairs

print(json.dumps(compile_multi_cta_pairs(json.loads(sys.argv[1]), ("ovl", "base"))))
"""


@pytest.fixture(scope="module")
def compiled():
    jobs = [("c4_ovl_lnpack", "c4_defer_lnpack", 1024, op) for op in ("matmul_rmsnorm", "matmul_layernorm")]
    jobs += [("c2_t2_ovl_lnpack", "c2_t2_bk32_lnpack", 1024, "matmul_layernorm"),
             ("c8_ovl_lnpack", "c8_defer_lnpack", 2048, "matmul_layernorm")]
    return run_python_json_parallel(_SCRIPT, jobs, timeout=400)


def test_compile_benchmark_n(compiled):
    assert len(compiled) == 4
    for key, r in compiled.items():
        ovl, base = r["ovl"], r["base"]
        assert ovl["ptxas"]["spill_stores"] == 0 == ovl["ptxas"]["spill_loads"], (key, ovl["ptxas"])
        assert ovl["smem"] <= SMEM_LIMIT_BYTES and ovl["smem"] <= ovl["est"], (key, ovl["smem"], ovl["est"])
        # the same exchange, only its wait moved: as many DSMEM stores as the kernel without the overlap
        assert ovl["extra"]["st_async"] == base["extra"]["st_async"] > 0, (key, ovl["extra"], base["extra"])
        cfg = km.SHIPPED_CONFIGS[key.split("/")[0]]
        # per consumer (replicated code) and parked tile: in the next mainloop, after a short one, after the walk
        assert ovl["extra"]["tma_store"] == 3 * cfg.TILES_PER_CTA * cfg.NUM_CONSUMERS, (key, ovl["extra"])
        assert ovl["extra"]["reqnctapercluster"] == base["extra"]["reqnctapercluster"]
