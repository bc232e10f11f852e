"""Tests of the ``kernels_tlx.lazy_prenorm`` variants that compute the statistics outside the consumer warpgroups
(``TilingConfig.STATS_IN_PRODUCER`` / ``STATS_WARPGROUP``; run with ``.venv-tlx/bin/python -m pytest tests/tlx``).

1. Compile-only for sm_90a of every shipped STATS_* config (RMSNorm and LayerNorm, and their GEMM) at the blog shape
   and the odd shapes (M = 1, K/N tails, K < BLOCK_K, the multi-wave tail shape): no spills (ptxas -v), the warp
   count (16 with the statistics warpgroup, 12 otherwise and for the GEMM), the mbarrier arrive counts (``empty``
   = NUM_CONSUMERS + 1, the two ``stats_full`` / ``stats_empty`` hand-off barriers; the GEMM keeps the plain ring),
   the consumers' wgmma windows free of shared loads (the statistics moved out), the setmaxnreg values.
2. The flat K-step sequence of the STATS_IN_PRODUCER producer (``_flat_steps`` / ``_flat_step``, the helpers the
   kernel calls) under ``TRITON_INTERPRET=1``: the same (tile, k) sequence as the consumers' nested loops.
3. Config validation.

Compile-only does not catch barrier-phase bugs or races: ``python -m kernels_tlx.lazy_prenorm`` on the GPU is the
correctness test (it covers these configs: they are in SHIPPED_CONFIGS / SHIPPED_LN_CONFIGS).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from kernels_tlx import lazy_prenorm as ktlx  # noqa: E402
from kernels_tlx.lazy_prenorm import SHIPPED_CONFIGS, SHIPPED_LN_CONFIGS, TilingConfig  # noqa: E402
from normfuse.compile_only import SMEM_LIMIT_BYTES  # noqa: E402
from normfuse.testing import run_python_json  # noqa: E402

# the in-loop kernel's (the cluster form's STATS_IN_PRODUCER: tests/tlx/test_lazy_prenorm_prod_tlx.py)
STATS_CONFIGS = {n: c for n, c in SHIPPED_CONFIGS.items() if c.stats_off_consumers and c.CLUSTER_SIZE == 1}
STATS_LN_CONFIGS = {n: c for n, c in SHIPPED_LN_CONFIGS.items() if c.stats_off_consumers and c.CLUSTER_SIZE == 1}
SHAPES = [(262144, 1024, 1024), (1, 1000, 1000), (129, 264, 8), (17793, 1000, 1000)]  # (M, N, K)

_COMPILE_SCRIPT = r"""
import json, re, sys, torch
from normfuse import compile_only
from normfuse.codestats import capture_compiled, ptxas_stats
compile_only.install(90)
from kernels_tlx import lazy_prenorm as K

jobs = json.loads(sys.argv[1])
out = {}
for key, op, cfg, (M, N, Kd) in jobs:
    a = torch.empty(M, Kd, dtype=torch.bfloat16)
    b = torch.empty(Kd, N, dtype=torch.bfloat16)
    with capture_compiled() as kernels:  # the kernel compile_sm90 summarized (one compile)
        s = K.compile_sm90(op, a, b, eps=1e-5, config=cfg)
    compiled, = kernels
    ptx = compiled.asm["ptx"]
    try:  # ptxas -v for sm_90a
        st = ptxas_stats(compiled)
    except RuntimeError:  # ptxas failed: reported as ptxas_ok = False
        st = None
    s["ptxas_ok"] = st is not None
    s["spill_stores"] = st and st["spill_st"]
    s["mbarrier_init_counts"] = sorted(int(x) for x in re.findall(r"mbarrier\.init\.shared::cta\.b64 \[[^]]+\], (\d+);", ptx))
    out[key] = s
print(json.dumps(out))
"""


def _jobs():
    jobs = []
    for name, cfg in STATS_CONFIGS.items():
        for op in ("matmul", "lazy_rmsnorm_matmul"):
            for shape in SHAPES:
                jobs.append([f"{name}/{op}/{'x'.join(map(str, shape))}", op, cfg.to_dict(), list(shape)])
    for name, cfg in STATS_LN_CONFIGS.items():
        for shape in SHAPES:
            jobs.append([f"{name}/{ktlx.LN_OP}/{'x'.join(map(str, shape))}", ktlx.LN_OP, cfg.to_dict(), list(shape)])
    return jobs


@pytest.fixture(scope="module")
def compiled() -> dict:
    return run_python_json(_COMPILE_SCRIPT, json.dumps(_jobs()), timeout=400)


def test_stats_configs_shipped():
    # both placements of the statistics, for both norms, are shipped (so the GPU self-check runs them)
    assert {c.STATS_IN_PRODUCER for c in STATS_CONFIGS.values()} == {True, False}
    assert {c.STATS_IN_PRODUCER for c in STATS_LN_CONFIGS.values()} == {True, False}
    for cfg in {**STATS_CONFIGS, **STATS_LN_CONFIGS}.values():
        assert TilingConfig.from_dict(cfg.to_dict()) == cfg
        assert not cfg.REUSE_RSTD and cfg.PERSISTENT
    assert STATS_CONFIGS["stats_producer"] == TilingConfig(STATS_IN_PRODUCER=True, CONSUMER_REGS=200)


@pytest.mark.parametrize("key", [j[0] for j in _jobs()])
def test_compile_sm90(compiled, key):
    name, op, _ = key.split("/")
    cfg = {**STATS_CONFIGS, **STATS_LN_CONFIGS}[name]
    s = compiled[key]
    m, x = s["ptx_markers"], s["ptx_extra"]
    assert s["ptxas_ok"] and s["spill_stores"] == 0, s
    assert m["wgmma"] > 0 and m["tma_load"] > 0 and s["smem_ok"] and s["shared_bytes"] <= SMEM_LIMIT_BYTES, s
    assert s["shared_bytes"] <= s["smem_estimate"] <= s["shared_bytes"] + 4096, s
    assert x["mbarrier_arrive_expect_tx"] == 1 and x["wgmma_wait_1"] == cfg.NUM_CONSUMERS, s
    assert cfg.CONSUMER_REGS in x["setmaxnreg"], s
    ns, nc = cfg.NUM_STAGES, cfg.NUM_CONSUMERS
    if op == "matmul":
        # the GEMM of a STATS_* config is the plain kernel: 12 warps, the plain ring, no statistics
        assert s["num_warps"] == cfg.num_warps_gemm == 12, s
        assert s["mbarrier_init_counts"] == sorted([1] * ns + [nc] * ns), s
        assert x["ld_shared_v4"] == 0, s
        return
    assert s["num_warps"] == cfg.num_warps_total == (16 if cfg.STATS_WARPGROUP else 12), s
    # full (1), empty (consumers + the statistics reader), stats_full (1) x 2, stats_empty (consumers) x 2
    assert s["mbarrier_init_counts"] == sorted([1] * ns + [nc + 1] * ns + [1, 1] + [nc, nc]), s
    # the statistics read the A tiles from shared memory, but no longer inside the consumers' wgmma windows
    assert x["ld_shared_v4"] > 0 and x["ld_shared_during_wgmma"] == 0, s
    assert x["branch_after_wgmma_commit"] == 0, s
    if cfg.STATS_WARPGROUP:
        assert cfg.STATS_REGS in x["setmaxnreg"], s
    else:
        assert 104 in x["setmaxnreg"], s  # the producer's share with CONSUMER_REGS = 200 (it needs ~64-80)


def test_stats_cost_only_the_handoff_in_shared_memory(compiled):
    # fused - GEMM = the double-buffered rstd (and d) sets + 4 mbarriers + the LayerNorm epilogue buffers
    for name, cfg in STATS_CONFIGS.items():
        for (M, N, K) in SHAPES:
            g = compiled[f"{name}/matmul/{M}x{N}x{K}"]["shared_bytes"]
            f = compiled[f"{name}/lazy_rmsnorm_matmul/{M}x{N}x{K}"]["shared_bytes"]
            assert 0 < f - g <= 2 * cfg.BLOCK_M * 4 + 256, (name, g, f)


# --------------------------------------------------------------------------------------------------------
# 2. the STATS_IN_PRODUCER flat step sequence, under the Triton interpreter
# --------------------------------------------------------------------------------------------------------
_SEQ_SCRIPT = r"""
import json, sys, torch, triton, triton.language as tl
from kernels_tlx.lazy_prenorm import TilingConfig, _flat_step, _flat_steps, _launch_args, _tile_coords, _tile_range

@triton.jit
def probe(flat_ptr, nest_ptr, M, N, K, max_steps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    base = tl.program_id(0) * max_steps * 4
    # the producer's flat loop (STATS_IN_PRODUCER)
    for j in range(0, _flat_steps(num_tiles, k_tiles)):
        t, ki, pid_m, pid_n = _flat_step(j, k_tiles, num_pid_m, num_pid_n, GROUP_M)
        tl.store(flat_ptr + base + j * 4 + 0, t)
        tl.store(flat_ptr + base + j * 4 + 1, ki)
        tl.store(flat_ptr + base + j * 4 + 2, pid_m)
        tl.store(flat_ptr + base + j * 4 + 3, pid_n)
    # the consumers' nested loops
    first, last, step = _tile_range(num_tiles, False)
    j = 0
    t = 0
    for tile_id in range(first, last, step):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M, False)
        for ki in range(0, k_tiles):
            tl.store(nest_ptr + base + j * 4 + 0, t)
            tl.store(nest_ptr + base + j * 4 + 1, ki)
            tl.store(nest_ptr + base + j * 4 + 2, pid_m)
            tl.store(nest_ptr + base + j * 4 + 3, pid_n)
            j += 1
        t += 1

out = {}
for key, cfg, (M, N, K) in json.loads(sys.argv[1]):
    cfg = TilingConfig.from_dict(cfg)
    a = torch.empty(M, K, dtype=torch.bfloat16)
    b = torch.empty(K, N, dtype=torch.bfloat16)
    c = torch.empty(M, N, dtype=torch.bfloat16)
    _, grid, _ = _launch_args(a, b, c, 1e-6, True, cfg, 132)
    num_tiles = -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
    max_steps = (num_tiles // grid[0] + 1) * -(-K // cfg.BLOCK_K)
    flat = torch.full((grid[0], max_steps, 4), -1, dtype=torch.int32)
    nest = torch.full((grid[0], max_steps, 4), -1, dtype=torch.int32)
    probe[grid](flat, nest, M, N, K, max_steps, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K,
                GROUP_M=cfg.GROUP_M)
    out[key] = {"flat": flat.tolist(), "nest": nest.tolist(), "grid": grid[0]}
print(json.dumps(out))
"""
_SEQ_CASES = {  # (M, N, K): tails, fewer tiles than SMs, several tiles per CTA with a K tail, K < BLOCK_K
    "stats_producer": [(1, 1000, 1000), (257, 520, 72), (4096, 2048, 200), (17793, 1000, 8)],
    "nonpersistent_producer": [(1000, 1000, 1000)],
}


@pytest.fixture(scope="module")
def sequences() -> dict:
    cfgs = {"stats_producer": STATS_CONFIGS["stats_producer"],
            "nonpersistent_producer": TilingConfig(STATS_IN_PRODUCER=True, CONSUMER_REGS=200, PERSISTENT=False)}
    jobs = [[f"{n}/{'x'.join(map(str, s))}", cfgs[n].to_dict(), list(s)] for n, shapes in _SEQ_CASES.items()
            for s in shapes]
    return run_python_json(_SEQ_SCRIPT, json.dumps(jobs), env={"TRITON_INTERPRET": "1"}, timeout=300)


@pytest.mark.parametrize("key", [f"{n}/{'x'.join(map(str, s))}" for n, shapes in _SEQ_CASES.items() for s in shapes])
def test_flat_producer_sequence_matches_consumers(sequences, key):
    r = sequences[key]
    M, N, K = map(int, key.split("/")[1].split("x"))
    assert r["flat"] == r["nest"]  # same (tile, k) sequence per CTA: the barrier phases depend on it
    steps = [t for cta in r["flat"] for t in cta if t[0] >= 0]
    k_tiles = -(-K // 64)
    assert len(steps) == -(-M // 128) * -(-N // 256) * k_tiles  # every (tile, k) once over all CTAs
    assert len({(t[2], t[3], t[1]) for t in steps}) == len(steps)


# --------------------------------------------------------------------------------------------------------
# 3. config validation
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, match", [
    ({"STATS_WARPGROUP": True}, "BLOCK_N <= 128"),  # 16 warps: ptxas compiles every thread for <= 128 registers
    ({"STATS_WARPGROUP": True, "BLOCK_N": 128, "NUM_STAGES": 4}, "register file"),  # 2 x 232 + 56 + producer
    ({"STATS_WARPGROUP": True, "BLOCK_N": 128, "NUM_STAGES": 4, "CONSUMER_REGS": 192, "STATS_REGS": 60},
     "multiple of 8"),
    ({"STATS_IN_PRODUCER": True, "REUSE_RSTD": True}, "REUSE_RSTD=False"),
    ({"STATS_WARPGROUP": True, "BLOCK_N": 128, "CONSUMER_REGS": 192, "REUSE_RSTD": True}, "REUSE_RSTD=False"),
    ({"STATS_WARPGROUP": True, "STATS_IN_PRODUCER": True, "BLOCK_N": 128, "CONSUMER_REGS": 192}, "exclusive"),
    ({"STATS_IN_PRODUCER": 1}, "bool"),
    ({"STATS_WARPGROUP": "yes"}, "bool"),
])
def test_stats_config_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        TilingConfig.from_dict(bad)


def test_stats_config_defaults():
    c = TilingConfig()
    assert c.STATS_WARPGROUP is False and c.STATS_IN_PRODUCER is False and c.STATS_REGS == 56
    assert not c.stats_off_consumers and c.num_warps_total == c.num_warps_gemm == 12
    w = STATS_CONFIGS["stats_warpgroup_bn128_s4"]
    assert w.stats_off_consumers and w.num_warps_total == 16 and w.num_warps_gemm == 12
    # the double-buffered hand-off is in the shared-memory estimate
    assert STATS_CONFIGS["stats_producer"].smem_bytes() == TilingConfig().smem_bytes() + 128 * 4 + 32
    # the other TLX kernels' register check keeps its two-argument form
    assert ktlx.consumer_register_errors(2, 232) == []
    assert ktlx.consumer_register_errors(2, 232, 56)
