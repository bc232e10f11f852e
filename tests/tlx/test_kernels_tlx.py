"""Tests of ``kernels_tlx.lazy_prenorm`` (run with the TLX venv: ``.venv-tlx/bin/python -m pytest tests/tlx``).

1. Compile-only for sm_90 (TLX has no interpreter): every shipped config (+ a single-consumer one), both ops,
   bf16, at the blog shape (M=262144, K=N=1024) and an odd shape (M=1, K=N=1000). Asserts wgmma, TMA,
   mbarrier and setmaxnreg in the PTX, shared memory within 227 KB (and close to ``TilingConfig.smem_bytes``),
   the warp count, the ``async_dot_wait(1)`` pipelining, no accumulator layout conversion (no ldmatrix), and
   -- for the fused op only -- shared-memory loads of the A tile issued between the wgmma commit and its wait
   (the sum of squares overlapping the MMA); with REUSE_RSTD, the sum of squares sits behind a branch right
   after the wgmma commit. Subprocess: the fake driver is process-global.
1b. The tile schedule (``_tile_range``, ``_tile_coords``, ``_starts_row_run``: the very helpers both the
   producer and the consumers call) run under ``TRITON_INTERPRET=1`` in a plain Triton probe kernel: every tile
   exactly once, and with REUSE_RSTD the sum of squares is computed exactly on the first tile of every run of
   one M-tile within a CTA (so each reused rstd was stored by the same consumer for the same M-tile).
2. Config validation and input validation (in-process; raised before anything is compiled or launched).
3. GPU (marker ``gpu``, skipped without CUDA): every shipped config through the sweep worker's check.
4. LayerNorm (``lazy_layernorm_matmul``): sm_90 compile of ``SHIPPED_LN_CONFIGS`` (+ BLOCK_N = 128 twins) at an
   EVEN_K and two K-tail shapes (the extra k16 register-A wgmma, its fence, no spills, no wgmma serialization; the
   broadcast epilogue's spills at BLOCK_N = 256), input errors, the self-check's LayerNorm part, and the GPU check
   (also with mean-shifted inputs).

Compile-only does not catch barrier-phase bugs, races or deadlocks: the GPU check (3, or
``python -m kernels_tlx.lazy_prenorm``) is the correctness test.
"""

from __future__ import annotations

import dataclasses
import json
import sys
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
from normfuse.testing import run_python_json  # noqa: E402

COMPILE_SHAPES = [(262144, 1024, 1024), (1, 1000, 1000)]  # (M, N, K)




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
# every shipped config, plus an accepted-but-unshipped single-consumer one (BLOCK_M = 64, 8 warps); the configs
# with the statistics off the consumers (STATS_IN_PRODUCER / STATS_WARPGROUP) are compiled and checked in
# tests/tlx/test_lazy_prenorm_stats_tlx.py
# (the cluster form, CLUSTER_SIZE > 1, serves one N range and is another kernel: tests/tlx/test_lazy_prenorm_cluster_tlx.py)
COMPILE_CONFIGS = {**{n: c for n, c in SHIPPED_CONFIGS.items() if not c.stats_off_consumers and c.CLUSTER_SIZE == 1 and not c.A_FROM_REGS},
                   "single_consumer": TilingConfig(BLOCK_M=64, NUM_CONSUMERS=1)}


@pytest.fixture(scope="module")
def compiled() -> dict:
    cfgs = json.dumps({k: v.to_dict() for k, v in COMPILE_CONFIGS.items()})
    return run_python_json(_COMPILE_SCRIPT, cfgs, json.dumps(COMPILE_SHAPES), timeout=170)


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
        # REUSE_RSTD: each consumer skips it (a branch right after its wgmma commit) on the reused N-tiles
        assert x["branch_after_wgmma_commit"] == (cfg.NUM_CONSUMERS if cfg.REUSE_RSTD else 0), s
    else:
        # the GEMM baseline is the same kernel without the norm: no vector shared loads at all
        assert x["ld_shared_v4"] == 0 and x["ld_shared_during_wgmma"] == 0, s
        assert x["branch_after_wgmma_commit"] == 0, s


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
_SCHEDULE_CONFIGS = {n: c for n, c in SHIPPED_CONFIGS.items() if c.REUSE_RSTD or n in ("default", "bn128_s4")}


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
    return run_python_json(_SCHEDULE_SCRIPT, json.dumps(jobs), env={"TRITON_INTERPRET": "1"}, timeout=170)


def test_schedule_configs_present():
    assert {"reuse_rstd", "reuse_rstd_bn128_s4"} <= set(_SCHEDULE_CONFIGS)
    assert all(_SCHEDULE_CONFIGS[n].REUSE_RSTD for n in ("reuse_rstd", "reuse_rstd_bn128_s4"))


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
    from normfuse.testing import assert_rejects_bad_inputs

    f = getattr(ktlx, fn)
    assert_rejects_bad_inputs(f, torch.bfloat16, {"BLOCK_M": 96})
    a, b = _ab()
    with pytest.raises(TypeError, match="bf16 and fp16"):  # fp32 is valid for the technique, not for this kernel
        f(a.float(), b.float())
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
    monkeypatch.setattr(ktlx, "_CLUSTER_CHECK_SHAPES", [])  # (the cluster configs then serve none of the shapes)
    monkeypatch.setattr(ktlx, "_BENCH_SHAPES", [(64, 32, 32)])
    monkeypatch.setattr(ktlx, "matmul", fake_matmul)
    monkeypatch.setattr(ktlx, "lazy_rmsnorm_matmul", fake_fused)
    monkeypatch.setattr(ktlx, "_num_sms", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "fake")
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **k: (fn(), 1.0)[1])
    rc = ktlx._self_check(["--variant", "rmsnorm", "--hang-timeout", "60"])
    out = capsys.readouterr().out
    assert rc == 1, out
    n_cfg = sum(c.CLUSTER_SIZE == 1 for c in SHIPPED_CONFIGS.values())  # the cluster form serves N > 256 only
    n_runs = n_cfg * 2 * 2
    assert out.count("[run ]") == n_runs and out.count(" ok  ") == n_runs - 2, out
    assert "2 FAILURE(S): nonpersistent lazy_rmsnorm_matmul" in out, out
    assert out.count(" TFLOP/s\n") == 1 + 2 * n_cfg and "hidden" in out and "GB/s" in out, out
    assert "[run ] cluster_c2 " not in out and "[cluster_c2] does not serve N=32: not timed" in out, out
    for name in ("reuse_rstd", "reuse_rstd_bn128_s4"):  # the REUSE_RSTD configs are checked and timed too
        assert out.count(f"[run ] {name} ") == 2 * 2, out
        assert f"tlx fused  [{name}]" in out and f"tlx matmul [{name}]" in out, out
    # --config alone selects among both variants' configs (these are RMSNorm ones, so only RMSNorm runs)
    assert ktlx._self_check(["--config", "reuse_rstd", "--config", "reuse_rstd_bn128_s4", "--no-bench"]) == 0
    assert ktlx._self_check(["--config", "default", "--no-bench"]) == 0


# --------------------------------------------------------------------------------------------------------
# 3. GPU correctness of every shipped config (needs an sm_90 GPU and fbtriton)
# --------------------------------------------------------------------------------------------------------
def _served_shapes(cfg, shapes):
    """The (M, N, K) of ``shapes`` a config serves; for the cluster form (one N range) also the self-check's cluster
    shapes. Never empty: a config must be checked somewhere."""
    served = ktlx._served_shapes(cfg, shapes, ktlx._CLUSTER_CHECK_SHAPES)
    assert served, f"{cfg} serves none of {shapes}"
    return served


def test_served_shapes_cover_every_shipped_config():
    for cfg in list(SHIPPED_CONFIGS.values()) + list(ktlx.SHIPPED_LN_CONFIGS.values()):
        served = _served_shapes(cfg, [(1, 1000, 1000), (300, 2000, 264)])
        assert cfg.CLUSTER_SIZE > 1 or len(served) == 2


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
    # + the REUSE_RSTD tail shape (ODD_SHAPES have <= 132 tiles: one tile per CTA, so no rstd is ever reused); the
    # cluster form serves one N range: the shapes it serves, plus the self-check's cluster shapes
    shapes = _served_shapes(SHIPPED_CONFIGS[name], list(ODD_SHAPES) + [(17793, 1000, 1000)])
    for impl in ("gemm", "fused"):
        for seed, (M, N, K) in enumerate(shapes):
            req = {"technique": "lazy_prenorm", "dsl": "tlx", "impl": impl, "M": M, "N": N, "K": K,
                   "dtype": "bf16", "eps": 1e-6, "config": cfg, "mode": "gpu", "seed": 1000 + seed,
                   "check_only": True}
            r = measure(req)
            if r["status"] != "ok":
                failures.append(f"{name}/{impl} at {M}x{N}x{K}: {r['status']} {r.get('error', '')}")
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------------------------------------
# 4. LayerNorm (lazy_layernorm_matmul): compile-only for sm_90, configs, errors, self-check, GPU
# --------------------------------------------------------------------------------------------------------
_LN_COMPILE_SCRIPT = r"""
import json, re, subprocess, sys, tempfile, torch
from pathlib import Path
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import lazy_prenorm as K
from normfuse.codestats import ptxas_log

configs, shapes = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {}
for name, cfg in configs.items():
    for (M, N, Kd) in shapes:
        a = torch.empty(M, Kd, dtype=torch.bfloat16)
        b = torch.empty(Kd, N, dtype=torch.bfloat16)
        s = K.compile_sm90("lazy_layernorm_matmul", a, b, eps=1e-5, config=cfg)
        # registers / spills of the whole kernel (ptxas -v on the PTX)
        c = torch.empty(M, N, dtype=torch.bfloat16)
        cfg_t = K.TilingConfig.from_dict(cfg)
        args, grid, kw = K._launch_args(a, b, c, 1e-5, True, cfg_t, K.H200_NUM_SMS, (torch.empty(N), torch.empty(N)))
        ck = K._lazy_prenorm_ws_kernel.warmup(*args, grid=grid, **kw)
        log = ptxas_log(ck.asm["ptx"])[1]
        s["spill_stores"] = sum(int(x) for x in re.findall(r"(\d+) bytes spill stores", log))
        s["serialized"] = "C7515" in log
        s["fence_proxy_async"] = ck.asm["ptx"].count("fence.proxy.async")
        s["k16_register_a"] = len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16 \{[^}]*\}, \{",
                                             ck.asm["ptx"]))
        out[f"{name}/{M}x{N}x{Kd}"] = s
print(json.dumps(out))
"""
# the shipped LayerNorm configs (but the STATS_* ones: tests/tlx/test_lazy_prenorm_stats_tlx.py), plus the broadcast
# epilogue without REUSE_RSTD and with BLOCK_N = 128
LN_COMPILE_CONFIGS = {**{n: c for n, c in ktlx.SHIPPED_LN_CONFIGS.items()
                         if not c.stats_off_consumers and c.CLUSTER_SIZE == 1 and not c.A_FROM_REGS},
                      "bcast_bn128_s4": TilingConfig(BLOCK_N=128, NUM_STAGES=4, LN_EPILOGUE_MMA=False),
                      "mma_bn128_s4": TilingConfig(BLOCK_N=128, NUM_STAGES=4)}
LN_COMPILE_SHAPES = [(262144, 1024, 1024), (1, 1000, 1000), (17793, 1000, 1000)]  # EVEN_K, K tail, K tail


@pytest.fixture(scope="module")
def ln_compiled() -> dict:
    cfgs = json.dumps({k: v.to_dict() for k, v in LN_COMPILE_CONFIGS.items()})
    return run_python_json(_LN_COMPILE_SCRIPT, cfgs, json.dumps(LN_COMPILE_SHAPES), timeout=300)


def test_ln_shipped_configs():
    assert set(ktlx.SHIPPED_LN_CONFIGS) == {"ln_reuse_rstd_subtile", "ln_subtile", "ln_reuse_rstd_broadcast",
                                            "ln_stats_producer_subtile", "ln_stats_warpgroup_bn128_s4",
                                            "ln_a_regs_subtile", "ln_a_regs_bn128_s4",
                                            *(f"ln_cluster_c{c}{d}" for c in (2, 4, 8) for d in ("", "_defer")),
                                            *(f"ln_cluster_c{c}_defer_elem" for c in (2, 4, 8)),  # STATS_ELEMENTWISE
                                            "ln_cluster_c2_defer_elem_asm", "ln_cluster_c4_defer_elem_asm",
                                            *(f"ln_cluster_c{c}_defer_elem_asm_mma{p}" for c in (2, 4)
                                              for p in ("", "_pf", "_smemshift")),  # LN_RANK1_MMA, LN_SHIFT_*
                                            *(f"ln_cluster_c4_defer_elem_asm_mma_fill{r}"  # FILL_IDLE_SMS
                                              for r in ("", "80", "65", "50", "90", "85")),
                                            "ln_cluster_c8_s2_defer_elem_asm_mma"}
    for name, cfg in ktlx.SHIPPED_LN_CONFIGS.items():
        assert TilingConfig.from_dict(cfg.to_dict()) == cfg, name
        if cfg.CLUSTER_SIZE > 1:  # another kernel (multi_cta's): its shared memory is checked by compiling it
            cfg.cluster_config()  # tests/tlx/test_lazy_prenorm_cluster_tlx.py
            continue
        assert cfg.smem_bytes(layernorm=True) <= SMEM_LIMIT_BYTES, name
    # the default tile with the extra-MMA epilogue does not fit without EPILOGUE_SUBTILE
    assert DEFAULT_CONFIG.LN_EPILOGUE_MMA and DEFAULT_CONFIG.smem_bytes(layernorm=True) > SMEM_LIMIT_BYTES
    assert DEFAULT_CONFIG.smem_bytes(layernorm=False) == DEFAULT_CONFIG.smem_bytes()


def test_ln_default_config_fits(monkeypatch):
    """``lazy_layernorm_matmul(config=None)`` launches a config that passes its own shared-memory check (it used to
    take DEFAULT_CONFIG, which the check then refused on the GPU: found by the GPU contract test)."""
    seen = {}
    monkeypatch.setattr(ktlx, "_run", lambda a, b, eps, fuse, config, ln: seen.setdefault("config", config))
    a, b, cs = torch.randn(128, 64), torch.randn(64, 256), torch.zeros(256)
    for config in (None, {}):  # no overrides: the op's own default (the runner and gpu_checks pass {})
        seen.clear()
        ktlx.lazy_layernorm_matmul(a.half(), b.half(), cs, cs, config=config)
        cfg = TilingConfig.from_dict(seen["config"])
        assert cfg == ktlx.DEFAULT_LN_CONFIG and cfg.smem_bytes(layernorm=True) <= SMEM_LIMIT_BYTES
    seen.clear()
    ktlx.lazy_layernorm_matmul(a.half(), b.half(), cs, cs, config={"REUSE_RSTD": True, "LN_EPILOGUE_MMA": False})
    assert seen["config"] == {"REUSE_RSTD": True, "LN_EPILOGUE_MMA": False}  # overrides stay overrides


@pytest.mark.parametrize("name", list(LN_COMPILE_CONFIGS))
@pytest.mark.parametrize("shape", LN_COMPILE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_ln_compile_sm90(ln_compiled, name, shape):
    cfg = LN_COMPILE_CONFIGS[name]
    M, N, K = shape
    s = ln_compiled[f"{name}/{M}x{N}x{K}"]
    m, x = s["ptx_markers"], s["ptx_extra"]
    assert m["wgmma"] > 0 and m["tma_load"] > 0 and m["mbarrier"] > 0 and m["setmaxnreg"] > 0, s
    assert s["shared_bytes"] <= SMEM_LIMIT_BYTES and s["smem_ok"], s
    assert s["shared_bytes"] <= s["smem_estimate"] <= s["shared_bytes"] + 4096, s
    assert s["num_warps"] == cfg.num_warps_total, s
    assert x["mbarrier_arrive_expect_tx"] == 1 and x["wgmma_wait_1"] == cfg.NUM_CONSUMERS, s
    # the statistics read the A tile from shared memory while the wgmma is in flight; REUSE_RSTD skips them
    assert x["ld_shared_during_wgmma"] >= 8, s
    assert x["branch_after_wgmma_commit"] == (cfg.NUM_CONSUMERS if cfg.REUSE_RSTD else 0), s
    assert not s["serialized"], s  # ptxas did not serialize the wgmmas (C7515)
    if cfg.LN_EPILOGUE_MMA:
        # one more (k16, register-A) wgmma per consumer, queued behind the K loop's last one (no extra wait);
        # its shared B operand fenced for the async proxy
        assert s["k16_register_a"] == cfg.NUM_CONSUMERS and x["wgmma_wait_0"] == cfg.NUM_CONSUMERS, s
        assert s["fence_proxy_async"] >= 1 and s["spill_stores"] == 0, s
        assert x["ldmatrix"] <= cfg.NUM_CONSUMERS, s  # only the 64x16 A operand goes through ldmatrix
    else:
        assert s["k16_register_a"] == 0 and x["wgmma_wait_0"] == cfg.NUM_CONSUMERS, s
        assert x["ldmatrix"] == 0, s  # the accumulator is never converted (64-column chunks)
        # the broadcast epilogue: every thread holds its columns' colsum / beta_b values; at BLOCK_N = 256 ptxas
        # spills (the reason LN_EPILOGUE_MMA is the default), at 128 it does not
        assert (s["spill_stores"] > 0) == (cfg.BLOCK_N == 256), s


def test_ln_compile_costs_little_over_rmsnorm(compiled, ln_compiled):
    # the broadcast twin of reuse_rstd: the same kernel plus the d buffers (BLOCK_M fp32) and nothing else
    r = compiled[f"reuse_rstd/lazy_rmsnorm_matmul/262144x1024x1024"]["shared_bytes"]
    ln = ln_compiled["ln_reuse_rstd_broadcast/262144x1024x1024"]["shared_bytes"]
    assert 0 < ln - r <= 128 * 4 + 256, (r, ln)


def test_ln_input_errors():
    from normfuse.testing import assert_rejects_bad_inputs

    def f(a, b, config=None):
        n = b.shape[-1] if hasattr(b, "shape") else 16
        return ktlx.lazy_layernorm_matmul(a, b, torch.zeros(n), torch.zeros(n), config=config)

    assert_rejects_bad_inputs(f, torch.bfloat16, {"BLOCK_M": 96})
    a, b = _ab()
    cs = torch.zeros(16)
    with pytest.raises(ValueError, match="CUDA"):  # valid inputs, but CPU tensors (TLX has no interpreter)
        ktlx.lazy_layernorm_matmul(a, b, cs, cs, config=ktlx.SHIPPED_LN_CONFIGS["ln_subtile"])
    with pytest.raises(ValueError, match=r"colsum must have shape \[N\]"):
        ktlx.lazy_layernorm_matmul(a, b, torch.zeros(8), cs)
    with pytest.raises(TypeError, match="beta_b must be float32"):
        ktlx.lazy_layernorm_matmul(a, b, cs, cs.bfloat16())
    with pytest.raises(TypeError, match="bf16 and fp16"):
        ktlx.lazy_layernorm_matmul(a.float(), b.float(), cs, cs)
    for eps in (0.0, -1e-6, float("nan"), "1e-5", None, True):
        with pytest.raises(ValueError, match="eps"):
            ktlx.lazy_layernorm_matmul(a, b, cs, cs, eps=eps)
    with pytest.raises(ValueError, match="shared memory"):  # default tile + extra-MMA epilogue: > 227 KB
        ktlx.compile_sm90("lazy_layernorm_matmul", a, b)
    with pytest.raises(ValueError, match="LN_EPILOGUE_MMA must be a bool"):
        TilingConfig.from_dict({"LN_EPILOGUE_MMA": 1})


def test_ln_self_check_dry_run_on_cpu(monkeypatch, capsys):
    """The LayerNorm part of ``python -m kernels_tlx.lazy_prenorm`` end to end on the CPU with torch stand-ins;
    one stand-in forgets the mean correction for one config: reported, exit code 1."""
    import triton.testing

    from normfuse.techniques import lazy_prenorm as T

    def fake_matmul(a, b, *, config=None):
        return (a.float() @ b.float()).to(a.dtype)

    def fake_ln(a, b, colsum, beta_b, *, eps=1e-5, config=None):
        if config is ktlx.SHIPPED_LN_CONFIGS["ln_subtile"]:
            colsum = torch.zeros_like(colsum)  # deliberately wrong: no mean correction
        return T.lazy_layernorm_emulated(a, b, colsum, beta_b, eps).to(a.dtype)

    monkeypatch.setattr(ktlx, "_DEVICE", "cpu")
    monkeypatch.setattr(ktlx, "_CHECK_SHAPES", [(1, 24, 40), (70, 48, 16)])
    monkeypatch.setattr(ktlx, "_LN_SHIFT_CASES", [(33, 24, 40, 10.0)])
    monkeypatch.setattr(ktlx, "_CLUSTER_CHECK_SHAPES", [])
    monkeypatch.setattr(ktlx, "_LN_CLUSTER_SHIFT_CASES", [])
    monkeypatch.setattr(ktlx, "_BENCH_SHAPES", [(64, 32, 32)])
    monkeypatch.setattr(ktlx, "matmul", fake_matmul)
    monkeypatch.setattr(ktlx, "lazy_layernorm_matmul", fake_ln)
    monkeypatch.setattr(ktlx, "_num_sms", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "fake")
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **k: (fn(), 1.0)[1])
    rc = ktlx._self_check(["--variant", "layernorm", "--hang-timeout", "60"])
    out = capsys.readouterr().out
    assert rc == 1, out
    n_ln = sum(c.CLUSTER_SIZE == 1 for c in ktlx.SHIPPED_LN_CONFIGS.values())  # (cluster configs: N > 256 only)
    # per config: 2 shapes x (matmul + fused) + 1 shifted case (fused only)
    assert out.count("[run ]") == 5 * n_ln and out.count(" ok  ") == 5 * n_ln - 3, out
    assert "3 FAILURE(S): ln_subtile lazy_layernorm_matmul" in out and "shift=10" in out, out
    assert "torch eager layernorm" in out and out.count(" TFLOP/s\n") == 1 + 2 * n_ln, out
    assert ktlx._self_check(["--variant", "layernorm", "--config", "ln_reuse_rstd_subtile", "--no-bench"]) == 0
    with pytest.raises(SystemExit):  # an RMSNorm config under --variant layernorm selects nothing
        ktlx._self_check(["--variant", "layernorm", "--config", "default", "--no-bench"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(ktlx.SHIPPED_LN_CONFIGS))
def test_ln_shipped_configs_correct_on_gpu(name):
    from normfuse.gpu_checks import ODD_SHAPES
    from normfuse.worker import measure

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the TLX kernel targets sm_90 (wgmma, setmaxnreg)")
    cfg = ktlx.SHIPPED_LN_CONFIGS[name].to_dict()
    failures = []
    shapes = _served_shapes(ktlx.SHIPPED_LN_CONFIGS[name], list(ODD_SHAPES) + [(17793, 1000, 1000)])  # + REUSE_RSTD tail
    for options in ({}, {"mean_shift": 10.0}):
        for seed, (M, N, K) in enumerate(shapes):
            req = {"technique": "lazy_prenorm", "variant": "layernorm", "dsl": "tlx", "impl": "fused", "M": M,
                   "N": N, "K": K, "dtype": "bf16", "eps": 1e-5, "config": cfg, "mode": "gpu", "seed": 2000 + seed,
                   "check_only": True, "options": options}
            r = measure(req)
            if r["status"] != "ok":
                failures.append(f"{name} at {M}x{N}x{K} {options}: {r['status']} {r.get('error', '')}")
    assert not failures, "\n".join(failures)
