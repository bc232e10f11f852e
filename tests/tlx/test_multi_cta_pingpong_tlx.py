"""CPU checks of the STORE_DEFER and PINGPONG schedules of ``kernels_tlx.multi_cta`` (TLX venv:
``.venv-tlx/bin/python -m pytest tests/tlx/test_multi_cta_pingpong_tlx.py``).

Compile-only for sm_90a (in a subprocess: the fake driver is process-global), LayerNorm and RMSNorm at the
benchmark N (c4: 1024, c8: 2048) and the no-norm cluster GEMM of the same schedule (``matmul_cluster``):

- STORE_DEFER: the TMA output store is *not* followed by ``cp.async.bulk.wait_group.read 0`` (it is in the
  default build: the wait the option removes from the epilogue); the wait comes once per tile per consumer
  after the mainloop plus once before exit; a ``fence.proxy.async`` precedes the store; bit-identical math, so
  the fp32 instruction count equals the config without it; no spills.
- PINGPONG: named barriers 9 / 10 with 256 threads in the PTX (consumer 0: wait 9 per tile and once at exit,
  arrive 10; consumer 1: arrive 9 at start and per tile, wait 10), a 40 KB stage (one [64, 64] A box + the
  [64, 256] B tile) armed on ``full``, the ``empty`` barriers initialized with one arrival, the per-consumer
  DSMEM exchange unchanged (st.async sites, receive bytes), shared memory < 227 KB, no spills.
- Config validation of the new options, and that they reach the kernel only when set.

Compile-only cannot see deadlocks or numerics: ``python -m kernels_tlx.multi_cta --quick --no-bench --config
c4_pp_lnpack ...`` on the H200 is the correctness test (all cluster sizes: c1_pp, c2_pp, c4/c8_pp_lnpack,
c16_pp).
"""

from __future__ import annotations

import json
import re
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

_SCRIPT = r"""
import json, re, sys, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import multi_cta as km
from normfuse.codestats import ptxas_info

def facts(ptx):
    lines = [l.strip() for l in ptx.splitlines()]
    idx = [i for i, l in enumerate(lines) if "cp.async.bulk.tensor.2d.global.shared::cta" in l]
    after = []  # the first non-trivial instruction after each output store's commit_group
    for i in idx:
        j = i + 1
        while j < len(lines) and not lines[j].startswith("cp.async.bulk.commit_group"):
            j += 1
        k = j + 1
        while k < len(lines) and (not lines[k] or lines[k].startswith("//") or lines[k].startswith(".loc")):
            k += 1
        after.append(lines[k] if k < len(lines) else "")
    return {
        "tma_stores": len(idx),
        "wait_after_store": sum(a.startswith("cp.async.bulk.wait_group.read") for a in after),
        "store_waits": len(re.findall(r"cp\.async\.bulk\.wait_group\.read\s+0;", ptx)),
        "fence_proxy_async": ptx.count("fence.proxy.async.shared::cta"),
        "bar_sync_9": len(re.findall(r"\bbar\.sync\s+9, 256;", ptx)),
        "bar_sync_10": len(re.findall(r"\bbar\.sync\s+10, 256;", ptx)),
        "bar_arrive_9": len(re.findall(r"\bbar\.arrive\s+9, 256;", ptx)),
        "bar_arrive_10": len(re.findall(r"\bbar\.arrive\s+10, 256;", ptx)),
        "mbarrier_init_counts": sorted({int(v) for v in re.findall(
            r"mbarrier\.init\.shared(?:::cta)?\.b64 \[[^\]]+\], (\d+);", ptx)}),
    }

out = {}
for name, N, base in json.loads(sys.argv[1]):
    a = torch.empty(4096, 1024, dtype=torch.bfloat16)
    b = torch.empty(1024, N, dtype=torch.bfloat16)
    for cfg_name in (name, base):
        cfg = km.SHIPPED_CONFIGS[cfg_name]
        for op in ("matmul_rmsnorm", "matmul_layernorm"):
            r = km.compile_sm90(op, a, b, config=cfg, ptxas=True)
            _, _, _, args, kw = km._prepare(a, b, None, None, 1e-5, km._NORM_OF_OP[op], cfg, need_cuda=False)
            ck = km._multi_cta_norm_kernel.warmup(*args, grid=(cfg.CLUSTER_SIZE,), **kw)  # cached: same kernel
            r["facts"] = facts(ck.asm["ptx"])
            out[f"{cfg_name}/{op}/{N}"] = r
        _, _, _, args, kw = km._prepare(a, b, None, None, None, "none", cfg, need_cuda=False)
        ck = km._multi_cta_norm_kernel.warmup(*args, grid=(cfg.CLUSTER_SIZE,), **kw)
        out[f"{cfg_name}/none/{N}"] = {"facts": facts(ck.asm["ptx"]), "shared_bytes": int(ck.metadata.shared),
                                       "ptxas": ptxas_info(ck.asm["ptx"])}
print(json.dumps(out))
"""

# (new config, target N, the config it is compared with)
JOBS = [("c4_defer_lnpack", 1024, "c4_lnpack"), ("c8_defer_lnpack", 2048, "c8_lnpack"),
        ("c4_pp_lnpack", 1024, "c4_defer_lnpack"), ("c8_pp_lnpack", 2048, "c8_defer_lnpack")]


@pytest.fixture(scope="module")
def compiled():
    return run_python_json_parallel(_SCRIPT, JOBS, timeout=600)  # two compile processes in parallel


def _no_spills(r, key):
    assert r["ptxas"]["spill_stores"] == 0 and r["ptxas"]["spill_loads"] == 0, (key, r["ptxas"])


@pytest.mark.parametrize("name, N, base", JOBS)
@pytest.mark.parametrize("op", ["matmul_rmsnorm", "matmul_layernorm", "none"])
def test_store_wait_deferred(compiled, name, N, base, op):
    r, rb = compiled[f"{name}/{op}/{N}"], compiled[f"{base}/{op}/{N}"]
    f, fb = r["facts"], rb["facts"]
    cfg = SHIPPED_CONFIGS[name]
    assert cfg.STORE_DEFER
    assert f["tma_stores"] >= cfg.NUM_CONSUMERS and f["wait_after_store"] == 0, (name, op, f)
    # one wait per consumer per tile (after the mainloop) + one per consumer before exit
    assert f["store_waits"] == 2 * cfg.NUM_CONSUMERS, (name, op, f)
    assert f["fence_proxy_async"] >= cfg.NUM_CONSUMERS, (name, op, f)
    if not SHIPPED_CONFIGS[base].STORE_DEFER:  # the default build waits right after every store
        assert fb["wait_after_store"] == fb["tma_stores"] > 0, (base, op, fb)
    _no_spills(r, (name, op))
    assert r["shared_bytes"] <= SMEM_LIMIT_BYTES, (name, op, r["shared_bytes"])
    if op != "none":
        assert 0 <= r["smem_estimate"] - r["shared_bytes"] <= 4096, (name, op, r["smem_estimate"], r["shared_bytes"])
        # the same per-element math (bit-identical results): same fp32 instruction count, same exchange
        for k in ("f32_arith", "selp_f32", "st_async", "st_async_b64"):
            assert r["ptx_extra"][k] == rb["ptx_extra"][k], (name, op, k, r["ptx_extra"][k], rb["ptx_extra"][k])


@pytest.mark.parametrize("name, N", [("c4_pp_lnpack", 1024), ("c8_pp_lnpack", 2048)])
@pytest.mark.parametrize("op", ["matmul_rmsnorm", "matmul_layernorm", "none"])
def test_pingpong_schedule(compiled, name, N, op):
    r = compiled[f"{name}/{op}/{N}"]
    f = r["facts"]
    cfg = SHIPPED_CONFIGS[name]
    assert cfg.PINGPONG and cfg.NUM_CONSUMERS == 2
    # consumer 0: wait 9 per tile + once at exit, arrive 10; consumer 1: arrive 9 at start + per tile, wait 10
    assert (f["bar_sync_9"], f["bar_arrive_10"], f["bar_arrive_9"], f["bar_sync_10"]) == (2, 1, 2, 1), (name, op, f)
    # every mbarrier counts 1 arrival: full, recv and empty (one consumer releases a slot; cooperative: 2)
    assert f["mbarrier_init_counts"] == [1], (name, op, f)
    assert 2 in compiled[f"{name.replace('_pp_', '_defer_')}/{op}/{N}"]["facts"]["mbarrier_init_counts"]
    _no_spills(r, (name, op))
    assert r["shared_bytes"] <= SMEM_LIMIT_BYTES, (name, op, r["shared_bytes"])
    if op == "none":
        return
    bn = cfg.block_n(N)
    assert (64 * cfg.BLOCK_K + cfg.BLOCK_K * bn) * 2 in r["expect_tx_bytes"] == sorted(r["expect_tx_bytes"]), r
    assert (cfg.BLOCK_M * cfg.BLOCK_K + cfg.BLOCK_K * bn) * 2 not in r["expect_tx_bytes"], r["expect_tx_bytes"]
    ex = r["ptx_extra"]
    C, nstat = cfg.CLUSTER_SIZE, (2 if op == "matmul_layernorm" else 1)
    packed = op == "matmul_layernorm"  # LN_PACKED
    assert ex["st_async"] == 2 * C * 2 * (1 if packed else nstat), (name, op, ex)  # per consumer, as cooperative
    assert nstat * 64 * 4 * (C - 1) in r["expect_tx_bytes"], (name, op, r["expect_tx_bytes"])
    assert ex["wgmma_wait_1"] >= 1 and cfg.CONSUMER_REGS in ex["setmaxnreg"], (name, op, ex)
    assert r["ttgir_cluster_sync"]["regions"] == [[2, 2]] * 3, (name, op, r["ttgir_cluster_sync"])
    # ping-pong does not change the epilogue math: same fp32 instruction count as the cooperative build
    base = compiled[f"{name.replace('_pp_', '_defer_')}/{op}/{N}"]["ptx_extra"]
    assert ex["f32_arith"] == base["f32_arith"], (name, op, ex["f32_arith"], base["f32_arith"])


def test_new_configs_and_flags():
    for name, cfg in SHIPPED_CONFIGS.items():
        if "_pp" in name:
            assert cfg.PINGPONG and cfg.STORE_DEFER, name
        if "_defer" in name:
            assert cfg.STORE_DEFER and not cfg.PINGPONG, name
    # every cluster size has a ping-pong config (the GPU self-check runs them all)
    assert {c.CLUSTER_SIZE for c in SHIPPED_CONFIGS.values() if c.PINGPONG} == {1, 2, 4, 8, 16}
    a, b = torch.empty(256, 64, dtype=torch.bfloat16), torch.empty(64, 1024, dtype=torch.bfloat16)
    for name, cfg in SHIPPED_CONFIGS.items():
        for norm in ("rms", "layer", "none"):
            if not cfg.supports(1024) or (cfg.RECOMPUTE_TILES and norm == "none"):  # (no GEMM of its own)
                continue
            kw = km._prepare(a, b, None, None, 1e-5, norm, cfg, need_cuda=False)[4]
            # (EPILOGUE_OVERLAP: its one-tile GEMM, matmul_cluster, runs with the deferred store)
            defer = cfg.STORE_DEFER or (cfg.EPILOGUE_OVERLAP and norm == "none" and cfg.TILES_PER_CTA == 1)
            assert kw.get("STORE_DEFER", False) == defer and kw.get("PINGPONG", False) == cfg.PINGPONG, (name, norm)
            if not (defer or cfg.PINGPONG):  # the old configs build the old kernels
                assert "STORE_DEFER" not in kw and "PINGPONG" not in kw, name
    c = TilingConfig
    assert c(PINGPONG=True).a_stage_rows == 64 and c().a_stage_rows == 128
    # the ping-pong ring is 1/6 smaller (40 KB stages): 197 KB for LayerNorm at c4, N = 1024
    assert c(PINGPONG=True, STORE_DEFER=True).smem_bytes(256) == c().smem_bytes(256) - 3 * 64 * 64 * 2
    assert c(CLUSTER_SIZE=16, PINGPONG=True, STORE_DEFER=True).supports(4096)  # no EPILOGUE_SUBTILE needed


@pytest.mark.parametrize("bad, match", [
    ({"PINGPONG": True, "NUM_CONSUMERS": 1, "BLOCK_M": 64}, "PINGPONG=True needs NUM_CONSUMERS=2"),
    ({"PINGPONG": True, "CLUSTER_SIZE": 4, "MULTICAST_A": True}, "PINGPONG=True with MULTICAST_A"),
    ({"STORE_DEFER": True, "EPILOGUE_SUBTILE": True}, "STORE_DEFER=True with EPILOGUE_SUBTILE"),
    ({"PINGPONG": True, "STORE_DEFER": True, "NUM_STAGES": 4, "BLOCK_N": 256}, "shared memory"),
    ({"PINGPONG": 1}, "bool"),
    ({"STORE_DEFER": "yes"}, "bool"),
])
def test_config_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        TilingConfig.from_dict(bad)


def test_ptx_fact_regexes():
    """The PTX patterns of the compile script match the instruction spellings they look for."""
    ptx = "\tbar.sync \t9, 256;\n\tbar.arrive \t10, 256;\n\tcp.async.bulk.wait_group.read \t0;\n"
    assert re.findall(r"\bbar\.sync\s+9, 256;", ptx) and re.findall(r"\bbar\.arrive\s+10, 256;", ptx)
    assert re.findall(r"cp\.async\.bulk\.wait_group\.read\s+0;", ptx)
