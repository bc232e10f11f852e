"""Tests of ``kernels_tlx.norms`` (TLX venv: ``.venv-tlx/bin/python -m pytest tests/tlx/test_norms_tlx.py``).

1. Compile-only for sm_90 (TLX has no interpreter), in a subprocess (the fake driver is process-global): every
   shipped config x both ops (affine and not) at each of its ``TARGET_N`` plus a ragged N (masked tail; for
   clusters also a rank owning no valid column). Asserts shared memory within 227 KB, the warp count, no
   ptxas spills at the target N, and for cluster configs the DSMEM protocol in the PTX: cluster dims
   ``[C, 1, 1]``, grid ``M * C``, ``mapa``, one ``st.async ... complete_tx`` site per peer and exchange (each
   predicated: issued by one thread, matching the ``4 * (C - 1)`` expected bytes), one ``expect_tx`` and one
   ``mbarrier.try_wait`` per exchange, ``fence.mbarrier_init`` and exactly one cluster barrier; plain configs
   have none of these.
2. Config validation and input validation (in-process; raised before anything is compiled or launched).

Compile-only does not catch barrier-phase bugs, races, deadlocks or numerics: ``python -m kernels_tlx.norms``
on the H200 is the correctness test.
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

from kernels_tlx import norms as kn  # noqa: E402
from kernels_tlx.norms import DEFAULT_CONFIG, SHIPPED_CONFIGS, TARGET_N, TilingConfig  # noqa: E402
from normfuse.compile_only import SMEM_LIMIT_BYTES  # noqa: E402
from normfuse.testing import run_python_json, run_python_json_parallel  # noqa: E402

COMPILE_M = 4096
RAGGED_N = {1: 1000, 2: 20000, 4: 20000, 8: 20000}  # C=8: BLOCK_N 4096, ranks 5..7 own no column < N




# --------------------------------------------------------------------------------------------------------
# 1. compile-only for sm_90
# --------------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, sys, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import norms

jobs = json.loads(sys.argv[1])
out = {}
for name, N, M in jobs:
    cfg = norms.SHIPPED_CONFIGS[name]
    x = torch.empty(M, N, dtype=torch.bfloat16)  # never read
    for op in norms.OPS:
        for affine in (False, True):
            r = norms.compile_sm90(op, x, eps=1e-6, config=cfg, affine=affine)
            out[f"{name}/{op}/{M}x{N}/affine={affine}"] = r
print(json.dumps(out))
"""

_PTX_SCRIPT = r"""
import json, sys, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import norms
cfg = norms.TilingConfig(CLUSTER_SIZE=int(sys.argv[1]))
res = {}
for op in norms.OPS:
    ck = norms._launch(op, torch.empty(8, 32768, dtype=torch.bfloat16), None, None, 1e-5, cfg, need_cuda=False,
                       compile_only=True)[3]
    res[op] = ck.asm["ptx"]
print(json.dumps(res))
"""


def _jobs():
    jobs = []
    for name, cfg in SHIPPED_CONFIGS.items():
        for N in TARGET_N[name]:
            jobs.append((name, N, COMPILE_M))
        jobs.append((name, RAGGED_N[cfg.CLUSTER_SIZE], 1))  # ragged N, M = 1
    return jobs


@pytest.fixture(scope="module")
def compiled():
    return run_python_json_parallel(_COMPILE_SCRIPT, _jobs(), timeout=170)  # two compile processes in parallel


def test_every_shipped_config_targets_are_supported():
    assert set(TARGET_N) == set(SHIPPED_CONFIGS)
    assert SHIPPED_CONFIGS["default"] == DEFAULT_CONFIG
    covered = set()
    for name, cfg in SHIPPED_CONFIGS.items():
        for N in TARGET_N[name]:
            assert cfg.supports(N), (name, N)
            covered.add(N)
    assert covered >= {512, 1024, 2048, 4096, 8192, 16384, 32768}
    assert 3 <= len(SHIPPED_CONFIGS) <= 6


def test_compile_all_configs(compiled):
    assert len(compiled) == 4 * len(_jobs())
    for key, r in compiled.items():
        name, op, shape, _ = key.split("/")
        M, N = map(int, shape.split("x"))
        cfg = SHIPPED_CONFIGS[name]
        C = cfg.CLUSTER_SIZE
        ex = r["ptx_extra"]
        n_exch = 1 if op == "rms_norm" else 2
        assert r["smem_ok"] and r["shared_bytes"] <= SMEM_LIMIT_BYTES, key
        assert r["shared_bytes"] <= 4096, (key, r["shared_bytes"])  # registers hold the row; smem is scratch
        assert r["num_warps"] == cfg.num_warps, key
        assert r["block_n"] == cfg.block_n(N) and r["block_n"] * C >= N, key
        if N in TARGET_N[name]:
            assert r["ptxas"]["spill_stores"] == 0 and r["ptxas"]["spill_loads"] == 0, (key, r["ptxas"])
        if C == 1:
            assert r["grid"] == [-(-M // cfg.ROWS)], key
            assert r["cluster_dims"] in ([], [1, 1, 1]), key
            assert r["ptx_markers"]["mapa"] == 0 and ex["st_async"] == 0 and ex["barrier_cluster_arrive"] == 0, key
        else:
            assert r["grid"] == [M * C], key
            assert r["cluster_dims"] == [C, 1, 1], key
            # one st.async (+ a mapa for its slot and one for the peer's barrier) per static peer site per exchange
            assert ex["st_async"] == C * n_exch, (key, ex)
            assert ex["mbarrier_complete_tx"] == C * n_exch, (key, ex)
            assert r["ptx_markers"]["mapa"] == 2 * C * n_exch, (key, r["ptx_markers"])
            assert ex["mbarrier_expect_tx"] == n_exch and ex["mbarrier_try_wait"] == n_exch, (key, ex)
            assert ex["fence_mbarrier_init"] == 1, (key, ex)
            assert ex["barrier_cluster_arrive"] == 1 and ex["barrier_cluster_wait"] == 1, (key, ex)
            assert ex["cluster_ctarank"] >= 1, key


@pytest.mark.parametrize("C", [2, 8])
def test_cluster_ptx_protocol(C):
    """The DSMEM protocol in PTX order: init, expect_tx (4*(C-1) bytes, one thread), fence.mbarrier_init, cluster
    barrier, then predicated st.async into the peers, then the try_wait; the own slot is read back only after."""
    ptxs = run_python_json(_PTX_SCRIPT, str(C), timeout=170)
    for op, ptx in ptxs.items():
        n_exch = 1 if op == "rms_norm" else 2
        lines = [ln.strip() for ln in ptx.splitlines()]

        def idx(pattern):
            return [i for i, ln in enumerate(lines) if re.search(pattern, ln)]

        init, expect = idx(r"mbarrier\.init"), idx(r"mbarrier\.arrive\.expect_tx")
        fence, arrive = idx(r"fence\.mbarrier_init"), idx(r"barrier\.cluster\.arrive")
        wait = idx(r"barrier\.cluster\.wait")
        st_async, try_wait = idx(r"st\.async"), idx(r"mbarrier\.try_wait")
        assert len(init) == n_exch and len(expect) == n_exch, op
        assert max(init) < min(expect) <= max(expect) < fence[0] < arrive[0] < wait[0] < min(st_async), op
        for i in expect:
            assert re.search(rf", {4 * (C - 1)};$", lines[i]), (op, lines[i])  # bytes the C-1 peers push
        expect_pred = {re.match(r"@(%p\d+)", lines[i]).group(1) for i in expect}
        for i in st_async:  # one thread per CTA issues each remote store (else the tx count would over-complete)
            m = re.match(r"@(%p\d+) st\.async\.shared::cluster\.mbarrier::complete_tx::bytes\.b32", lines[i])
            assert m, (op, lines[i])
        st_pred = {re.match(r"@(%p\d+)", lines[i]).group(1) for i in st_async}
        assert st_pred == expect_pred, (op, st_pred, expect_pred)  # the same single-thread predicate
        # exchange e: its C st.async sites precede its try_wait, and exchange 2's stores follow exchange 1's wait
        for e in range(n_exch):
            sites = st_async[e * C:(e + 1) * C]
            assert max(sites) < try_wait[e], op
            if e:
                assert try_wait[e - 1] < min(sites), op


# --------------------------------------------------------------------------------------------------------
# 2. config and input validation
# --------------------------------------------------------------------------------------------------------
def test_config_defaults_and_round_trip():
    assert DEFAULT_CONFIG == TilingConfig() == TilingConfig.from_dict(None) == TilingConfig.from_dict({})
    for cfg in SHIPPED_CONFIGS.values():
        assert TilingConfig.from_dict(cfg.to_dict()) == cfg
        assert TilingConfig.from_dict(cfg) is cfg
    assert DEFAULT_CONFIG.block_n(1000) == 1024
    assert TilingConfig(CLUSTER_SIZE=4).block_n(32768) == 8192
    assert TilingConfig(CLUSTER_SIZE=8).block_n(20000) == 4096
    assert TilingConfig(BLOCK_N=2048).block_n(1) == 2048


@pytest.mark.parametrize("bad, match", [
    ({"BLOCK_N": 1000}, "power of 2"),
    ({"ROWS": 3}, "power of 2"),
    ({"num_warps": 6}, "power of 2"),
    ({"num_warps": 64}, "<= 32"),
    ({"CLUSTER_SIZE": 3}, "CLUSTER_SIZE"),
    ({"CLUSTER_SIZE": 16}, "CLUSTER_SIZE"),
    ({"CLUSTER_SIZE": 2, "ROWS": 2}, "ROWS"),
    ({"ROWS": 0}, "positive"),
    ({"BLOCK_N": True}, "positive"),
    ({"num_warps": 2.0}, "positive"),
    ({"BLOCK_N": 65536, "num_warps": 4}, "registers"),
    ({"ROWS": 128}, "ROWS"),
    ({"BLCK_N": 64}, "unknown"),
])
def test_config_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        TilingConfig.from_dict(bad)


def test_config_n_dependent_checks():
    with pytest.raises(ValueError, match="BLOCK_N \\* CLUSTER_SIZE"):
        TilingConfig(BLOCK_N=512).block_n(1000)
    with pytest.raises(ValueError, match="registers"):
        TilingConfig(ROWS=4, num_warps=4).block_n(8192)
    assert not TilingConfig(ROWS=4, num_warps=4).supports(8192)
    assert TilingConfig(CLUSTER_SIZE=2, BLOCK_N=512).supports(1000)
    with pytest.raises(TypeError):
        TilingConfig.from_dict([("ROWS", 2)])


@pytest.mark.parametrize("op", ["rms", "ln"])
def test_bad_inputs(op):
    fn = kn.rms_norm if op == "rms" else kn.layer_norm
    x = torch.randn(8, 64).to(torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        fn(x.float())  # fp32 is in the norms' contract of every DSL: validated, then refused only for the CPU
    with pytest.raises(TypeError):
        fn(x.to(torch.int32))
    with pytest.raises(TypeError):
        fn(x.float().numpy())
    with pytest.raises(ValueError):
        fn(x[None])  # rank
    with pytest.raises(ValueError, match="contiguous"):
        fn(torch.randn(16, 64).to(torch.bfloat16)[::2])
    with pytest.raises(ValueError, match="weight"):
        fn(x, torch.ones(32, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="weight"):
        fn(x, torch.ones(64, dtype=torch.float16))
    with pytest.raises(ValueError, match="eps"):
        fn(x, eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        fn(x, eps=float("nan"))
    with pytest.raises(ValueError, match="CUDA"):
        fn(x)  # CPU tensors
    with pytest.raises(ValueError, match="CUDA"):
        fn(x.half(), torch.ones(64, dtype=torch.float16))
    with pytest.raises(ValueError, match="power of 2"):
        fn(x, config={"ROWS": 3})
    with pytest.raises(ValueError, match="BLOCK_N"):
        fn(x, config={"BLOCK_N": 32})  # cannot hold a row of 64
    if op == "ln":
        with pytest.raises(ValueError, match="bias"):
            kn.layer_norm(x, None, torch.ones(63, dtype=torch.bfloat16))


def test_compile_sm90_rejects_unknown_op():
    with pytest.raises(ValueError, match="unknown op"):
        kn._launch("softmax", torch.empty(4, 64, dtype=torch.bfloat16), None, None, 1e-6, DEFAULT_CONFIG,
                   need_cuda=False, compile_only=True)


@pytest.mark.gpu
def test_shipped_norm_configs_correct_on_gpu():
    """Every config of configs/tiling/norms_h200.yaml for TLX, at the odd shapes of normfuse.gpu_checks."""
    from normfuse.gpu_checks import check_all

    failures = check_all("tlx", "norms")
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
def test_shipped_norm_configs_special_values_on_gpu():
    """TLX norms: large |x| matches the reference; a NaN stays in its own row."""
    from normfuse.gpu_checks import check_norm_special_values

    failures = check_norm_special_values("tlx")
    assert not failures, "\n".join(failures)
