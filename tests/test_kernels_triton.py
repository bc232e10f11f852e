"""Tests of ``kernels_triton.lazy_prenorm`` on a CPU-only machine.

1. Semantics under ``TRITON_INTERPRET=1`` (fp32/fp16, odd shapes, every ``sumsq`` formulation under every
   ``schedule``) against the fp32 reference of ``normfuse.techniques.lazy_prenorm``. Runs in a subprocess: the
   interpreter flag must be set before triton is imported.
2. Compile-only for sm_90 at the default tiles and the benchmark shape (bf16, M=262144, K=N=1024) and at
   M=1, K=N=1000, every formulation and schedule: wgmma and TMA in the PTX, shared memory within the H100/H200
   limit; for the row-block schedules also the TTGIR (K loop software-pipelined with num_stages-deep A and B
   TMA rings, flattened or nested as asked). Subprocess: the fake driver is process-global.
3. Config validation and input validation errors (in-process: they are raised before any launch).
4. LayerNorm (``lazy_layernorm_matmul``): interpreter semantics at fp16/fp32 with mean-shifted inputs (every
   schedule and formulation, K tails, negative controls), sm_90 compile with the pipelining of every K loop and
   the extra-MMA epilogue checked in the TTGIR, ptxas (no spills, no wgmma serialization) for the shipped LN
   tilings, and input errors.

None of this catches the pipeliner miscompile (triton#6691): that needs the GPU correctness run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kernels_triton import lazy_prenorm as ktl  # noqa: E402
from normfuse.testing import run_python_json  # noqa: E402
from kernels_triton.lazy_prenorm import DEFAULT_CONFIG, SCHEDULE_CHOICES, SUMSQ_CHOICES, TilingConfig  # noqa: E402





# --------------------------------------------------------------------------------------------------------
# 1. interpreter semantics
# --------------------------------------------------------------------------------------------------------
_INTERP_SCRIPT = r"""
import json, os
assert os.environ.get("TRITON_INTERPRET") == "1"
import torch
from normfuse.techniques import lazy_prenorm as T
from kernels_triton.lazy_prenorm import matmul, lazy_rmsnorm_matmul, SUMSQ_CHOICES, SCHEDULE_CHOICES

SMALL = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)
# (M, N, K, extra config): M=1; K=N=72 not multiples of the block; several row tiles with a short last group;
# the minimum block (16) with N, K not multiples of it either way; a prime M with a single N tile (N < BLOCK_N:
# the row-block N loop is empty after the first tile); K=N=1000 (8 N tiles with a 104-wide tail, K tail 104).
CASES = [
    (1, 72, 72, {}),
    (37, 72, 72, {}),
    (100, 40, 104, dict(BLOCK_M=16, GROUP_M=3)),
    (64, 64, 64, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1)),
    (67, 24, 48, dict(BLOCK_N=64, BLOCK_K=16, GROUP_M=8, num_stages=1)),
    (3, 1000, 1000, dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128)),
]
EPS = 1e-6
results = []
for dtype in ("fp32", "fp16"):
    for M, N, K, extra in CASES:
        cfg = {**SMALL, **extra}
        inp = T.make_inputs(M, N, K, dtype=dtype, seed=M + N + K)
        a, b, bf = inp["a"], inp["b"], inp["b_folded"]

        ref_mm = a.float() @ b.float()
        tol_mm = T.tolerance(ref_mm, a @ b)
        ref = T.reference(inp, EPS)
        tol = T.tolerance(ref, T.unfused_torch(inp, EPS))
        for schedule in SCHEDULE_CHOICES:
            # GEMM: fp32 reference, tolerance from torch in the same dtype
            out = matmul(a, b, config={**cfg, "schedule": schedule})
            assert out.dtype == a.dtype and out.shape == (M, N), (out.dtype, out.shape)
            r = T.compare(out, ref_mm, tol_mm)
            results.append(dict(op="matmul", dtype=dtype, shape=[M, N, K], sumsq=None, schedule=schedule, **r))

            # fused: the technique's reference and tolerance
            for sumsq in SUMSQ_CHOICES:
                out = lazy_rmsnorm_matmul(a, bf, eps=EPS, config={**cfg, "sumsq": sumsq, "schedule": schedule})
                assert out.dtype == a.dtype and out.shape == (M, N), (out.dtype, out.shape)
                r = T.compare(out, ref, tol)
                results.append(dict(op="lazy_rmsnorm_matmul", dtype=dtype, shape=[M, N, K], sumsq=sumsq,
                                    schedule=schedule, **r))

# eps is honoured (a large eps changes the answer visibly), per schedule
inp = T.make_inputs(37, 72, 72, dtype="fp32", seed=1)
ref = T.reference(inp, 0.5)
for schedule, sumsq in [("tile", "reload"), ("rowblock", "prepass"), ("rowblock", "reload")]:
    out = lazy_rmsnorm_matmul(inp["a"], inp["b_folded"], eps=0.5,
                              config={**SMALL, "sumsq": sumsq, "schedule": schedule})
    r = T.compare(out, ref, T.tolerance(ref, T.unfused_torch(inp, 0.5)))
    results.append(dict(op="lazy_rmsnorm_matmul", dtype="fp32", shape=[37, 72, 72], sumsq=f"{sumsq} eps=0.5",
                        schedule=schedule, **r))

# negative control: the plain GEMM must FAIL the fused check (rows have scales 0.25..4, so rstd is visible)
inp = T.make_inputs(37, 72, 72, dtype="fp32", seed=2)
ref = T.reference(inp, EPS)
neg = T.compare(matmul(inp["a"], inp["b_folded"], config=SMALL), ref, T.tolerance(ref, T.unfused_torch(inp, EPS)))
print(json.dumps(dict(results=results, negative_control_ok=neg["ok"])))
"""


def test_interpreter_semantics():
    out = run_python_json(_INTERP_SCRIPT, env={"TRITON_INTERPRET": "1"}, timeout=240)
    bad = [r for r in out["results"] if not r["ok"]]
    assert not bad, json.dumps(bad, indent=1)
    n_fused = sum(r["op"] == "lazy_rmsnorm_matmul" for r in out["results"])
    assert n_fused == 2 * 6 * len(SUMSQ_CHOICES) * len(SCHEDULE_CHOICES) + 3
    assert sum(r["op"] == "matmul" for r in out["results"]) == 2 * 6 * len(SCHEDULE_CHOICES)
    assert out["negative_control_ok"] is False, "the check cannot tell a missing rstd from a correct kernel"


# --------------------------------------------------------------------------------------------------------
# 2. compile-only for sm_90
# --------------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_triton.lazy_prenorm import compile_sm90, SUMSQ_CHOICES, SCHEDULE_CHOICES

out = {}
for (M, N, K) in [(262144, 1024, 1024), (1, 1000, 1000)]:
    a = torch.empty(M, K, dtype=torch.bfloat16)
    b = torch.empty(K, N, dtype=torch.bfloat16)
    out[f"matmul/{M}x{N}x{K}"] = compile_sm90("matmul", a, b)
    for sumsq in SUMSQ_CHOICES:
        cfg = None if sumsq == "reload" else {"sumsq": sumsq}  # None = DEFAULT_CONFIG (sumsq="reload")
        out[f"lazy_rmsnorm_matmul[{sumsq}]/{M}x{N}x{K}"] = compile_sm90("lazy_rmsnorm_matmul", a, b, eps=1e-6,
                                                                        config=cfg)
    for schedule in SCHEDULE_CHOICES[1:]:
        out[f"matmul[{schedule}]/{M}x{N}x{K}"] = compile_sm90("matmul", a, b, config={"schedule": schedule})
        for sumsq in SUMSQ_CHOICES:
            out[f"lazy_rmsnorm_matmul[{schedule},{sumsq}]/{M}x{N}x{K}"] = compile_sm90(
                "lazy_rmsnorm_matmul", a, b, eps=1e-6, config={"sumsq": sumsq, "schedule": schedule})
print(json.dumps(out))
"""


def test_compile_sm90():
    from normfuse.compile_only import SMEM_LIMIT_BYTES

    out = run_python_json(_COMPILE_SCRIPT, timeout=240)
    assert DEFAULT_CONFIG.sumsq == "reload" and DEFAULT_CONFIG.schedule == "tile"
    assert len(out) == 2 * (1 + len(SUMSQ_CHOICES)) * len(SCHEDULE_CHOICES)
    for name, s in out.items():
        m = s["ptx_markers"]
        assert m["wgmma"] > 0, (name, s)
        assert m["tma_load"] > 0, (name, s)
        assert s["shared_bytes"] <= SMEM_LIMIT_BYTES and s["smem_ok"], (name, s)
        assert s["num_warps"] == DEFAULT_CONFIG.num_warps, (name, s)
    print(json.dumps(out, indent=1))


# The row-block kernels nest loops (prepass / peeled first tile / loop over N tiles around the K loop): check in the
# TTGIR that the K loop of every tile is still software-pipelined the way the tile kernel's is.
_TTGIR_SCRIPT = r"""
import json, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_triton.lazy_prenorm import compile_sm90_kernel

a = torch.empty(262144, 1024, dtype=torch.bfloat16)
b = torch.empty(1024, 1024, dtype=torch.bfloat16)
out = {}
for schedule in ("tile", "rowblock", "rowblock_nested"):
    out[f"matmul/{schedule}"] = compile_sm90_kernel("matmul", a, b, config={"schedule": schedule}).asm["ttgir"]
    for sumsq in ("prepass", "reload"):
        ck = compile_sm90_kernel("lazy_rmsnorm_matmul", a, b, config={"schedule": schedule, "sumsq": sumsq})
        out[f"lazy_rmsnorm_matmul/{schedule}/{sumsq}"] = ck.asm["ttgir"]
print(json.dumps(out))
"""


def _scf_for_bodies(ttgir: str) -> list[str]:
    """The text of every ``scf.for`` op (header line to closing brace) of a TTGIR dump."""
    lines = ttgir.splitlines()
    bodies = []
    for i, line in enumerate(lines):
        if "scf.for" not in line:
            continue
        depth, j = line.count("{") - line.count("}"), i
        while depth > 0:
            j += 1
            depth += lines[j].count("{") - lines[j].count("}")
        bodies.append("\n".join(lines[i:j + 1]))
    return bodies


def test_compile_sm90_rowblock_pipelining():
    cfg = DEFAULT_CONFIG  # 128x256x64, num_stages=3
    ns, bm, bn, bk = cfg.num_stages, cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
    ttgirs = run_python_json(_TTGIR_SCRIPT, timeout=240)
    for name, ttgir in ttgirs.items():
        op, schedule, *sumsq = name.split("/")
        # every MMA loop: async wgmma left in flight, A and B TMA rings num_stages deep (the shared_tile hazard
        # would show as an A ring one slot short)
        mma_loops = [b for b in _scf_for_bodies(ttgir) if "ttng.warp_group_dot " in b]
        inner = [b for b in mma_loops if b.count("scf.for") == 1]
        assert inner, name
        n_tile_loops = 2 if sumsq == ["reload"] and schedule != "tile" else 1  # reload peels the first tile
        assert len(inner) == n_tile_loops, (name, len(inner))
        for body in inner:
            assert f"tt.num_stages = {ns} : i32" in body.splitlines()[-1], name
            assert "isAsync = true" in body and "pendings = 1" in body, name
            assert body.count("ttng.async_tma_copy_global_to_local") == 2, name  # A and B, one each per step
        assert ttgir.count(f"!ttg.memdesc<{ns}x{bm}x{bk}xbf16") >= n_tile_loops, name
        assert ttgir.count(f"!ttg.memdesc<{ns}x{bk}x{bn}xbf16") >= n_tile_loops, name
        assert f"!ttg.memdesc<{ns - 1}x{bm}x{bk}xbf16, #shared," not in ttgir or sumsq == ["reload"], name
        if schedule == "rowblock":  # flattened: the N-tile epilogue (TMA store) sits in the pipelined loop
            assert any("ttng.async_tma_copy_local_to_global" in b for b in inner), name
        elif schedule == "rowblock_nested":  # nested: an outer loop over N tiles holds the pipelined K loop
            assert not any("ttng.async_tma_copy_local_to_global" in b for b in inner), name
            assert any(b.count("scf.for") == 2 and "async_tma_copy_local_to_global" in b for b in mma_loops), name
        if sumsq == ["prepass"] and schedule != "tile":  # TMA prepass, deeper than the GEMM loop, no MMA
            pre = [b for b in _scf_for_bodies(ttgir) if "ttng.warp_group_dot " not in b and "tt.num_stages" in b]
            assert len(pre) == 1 and "ttng.async_tma_copy_global_to_local" in pre[0], name
            stages = ktl._prepass_stages(cfg)
            assert stages > ns and f"tt.num_stages = {stages} : i32" in pre[0], name
        if sumsq == ["reload"]:  # the separate pointer read of A goes through its own cp.async ring
            assert "ttg.async_copy_global_to_local" in ttgir, name


# --------------------------------------------------------------------------------------------------------
# 3. config and input validation
# --------------------------------------------------------------------------------------------------------
def test_config_defaults_and_roundtrip():
    assert TilingConfig.from_dict(None) == DEFAULT_CONFIG == TilingConfig()
    c = DEFAULT_CONFIG
    assert (c.BLOCK_M, c.BLOCK_N, c.BLOCK_K, c.GROUP_M, c.num_warps, c.num_stages, c.sumsq, c.schedule) == (
        128, 256, 64, 8, 8, 3, "reload", "tile")
    c2 = TilingConfig.from_dict({"BLOCK_N": 128, "sumsq": "prepass", "num_stages": 4, "schedule": "rowblock"})
    assert (c2.BLOCK_N, c2.sumsq, c2.num_stages, c2.BLOCK_M, c2.schedule) == (128, "prepass", 4, 128, "rowblock")
    assert TilingConfig.from_dict(c2.to_dict()) == c2
    assert set(SUMSQ_CHOICES) == {"shared_tile", "reload", "prepass"}
    assert SCHEDULE_CHOICES == ("tile", "rowblock", "rowblock_nested")


def test_prepass_stages():
    # the row-block prepass ring fits in the GEMM ring's bytes: (stages - 1) A tiles <= num_stages (A + B) tiles
    for bm, bn, ns in [(128, 256, 3), (128, 128, 4), (128, 256, 2), (64, 16, 1), (256, 256, 1), (16, 256, 5)]:
        cfg = TilingConfig(BLOCK_M=bm, BLOCK_N=bn, num_stages=ns)
        st = ktl._prepass_stages(cfg)
        assert ns <= st <= max(ns, 8), (cfg, st)
        assert st == ns or (st - 1) * bm <= ns * (bm + bn), (cfg, st)
    assert ktl._prepass_stages(DEFAULT_CONFIG) == 8


@pytest.mark.parametrize("bad, match", [
    ({"BLOCK_MM": 64}, "valid keys"),
    ({"block_m": 64}, "BLOCK_M"),  # the message lists the valid keys
    ({"BLOCK_M": 96}, "power of 2"),
    ({"BLOCK_N": 512}, "power of 2"),
    ({"BLOCK_K": 8}, "power of 2"),
    ({"BLOCK_M": 0}, "power of 2"),
    ({"BLOCK_M": 128.0}, "int"),
    ({"BLOCK_M": True}, "int"),
    ({"GROUP_M": 0}, "GROUP_M"),
    ({"num_warps": 6}, "num_warps"),
    ({"num_warps": 64}, "num_warps"),
    ({"num_stages": 0}, "num_stages"),
    ({"num_stages": "3"}, "int"),
    ({"sumsq": "fused"}, "shared_tile"),
    ({"sumsq": None}, "sumsq"),
    ({"schedule": "persistent"}, "rowblock"),
    ({"schedule": None}, "schedule"),
])
def test_config_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        TilingConfig.from_dict(bad)


def test_config_type_errors():
    with pytest.raises(TypeError):
        TilingConfig.from_dict([("BLOCK_M", 64)])
    a = torch.randn(16, 16)
    with pytest.raises(TypeError):
        ktl.matmul(a, a, config="default")


def _ab(M=16, K=16, N=16, dtype=torch.float16):
    return torch.randn(M, K).to(dtype), torch.randn(K, N).to(dtype)


@pytest.mark.parametrize("fn", ["matmul", "lazy_rmsnorm_matmul"])
def test_input_errors(fn):
    from normfuse.testing import assert_rejects_bad_inputs

    f = getattr(ktl, fn)
    assert_rejects_bad_inputs(f, torch.float16, {"BLOCK_M": 48})
    with pytest.raises(ValueError, match="CUDA"):  # valid inputs, but CPU tensors without the interpreter
        f(*_ab())


def test_eps_errors():
    a, b = _ab()
    for eps in (0.0, -1e-6, float("nan"), float("inf"), "1e-6", None, True):
        with pytest.raises(ValueError, match="eps"):
            ktl.lazy_rmsnorm_matmul(a, b, eps=eps)


def test_compile_sm90_argument_errors():
    # raised before anything is compiled, so no fake driver is needed
    a, b = _ab(dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="unknown op"):
        ktl.compile_sm90("rmsnorm", a, b)
    # contiguous but misaligned view (base 2 bytes off): TMA descriptors need 16-byte aligned bases
    flat = torch.empty(16 * 16 + 1, dtype=torch.bfloat16)
    a_mis = flat[1:].view(16, 16)
    assert a_mis.is_contiguous() and a_mis.data_ptr() % 16
    with pytest.raises(ValueError, match="16-byte aligned"):
        ktl.compile_sm90("matmul", a_mis, b)
    with pytest.raises(ValueError, match="eps"):
        ktl.compile_sm90("lazy_rmsnorm_matmul", a, b, eps=0.0)


# --------------------------------------------------------------------------------------------------------
# 4. LayerNorm (lazy_layernorm_matmul): interpreter semantics, sm_90 compile and pipelining, errors
# --------------------------------------------------------------------------------------------------------
_LN_INTERP_SCRIPT = r"""
import json, os
assert os.environ.get("TRITON_INTERPRET") == "1"
import torch
from normfuse.techniques import lazy_prenorm as T
from kernels_triton.lazy_prenorm import lazy_layernorm_matmul, SCHEDULE_CHOICES

SMALL = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)
# M=1; K, N not multiples of the block (K tail: the shifted sums must mask the padding); the minimum block with
# EVEN_K; N < BLOCK_N (the row-block N loop is empty after the peeled tile); K < BLOCK_K
CASES = [
    (1, 72, 72, {}),
    (37, 72, 72, {}),
    (64, 64, 64, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1)),
    (67, 24, 48, dict(BLOCK_N=64, BLOCK_K=16, GROUP_M=8, num_stages=1)),
    (33, 40, 16, dict(BLOCK_K=64)),
]
EPS = 1e-5
results = []

def run(inp, cfg, eps=EPS):
    return lazy_layernorm_matmul(inp["a"], inp["b_folded"], inp["colsum"], inp["beta_b"], eps=eps, config=cfg)

for dtype in ("fp32", "fp16"):
    for M, N, K, extra in CASES:
        for shift in (0.0, 100.0):
            inp = T.make_inputs(M, N, K, dtype=dtype, seed=M + N + K, variant="layernorm", mean_shift=shift)
            ref = T.reference(inp, EPS, "layernorm")
            tol = T.tolerance(ref, T.unfused_torch(inp, EPS, "layernorm"))
            combos = ([(s, q) for s in SCHEDULE_CHOICES for q in ("reload", "prepass", "shared_tile")] if shift == 0
                      else [("tile", "reload"), ("rowblock", "prepass"), ("rowblock_nested", "reload")])
            for schedule, sumsq in combos:
                out = run(inp, {**SMALL, **extra, "sumsq": sumsq, "schedule": schedule})
                assert out.dtype == inp["a"].dtype and out.shape == (M, N), (out.dtype, out.shape)
                results.append(dict(dtype=dtype, shape=[M, N, K], shift=shift, sumsq=sumsq, schedule=schedule,
                                    **T.compare(out, ref, tol)))

# eps is honoured (a large eps changes the answer visibly), per epilogue
inp = T.make_inputs(37, 72, 72, dtype="fp32", seed=1, variant="layernorm")
ref = T.reference(inp, 0.5, "layernorm")
for schedule, sumsq in [("tile", "reload"), ("rowblock", "prepass"), ("rowblock_nested", "reload")]:
    r = T.compare(run(inp, {**SMALL, "sumsq": sumsq, "schedule": schedule}, eps=0.5), ref,
                  T.tolerance(ref, T.unfused_torch(inp, 0.5, "layernorm")))
    results.append(dict(dtype="fp32", shape=[37, 72, 72], shift=0.0, sumsq=f"{sumsq} eps=0.5", schedule=schedule, **r))

# negative controls: without the mean correction (colsum = 0) or without beta (beta_b = 0) the check must fail,
# for both epilogues
inp = T.make_inputs(37, 72, 72, dtype="fp32", seed=2, variant="layernorm", mean_shift=10.0)
ref = T.reference(inp, EPS, "layernorm")
tol = T.tolerance(ref, T.unfused_torch(inp, EPS, "layernorm"))
neg = []
for schedule in ("tile", "rowblock"):
    cfg = {**SMALL, "sumsq": "reload", "schedule": schedule}
    for broken in ("colsum", "beta_b"):
        x = dict(inp, **{broken: torch.zeros_like(inp[broken])})
        neg.append(T.compare(run(x, cfg), ref, tol)["ok"])
print(json.dumps(dict(results=results, negative_controls=neg)))
"""


def test_layernorm_interpreter_semantics():
    out = run_python_json(_LN_INTERP_SCRIPT, env={"TRITON_INTERPRET": "1"}, timeout=600)
    bad = [r for r in out["results"] if not r["ok"]]
    assert not bad, json.dumps(bad, indent=1)
    assert len(out["results"]) == 2 * 5 * (9 + 3) + 3
    assert {r["schedule"] for r in out["results"]} == set(SCHEDULE_CHOICES)
    assert out["negative_controls"] == [False] * 4, "the check cannot tell a missing mean / beta term"


_LN_COMPILE_SCRIPT = r"""
import json, re, subprocess, sys, tempfile, torch, yaml
from pathlib import Path
from normfuse import compile_only
compile_only.install(90)
from kernels_triton.lazy_prenorm import compile_sm90_kernel
from normfuse.codestats import ptxas_log

def ptxas(ck):
    rc, log = ptxas_log(ck.asm["ptx"])
    return {"rc": rc, "serialized": "C7515" in log,
            "spills": [int(x) for x in re.findall(r"(\d+) bytes spill stores", log)]}

out = {}
for (M, N, K) in [(262144, 1024, 1024), (1, 1000, 1000)]:
    a = torch.empty(M, K, dtype=torch.bfloat16)
    b = torch.empty(K, N, dtype=torch.bfloat16)
    for schedule in ("tile", "rowblock", "rowblock_nested"):
        for sumsq in ("reload", "prepass"):
            ck = compile_sm90_kernel("lazy_layernorm_matmul", a, b, eps=1e-5, config={"sumsq": sumsq, "schedule": schedule})
            out[f"{schedule}/{sumsq}/{M}x{N}x{K}"] = dict(compile_only.summarize(ck), ttgir=ck.asm["ttgir"])
# every shipped LayerNorm tiling at the blog shape: no spills, no ptxas wgmma serialization
tiling = yaml.safe_load(Path("configs/tiling/lazy_prenorm_ln_h200.yaml").read_text())["triton"]
a = torch.empty(262144, 2048, dtype=torch.bfloat16)
b = torch.empty(2048, 512, dtype=torch.bfloat16)
for cfg in tiling:
    cfg = {k: v for k, v in cfg.items() if k not in ("name", "impls")}
    ck = compile_sm90_kernel("lazy_layernorm_matmul", a, b, eps=1e-5, config=cfg)
    out["shipped/" + cfg["schedule"] + "/" + cfg["sumsq"]] = dict(compile_only.summarize(ck), **ptxas(ck), ttgir="")
print(json.dumps(out))
"""


def test_layernorm_compile_sm90_and_pipelining():
    from normfuse.compile_only import SMEM_LIMIT_BYTES

    out = run_python_json(_LN_COMPILE_SCRIPT, timeout=400)
    cfg = DEFAULT_CONFIG
    ns, bm, bn = cfg.num_stages, cfg.BLOCK_M, cfg.BLOCK_N
    assert len([k for k in out if k.startswith("shipped/")]) == 3
    for name, s in out.items():
        assert s["ptx_markers"]["wgmma"] > 0 and s["ptx_markers"]["tma_load"] > 0, name
        assert s["shared_bytes"] <= SMEM_LIMIT_BYTES and s["smem_ok"], (name, s["shared_bytes"])
        if name.startswith("shipped/"):
            assert s["rc"] == 0 and not s["serialized"] and s["spills"] == [0], (name, s)
            continue
        schedule, sumsq, shape = name.split("/")
        if shape != "262144x1024x1024":
            continue
        ttgir = s["ttgir"]
        mma_loops = [b for b in _scf_for_bodies(ttgir) if "ttng.warp_group_dot " in b]
        inner = [b for b in mma_loops if b.count("scf.for") == 1]
        assert len(inner) == (2 if sumsq == "reload" and schedule != "tile" else 1), name
        for body in inner:  # every MMA K loop pipelined like the GEMM's: ns-deep TMA rings, async wgmma in flight
            assert f"tt.num_stages = {ns} : i32" in body.splitlines()[-1], name
            assert "isAsync = true" in body and "pendings = 1" in body, name
            assert body.count("ttng.async_tma_copy_global_to_local") == 2, name
        ext_dot = f"tensor<{bm}x16xbf16"  # the rank-1 epilogue MMA: A_ext [BLOCK_M, 16]
        if schedule == "rowblock":  # flattened: broadcast epilogue inside the loop, the extra MMA only when peeled
            flat = [b for b in inner if "ttng.async_tma_copy_local_to_global" in b]
            assert len(flat) == 1 and flat[0].count("ttng.warp_group_dot ") == 1, name
            assert (ext_dot in ttgir) == (sumsq == "reload"), name
        else:  # tile / nested: the extra MMA after the K loop, K = 16, B = the [16, BLOCK_N] colsum / beta_b splits
            assert ext_dot in ttgir and f"memdesc<16x{bn}xbf16" in ttgir, name
            assert not any(ext_dot in b for b in inner), name


def _ln_args(M=16, K=16, N=16, dtype=torch.float16):
    a, b = _ab(M, K, N, dtype)
    return a, b, torch.zeros(N), torch.zeros(N)


def test_layernorm_input_errors():
    from normfuse.testing import assert_rejects_bad_inputs

    def f(a, b, config=None):  # valid epilogue vectors for whatever N b has
        n = b.shape[-1] if hasattr(b, "shape") else 16
        return ktl.lazy_layernorm_matmul(a, b, torch.zeros(n), torch.zeros(n), config=config)

    assert_rejects_bad_inputs(f, torch.float16, {"BLOCK_M": 48})
    a, b, cs, bb = _ln_args()
    with pytest.raises(ValueError, match="CUDA"):  # valid inputs, but CPU tensors without the interpreter
        ktl.lazy_layernorm_matmul(a, b, cs, bb)
    with pytest.raises(ValueError, match=r"colsum must have shape \[N\]"):
        ktl.lazy_layernorm_matmul(a, b, torch.zeros(8), bb)
    with pytest.raises(TypeError, match="beta_b must be float32"):
        ktl.lazy_layernorm_matmul(a, b, cs, bb.half())
    with pytest.raises(TypeError, match="colsum must be a torch.Tensor"):
        ktl.lazy_layernorm_matmul(a, b, cs.numpy(), bb)
    for eps in (0.0, -1e-6, float("nan"), "1e-5", None, True):
        with pytest.raises(ValueError, match="eps"):
            ktl.lazy_layernorm_matmul(a, b, cs, bb, eps=eps)
    with pytest.raises(ValueError, match="colsum"):  # compile-only validates the vectors it is given
        ktl.compile_sm90("lazy_layernorm_matmul", a.bfloat16(), b.bfloat16(), torch.zeros(3), bb)
