"""CPU checks of ``kernels_tlx.multi_cta``'s TILES_PER_CTA option (TLX venv: ``.venv-tlx/bin/python -m pytest
tests/tlx/test_multi_cta_tiles_tlx.py``): two column tiles per CTA, the first parked in shared memory.

- Config validation: 1 or 2 tiles, not with PINGPONG / MULTICAST_A / EPILOGUE_SUBTILE / STORE_DEFER, the row
  coverage ``CLUSTER_SIZE * TILES_PER_CTA * BLOCK_N`` and idle ranks in ``block_n``; Lazy LayerNorm rejects it,
  Lazy RMSNorm takes it; ``kernels_tlx.lazy_prenorm.TilingConfig`` passes it to its cluster form.
- Launch flags: TILES (and, for LayerNorm, EVEN_N = the row fills C * 2 * BLOCK_N) reach the kernel only when set,
  so the one-tile builds are unchanged.
- Compile-only for sm_90a at the benchmark N (c2 at 1024, c4 at 2048): no spills, shared memory under 227 KB,
  one DSMEM exchange per M-tile (the st.async sites of the one-tile kernel of the same cluster), two TMA output
  stores (the parked tile and the register tile), B loads at two column offsets.

Compile-only cannot see deadlocks or numerics: ``python -m kernels_tlx.multi_cta --quick --no-bench --config c1_t2
--config c2_t2_lnpack --config c4_t2_lnpack --config c8_t2_lnpack`` on the H200 is the correctness test.
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

from kernels_tlx import lazy_prenorm as klp  # noqa: E402
from kernels_tlx import multi_cta as km  # noqa: E402
from kernels_tlx.multi_cta import SHIPPED_CONFIGS, TilingConfig  # noqa: E402
from normfuse.compile_only import SMEM_LIMIT_BYTES  # noqa: E402
from normfuse.testing import run_python_json_parallel  # noqa: E402


@pytest.mark.parametrize("bad, match", [
    ({"TILES_PER_CTA": 3}, "TILES_PER_CTA=3 must be 1 or 2"),
    ({"TILES_PER_CTA": 2, "PINGPONG": True, "STORE_DEFER": True}, "PINGPONG=True: not implemented.*STORE_DEFER=True: implied"),
    ({"TILES_PER_CTA": 2, "CLUSTER_SIZE": 8, "MULTICAST_A": True}, "MULTICAST_A=True"),
    ({"TILES_PER_CTA": 2, "EPILOGUE_SUBTILE": True}, "EPILOGUE_SUBTILE=True"),
    ({"TILES_PER_CTA": 2, "CLUSTER_SIZE": 16}, "CLUSTER_SIZE <= 8"),
])
def test_config_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        TilingConfig.from_dict(bad)


def test_block_n_row_coverage():
    c = TilingConfig
    assert c(CLUSTER_SIZE=2, TILES_PER_CTA=2).block_n(1024) == 256
    assert c(CLUSTER_SIZE=2, TILES_PER_CTA=2).block_n(600) == 256  # rank 1: 88 columns, its second tile none
    assert c(CLUSTER_SIZE=4, TILES_PER_CTA=2).block_n(2048) == 256 and c(CLUSTER_SIZE=4, TILES_PER_CTA=2).block_n(1024) == 128
    assert c(CLUSTER_SIZE=8, TILES_PER_CTA=2).block_n(4096) == 256  # N = 4096 with a portable cluster
    with pytest.raises(ValueError, match="too wide.*CLUSTER_SIZE \\* TILES_PER_CTA \\* BLOCK_N = 2 \\* 2 \\* 256 = 1024"):
        c(CLUSTER_SIZE=2, TILES_PER_CTA=2).block_n(1032)
    with pytest.raises(ValueError, match="TILES_PER_CTA=2: only cdiv\\(N, TILES_PER_CTA \\* BLOCK_N\\) = 2 ranks"):
        c(CLUSTER_SIZE=4, TILES_PER_CTA=2, BLOCK_N=256).block_n(1024)
    assert not c(CLUSTER_SIZE=2, TILES_PER_CTA=2).supports(4096)


def test_launch_flags_and_lazy_rejects():
    a = torch.empty(256, 64, dtype=torch.bfloat16)
    for N, cfg, even in ((1024, SHIPPED_CONFIGS["c2_t2_lnpack"], True), (600, SHIPPED_CONFIGS["c2_t2_lnpack"], False),
                         (2048, SHIPPED_CONFIGS["c4_t2_lnpack"], True), (1800, SHIPPED_CONFIGS["c4_t2_lnpack"], False)):
        b = torch.empty(64, N, dtype=torch.bfloat16)
        *_, kw = km._prepare(a, b, None, None, 1e-5, "layer", cfg, need_cuda=False)
        assert kw["TILES"] == 2 and kw["EVEN_N"] is even and kw["LN_PACKED"] is True, (N, kw)
        *_, kw = km._prepare(a, b, None, None, 1e-6, "rms", cfg, need_cuda=False)
        assert kw["TILES"] == 2 and "EVEN_N" not in kw and "LN_PACKED" not in kw, (N, kw)
        plain = TilingConfig.from_dict({**cfg.to_dict(), "LN_PACKED": False})
        *_, kw = km._prepare(a, b, None, None, 1e-6, "lazy_rms", plain, need_cuda=False)
        assert kw["TILES"] == 2 and kw["NORM"] == "lazy_rms", kw
        with pytest.raises(ValueError, match="TILES_PER_CTA=2 is not supported"):
            km._prepare(a, b, None, None, 1e-6, "lazy_layer", plain, need_cuda=False)
    *_, kw = km._prepare(a, torch.empty(64, 1024, dtype=torch.bfloat16), None, None, 1e-5, "layer",
                         SHIPPED_CONFIGS["c4_lnpack"], need_cuda=False)
    assert "TILES" not in kw  # one tile per CTA: the kernel's default constexpr, an unchanged build
    g = klp.SHIPPED_CONFIGS["cluster_c2_t2"]
    assert g.cluster_config().TILES_PER_CTA == 2 and g.supports(1024) and not g.supports(2048)
    with pytest.raises(ValueError, match="TILES_PER_CTA are options of the cluster form"):
        klp.TilingConfig(TILES_PER_CTA=2)
    for bad, match in (({"TILES_PER_CTA": 3}, "TILES_PER_CTA=3 must be 1 or 2"),
                       ({"TILES_PER_CTA": 2, "STORE_DEFER": True}, "TILES_PER_CTA=2 with STORE_DEFER=True: implied")):
        with pytest.raises(ValueError, match=match):  # at construction, not only at the first call
            klp.TilingConfig(CLUSTER_SIZE=2, **bad)
    with pytest.raises(ValueError, match="N > 4096 is not supported"):
        TilingConfig(CLUSTER_SIZE=8, TILES_PER_CTA=2).block_n(8192)
    with pytest.raises(ValueError, match="would idle: use CLUSTER_SIZE=2 or a smaller BLOCK_N"):
        TilingConfig(CLUSTER_SIZE=4, TILES_PER_CTA=2).block_n(600)


_SCRIPT = r"""
import json, re, sys, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import multi_cta as km

out = {}
for name, base, N, op in json.loads(sys.argv[1]):
    a = torch.empty(4096, 1024, dtype=torch.bfloat16)
    r = {}
    # the one-tile kernel of the same cluster at the N it covers with 256-wide tiles (half the row)
    for key, cfg, n in (("t2", km.SHIPPED_CONFIGS[name], N), ("base", km.SHIPPED_CONFIGS[base], N // 2)):
        b = torch.empty(1024, n, dtype=torch.bfloat16)
        s = km.compile_sm90(op, a, b, config=cfg, ptxas=True)
        ptx_b = s.pop("ptx_extra")
        r[key] = {"ptxas": s["ptxas"], "smem": s["shared_bytes"], "st_async": ptx_b["st_async"], "block_n": s["block_n"],
                  "expect_tx": s["expect_tx_bytes"]}
    out[f"{name}/{op}/{N}"] = r
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled():
    jobs = [("c2_t2_lnpack", "c2", 1024, op) for op in ("matmul_rmsnorm", "matmul_layernorm")]
    jobs += [("c4_t2_lnpack", "c4_lnpack", 2048, "matmul_layernorm"), ("c2_t2_lnpack", "c2", 1024, "matmul_cluster"),
             ("c2_t2_lnpack", "c2", 1024, "lazy_rmsnorm_matmul")]
    return run_python_json_parallel(_SCRIPT, jobs, timeout=400)


def test_compile_benchmark_n(compiled):
    assert len(compiled) == 5
    for key, r in compiled.items():
        t2 = r["t2"]
        assert t2["ptxas"]["spill_stores"] == 0 == t2["ptxas"]["spill_loads"], (key, t2["ptxas"])
        assert t2["smem"] <= SMEM_LIMIT_BYTES, key
        assert t2["block_n"] == 256, key
        assert (128 * 64 + 64 * 256) * 2 in t2["expect_tx"], key  # the same 48 KB stage
        if "rmsnorm" in key:
            # one exchange per M-tile: as many st.async sites as the one-tile kernel of the same cluster
            assert t2["st_async"] == r["base"]["st_async"] > 0, (key, t2, r["base"])
        elif "matmul_layernorm" in key:  # LN_PACKED: consumers x peer loop x 2 rows per thread x one word
            C = SHIPPED_CONFIGS[key.split("/")[0]].CLUSTER_SIZE
            assert t2["st_async"] == 2 * C * 2, (key, t2)
