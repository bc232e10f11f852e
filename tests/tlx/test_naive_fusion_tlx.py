"""Tests of ``kernels_tlx.naive_fusion`` (TLX venv: ``.venv-tlx/bin/python -m pytest tests/tlx/...``).

1. Compile-only for sm_90 (TLX has no interpreter), in subprocesses (the fake driver is process-global): every
   shipped config (+ two unshipped variants: one CTA per tile, no epilogue subtile) at the shapes it serves among
   the blog shape with K = N = 128, K = N = 256, N = 512, an N split with padding columns (N = 320) and an odd
   tiny shape (M = 1, N = 24, K = 8), for LayerNorm with affine and RMSNorm without (+ the norm-free variant).
   Asserts wgmma, TMA loads and stores, mbarriers and setmaxnreg (with the planned consumer register count) in
   the PTX; the warp count; shared memory within 227 KB and within 4 KB under ``Plan.SMEM_BYTES``; no ptxas
   spills; the persistent grid; the ``async_dot_wait(1)`` pipelining; and the cross-warpgroup exchange: one
   ``bar.sync 8 + rg, 128 * N_SPLIT`` per exchange and warpgroup when N is split, none otherwise, each with a
   shared store before it and shared loads after it; no accumulator layout conversion (ldmatrix only for the
   [64]-float statistic slots).
2. The epilogue math helpers (``_centre``, ``_rstd``, ``_affine``) run by the Triton interpreter in a probe
   kernel that splits rows into N_SPLIT slices and combines per-slice partials in slot order, exactly like the
   exchange: against a torch fp32 reference, incl. padding columns (the probe fails if the padding mask is off).
3. Config validation, the N/K limits (MAX_N, registers, shared memory) and input validation.
4. The GPU self-check script end to end on CPU with torch stand-ins (so a Python error cannot waste GPU time).
5. GPU (marker ``gpu``): the self-check's correctness part.

Compile-only does not catch barrier-phase bugs, races or deadlocks: ``python -m kernels_tlx.naive_fusion`` on the
H200 is the correctness test.
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

from kernels_tlx import naive_fusion as nf  # noqa: E402
from kernels_tlx.naive_fusion import DEFAULT_CONFIG, MAX_N, SHIPPED_CONFIGS, TilingConfig  # noqa: E402
from normfuse.compile_only import SMEM_LIMIT_BYTES  # noqa: E402
from normfuse.testing import run_python_json, run_python_json_parallel  # noqa: E402

# --------------------------------------------------------------------------------------------------------
# 1. compile-only for sm_90
# --------------------------------------------------------------------------------------------------------
COMPILE_SHAPES = [(262144, 128, 128), (262144, 256, 256), (17793, 512, 128), (4099, 320, 72), (1, 24, 8)]  # M,N,K
# unshipped variants, each at a few shapes: one CTA per tile; no epilogue subtile
EXTRA_CONFIGS = {
    "nonpersistent": (TilingConfig(PERSISTENT=False), COMPILE_SHAPES[:2]),
    "no_subtile_m64": (TilingConfig(BLOCK_M=64, EPILOGUE_SUBTILE=False), COMPILE_SHAPES[:2]),
}
COMPILE_CONFIGS = {**SHIPPED_CONFIGS, **{k: v[0] for k, v in EXTRA_CONFIGS.items()}}
COMPILE_OPS = (("matmul_layernorm", True), ("matmul_rmsnorm", False))  # (op, affine)

_COMPILE_SCRIPT = r"""
import json, sys, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import naive_fusion as nf

out = {}
for key, cfg, (M, N, K), op, affine in json.loads(sys.argv[1]):
    a = torch.empty(M, K, dtype=torch.bfloat16)  # never read: only shape, dtype and alignment matter
    b = torch.empty(K, N, dtype=torch.bfloat16)
    out[key] = nf.compile_sm90(op, a, b, eps=1e-5, config=cfg, affine=affine, ptxas=op != "matmul")
print(json.dumps(out))
"""

_PTX_SCRIPT = r"""
import json, sys, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import naive_fusion as nf
res = {}
for key, cfg, (M, N, K), norm in json.loads(sys.argv[1]):
    a = torch.empty(M, K, dtype=torch.bfloat16); b = torch.empty(K, N, dtype=torch.bfloat16)
    args, grid, kw, *_ = nf._prepare(a, b, None, None, 1e-5, norm, cfg, need_cuda=False)
    res[key] = nf._naive_fusion_ws_kernel.warmup(*args, grid=grid, **kw).asm["ptx"]
print(json.dumps(res))
"""


def _compile_jobs():
    jobs = []
    for name, cfg in COMPILE_CONFIGS.items():
        shapes = COMPILE_SHAPES if name in SHIPPED_CONFIGS else EXTRA_CONFIGS[name][1]
        for (M, N, K) in shapes:
            if not cfg.supports(N, K):
                continue
            for op, affine in COMPILE_OPS:
                jobs.append((f"{name}/{op}/{M}x{N}x{K}", cfg.to_dict(), (M, N, K), op, affine))
    # the norm-free variant of the kernel and the re-exported GEMM, once each
    jobs.append(("m64_res/_gemm_full_n/17793x512x128", SHIPPED_CONFIGS["m64_res"].to_dict(), (17793, 512, 128),
                 "_gemm_full_n", False))
    jobs.append(("lazy_prenorm/matmul/262144x128x128", {"BLOCK_N": 128, "NUM_STAGES": 4}, (262144, 128, 128),
                 "matmul", False))
    return jobs


@pytest.fixture(scope="module")
def compiled() -> dict:
    return run_python_json_parallel(_COMPILE_SCRIPT, _compile_jobs(), timeout=300)  # two compile processes in parallel


def test_compile_jobs_cover_the_interesting_cases():
    keys = [j[0] for j in _compile_jobs()]
    # every shipped config is compiled; an N split (N_SPLIT > 1) with 2 and with 3-4 warpgroups is among them
    for name in SHIPPED_CONFIGS:
        assert any(k.startswith(name + "/") for k in keys), name
    plans = [TilingConfig.from_dict(cfg).plan(N, K) for _, cfg, (M, N, K), op, _ in _compile_jobs() if op != "matmul"]
    assert {1, 2, 3, 4} <= {p.N_SPLIT for p in plans}
    assert any(p.N_SPLIT == 2 and p.ROW_GROUPS == 2 for p in plans)  # named barriers 8 and 9 side by side
    for name, (cfg, shapes) in EXTRA_CONFIGS.items():
        assert all(cfg.supports(N, K) for (M, N, K) in shapes), name


def test_compile_sm90(compiled):
    assert len(compiled) == len(_compile_jobs())
    for key, r in compiled.items():
        name, op, shape = key.split("/")
        M, N, K = map(int, shape.split("x"))
        m = r["ptx_markers"]
        assert m["wgmma"] > 0 and m["tma_load"] > 0 and m["mbarrier"] > 0 and m["setmaxnreg"] > 0, (key, r)
        assert r["smem_ok"] and r["shared_bytes"] <= SMEM_LIMIT_BYTES, (key, r)
        assert r["cluster_dims"] in ([], [1, 1, 1]), key
        if op == "matmul":  # delegated to kernels_tlx.lazy_prenorm.compile_sm90
            assert r["config"]["BLOCK_N"] == 128, key
            continue
        cfg = TilingConfig.from_dict(r["config"])
        p = cfg.plan(N, K)
        x = r["ptx_extra"]
        assert r["plan"]["N_SPLIT"] == p.N_SPLIT and r["plan"]["WG_N"] == p.WG_N, key
        assert r["shared_bytes"] <= r["smem_estimate"] <= r["shared_bytes"] + 4096, (key, r["shared_bytes"], r["plan"])
        assert r["num_warps"] == p.num_warps_total == 4 + 4 * p.NUM_CONSUMERS, (key, r)
        # the consumers really get the planned registers (a budget the compiler cannot meet drops setmaxnreg)
        assert p.CONSUMER_REGS in x["setmaxnreg"], (key, x)
        assert r["ptxas"]["spill_stores"] == 0 and r["ptxas"]["spill_loads"] == 0, (key, r["ptxas"])
        tiles = -(-M // cfg.BLOCK_M)
        assert r["grid"] == [min(nf.H200_NUM_SMS, tiles) if cfg.PERSISTENT else tiles], (key, r["grid"])
        # one wgmma group in flight per consumer in the K loop, y written by TMA stores
        assert x["wgmma_wait_1"] == p.NUM_CONSUMERS and x["wgmma_wait_0"] >= p.NUM_CONSUMERS, (key, x)
        storing = p.NUM_CONSUMERS if M > 64 else p.N_SPLIT  # M = 1 is specialized: row group 1 never stores
        assert x["tma_store"] >= storing * (2 if p.STORE_N < p.WG_N else 1), (key, x)
        # cross-warpgroup exchange: bar.sync <8 + rg>, <128 * N_SPLIT> once per exchange and warpgroup
        n_exch = {"matmul_layernorm": 2, "matmul_rmsnorm": 1, "_gemm_full_n": 0}[op]
        named = {k: v for k, v in x["bar_sync"].items() if int(k.split(",")[0]) >= 8}
        if p.N_SPLIT > 1 and n_exch:
            want = {f"{8 + rg},{128 * p.N_SPLIT}": n_exch * p.N_SPLIT for rg in range(p.ROW_GROUPS)}
            assert named == want, (key, x["bar_sync"])
        else:
            assert named == {}, (key, x["bar_sync"])
        # the accumulator is normalized and stored in its wgmma layout: no 2-D layout conversion (only [64]
        # statistics and the [WG_N] weight/bias vectors are converted, through a few hundred bytes of smem)
        assert r["convert_layout_2d"] == 0, (key, r["convert_layout_2d"])
        if op == "_gemm_full_n":
            assert x["st_global"] == 0, (key, x)  # no statistics
        else:
            assert x["st_global"] >= 1, (key, x)  # rstd (and mean)


@pytest.mark.parametrize("case", [("m64_res", 17793, 512, 128, "layernorm"),
                                  ("m64_wg128", 4099, 320, 72, "rmsnorm"),
                                  ("m128_wg128_s3", 4099, 256, 128, "layernorm"),
                                  ("default", 1000, 256, 128, "layernorm")], ids=lambda c: c[0])
def test_exchange_ptx_order(case):
    """Each named barrier of the exchange has the warpgroup's shared store of its partial before it and the
    shared loads of the slots after it (nothing reordered across the bar.sync); no named barrier without a split."""
    name, M, N, K, norm = case
    cfg = COMPILE_CONFIGS[name]
    p = cfg.plan(N, K)
    ptx = run_python_json(_PTX_SCRIPT, json.dumps([[name, cfg.to_dict(), [M, N, K], norm]]), timeout=170)[name]
    lines = [ln.strip() for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith((".loc", "//"))]
    named = [i for i, ln in enumerate(lines) if re.match(r"bar\.sync\s+(8|9),\s*\d+;", ln)]
    n_exch = 2 if norm == "layernorm" else 1
    if p.N_SPLIT == 1:
        assert named == []
        return
    assert len(named) == n_exch * p.NUM_CONSUMERS
    bounds = [0] + named + [len(lines)]
    for j, i in enumerate(named):
        before, after = lines[bounds[j]:i], lines[i + 1:bounds[j + 2]]
        assert any(ln.startswith("st.shared") for ln in before), (case, j)
        assert sum(ln.startswith(("ld.shared", "ldmatrix")) for ln in after) >= p.N_SPLIT, (case, j)


# --------------------------------------------------------------------------------------------------------
# 2. epilogue math under the Triton interpreter
# --------------------------------------------------------------------------------------------------------
_EPILOGUE_SCRIPT = r"""
import json, sys, torch, triton, triton.language as tl
from kernels_tlx.naive_fusion import _affine, _centre, _rstd

@triton.jit
def probe(c_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, N, eps, WG_N: tl.constexpr, N_SPLIT: tl.constexpr,
          NORM: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, EVEN_N: tl.constexpr):
    # rows of c = the fp32 accumulator, split into N_SPLIT warpgroup slices of WG_N columns (zero padding past N,
    # as TMA's zero fill leaves it); partials are combined in slot order, like _row_allreduce
    rows = tl.program_id(0) * 64 + tl.arange(0, 64)
    row_ok = rows < M
    total = tl.zeros([64], tl.float32)
    for j in tl.static_range(N_SPLIT):
        cols = j * WG_N + tl.arange(0, WG_N)
        acc = tl.load(c_ptr + rows[:, None] * N + cols[None, :], mask=row_ok[:, None] & (cols < N)[None, :], other=0.0)
        if NORM == 1:
            total += tl.sum(acc * acc, axis=1)
        else:
            total += tl.sum(acc, axis=1)
    if NORM == 2:
        m2 = tl.zeros([64], tl.float32)
        for j in tl.static_range(N_SPLIT):
            cols = j * WG_N + tl.arange(0, WG_N)
            acc = tl.load(c_ptr + rows[:, None] * N + cols[None, :], mask=row_ok[:, None] & (cols < N)[None, :],
                          other=0.0)
            xc, mean = _centre(acc, total, N, cols < N, EVEN_N)
            m2 += tl.sum(xc * xc, axis=1)
        rstd = _rstd(m2, N, eps)
        tl.store(mean_ptr + rows, mean, mask=row_ok)
    else:
        rstd = _rstd(total, N, eps)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)
    for j in tl.static_range(N_SPLIT):
        cols = j * WG_N + tl.arange(0, WG_N)
        mask = row_ok[:, None] & (cols < N)[None, :]
        acc = tl.load(c_ptr + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
        if NORM == 2:
            xc, mean = _centre(acc, total, N, cols < N, EVEN_N)
            y = xc * rstd[:, None]
        else:
            y = acc * rstd[:, None]
        y = _affine(y, w_ptr, b_ptr, cols, cols < N, HAS_W, HAS_B)
        tl.store(y_ptr + rows[:, None] * N + cols[None, :], y, mask=mask)

out = {}
for key, M, N, WG_N, N_SPLIT, norm, affine, even in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(M + N)
    c = torch.randn(M, N, generator=g) * torch.exp2(torch.rand(M, 1, generator=g) * 4 - 2) + 0.5
    w = 1 + 0.1 * torch.randn(N, generator=g)
    b = 0.1 * torch.randn(N, generator=g)
    y = torch.full((M, N), float("nan")); mean = torch.full((M,), float("nan")); rstd = torch.full((M,), float("nan"))
    eps = 1e-5 if norm == "layernorm" else 1e-6
    probe[(triton.cdiv(M, 64),)](c, w, b, y, mean, rstd, M, N, eps, WG_N=WG_N, N_SPLIT=N_SPLIT,
                                  NORM=2 if norm == "layernorm" else 1, HAS_W=affine,
                                  HAS_B=affine and norm == "layernorm", EVEN_N=even)
    F = torch.nn.functional
    if norm == "layernorm":
        ref = F.layer_norm(c, (N,), w if affine else None, b if affine else None, eps)
        ref_rstd = torch.rsqrt(c.var(-1, unbiased=False) + eps)
        mean_err = ((mean - c.mean(-1)).abs() / c.std(-1)).max().item()
    else:
        ref = F.rms_norm(c, (N,), w if affine else None, eps)
        ref_rstd = torch.rsqrt(c.pow(2).mean(-1) + eps)
        mean_err = 0.0
    out[key] = {"y_err": (y - ref).abs().max().item(), "rstd_rel": ((rstd - ref_rstd).abs() / ref_rstd).max().item(),
                "mean_err": mean_err}
print(json.dumps(out))
"""
# (M, N, WG_N, N_SPLIT): padding inside one warpgroup, a 3-way split with padding in the last slice, an even
# 2-way split, N below the 32-column minimum tile
_EPILOGUE_SPLITS = [(70, 200, 256, 1), (70, 320, 128, 3), (130, 512, 256, 2), (5, 24, 32, 1)]


@pytest.fixture(scope="module")
def epilogue() -> dict:
    jobs = []
    for (M, N, wg, ns) in _EPILOGUE_SPLITS:
        for norm in ("layernorm", "rmsnorm"):
            for affine in (False, True):
                jobs.append([f"{norm}/{M}x{N}/{wg}x{ns}/affine={affine}", M, N, wg, ns, norm, affine, N == wg * ns])
    # the padding mask matters: claiming EVEN_N at N = 200 in a 256-column slice must break LayerNorm
    jobs.append(["wrong_even", 70, 200, 256, 1, "layernorm", False, True])
    return run_python_json(_EPILOGUE_SCRIPT, json.dumps(jobs), env={"TRITON_INTERPRET": "1"}, timeout=170)


def test_epilogue_math_matches_torch(epilogue):
    keys = [k for k in epilogue if k != "wrong_even"]
    assert len(keys) == len(_EPILOGUE_SPLITS) * 4
    for k in keys:
        r = epilogue[k]
        assert r["y_err"] <= 2e-5 and r["rstd_rel"] <= 2e-6 and r["mean_err"] <= 1e-6, (k, r)


def test_epilogue_padding_mask_is_needed(epilogue):
    assert epilogue["wrong_even"]["rstd_rel"] > 1e-2, epilogue["wrong_even"]


def test_plans_match_the_kernel_split():
    # the N split each probe case stands for is what the config's plan does
    assert TilingConfig(WG_BLOCK_N=256).plan(200, 64).N_SPLIT == 1
    assert TilingConfig(BLOCK_M=64, WG_BLOCK_N=128).plan(320, 64).N_SPLIT == 3
    p = TilingConfig(BLOCK_M=64).plan(512, 128)
    assert (p.WG_N, p.N_SPLIT, p.NUM_CONSUMERS, p.ACC_REGS) == (256, 2, 2, 128)
    assert TilingConfig().plan(24, 8).WG_N == 32


# --------------------------------------------------------------------------------------------------------
# 3. config and input validation
# --------------------------------------------------------------------------------------------------------
def test_config_defaults_and_roundtrip():
    assert TilingConfig.from_dict(None) == DEFAULT_CONFIG == TilingConfig() == TilingConfig.from_dict({})
    c = DEFAULT_CONFIG
    assert (c.BLOCK_M, c.WG_BLOCK_N, c.BLOCK_K, c.NUM_STAGES) == (128, 256, 64, 4)
    assert c.B_RESIDENT and c.EPILOGUE_SUBTILE and c.PERSISTENT
    assert TilingConfig.from_dict(DEFAULT_CONFIG) is DEFAULT_CONFIG
    for name, cfg in SHIPPED_CONFIGS.items():
        assert TilingConfig.from_dict(cfg.to_dict()) == cfg, name
    assert 3 <= len(SHIPPED_CONFIGS) <= 5 and SHIPPED_CONFIGS["default"] == DEFAULT_CONFIG


@pytest.mark.parametrize("bad, match", [
    ({"BLOCK_MM": 64}, "valid keys"),
    ({"BLOCK_M": 96}, "power of 2"),
    ({"BLOCK_M": 256}, "64 or 128"),
    ({"BLOCK_M": 32}, "64 or 128"),
    ({"WG_BLOCK_N": 96}, "power of 2"),
    ({"WG_BLOCK_N": 512}, "WG_BLOCK_N"),
    ({"WG_BLOCK_N": 16}, "WG_BLOCK_N"),
    ({"BLOCK_K": 8}, "BLOCK_K"),
    ({"BLOCK_K": 256}, "BLOCK_K"),
    ({"NUM_STAGES": 1}, "NUM_STAGES"),
    ({"NUM_STAGES": 9}, "NUM_STAGES"),
    ({"BLOCK_M": 0}, "positive integer"),
    ({"BLOCK_M": 128.0}, "integer"),
    ({"NUM_STAGES": True}, "integer"),
    ({"B_RESIDENT": 1}, "bool"),
    ({"EPILOGUE_SUBTILE": "yes"}, "bool"),
    ({"PERSISTENT": None}, "bool"),
])
def test_config_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        TilingConfig.from_dict(bad)


# which (K, N) cells of the blog grid (+ N = 512) each shipped config serves (the rest: 'unsupported')
_GRID = [(K, N) for K in (64, 128, 256) for N in (64, 128, 256, 512)]
_UNSERVED = {
    "default": {(64, 512), (128, 512), (256, 512)},  # 2 row groups x 2 warpgroups of 64x256: registers
    "m64_res": {(256, 512)},  # resident B 256x512 = 256 KB: shared memory
    "m64_wg128": {(256, 512)},  # same
    "m64_stream": set(),
    "m128_wg128_s3": {(64, 512), (128, 512), (256, 512)},  # 2 row groups x 4 slices > MAX_CONSUMERS
}


def test_shipped_configs_cover_the_grid():
    assert set(_UNSERVED) == set(SHIPPED_CONFIGS)
    for name, cfg in SHIPPED_CONFIGS.items():
        for (K, N) in _GRID:
            assert cfg.supports(N, K) == ((K, N) not in _UNSERVED[name]), (name, K, N)
    # every cell is served by at least one shipped config, and every config's estimate stays within 227 KB
    for (K, N) in _GRID:
        assert any(cfg.supports(N, K) for cfg in SHIPPED_CONFIGS.values()), (K, N)


def test_plan_limits_name_the_constraint():
    with pytest.raises(ValueError, match="MAX_N=512"):
        TilingConfig(BLOCK_M=64, WG_BLOCK_N=128).plan(520, 64)
    with pytest.raises(ValueError, match="register limit"):
        TilingConfig().plan(512, 64)  # 4 warpgroups x 128 accumulator registers > 112
    with pytest.raises(ValueError, match="MAX_CONSUMERS"):
        TilingConfig(WG_BLOCK_N=64).plan(512, 64)  # 2 row groups x 8 slices
    with pytest.raises(ValueError, match="register limit without EPILOGUE_SUBTILE"):  # ptxas spilled 24 B
        TilingConfig(BLOCK_M=64, WG_BLOCK_N=128, EPILOGUE_SUBTILE=False, NUM_STAGES=2).plan(512, 64)
    assert TilingConfig(BLOCK_M=64, WG_BLOCK_N=128, EPILOGUE_SUBTILE=False).supports(256, 64)
    with pytest.raises(ValueError, match="shared memory.*B resident"):
        TilingConfig(BLOCK_M=64).plan(512, 256)
    with pytest.raises(ValueError, match="shared memory.*B streamed"):
        TilingConfig(BLOCK_M=64, BLOCK_K=128, NUM_STAGES=8, B_RESIDENT=False).plan(512, 4096)
    assert TilingConfig(BLOCK_M=64, B_RESIDENT=False, BLOCK_K=32).supports(512, 8192)  # streamed B: any K
    # config=None: DEFAULT_CONFIG where resident B fits, streamed B where it does not (the drop-ins' K = 4096)
    assert nf.default_config(256, 256) == nf.DEFAULT_CONFIG
    assert not nf.DEFAULT_CONFIG.supports(256, 4096) and nf.default_config(256, 4096).supports(256, 4096)
    assert not nf.default_config(256, 4096).B_RESIDENT
    assert TilingConfig().max_n() == 256 and TilingConfig(BLOCK_M=64).max_n() == 512 == MAX_N
    assert TilingConfig(BLOCK_M=64, WG_BLOCK_N=128).max_n() == 512
    assert TilingConfig(WG_BLOCK_N=128).max_n() == 256
    # the register rule is what the compiler can allocate (setmaxnreg asserted in test_compile_sm90)
    for nc, regs in nf.CONSUMER_REGS.items():
        assert nc * 128 * regs + 128 * 24 <= nf.REGISTER_FILE, nc


def _ab(M=16, K=16, N=16, dtype=torch.bfloat16):
    return torch.randn(M, K).to(dtype), torch.randn(K, N).to(dtype)


@pytest.mark.parametrize("fn", ["matmul_layernorm", "matmul_rmsnorm"])
def test_input_errors(fn):
    from normfuse.testing import assert_rejects_bad_inputs

    f = getattr(nf, fn)
    assert_rejects_bad_inputs(f, torch.bfloat16, {"BLOCK_M": 96})
    a, b = _ab()
    with pytest.raises(TypeError, match="bf16 and fp16"):
        f(a.float(), b.float())
    with pytest.raises(ValueError, match="valid keys"):
        f(a, b, config={"BLOCKM": 64})
    with pytest.raises(ValueError, match=r"weight must have shape \[N\]"):
        f(a, b, torch.ones(8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="weight"):
        f(a, b, torch.ones(16, dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        f(a, b, torch.ones(32, dtype=torch.bfloat16)[::2])
    with pytest.raises(ValueError, match="eps"):
        f(a, b, eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        f(a, b, eps=float("nan"))
    with pytest.raises(ValueError, match="MAX_N=512"):  # the limit is named even on CPU tensors
        f(torch.randn(16, 16).bfloat16(), torch.randn(16, 1024).bfloat16())
    with pytest.raises(ValueError, match="CUDA"):  # valid inputs, but CPU tensors (TLX has no interpreter)
        f(a, b)
    with pytest.raises(TypeError, match="weight must have a's dtype"):  # one dtype rule in every DSL
        f(a, b, torch.ones(16, dtype=torch.float32))


def test_layernorm_bias_errors():
    a, b = _ab()
    with pytest.raises(ValueError, match=r"bias must have shape \[N\]"):
        nf.matmul_layernorm(a, b, None, torch.ones(15, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bias"):
        nf.matmul_layernorm(a, b, None, [1.0] * 16)


def test_matmul_is_the_lazy_prenorm_gemm():
    from kernels_tlx import lazy_prenorm

    assert nf.matmul is lazy_prenorm.matmul
    a, b = _ab()
    with pytest.raises(ValueError, match="CUDA"):
        nf.matmul(a, b)


def test_compile_sm90_argument_errors():
    a, b = _ab()
    with pytest.raises(ValueError, match="unknown op"):
        nf.compile_sm90("layernorm", a, b)
    with pytest.raises(TypeError, match="bf16 and fp16"):
        nf.compile_sm90("matmul_layernorm", a.float(), b.float())
    flat = torch.empty(16 * 16 + 1, dtype=torch.bfloat16)
    a_mis = flat[1:].view(16, 16)
    assert a_mis.is_contiguous() and a_mis.data_ptr() % 16
    with pytest.raises(ValueError, match="16-byte aligned"):
        nf.compile_sm90("matmul_rmsnorm", a_mis, b)
    with pytest.raises(ValueError, match="shared memory"):
        nf.compile_sm90("matmul_layernorm", torch.empty(64, 256, dtype=torch.bfloat16),
                        torch.empty(256, 512, dtype=torch.bfloat16), config={"BLOCK_M": 64})


def _load_tiling_yaml(path: Path) -> dict:
    """PyYAML where installed (the main venv); else a parser of this file's subset (the TLX venv has no yaml):
    top-level ``key: []`` or ``key:`` followed by ``- {k: v, ...}`` flow mappings of scalars and flat lists."""
    try:
        import yaml

        return yaml.safe_load(path.read_text())
    except ImportError:
        pass

    def scalar(v):
        v = v.strip()
        if v in ("true", "false"):
            return v == "true"
        if re.fullmatch(r"-?\d+", v):
            return int(v)
        return v

    data, key = {}, None
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.fullmatch(r"(\w+):\s*(\[\])?", line)
        if m:
            key = m.group(1)
            data[key] = []
            continue
        m = re.fullmatch(r"\s+- \{(.*)\}", line)
        assert m and key, f"unexpected line for the fallback parser: {line!r}"
        entry = {}
        for k, v in re.findall(r"(\w+): (\[[^\]]*\]|[^,]+)", m.group(1)):
            entry[k] = [scalar(x) for x in v[1:-1].split(",")] if v.startswith("[") else scalar(v)
        data[key].append(entry)
    return data


def test_tiling_file_tlx_section():
    data = _load_tiling_yaml(REPO / "configs" / "tiling" / "naive_fusion_h200.yaml")
    assert set(data) >= {"triton", "helion", "tlx"}
    entries = data["tlx"]
    assert 3 <= len(entries) <= 8 and len({e["name"] for e in entries}) == len(entries)
    fused = [e for e in entries if e.get("impls") == ["fused"]]
    gemm = [e for e in entries if e.get("impls") == ["gemm"]]
    assert len(fused) + len(gemm) == len(entries) and 3 <= len(fused) <= 5 and gemm
    fields = lambda e: {k: v for k, v in e.items() if k not in ("name", "impls")}  # noqa: E731
    shipped = {TilingConfig.from_dict(fields(e)) for e in fused}
    assert shipped == set(SHIPPED_CONFIGS.values())  # the yaml is the self-check's list
    from kernels_tlx import lazy_prenorm

    for e in gemm:
        lazy_prenorm.TilingConfig.from_dict(fields(e))  # the re-exported matmul's own fields


# --------------------------------------------------------------------------------------------------------
# 4. the GPU self-check script, dry-run on CPU
# --------------------------------------------------------------------------------------------------------
def test_self_check_dry_run_on_cpu(monkeypatch, capsys):
    """``python -m kernels_tlx.naive_fusion`` end to end on the CPU with torch stand-ins for the kernels. One
    stand-in is wrong on purpose for one config: the script must report it and exit 1."""
    import triton.testing

    F = torch.nn.functional

    def stats(c, N, eps, ln):
        mean = c.mean(-1)
        rstd = torch.rsqrt((c - mean[:, None]).pow(2).mean(-1) + eps) if ln else torch.rsqrt(c.pow(2).mean(-1) + eps)
        return mean, rstd

    def fake_ln(a, b, weight=None, bias=None, *, eps=1e-5, config=None):
        c = a.float() @ b.float()
        mean, rstd = stats(c, b.shape[1], eps, True)
        y = F.layer_norm(c, (b.shape[1], ), None if weight is None else weight.float(),
                         None if bias is None else bias.float(), eps).to(a.dtype)
        return (y * 2 if config is SHIPPED_CONFIGS["m64_stream"] else y), mean, rstd  # deliberately wrong once

    def fake_rms(a, b, weight=None, *, eps=1e-6, config=None):
        c = a.float() @ b.float()
        _, rstd = stats(c, b.shape[1], eps, False)
        return F.rms_norm(c, (b.shape[1], ), None if weight is None else weight.float(), eps).to(a.dtype), rstd

    def fake_gemm(a, b, *, config=None):
        return (a.float() @ b.float()).to(a.dtype)

    shapes = [(1, 64, 64), (70, 200, 16), (70, 512, 256)]
    monkeypatch.setattr(nf, "_DEVICE", "cpu")
    monkeypatch.setattr(nf, "_CHECK_SHAPES", shapes)
    monkeypatch.setattr(nf, "_BENCH_KN", [(64, 64), (256, 512)])
    monkeypatch.setattr(nf, "_BENCH_M", 64)
    monkeypatch.setattr(nf, "matmul_layernorm", fake_ln)
    monkeypatch.setattr(nf, "matmul_rmsnorm", fake_rms)
    monkeypatch.setattr(nf, "_gemm_full_n", fake_gemm)
    monkeypatch.setattr(nf, "matmul", fake_gemm)
    monkeypatch.setattr(nf, "_compile_norm", lambda fn: fn)
    monkeypatch.setattr(nf, "_num_sms", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "fake")
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **k: (fn(), 1.0)[1])
    rc = nf._self_check(["--hang-timeout", "60"])
    out = capsys.readouterr().out
    assert rc == 1, out
    served = sum(cfg.supports(N, K) for cfg in SHIPPED_CONFIGS.values() for (M, N, K) in shapes)
    assert out.count("[run ]") == served * (2 * 2 + 1), out  # (LN, RMS) x affine + the GEMM-only kernel
    assert out.count("[skip]") == 2 * (len(SHIPPED_CONFIGS) * len(shapes) - served), out
    assert out.count(" FAIL ") == 2 * sum(SHIPPED_CONFIGS["m64_stream"].supports(N, K) for (M, N, K) in shapes), out
    assert "FAILURE(S): m64_stream layernorm 1x64x64 affine=False" in out, out
    assert out.count("K= 64 N= 64") == 1 and "K=256 N=512" in out and "fused" in out and "%)" in out, out
    assert nf._self_check(["--config", "default", "--config", "m64_res", "--no-bench"]) == 0
    capsys.readouterr()
    assert nf._self_check(["--config", "m64_stream", "--bench-only"]) == 0  # the wrong stand-in is never checked
    out = capsys.readouterr().out
    assert "[run ]" not in out and "K=256 N=512" in out and "ALL OK" in out, out


# --------------------------------------------------------------------------------------------------------
# 5. GPU correctness (needs an sm_90 GPU and fbtriton)
# --------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_self_check_on_gpu():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the TLX kernel targets sm_90 (wgmma, setmaxnreg)")
    assert nf._self_check(["--quick", "--no-bench"]) == 0
