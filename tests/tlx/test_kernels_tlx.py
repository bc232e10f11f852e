"""Tests of ``kernels_tlx.lazy_prenorm`` (run with the TLX venv: ``.venv-tlx/bin/python -m pytest tests/tlx``).

1. Compile-only for sm_90 (TLX has no interpreter): every shipped config (+ a single-consumer one), both ops,
   bf16, at the blog shape (M=262144, K=N=1024) and an odd shape (M=1, K=N=1000). Asserts wgmma, TMA,
   mbarrier and setmaxnreg in the PTX, shared memory within 227 KB (and close to ``TilingConfig.smem_bytes``),
   the warp count, the ``async_dot_wait(1)`` pipelining, no accumulator layout conversion (no ldmatrix), and
   -- for the fused op only -- shared-memory loads of the A tile issued between the wgmma commit and its wait
   (the sum of squares overlapping the MMA); with REUSE_RSTD / SHARED_RSTD, the sum of squares sits behind a
   branch right after the wgmma commit; with SHARED_RSTD, the fused kernel publishes rstd with 64-bit relaxed
   exchanges and polls it with ``ld.volatile.global.b64``, while its ``matmul`` is bit-identical PTX to the
   config without SHARED_RSTD. Subprocess: the fake driver is process-global.
1b. The tile schedule (``_tile_range``, ``_tile_coords``, ``_starts_row_run``: the very helpers both the
   producer and the consumers call) run under ``TRITON_INTERPRET=1`` in a plain Triton probe kernel: every tile
   exactly once, and with REUSE_RSTD the sum of squares is computed exactly on the first tile of every run of
   one M-tile within a CTA (so each reused rstd was stored by the same consumer for the same M-tile). For
   SHARED_RSTD (grouped order): every CTA walks increasing tile ids and every (m, n > 0) tile has a larger id
   than (m, 0), so no wait can close a cycle; also checked in plain Python over many shapes (partial groups) and
   by a wait-for simulation. The rstd slot helpers (pack, unpack, masked wait) run in the interpreter too.
2. Config validation and input validation (in-process; raised before anything is compiled or launched).
3. GPU (marker ``gpu``, skipped without CUDA): every shipped config through the sweep worker's check.

Compile-only does not catch barrier-phase bugs, races or deadlocks: the GPU check (3, or
``python -m kernels_tlx.lazy_prenorm``) is the correctness test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# fbtriton (TLX) only: in the upstream environment (e.g. `make test-gpu`) this module is skipped, not an error
pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from kernels_tlx import lazy_prenorm as ktlx  # noqa: E402
from kernels_tlx.lazy_prenorm import DEFAULT_CONFIG, SHIPPED_CONFIGS, TilingConfig  # noqa: E402
from normfuse.compile_only import SMEM_LIMIT_BYTES  # noqa: E402

COMPILE_SHAPES = [(262144, 1024, 1024), (1, 1000, 1000)]  # (M, N, K)


def _run_python(code: str, *argv: str, timeout: int = 170, interpret: bool = False) -> str:
    """Run ``code`` in a fresh interpreter at the repo root; return stdout, fail the test with stderr on error.
    ``interpret``: run with ``TRITON_INTERPRET=1`` (plain ``tl`` code only; TLX ops do not interpret)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"subprocess failed (rc={proc.returncode})\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc.stdout


# --------------------------------------------------------------------------------------------------------
# 1. compile-only for sm_90
# --------------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, sys, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx.lazy_prenorm import compile_sm90, OPS

configs, shapes = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {}
for name, cfg in configs.items():
    for (M, N, K) in shapes:
        a = torch.empty(M, K, dtype=torch.bfloat16)  # never read: only shape, dtype and alignment matter
        b = torch.empty(K, N, dtype=torch.bfloat16)
        for op in OPS:
            out[f"{name}/{op}/{M}x{N}x{K}"] = compile_sm90(op, a, b, eps=1e-6, config=None if name == "default" else cfg)
print(json.dumps(out))
"""
# every shipped config, plus accepted-but-unshipped single-consumer ones (BLOCK_M = 64, 8 warps)
COMPILE_CONFIGS = {**SHIPPED_CONFIGS, "single_consumer": TilingConfig(BLOCK_M=64, NUM_CONSUMERS=1),
                   "single_consumer_shared": TilingConfig(BLOCK_M=64, NUM_CONSUMERS=1, SHARED_RSTD=True)}


@pytest.fixture(scope="module")
def compiled() -> dict:
    cfgs = json.dumps({k: v.to_dict() for k, v in COMPILE_CONFIGS.items()})
    return json.loads(_run_python(_COMPILE_SCRIPT, cfgs, json.dumps(COMPILE_SHAPES)).strip().splitlines()[-1])


def test_compile_covers_every_shipped_config(compiled):
    assert set(SHIPPED_CONFIGS) >= {"default"} and SHIPPED_CONFIGS["default"] == DEFAULT_CONFIG
    assert len(compiled) == len(COMPILE_CONFIGS) * len(COMPILE_SHAPES) * len(ktlx.OPS)


@pytest.mark.parametrize("name", list(COMPILE_CONFIGS))
@pytest.mark.parametrize("op", ktlx.OPS)
@pytest.mark.parametrize("shape", COMPILE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_compile_sm90(compiled, name, op, shape):
    cfg = COMPILE_CONFIGS[name]
    M, N, K = shape
    s = compiled[f"{name}/{op}/{M}x{N}x{K}"]
    m, x = s["ptx_markers"], s["ptx_extra"]
    assert m["wgmma"] > 0 and m["tma_load"] > 0 and m["mbarrier"] > 0 and m["setmaxnreg"] > 0, s
    assert s["shared_bytes"] <= SMEM_LIMIT_BYTES and s["smem_ok"], s
    # the estimate used by TilingConfig validation is an upper bound, and tight
    assert s["shared_bytes"] <= s["smem_estimate"] <= s["shared_bytes"] + 4096, s
    assert s["num_warps"] == cfg.num_warps_total == 4 + 4 * cfg.NUM_CONSUMERS, s
    assert s["cluster_dims"] in ([], [1, 1, 1]), s
    # one producer arms each stage with one arrive.expect_tx; consumers keep one wgmma group in flight
    assert x["mbarrier_arrive_expect_tx"] == 1, s
    assert x["wgmma_wait_1"] == cfg.NUM_CONSUMERS and x["wgmma_wait_0"] >= cfg.NUM_CONSUMERS, s
    assert cfg.CONSUMER_REGS in x["setmaxnreg"], s
    # the epilogue scales and stores the accumulator in its wgmma layout (rstd goes through a 256-byte smem
    # round trip instead): an accumulator layout conversion would show up as ldmatrix
    assert x["ldmatrix"] == 0, s
    tiles = -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
    assert s["grid"] == [min(ktlx.H200_NUM_SMS, tiles) if cfg.PERSISTENT else tiles], s
    if op == "lazy_rmsnorm_matmul":
        # the sum of squares reads the A tile from shared memory while the wgmma is in flight
        assert x["ld_shared_v4"] > 0, s
        assert x["ld_shared_during_wgmma"] >= x["ld_shared_v4"] > 0, s
        # REUSE_RSTD / SHARED_RSTD: each consumer skips it (a branch right after its wgmma commit) on the N-tiles
        # that reuse rstd
        skips = cfg.REUSE_RSTD or cfg.SHARED_RSTD
        assert x["branch_after_wgmma_commit"] == (cfg.NUM_CONSUMERS if skips else 0), s
        if cfg.SHARED_RSTD:
            # each consumer publishes its rows with one relaxed 64-bit exchange and polls them with volatile 64-bit
            # loads (the first poll and the spin loop's)
            assert x["atom_exch_b64"] == cfg.NUM_CONSUMERS, s
            assert x["ld_volatile_global"] >= 2 * cfg.NUM_CONSUMERS, s
            assert s["grid"] == [min(ktlx.H200_NUM_SMS, tiles)], s  # persistent: all CTAs co-resident
    else:
        # the GEMM baseline is the same kernel without the norm: no vector shared loads at all
        assert x["ld_shared_v4"] == 0 and x["ld_shared_during_wgmma"] == 0, s
        assert x["branch_after_wgmma_commit"] == 0, s
    if not (op == "lazy_rmsnorm_matmul" and cfg.SHARED_RSTD):
        assert x["atom_exch_b64"] == 0 and x["ld_volatile_global"] == 0, s


def test_reuse_rstd_keeps_the_kernel_shape(compiled):
    # REUSE_RSTD changes the tile order and skips work; it allocates nothing and keeps the sum of squares code
    for name, cfg in COMPILE_CONFIGS.items():
        if not cfg.REUSE_RSTD:
            continue
        base = dataclasses.replace(cfg, REUSE_RSTD=False)
        twins = [n for n, c in COMPILE_CONFIGS.items() if c == base]
        assert twins, f"{name}: no shipped twin without REUSE_RSTD to compare with"
        for (M, N, K) in COMPILE_SHAPES:
            for op in ktlx.OPS:
                r = compiled[f"{name}/{op}/{M}x{N}x{K}"]
                b = compiled[f"{twins[0]}/{op}/{M}x{N}x{K}"]
                assert r["shared_bytes"] == b["shared_bytes"], (name, op, r, b)
                assert r["ptx_extra"]["ld_shared_v4"] == b["ptx_extra"]["ld_shared_v4"], (name, op, r, b)
                assert r["grid"] == b["grid"], (name, op, r, b)


def test_shared_rstd_keeps_the_gemm(compiled):
    # SHARED_RSTD leaves `matmul` alone (bit-identical PTX: the very same compile as its twin without it) and adds
    # only a few bytes of reduction scratch (the wait's all-rows-ready test) to the fused kernel
    n_shared = 0
    for name, cfg in COMPILE_CONFIGS.items():
        if not cfg.SHARED_RSTD:
            continue
        n_shared += 1
        base = dataclasses.replace(cfg, SHARED_RSTD=False)
        twins = [n for n, c in COMPILE_CONFIGS.items() if c == base]
        assert twins, f"{name}: no compiled twin without SHARED_RSTD to compare with"
        for (M, N, K) in COMPILE_SHAPES:
            key, twin = f"{name}/{{}}/{M}x{N}x{K}", f"{twins[0]}/{{}}/{M}x{N}x{K}"
            g, gb = compiled[key.format("matmul")], compiled[twin.format("matmul")]
            assert g["ptx_sha256"] == gb["ptx_sha256"] and g["shared_bytes"] == gb["shared_bytes"], (name, g, gb)
            f, fb = compiled[key.format("lazy_rmsnorm_matmul")], compiled[twin.format("lazy_rmsnorm_matmul")]
            assert 0 <= f["shared_bytes"] - fb["shared_bytes"] <= 64, (name, f, fb)
            assert f["ptx_extra"]["ld_shared_v4"] == fb["ptx_extra"]["ld_shared_v4"], (name, f, fb)
            assert f["grid"] == fb["grid"] and f["shared_bytes"] <= SMEM_LIMIT_BYTES, (name, f, fb)
    assert n_shared >= 3


def test_fused_costs_little_shared_memory(compiled):
    # fused = GEMM + the per-consumer rstd buffers (BLOCK_M fp32) and nothing else
    for name, cfg in COMPILE_CONFIGS.items():
        for (M, N, K) in COMPILE_SHAPES:
            g = compiled[f"{name}/matmul/{M}x{N}x{K}"]["shared_bytes"]
            f = compiled[f"{name}/lazy_rmsnorm_matmul/{M}x{N}x{K}"]["shared_bytes"]
            assert 0 <= f - g <= cfg.BLOCK_M * 4 + 256, (name, g, f)


# --------------------------------------------------------------------------------------------------------
# 1b. the tile schedule, run by the Triton interpreter
# --------------------------------------------------------------------------------------------------------
_SCHEDULE_SCRIPT = r"""
import json, sys, torch, triton, triton.language as tl
from kernels_tlx.lazy_prenorm import TilingConfig, _launch_args, _starts_row_run, _tile_coords, _tile_range

@triton.jit
def probe(out_ptr, M, N, max_tiles, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
          REUSE_RSTD: tl.constexpr):
    # the kernel's tile loop, verbatim (producer and consumers), recording what each iteration works on
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    first_tile, last_tile, tile_step = _tile_range(num_tiles, REUSE_RSTD)
    row = out_ptr + tl.program_id(0) * max_tiles * 4
    j = 0
    for tile_id in range(first_tile, last_tile, tile_step):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M, REUSE_RSTD)
        new_row = _starts_row_run(tile_id, first_tile, pid_n)
        tl.store(row + j * 4 + 0, tile_id)
        tl.store(row + j * 4 + 1, pid_m)
        tl.store(row + j * 4 + 2, pid_n)
        tl.store(row + j * 4 + 3, new_row.to(tl.int32))
        j += 1

out = {}
for key, cfg, (M, N) in json.loads(sys.argv[1]):
    cfg = TilingConfig.from_dict(cfg)
    a = torch.empty(M, 64, dtype=torch.bfloat16)
    b = torch.empty(64, N, dtype=torch.bfloat16)
    c = torch.empty(M, N, dtype=torch.bfloat16)
    _, grid, _ = _launch_args(a, b, c, 1e-6, True, cfg, 132)  # the host's grid for an H200
    num_tiles = -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
    max_tiles = num_tiles // grid[0] + 2
    res = torch.full((grid[0], max_tiles, 4), -1, dtype=torch.int32)
    probe[grid](res, M, N, max_tiles, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, GROUP_M=cfg.GROUP_M,
                REUSE_RSTD=cfg.REUSE_RSTD)
    out[key] = {"grid": grid[0], "runs": [[t for t in r if t[0] >= 0] for r in res.tolist()]}
print(json.dumps(out))
"""
# (M, N): single tile, M/N tails with fewer tiles than SMs, chunks starting inside an M-tile, and the GPU
# self-check's REUSE_RSTD tail shape (17793 = 139 * 128 + 1)
_SCHEDULE_SHAPES = [(1, 1000), (257, 520), (1000, 1000), (4096, 2048), (17793, 1000)]
_SCHEDULE_CONFIGS = {n: c for n, c in SHIPPED_CONFIGS.items()
                     if c.REUSE_RSTD or c.SHARED_RSTD or n in ("default", "bn128_s4")}


def _grouped_coords(t, num_pid_m, num_pid_n, group_m):
    """The default (grouped) order, written independently of the kernel."""
    per_group = group_m * num_pid_n
    first_m = (t // per_group) * group_m
    size_m = min(num_pid_m - first_m, group_m)
    return first_m + (t % per_group) % size_m, (t % per_group) // size_m


@pytest.fixture(scope="module")
def schedules() -> dict:
    jobs = [[f"{name}/{M}x{N}", cfg.to_dict(), [M, N]] for name, cfg in _SCHEDULE_CONFIGS.items()
            for (M, N) in _SCHEDULE_SHAPES]
    return json.loads(_run_python(_SCHEDULE_SCRIPT, json.dumps(jobs), interpret=True).strip().splitlines()[-1])


def _shared_rstd_waits_complete(runs, coords) -> bool:
    """Wait-for simulation of SHARED_RSTD: every CTA walks its tile list in order; a (m, n > 0) tile can finish only
    once (m, 0) has published (the writer publishes as part of its tile and waits on nothing). Any CTA whose
    current tile is ready advances; returns True iff every tile finishes (no CTA stuck forever in any order of
    progress, since the set of tiles that can finish only grows)."""
    published = set()
    pos = [0] * len(runs)
    progress = True
    while progress:
        progress = False
        for p, run in enumerate(runs):
            while pos[p] < len(run):
                m, n = coords(run[pos[p]])
                if n and m not in published:
                    break
                if n == 0:
                    published.add(m)
                pos[p] += 1
                progress = True
    return all(pos[p] == len(run) for p, run in enumerate(runs))


def test_schedule_configs_present():
    assert {"reuse_rstd", "reuse_rstd_bn128_s4", "shared_rstd", "shared_rstd_bn128_s4"} <= set(_SCHEDULE_CONFIGS)
    assert all(_SCHEDULE_CONFIGS[n].REUSE_RSTD for n in ("reuse_rstd", "reuse_rstd_bn128_s4"))
    assert all(_SCHEDULE_CONFIGS[n].SHARED_RSTD for n in ("shared_rstd", "shared_rstd_bn128_s4"))


@pytest.mark.parametrize("name", list(_SCHEDULE_CONFIGS))
@pytest.mark.parametrize("shape", _SCHEDULE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tile_schedule(schedules, name, shape):
    cfg = _SCHEDULE_CONFIGS[name]
    M, N = shape
    r = schedules[f"{name}/{M}x{N}"]
    num_pid_m, num_pid_n = -(-M // cfg.BLOCK_M), -(-N // cfg.BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    runs = r["runs"]
    assert r["grid"] == len(runs) == min(ktlx.H200_NUM_SMS, num_tiles)
    assert all(runs), "a CTA without tiles"
    # every output tile exactly once, over all CTAs
    assert sorted(t[0] for run in runs for t in run) == list(range(num_tiles))
    assert sorted((t[1], t[2]) for run in runs for t in run) == [(m, n) for m in range(num_pid_m)
                                                                 for n in range(num_pid_n)]
    if not cfg.REUSE_RSTD:
        for run in runs:
            for tid, pm, pn, _ in run:
                assert (pm, pn) == _grouped_coords(tid, num_pid_m, num_pid_n, cfg.GROUP_M)
            assert [t[0] for t in run] == sorted(t[0] for t in run)  # increasing tile ids within each CTA
        if cfg.SHARED_RSTD:
            # every wait (m, n > 0) -> (m, 0) points to a strictly smaller tile id, hence no cycle ...
            writer = {pm: tid for run in runs for tid, pm, pn, _ in run if pn == 0}
            assert len(writer) == num_pid_m
            assert all(tid > writer[pm] for run in runs for tid, pm, pn, _ in run if pn), (M, N)
            # ... and in every order of progress, all CTAs finish
            coords = {tid: (pm, pn) for run in runs for tid, pm, pn, _ in run}
            assert _shared_rstd_waits_complete([[t[0] for t in run] for run in runs], coords.__getitem__)
        return
    sizes = [len(run) for run in runs]
    assert max(sizes) - min(sizes) <= 1, sizes  # balanced chunks
    for run in runs:
        for j, (tid, pm, pn, new_row) in enumerate(run):
            assert (pm, pn) == divmod(tid, num_pid_n)  # m-major
            if j:
                assert tid == run[j - 1][0] + 1  # contiguous chunk
            # the sum of squares is computed exactly when this tile starts a run of its M-tile in this CTA;
            # otherwise the previous tile of this CTA was the same M-tile (the stored rstd is this row-tile's)
            starts = j == 0 or run[j - 1][1] != pm
            assert new_row == int(starts), (j, run[max(0, j - 1):j + 1])
            if not new_row:
                assert run[j - 1][1] == pm and run[j - 1][2] == pn - 1
    if (M, N) == (17793, 1000):
        # the GPU self-check shape really exercises reuse at every tail: the last M-tile (1 row) and the last,
        # partial N-tile reuse an rstd, and some chunks start inside an M-tile
        last = [t for run in runs for t in run if t[1] == num_pid_m - 1]
        assert len(last) == num_pid_n and sum(t[3] for t in last) == 1, last
        assert any(run[0][2] != 0 for run in runs)
        assert N % cfg.BLOCK_N and M % cfg.BLOCK_M <= cfg.rows_per_consumer


@pytest.mark.parametrize("group_m", [1, 3, 8])
def test_shared_rstd_writer_precedes_readers(group_m):
    """Plain-Python check of the SHARED_RSTD deadlock-freedom premise for the grouped order, over shapes with full
    and partial last groups, N below one tile, M = 1 and grids smaller and larger than the tile count: every
    (m, n > 0) tile id exceeds (m, 0)'s, each CTA's ids increase, and the wait-for simulation completes."""
    shapes = [(1, 1000), (129, 264), (257, 520), (1000, 1000), (1100, 4096), (17793, 1000), (4096, 2048),
              (9 * 128, 3 * 256), (262144, 1024)]
    checked_partial = False
    for M, N in shapes:
        for block_n in (128, 256):
            num_pid_m, num_pid_n = -(-M // 128), -(-N // block_n)
            num_tiles = num_pid_m * num_pid_n
            coords = [_grouped_coords(t, num_pid_m, num_pid_n, group_m) for t in range(num_tiles)]
            assert sorted(coords) == [(m, n) for m in range(num_pid_m) for n in range(num_pid_n)]
            first = {}
            for t, (m, n) in enumerate(coords):
                if n == 0:
                    first[m] = t
                else:
                    assert m in first and t > first[m], (M, N, block_n, group_m, t, m, n)
            checked_partial |= num_pid_m % group_m != 0 and num_pid_n > 1
            for grid in {min(ktlx.H200_NUM_SMS, num_tiles), min(7, num_tiles)}:
                runs = [list(range(p, num_tiles, grid)) for p in range(grid)]  # _tile_range's default order
                assert _shared_rstd_waits_complete(runs, coords.__getitem__), (M, N, block_n, group_m, grid)
    assert checked_partial or group_m == 1


def test_shared_rstd_simulation_detects_a_cycle():
    # the simulation is not vacuous: a reader ordered before its writer in the same CTA never finishes
    coords = {0: (0, 1), 1: (0, 0)}.__getitem__
    assert not _shared_rstd_waits_complete([[0, 1]], coords)
    assert _shared_rstd_waits_complete([[1], [0]], coords)


_SLOTS_SCRIPT = r"""
import json, struct, sys, torch, triton, triton.language as tl
from kernels_tlx.lazy_prenorm import _await_rstd, _pack_rstd, _unpack_rstd

@triton.jit
def publish(slots_ptr, rstd_ptr, M, epoch, BM: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    ok = rows < M
    rstd = tl.load(rstd_ptr + rows, mask=ok, other=0.0)
    tl.atomic_xchg(slots_ptr + rows, _pack_rstd(rstd, epoch), mask=ok, sem="relaxed", scope="gpu")

@triton.jit
def read(slots_ptr, out_ptr, M, epoch, BM: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    ok = rows < M
    ptrs = slots_ptr + rows
    word = tl.load(ptrs, mask=ok, other=0, volatile=True)
    word = _await_rstd(word, ptrs, ok, epoch)
    tl.store(out_ptr + rows, _unpack_rstd(word), mask=ok)

M, BM = 100, 64  # the second block has 36 rows in bounds; the slots past M hold a stale epoch
vals = torch.tensor([2.0 ** -20, 0.5, 1.0, 3.0e-3, 1.7e5] * 20, dtype=torch.float32)
slots = torch.zeros(128, dtype=torch.int64)
slots[M:] = (6 << 32) | 123  # rows past M: an older launch's words, never waited on
publish[(2, )](slots, vals, M, 7, BM=BM)
out = torch.zeros(128, dtype=torch.float32)
read[(2, )](slots, out, M, 7, BM=BM)
print(json.dumps({"hi": (slots[:M] >> 32).tolist(), "lo_bits": (slots[:M] & 0xFFFFFFFF).tolist(),
                  "want_bits": [struct.unpack("<I", struct.pack("<f", v))[0] for v in vals.tolist()],
                  "out": out[:M].tolist(), "vals": vals.tolist(), "tail": slots[M:].tolist()}))
"""


def test_rstd_slot_words_roundtrip_and_mask():
    """The slot helpers under the interpreter: (epoch << 32) | bits(rstd), bit-exact unpacking, and a wait that
    returns although the slots past M carry an old epoch (masked rows are never waited on)."""
    r = json.loads(_run_python(_SLOTS_SCRIPT, interpret=True, timeout=120).strip().splitlines()[-1])
    assert r["hi"] == [7] * 100
    assert r["lo_bits"] == r["want_bits"]
    assert r["out"] == r["vals"]
    assert r["tail"] == [(6 << 32) | 123] * 28


# --------------------------------------------------------------------------------------------------------
# 2. config and input validation
# --------------------------------------------------------------------------------------------------------
def test_config_defaults_and_roundtrip():
    assert TilingConfig.from_dict(None) == DEFAULT_CONFIG == TilingConfig()
    c = DEFAULT_CONFIG
    assert (c.BLOCK_M, c.BLOCK_N, c.BLOCK_K, c.GROUP_M, c.NUM_STAGES, c.NUM_CONSUMERS) == (128, 256, 64, 8, 3, 2)
    assert c.PERSISTENT is True and c.EPILOGUE_SUBTILE is False and c.CONSUMER_REGS == 232
    assert c.REUSE_RSTD is False
    assert (c.rows_per_consumer, c.acc_regs_per_thread, c.num_warps_total) == (64, 128, 12)
    assert TilingConfig.from_dict({}) == DEFAULT_CONFIG
    assert TilingConfig.from_dict(DEFAULT_CONFIG) is DEFAULT_CONFIG
    c2 = TilingConfig.from_dict({"BLOCK_N": 128, "NUM_STAGES": 4, "PERSISTENT": False})
    assert (c2.BLOCK_N, c2.NUM_STAGES, c2.PERSISTENT, c2.BLOCK_M) == (128, 4, False, 128)
    assert TilingConfig.from_dict(c2.to_dict()) == c2
    for name, cfg in SHIPPED_CONFIGS.items():
        assert TilingConfig.from_dict(cfg.to_dict()) == cfg, name
        assert cfg.smem_bytes() <= SMEM_LIMIT_BYTES, name
    # the REUSE_RSTD configs: the default / bn128_s4 tiles with the M-tile-major schedule
    assert SHIPPED_CONFIGS["reuse_rstd"] == dataclasses.replace(DEFAULT_CONFIG, REUSE_RSTD=True)
    assert SHIPPED_CONFIGS["reuse_rstd_bn128_s4"] == dataclasses.replace(SHIPPED_CONFIGS["bn128_s4"], REUSE_RSTD=True)
    assert TilingConfig.from_dict({"REUSE_RSTD": True}) == SHIPPED_CONFIGS["reuse_rstd"]
    # the SHARED_RSTD configs: the default / bn128_s4 tiles and order, rstd shared across CTAs
    assert c.SHARED_RSTD is False
    assert SHIPPED_CONFIGS["shared_rstd"] == dataclasses.replace(DEFAULT_CONFIG, SHARED_RSTD=True)
    assert SHIPPED_CONFIGS["shared_rstd_bn128_s4"] == dataclasses.replace(SHIPPED_CONFIGS["bn128_s4"],
                                                                          SHARED_RSTD=True)
    assert TilingConfig.from_dict({"SHARED_RSTD": True}) == SHIPPED_CONFIGS["shared_rstd"]
    for name in ("shared_rstd", "shared_rstd_bn128_s4"):
        cfg = SHIPPED_CONFIGS[name]
        assert cfg.PERSISTENT and not cfg.REUSE_RSTD and cfg.GROUP_M == 8, name
        # more than half of an SM's shared memory: one CTA per SM (the co-residency argument)
        assert SMEM_LIMIT_BYTES // 2 < cfg.smem_bytes() <= SMEM_LIMIT_BYTES, name
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_CONFIG.BLOCK_M = 64  # type: ignore[misc]


@pytest.mark.parametrize("bad, match", [
    ({"BLOCK_MM": 64}, "valid keys"),
    ({"block_m": 64}, "BLOCK_M"),  # the message lists the valid keys
    ({"name": "default"}, "valid keys"),
    ({"BLOCK_M": 96}, "power of 2"),
    ({"BLOCK_N": 96}, "power of 2"),
    ({"BLOCK_K": 48}, "power of 2"),
    ({"BLOCK_N": 512}, "BLOCK_N"),
    ({"BLOCK_N": 16}, "BLOCK_N"),
    ({"BLOCK_K": 8}, "BLOCK_K"),
    ({"BLOCK_K": 256}, "BLOCK_K"),
    ({"BLOCK_M": 0}, "positive integer"),
    ({"BLOCK_M": 128.0}, "integer"),
    ({"BLOCK_M": True}, "integer"),
    ({"NUM_STAGES": "3"}, "integer"),
    ({"GROUP_M": 0}, "GROUP_M"),
    ({"NUM_STAGES": 1}, "NUM_STAGES"),
    ({"NUM_STAGES": 9}, "NUM_STAGES"),
    ({"NUM_CONSUMERS": 4}, "NUM_CONSUMERS"),
    ({"NUM_CONSUMERS": 3}, "power of 2"),
    ({"BLOCK_M": 64}, "must be 64"),  # 2 consumers x 32 rows: below one wgmma
    ({"BLOCK_M": 256}, "must be 64"),  # 128 rows per warpgroup: not offered
    ({"BLOCK_M": 128, "NUM_CONSUMERS": 1}, "must be 64"),
    ({"CONSUMER_REGS": 236}, "multiple of 8"),
    ({"CONSUMER_REGS": 248}, "register file"),
    ({"CONSUMER_REGS": 160}, "accumulator registers"),  # 64 x 256 fp32 = 128 regs/thread + 64
    ({"NUM_STAGES": 4}, "shared memory"),  # 4 x 48 KB ring + 64 KB epilogue staging > 227 KB
    ({"NUM_STAGES": 5, "EPILOGUE_SUBTILE": True}, "shared memory"),
    ({"BLOCK_K": 128, "NUM_STAGES": 3}, "shared memory"),
    ({"PERSISTENT": 1}, "bool"),
    ({"EPILOGUE_SUBTILE": "yes"}, "bool"),
    ({"REUSE_RSTD": 1}, "bool"),
    ({"REUSE_RSTD": True, "PERSISTENT": False}, "needs PERSISTENT"),
    ({"SHARED_RSTD": 1}, "bool"),
    ({"SHARED_RSTD": True, "PERSISTENT": False}, "SHARED_RSTD=True needs PERSISTENT"),
    ({"SHARED_RSTD": True, "REUSE_RSTD": True}, "exclusive"),
])
def test_config_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        TilingConfig.from_dict(bad)


def test_config_type_errors():
    with pytest.raises(TypeError):
        TilingConfig.from_dict([("BLOCK_M", 64)])
    with pytest.raises(TypeError):
        TilingConfig.from_dict("default")
    a = torch.randn(16, 16).half()
    with pytest.raises(TypeError):
        ktlx.matmul(a, a, config="default")


def _ab(M=16, K=16, N=16, dtype=torch.bfloat16):
    return torch.randn(M, K).to(dtype), torch.randn(K, N).to(dtype)


@pytest.mark.parametrize("fn", ["matmul", "lazy_rmsnorm_matmul"])
def test_input_errors(fn):
    f = getattr(ktlx, fn)
    a, b = _ab()
    with pytest.raises(TypeError):  # mixed dtypes
        f(a, b.float())
    with pytest.raises(TypeError, match="bf16 and fp16"):  # fp32 is valid for the technique, not for this kernel
        f(a.float(), b.float())
    with pytest.raises(TypeError):  # unsupported dtype
        f(a.to(torch.int32), b.to(torch.int32))
    with pytest.raises(TypeError):  # not a tensor
        f(a.float().numpy(), b)
    with pytest.raises(ValueError):  # rank
        f(a[None], b)
    with pytest.raises(ValueError):  # inner dims differ
        f(a, torch.randn(24, 16).bfloat16())
    with pytest.raises(ValueError):  # non-contiguous
        f(torch.randn(32, 16).bfloat16()[::2], b)
    with pytest.raises(ValueError, match="multiple of 8"):  # K not a multiple of 8 (TMA 16-byte rows)
        f(torch.randn(16, 12).bfloat16(), torch.randn(12, 16).bfloat16())
    with pytest.raises(ValueError, match="multiple of 8"):  # N not a multiple of 8
        f(a, torch.randn(16, 20).bfloat16())
    with pytest.raises(ValueError, match="power of 2"):  # bad config through the public function
        f(a, b, config={"BLOCK_M": 96})
    with pytest.raises(ValueError, match="valid keys"):
        f(a, b, config={"BLOCKM": 64})
    with pytest.raises(ValueError, match="CUDA"):  # valid inputs, but CPU tensors (TLX has no interpreter)
        f(a, b)


def test_eps_errors():
    a, b = _ab()
    for eps in (0.0, -1e-6, float("nan"), float("inf"), "1e-6", None, True):
        with pytest.raises(ValueError, match="eps"):
            ktlx.lazy_rmsnorm_matmul(a, b, eps=eps)


def test_compile_sm90_argument_errors():
    # raised before anything is compiled, so no fake driver is needed
    a, b = _ab()
    with pytest.raises(ValueError, match="unknown op"):
        ktlx.compile_sm90("rmsnorm", a, b)
    with pytest.raises(TypeError, match="bf16 and fp16"):
        ktlx.compile_sm90("matmul", a.float(), b.float())
    # contiguous but misaligned view (base 2 bytes off): TMA descriptors need 16-byte aligned bases
    flat = torch.empty(16 * 16 + 1, dtype=torch.bfloat16)
    a_mis = flat[1:].view(16, 16)
    assert a_mis.is_contiguous() and a_mis.data_ptr() % 16
    with pytest.raises(ValueError, match="16-byte aligned"):
        ktlx.compile_sm90("matmul", a_mis, b)
    with pytest.raises(ValueError, match="eps"):
        ktlx.compile_sm90("lazy_rmsnorm_matmul", a, b, eps=0.0)
    with pytest.raises(ValueError, match="shared memory"):
        ktlx.compile_sm90("matmul", a, b, config={"NUM_STAGES": 6})


def test_shared_rstd_launch_args():
    """Host side of SHARED_RSTD (CPU tensors; nothing is launched): the fused op gets the slot buffer, the epoch,
    SHARED_RSTD=True and a cooperative launch; ``matmul`` of the same config gets exactly the default GEMM's
    arguments; a bad buffer or epoch is refused."""
    a, b = _ab(M=300, K=64, N=512)
    c = torch.empty(300, 512, dtype=torch.bfloat16)
    cfg = SHIPPED_CONFIGS["shared_rstd"]
    slots = torch.zeros(300, dtype=torch.int64)
    args, grid, kw = ktlx._launch_args(a, b, c, 1e-6, True, cfg, 132, slots, 5)
    assert args[3] is slots and args[4] == 5 and args[5:8] == (300, 512, 64)
    assert kw["SHARED_RSTD"] is True and kw["REUSE_RSTD"] is False and kw["FUSE_RMSNORM"] is True
    assert kw.get("launch_cooperative_grid") is ktlx._COOPERATIVE_SHARED_RSTD
    assert grid == (min(132, 3 * 2), )
    for fuse, config in ((False, cfg), (False, DEFAULT_CONFIG), (True, DEFAULT_CONFIG)):
        args, grid_, kw = ktlx._launch_args(a, b, c, 1e-6, fuse, config, 132, slots, 5)
        assert args[3] is None and args[4] is None and kw["SHARED_RSTD"] is False and grid_ == grid
        assert "launch_cooperative_grid" not in kw
    g_shared = ktlx._launch_args(a, b, c, None, False, cfg, 132)[2]
    g_default = ktlx._launch_args(a, b, c, None, False, DEFAULT_CONFIG, 132)[2]
    assert g_shared == g_default  # matmul of a SHARED_RSTD config: the default GEMM, same compile
    args = ktlx._launch_args(a, b, c, 1e-6, True, cfg, 132)[0]  # compile-only: a fresh zeroed buffer
    assert args[3].dtype == torch.int64 and args[3].numel() == 300 and not args[3].any() and args[4] == 1
    for bad_slots, epoch in ((torch.zeros(299, dtype=torch.int64), 5), (slots.int(), 5), (slots, 0),
                             (slots, 2**31)):
        with pytest.raises(ValueError, match="SHARED_RSTD"):
            ktlx._launch_args(a, b, c, 1e-6, True, cfg, 132, bad_slots, epoch)


def test_rstd_slots_and_epochs(monkeypatch):
    """Slot buffers: zeroed, one per (device, stream), grown to the largest M; epochs: new on every call, starting
    at 1, and a wrap-around past 2**31 - 1 zeroes every buffer before epoch 1 is handed out again."""
    monkeypatch.setattr(ktlx, "_RSTD_SLOTS", {})
    monkeypatch.setattr(ktlx, "_rstd_epoch", 0)
    cpu = torch.device("cpu")
    s1 = ktlx._rstd_slots(cpu, 100)
    assert s1.dtype == torch.int64 and s1.numel() == 100 and not s1.any()
    assert ktlx._rstd_slots(cpu, 60) is s1 and ktlx._rstd_slots(cpu, 100) is s1  # smaller M: same buffer
    s1.fill_((3 << 32) | 77)  # words of earlier launches stay (never cleared between launches)
    assert ktlx._rstd_slots(cpu, 100) is s1 and s1.all()
    s2 = ktlx._rstd_slots(cpu, 150)  # larger M: a fresh zeroed buffer, at least doubled
    assert s2 is not s1 and s2.numel() == 200 and not s2.any()
    other = ktlx._rstd_slots(cpu, 10, stream=1234)  # another stream never shares slots
    assert other is not s2 and ktlx._rstd_slots(cpu, 150) is s2
    assert [ktlx._next_epoch() for _ in range(3)] == [1, 2, 3]
    monkeypatch.setattr(ktlx, "_rstd_epoch", ktlx._EPOCH_MAX - 1)
    s2.fill_(ktlx._EPOCH_MAX << 32)
    assert ktlx._next_epoch() == ktlx._EPOCH_MAX and s2.all()
    assert ktlx._next_epoch() == 1 and not s2.any() and not other.any()  # wrapped: all slots zeroed
    assert ktlx._EPOCH_MAX == 2**31 - 1  # travels as an i32 kernel argument


def test_self_check_dry_run_on_cpu(monkeypatch, capsys):
    """Run the GPU self-check script (``python -m kernels_tlx.lazy_prenorm``) end to end on the CPU with torch
    stand-ins for the kernels, so that a Python error in it cannot waste GPU time. One stand-in is wrong on
    purpose for one config: the script must report it and exit 1."""
    import triton.testing

    def fake_matmul(a, b, *, config=None):
        return (a.float() @ b.float()).to(a.dtype)

    def fake_fused(a, b, *, eps=1e-6, config=None):
        from normfuse.techniques import lazy_prenorm as T

        out = (T.rstd(a, eps)[:, None] * (a.float() @ b.float())).to(a.dtype)
        return out * 2 if config is SHIPPED_CONFIGS["nonpersistent"] else out  # deliberately wrong once

    monkeypatch.setattr(ktlx, "_DEVICE", "cpu")
    monkeypatch.setattr(ktlx, "_CHECK_SHAPES", [(1, 24, 40), (70, 48, 16)])
    monkeypatch.setattr(ktlx, "_BENCH_SHAPES", [(64, 32, 32)])
    monkeypatch.setattr(ktlx, "matmul", fake_matmul)
    monkeypatch.setattr(ktlx, "lazy_rmsnorm_matmul", fake_fused)
    monkeypatch.setattr(ktlx, "_num_sms", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "fake")
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **k: (fn(), 1.0)[1])
    rc = ktlx._self_check(["--hang-timeout", "60"])
    out = capsys.readouterr().out
    assert rc == 1, out
    n_shared = sum(c.SHARED_RSTD for c in SHIPPED_CONFIGS.values())
    n_runs = len(SHIPPED_CONFIGS) * 2 * 2 + n_shared * 2  # + SHARED_RSTD's relaunch on rescaled rows per shape
    assert out.count("[run ]") == n_runs and out.count(" ok  ") == n_runs - 2, out
    assert out.count("fused relaunch") == n_shared * 2 and n_shared == 2, out
    assert "2 FAILURE(S): nonpersistent lazy_rmsnorm_matmul" in out, out
    assert out.count(" TFLOP/s\n") == 1 + 2 * len(SHIPPED_CONFIGS) and "hidden" in out and "GB/s" in out, out
    for name in ("reuse_rstd", "reuse_rstd_bn128_s4"):  # the REUSE_RSTD configs are checked and timed too
        assert out.count(f"[run ] {name} ") == 2 * 2, out
        assert f"tlx fused  [{name}]" in out and f"tlx matmul [{name}]" in out, out
    for name in ("shared_rstd", "shared_rstd_bn128_s4"):  # and the SHARED_RSTD ones, with their relaunch check
        assert out.count(f"[run ] {name} ") == 2 * 3, out
        assert f"tlx fused  [{name}]" in out and f"tlx matmul [{name}]" in out, out
    assert ktlx._self_check(["--config", "reuse_rstd", "--config", "reuse_rstd_bn128_s4", "--no-bench"]) == 0
    assert ktlx._self_check(["--config", "default", "--no-bench"]) == 0

    # the relaunch check catches a stale rstd: a fused stand-in that keeps the first launch's rstd per shape
    kept = {}

    def stale_fused(a, b, *, eps=1e-6, config=None):
        from normfuse.techniques import lazy_prenorm as T

        r = kept.setdefault(a.shape, T.rstd(a, eps))
        return (r[:, None] * (a.float() @ b.float())).to(a.dtype)

    monkeypatch.setattr(ktlx, "lazy_rmsnorm_matmul", stale_fused)
    capsys.readouterr()
    assert ktlx._self_check(["--config", "shared_rstd", "--no-bench"]) == 1
    out = capsys.readouterr().out
    assert "2 FAILURE(S): shared_rstd fused relaunch" in out, out


# --------------------------------------------------------------------------------------------------------
# 3. GPU correctness of every shipped config (needs an sm_90 GPU and fbtriton)
# --------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(SHIPPED_CONFIGS))
def test_shipped_configs_correct_on_gpu(name):
    from normfuse.gpu_checks import ODD_SHAPES
    from normfuse.worker import measure

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the TLX kernel targets sm_90 (wgmma, setmaxnreg)")
    cfg = SHIPPED_CONFIGS[name].to_dict()
    failures = []
    # + the REUSE_RSTD tail shape (ODD_SHAPES have <= 132 tiles: one tile per CTA, so no rstd is ever reused)
    shapes = list(ODD_SHAPES) + [(17793, 1000, 1000)]
    for impl in ("gemm", "fused"):
        for seed, (M, N, K) in enumerate(shapes):
            req = {"technique": "lazy_prenorm", "dsl": "tlx", "impl": impl, "M": M, "N": N, "K": K,
                   "dtype": "bf16", "eps": 1e-6, "config": cfg, "mode": "gpu", "seed": 1000 + seed,
                   "check_only": True}
            r = measure(req)
            if r["status"] != "ok":
                failures.append(f"{name}/{impl} at {M}x{N}x{K}: {r['status']} {r.get('error', '')}")
    assert not failures, "\n".join(failures)
