"""CPU tests for kernels_helion/lazy_prenorm.py: ref-mode semantics, generated Triton, sm_90 compile-only, errors
(RMSNorm, and in section 5 the LayerNorm kernels).

Ref mode and compile-only run in subprocesses: ``HELION_INTERPRET`` is read when helion is imported, and
``normfuse.compile_only.install(90)`` swaps Triton's driver for the rest of a process. None of this is a GPU
correctness check (the pipeliner miscompile of blocker 1 compiles fine); the GPU run must still compare every
benchmarked config against the reference.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kernels_helion import lazy_prenorm as L  # noqa: E402
from normfuse.testing import run_python_json  # noqa: E402
from normfuse.techniques import lazy_prenorm as T  # noqa: E402

IN_REF_MODE = L.ref_mode()




# ------------------------------------------------------------------------------------------------------------
# (1) ref-mode semantics against the fp32 reference
# ------------------------------------------------------------------------------------------------------------
REF_MODE_CODE = r"""
import json
import torch
from kernels_helion import lazy_prenorm as L
from normfuse import helion_compat
from normfuse.techniques import lazy_prenorm as T

x = torch.ones(2, 2, dtype=torch.bfloat16)
mm_ok = torch.mm(x, x, out_dtype=torch.float32).dtype == torch.float32  # raises without the shim on CPU torch
res = {"ref_mode": L.ref_mode(), "shim": helion_compat.status(), "mm_ok": mm_ok, "cases": [],
       "n_variants": len(L.SUMSQ_VARIANTS)}
odd_config = {"block_sizes": (16, 16, 16), "num_warps": 4, "num_stages": 4, "indexing": "pointer"}
for dtype in ("bf16", "fp32"):
    for (M, N, K) in [(1, 72, 72), (64, 72, 72), (33, 48, 200), (3, 1000, 1000)]:
        for eps in (1e-6, 1e-2):
            inp = T.make_inputs(M, N, K, dtype=dtype, seed=M + N + K)
            ref = T.reference(inp, eps)
            tol = T.tolerance(ref, T.unfused_torch(inp, eps))
            for variant in L.SUMSQ_VARIANTS:
                for cfg in ({"sumsq": variant}, dict(odd_config, sumsq=variant)):
                    out = L.lazy_rmsnorm_matmul(inp["a"], inp["b_folded"], eps=eps, config=cfg)
                    res["cases"].append(dict(op="lazy", dtype=dtype, shape=[M, N, K], eps=eps, variant=variant,
                                             out_dtype=str(out.dtype), out_shape=list(out.shape),
                                             **T.compare(out, ref, tol)))
        # plain GEMM: flash-attention rule against the fp32 product, with torch's same-dtype matmul as the yardstick
        a, b = inp["a"], inp["b"]
        mref = a.float() @ b.float()
        mtol = 2 * ((a @ b).float() - mref).abs().max().item() + 1e-3 * mref.abs().max().item()
        out = L.matmul(a, b, config=odd_config)
        res["cases"].append(dict(op="matmul", dtype=dtype, shape=[M, N, K], eps=None, variant=None,
                                 out_dtype=str(out.dtype), out_shape=list(out.shape), **T.compare(out, mref, mtol)))
print(json.dumps(res))
"""


def test_ref_mode_semantics():
    res = run_python_json(REF_MODE_CODE, env={"HELION_INTERPRET": "1"}, timeout=240)
    assert res["ref_mode"] is True
    # CPU torch 2.13 lacks aten::mm.dtype: the shim fills it in (else no matmul runs in ref mode)
    assert res["mm_ok"]
    assert res["n_variants"] == 4
    assert len(res["cases"]) == 2 * 4 * (2 * res["n_variants"] * 2 + 1)
    bad = [c for c in res["cases"] if not c["ok"]]
    assert not bad, f"{len(bad)} ref-mode cases exceed the spec tolerance, e.g. {bad[:3]}"
    for c in res["cases"]:
        M, N, _ = c["shape"]
        assert c["out_shape"] == [M, N]
        assert c["out_dtype"] == str(T.torch_dtype(c["dtype"]))


ROWBLOCK_REF_CODE = r"""
import json
import torch
from kernels_helion import lazy_prenorm as L
from normfuse.techniques import lazy_prenorm as T

res = []
configs = [{"sumsq": "rowblock"},
           {"sumsq": "rowblock", "block_sizes": (128, 128, 64), "num_stages": 3, "epilogue_subtile": 2,
            "sumsq_block_k": 256, "range_flattens": (None, True, None)},
           {"sumsq": "rowblock", "block_sizes": (16, 16, 16), "sumsq_block_k": 512, "indexing": "pointer",
            "range_num_stages": (3, 0, 0)}]
for dtype in ("bf16", "fp16", "fp32"):
    for (M, N, K) in [(1, 1000, 1000), (5, 1000, 1000), (130, 24, 40), (257, 72, 1032)]:
        inp = T.make_inputs(M, N, K, dtype=dtype, seed=7 * M + K)
        ref = T.reference(inp, 1e-5)
        tol = T.tolerance(ref, T.unfused_torch(inp, 1e-5))
        prepass = L.lazy_rmsnorm_matmul(inp["a"], inp["b_folded"], eps=1e-5, config={"sumsq": "prepass"})
        for cfg in configs:
            out = L.lazy_rmsnorm_matmul(inp["a"], inp["b_folded"], eps=1e-5, config=cfg)
            res.append(dict(dtype=dtype, shape=[M, N, K], out_shape=list(out.shape), out_dtype=str(out.dtype),
                            same_as_prepass=bool(torch.equal(out, prepass)), **T.compare(out, ref, tol)))
print(json.dumps(res))
"""


def test_ref_mode_rowblock_odd_shapes():
    # Ref mode runs the body on whole tensors: this checks the formulation's math (statistic over all of K, one
    # rstd per row, applied to every N tile), not its tiling; the Triton-interpreter test below checks the tiling.
    res = run_python_json(ROWBLOCK_REF_CODE, env={"HELION_INTERPRET": "1"}, timeout=240)
    assert len(res) == 3 * 4 * 3
    for c in res:
        M, N, _ = c["shape"]
        assert c["ok"], c
        assert c["same_as_prepass"], c  # whole-tensor eager: the same ops as "prepass", bit for bit
        assert c["out_shape"] == [M, N] and c["out_dtype"] == str(T.torch_dtype(c["dtype"]))


# The generated Triton code, run tile by tile on CPU by Triton's interpreter (TRITON_INTERPRET=1): the only CPU
# check of the tiling itself (edge masks in M, N and K, the statistic loop's own K block, rstd reused across the
# N loop, TMA boxes clipped at the tensor edge). fp32 only: the interpreter's bf16 dot is wrong (dsl-primer
# blocker 5), and its missing libdevice is patched with tl.math.rsqrt (the GPU keeps libdevice.rsqrt).
INTERPRETER_CODE = r"""
import json
import torch
import triton.language as tl
import torch._inductor.runtime.triton_compat as tc
tc.libdevice.rsqrt = lambda x, **kw: tl.math.rsqrt(x)  # looked up at call time: the interpreter patches tl.math
from kernels_helion import lazy_prenorm as L
from normfuse.techniques import lazy_prenorm as T

def run(op, inp, cfg, eps=1e-6):
    cfg = L.TilingConfig.from_dict(cfg)
    args = (inp["a"], inp["b"]) if op == "matmul" else (inp["a"], inp["b_folded"], eps)
    bound = L._KERNELS[cfg.kernel_key(op)].bind(args)
    with L._live_args(bound, args):
        hcfg = cfg.to_helion(op)
        code = bound.to_triton_code(hcfg)
        out = bound.compile_config(hcfg)(*args)
    return out, code

res = []
rb = {"sumsq": "rowblock", "num_warps": 4}
cases = [
    ((1, 1000, 1000), dict(rb, block_sizes=(16, 128, 64), sumsq_block_k=256, indexing="pointer")),
    ((33, 1000, 1000), dict(rb, block_sizes=(16, 256, 64), sumsq_block_k=128, indexing="pointer")),
    ((33, 1000, 1000), dict(rb, block_sizes=(32, 256, 64), sumsq_block_k=128)),  # TMA operands
    ((70, 200, 136), dict(rb, block_sizes=(32, 64, 32), num_stages=3, range_flattens=(None, True, None))),
    ((70, 200, 136), dict(rb, block_sizes=(32, 64, 32), sumsq_indexing="tensor_descriptor", epilogue_subtile=2)),
] + [((33, 200, 136), {"sumsq": v, "num_warps": 4, "block_sizes": (16, 64, 32), "indexing": "pointer"})
     for v in ("shared_tile", "reload", "prepass")]
for (M, N, K), cfg in cases:
    inp = T.make_inputs(M, N, K, dtype="fp32", seed=M + N + K)
    ref = T.reference(inp, 1e-6)
    out, code = run("lazy_rmsnorm_matmul", inp, cfg)
    res.append(dict(op="lazy", shape=[M, N, K], cfg={k: str(v) for k, v in cfg.items()}, tma="_desc.load(" in code,
                    **T.compare(out, ref, T.tolerance(ref, T.unfused_torch(inp, 1e-6)))))
inp = T.make_inputs(33, 1000, 1000, dtype="fp32", seed=3)
mref = inp["a"].double() @ inp["b"].double()
# (persistent pid_types cannot run here: the interpreter's tl.range rejects tl.program_id(0) as its start)
for cfg in ({"num_warps": 4, "block_sizes": (32, 256, 64)},
            {"num_warps": 4, "block_sizes": (16, 128, 64), "epilogue_subtile": 2, "l2_groupings": (2,)}):
    out, code = run("matmul", inp, cfg)
    res.append(dict(op="matmul", shape=[33, 1000, 1000], cfg={k: str(v) for k, v in cfg.items()},
                    tma="_desc.load(" in code, **T.compare(out, mref.float(), 1e-4 * mref.abs().max().item())))
print(json.dumps(res))
"""


def test_triton_interpreter_tiled_semantics():
    res = run_python_json(INTERPRETER_CODE, env={"TRITON_INTERPRET": "1"}, timeout=240)
    assert len(res) == 10
    bad = [c for c in res if not c["ok"]]
    assert not bad, bad
    assert res[2]["tma"] and not res[0]["tma"]  # both indexing paths were exercised


# ------------------------------------------------------------------------------------------------------------
# (2) generated Triton code
# ------------------------------------------------------------------------------------------------------------
needs_codegen = pytest.mark.skipif(IN_REF_MODE, reason="no code generation in Helion ref mode (HELION_INTERPRET=1)")


def _cpu(M, N, K, dtype=torch.bfloat16):
    return torch.empty(M, K, dtype=dtype), torch.empty(K, N, dtype=dtype)


def _loop_bodies(code: str) -> list[str]:
    """Bodies of the `for ... in tl.range(...)` loops of the @triton.jit function (indented lines after it)."""
    lines = code.splitlines()
    bodies = []
    for i, line in enumerate(lines):
        if re.match(r"\s*for \w+ in tl\.range\(", line):
            indent = len(line) - len(line.lstrip())
            body = []
            for nxt in lines[i + 1:]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                body.append(nxt)
            bodies.append("\n".join(body))
    return bodies


@needs_codegen
def test_codegen_matmul_and_shared_tile():
    a, b = _cpu(4096, 1024, 1024)
    code = L.triton_code("matmul", a, b)
    assert "tl.dot(" in code and "a_desc.load(" in code and "b_desc.load(" in code
    (body,) = _loop_bodies(code)
    assert body.count("tl.dot(") == 1
    code = L.triton_code("lazy_rmsnorm_matmul", a, b, config={"sumsq": "shared_tile"})
    (body,) = _loop_bodies(code)
    assert body.count("a_desc.load(") == 1 and "tl.load(a +" not in body  # one A load feeds both
    x = re.search(r"(\w+) = a_desc\.load\(", body).group(1)
    assert re.search(rf"tl\.dot\(tl\.cast\({x},", body) and f"tl.cast({x}, tl.float32)" in body
    assert "libdevice.rsqrt" in code


@needs_codegen
@pytest.mark.parametrize("indexing", ["tensor_descriptor", "pointer"])
def test_codegen_reload_has_two_separate_a_loads(indexing):
    a, b = _cpu(4096, 1024, 1024)
    code = L.triton_code("lazy_rmsnorm_matmul", a, b, config={"sumsq": "reload", "indexing": indexing})
    (body,) = _loop_bodies(code)
    assert body.count("tl.dot(") == 1
    desc = re.findall(r"(\w+) = a_desc\.load\(\[", body)
    ptr = re.findall(r"(\w+) = tl\.load\(a \+.*\)$", body, flags=re.M)
    hinted = re.findall(r"(\w+) = tl\.load\(a \+.*eviction_policy='evict_first'\)$", body, flags=re.M)
    assert len(hinted) == 1, body  # the statistic's load: pointer indexing + its own eviction hint
    sq_x = hinted[0]
    if indexing == "tensor_descriptor":  # dot <- TMA descriptor load
        assert len(desc) == 1 and len(ptr) == 1, body
        dot_x = desc[0]
    else:  # two pointer loads of A, kept apart by the eviction hint
        assert not desc and len(ptr) == 2, body
        (dot_x,) = set(ptr) - {sq_x}
    dot_line = next(line for line in body.splitlines() if "tl.dot(" in line)
    assert f"tl.cast({dot_x}, tl.bfloat16)" in dot_line and sq_x not in dot_line
    assert f"tl.cast({sq_x}, tl.float32)" in body


@needs_codegen
def test_codegen_new_config_after_first_tensors_are_freed():
    # Helion caches one BoundKernel per shape and re-reads the *first* call's tensors through weak references
    # during codegen; without kernels_helion's _live_args a later config on fresh CPU tensors silently lost TMA.
    for cfg in ({"sumsq": "reload"}, {"sumsq": "reload", "indexing": ("pointer", "tensor_descriptor", "pointer")},
                {"sumsq": "reload", "num_stages": 3}, {"sumsq": "shared_tile", "num_stages": 2}):
        a, b = _cpu(2048, 512, 512)  # a fresh pair each time: the previous pair is freed
        code = L.triton_code("lazy_rmsnorm_matmul", a, b, config=cfg)
        assert "b_desc.load(" in code, cfg


@needs_codegen
def test_codegen_prepass_has_dot_free_statistic_loop():
    a, b = _cpu(4096, 1024, 1024)
    code = L.triton_code("lazy_rmsnorm_matmul", a, b, config={"sumsq": "prepass"})
    stat, mma = _loop_bodies(code)
    assert "tl.dot(" not in stat and "tl.sum(" in stat and "tl.load(a +" in stat
    assert "tl.dot(" in mma and "tl.sum(" not in mma


def _loop_headers(code: str) -> list[tuple[int, str]]:
    """(indentation, line) of every `for ... in tl.range(...)` of the @triton.jit function, in program order."""
    return [(len(line) - len(line.lstrip()), line.strip()) for line in code.splitlines()
            if re.match(r"\s*for \w+ in tl\.range\(", line)]


@needs_codegen
def test_codegen_rowblock_statistic_outside_the_n_loop():
    a, b = _cpu(4096, 1024, 1024)
    code = L.triton_code("lazy_rmsnorm_matmul", a, b, config={"sumsq": "rowblock", "sumsq_block_k": 256})
    kernel = code[code.index("@triton.jit"):code.index("\ndef _lazy_rowblock_kernel")]
    assert "tl.program_id(0)" in kernel and "tl.program_id(1)" not in kernel  # the grid tiles M only
    assert re.search(r"_launcher\(_helion__lazy_rowblock_kernel, \(32,\)", code)  # 4096 / BLOCK_M programs
    (i_s, stat_hdr), (i_n, n_hdr), (i_k, k_hdr) = _loop_headers(code)
    assert i_s == i_n < i_k  # statistic loop and N loop are siblings; the K loop sits inside the N loop
    assert "_BLOCK_SIZE_1):" in stat_hdr and "_BLOCK_SIZE_2):" in n_hdr and "_BLOCK_SIZE_3):" in k_hdr
    assert "_BLOCK_SIZE_1 = tl.constexpr(256)" in code and "_BLOCK_SIZE_3 = tl.constexpr(64)" in code  # sumsq_block_k
    stat, n_body, k_body = _loop_bodies(code)
    assert "tl.sum(" in stat and "tl.dot(" not in stat and "evict_last" in stat
    assert "tl.sum(" not in n_body and "libdevice.rsqrt" not in n_body  # rstd: once per row block
    assert k_body.count("tl.dot(") == 1 and "tl.sum(" not in k_body
    assert "a_desc.load(" in k_body and "b_desc.load(" in k_body and "out_desc.store(" in n_body
    between = kernel[kernel.index(stat_hdr) + len(stat_hdr):kernel.index(n_hdr)]
    assert "libdevice.rsqrt" in between  # between the statistic loop and the N loop
    code = L.triton_code("lazy_rmsnorm_matmul", a, b, config={"sumsq": "rowblock",
                                                               "range_flattens": (None, True, None)})
    flags = ["flatten=True" in hdr for _, hdr in _loop_headers(code)]
    assert flags == [False, True, False]  # only the N loop is flattened (fused with its K loop)


@needs_codegen
def test_helion_range_lists_have_a_leading_grid_entry():
    # What TilingConfig.to_helion relies on: Helion's range_* config lists have one entry for the grid loop, then
    # one per device loop (DEVICE_LOOPS), and block_sizes has the lengths used in to_helion.
    a, b = _cpu(512, 256, 256)
    cfg = L.TilingConfig(pid_type="persistent_interleaved", persistent_flatten=True)
    for key, kernel in L._KERNELS.items():
        n = b.shape[1]
        args = ((a, b) if key[0] == "matmul" else (a, b, torch.empty(n), torch.empty(n), 1e-6) if key[0] == L.LN_OP
                else (a, b, 1e-6))
        spec = kernel.bind(args).config_spec
        loops = L.DEVICE_LOOPS[key]
        assert len(spec.range_flattens) == len(spec.range_unroll_factors) == 1 + len(loops), key
        assert spec.range_flattens[0].block_ids == ([0] if key in L.ROW_GRID else [0, 1]), key
        c = dataclasses.replace(cfg, sumsq=key[1] or "reload").to_helion(key[0])
        assert len(c.block_sizes) == len(spec.block_sizes), key
        assert len(c.range_flattens) == len(spec.range_flattens), key
        assert len(c.config.get("l2_groupings", [])) == len(spec.l2_groupings), key
    code = L.triton_code("matmul", a, b, config=cfg)
    assert re.search(r"for virtual_pid in tl\.range\(.*flatten=True\)", code)
    (k_hdr,) = [hdr for _, hdr in _loop_headers(code) if "virtual_pid" not in hdr]
    assert "flatten" not in k_hdr


@needs_codegen
def test_codegen_odd_shapes_are_masked():
    a, b = _cpu(1, 1000, 1000)
    for variant in L.SUMSQ_VARIANTS:
        code = L.triton_code("lazy_rmsnorm_matmul", a, b, config={"sumsq": variant})
        assert "tl.dot(" in code and "< 1000" in code  # K and N edges are masked (or TMA-clipped)


# ------------------------------------------------------------------------------------------------------------
# (3) compile-only for sm_90 (fake driver)
# ------------------------------------------------------------------------------------------------------------
COMPILE_CODE = r"""
import json, re
import torch
from normfuse import compile_only
compile_only.install(90)
from kernels_helion import lazy_prenorm as L

def slots(ck):
    # shared-memory ring buffers of the pipelined K loop: "<slots>x<rows>x<cols>xbf16"
    return re.findall(r"local_alloc : \(\) -> !ttg\.memdesc<(\d+)x(\d+)x(\d+)xbf16", ck.asm["ttgir"])

a = torch.empty(262144, 1024, dtype=torch.bfloat16)
b = torch.empty(1024, 1024, dtype=torch.bfloat16)
res = {"default": {op: L.compile_sm90(op, a, b) for op in L.OPS}, "pipelined": {}, "slots": {}, "odd": {},
       "scf_for": {}}
for name, cfg in {
    "matmul_ns3": ("matmul", {"num_stages": 3}),
    "reload_ns3": ("lazy_rmsnorm_matmul", {"sumsq": "reload", "num_stages": 3}),
    "prepass_ns3": ("lazy_rmsnorm_matmul", {"sumsq": "prepass", "num_stages": 3}),
    "shared_tile_ns3": ("lazy_rmsnorm_matmul", {"sumsq": "shared_tile", "num_stages": 3}),
    "reload_ns3_pointer": ("lazy_rmsnorm_matmul", {"sumsq": "reload", "num_stages": 3, "indexing": "pointer"}),
    "reload_ns3_m16": ("lazy_rmsnorm_matmul", {"sumsq": "reload", "num_stages": 3}),  # TMA box > M: pointer A
    "reload_ns4_128x128_persistent": ("lazy_rmsnorm_matmul", {"sumsq": "reload", "num_stages": 4,
        "block_sizes": (128, 128, 64), "pid_type": "persistent_interleaved"}),
    "rowblock_ns3": ("lazy_rmsnorm_matmul", {"sumsq": "rowblock", "num_stages": 3}),
}.items():
    x = torch.empty(16, 1024, dtype=torch.bfloat16) if name.endswith("m16") else a
    ck = L.compile_sm90_kernel(cfg[0], x, b, config=cfg[1])
    res["pipelined"][name] = compile_only.summarize(ck)
    res["slots"][name] = slots(ck)
    res["scf_for"][name] = ck.asm["ttgir"].count("scf.for")
a1 = torch.empty(1, 1000, dtype=torch.bfloat16)
b1 = torch.empty(1000, 1000, dtype=torch.bfloat16)
for variant in L.SUMSQ_VARIANTS:
    res["odd"][variant] = L.compile_sm90("lazy_rmsnorm_matmul", a1, b1, config={"sumsq": variant, "num_stages": 3})
res["odd"]["matmul"] = L.compile_sm90("matmul", a1, b1)
for name in ("persist-flat-128x256x64-s4-sub2", "rowblock-flatn-128x128x64-s3-sub2"):
    for op in L.OPS:
        res["odd"][f"{name}/{op}"] = L.compile_sm90(op, a1, b1, config=L.H200_CANDIDATES[name])
res["candidates"] = {}
for name, cfg in L.H200_CANDIDATES.items():
    for op in L.OPS:
        ck = L.compile_sm90_kernel(op, a, b, config=cfg)
        res["candidates"][f"{name}/{op}"] = dict(compile_only.summarize(ck), **L.ptxas_usage(ck), slots=slots(ck),
                                                 scf_for=ck.asm["ttgir"].count("scf.for"))
# Helion 1.5 offers range_warp_specializes only on compute capability >= 10.0
try:
    L.compile_sm90("matmul", a, b, config={"num_warps": 4, "num_stages": 3, "range_warp_specializes": (True,)})
    res["ws_sm90"] = "compiled"
except Exception as e:
    res["ws_sm90"] = f"{type(e).__name__}: {e}"
ck = L.compile_sm90_kernel("matmul", a, b, config={"pid_type": "persistent_interleaved", "maxnreg": 168})
res["maxnreg_ptx"] = re.findall(r"\.maxnreg (\d+)", ck.asm["ptx"])
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def compiled():
    return run_python_json(COMPILE_CODE, timeout=600)


def test_compile_sm90(compiled):
    res = compiled
    for op, s in res["default"].items():
        assert s["ptx_markers"]["wgmma"] > 0, (op, s)
        assert s["ptx_markers"]["tma_load"] > 0, (op, s)
        assert s["smem_ok"] and 0 < s["shared_bytes"] <= 232448, (op, s)
        assert s["num_warps"] == L.DEFAULT_CONFIG.num_warps
    for name, s in res["pipelined"].items():
        assert s["ptx_markers"]["wgmma"] > 0 and s["smem_ok"], (name, s)
    # The reload/prepass A tile keeps its own num_stages-deep TMA ring, like B: the sum-of-squares load was not
    # merged into the dot operand (CSE) and is not read out of the wgmma's ring buffer.
    for name in ("matmul_ns3", "reload_ns3", "prepass_ns3", "reload_ns3_pointer", "reload_ns3_m16", "rowblock_ns3"):
        a_ring, b_ring = res["slots"][name][:2]
        assert a_ring == ["3", "128", "64"] and b_ring == ["3", "64", "256"], (name, res["slots"][name])
    # rowblock: statistic loop, N loop, K loop (nested, pipelined like the GEMM's above)
    assert res["scf_for"]["rowblock_ns3"] == 3
    a_ring, b_ring = res["slots"]["reload_ns4_128x128_persistent"][:2]
    assert a_ring[0] == b_ring[0] == "4"
    for name, s in res["odd"].items():  # M=1, K=N=1000: compiles (BLOCK_M is clamped, so no wgmma here)
        assert s["smem_ok"], (name, s)
    assert "rowblock" in res["odd"]


def test_compile_sm90_h200_candidates(compiled):
    res = compiled
    cands = res["candidates"]
    assert len(cands) == 2 * len(L.H200_CANDIDATES)
    for name, s in cands.items():
        assert s["smem_ok"] and s["ptx_markers"]["wgmma"] > 0 and s["ptx_markers"]["tma_load"] > 0, (name, s)
        assert s["spill_store_bytes"] == 0 and s["spill_load_bytes"] == 0, (name, s)
        assert s["ctas_per_sm"] == (2 if "128x128" in name else 1), (name, s)
        stages = re.search(r"-s(\d)", name).group(1)
        assert s["slots"][0][0] == s["slots"][1][0] == stages, (name, s["slots"])  # A and B rings
    # persistent + persistent_flatten: Triton fused the tile loop and the K loop into one scf.for
    assert cands["persist-flat-128x256x64-s4-sub2/matmul"]["scf_for"] == 1
    assert cands["persist-flat-128x128x64-s3-sub2-x2/matmul"]["scf_for"] == 1
    # rowblock + range_flattens on the N loop: the statistic loop, then one fused N x K loop
    assert cands["rowblock-flatn-128x256x64-s4-sub2/lazy_rmsnorm_matmul"]["scf_for"] == 2
    assert cands["rowblock-flatn-128x128x64-s3-sub2/lazy_rmsnorm_matmul"]["scf_for"] == 2
    assert cands["rowblock-flatn-128x128x64-s3-sub2/lazy_rmsnorm_matmul"]["shared_bytes"] <= 232448 // 2 - 1024
    # what Helion 1.5 does on sm_90 with the knobs the GEMM question was about
    assert "expected 0" in res["ws_sm90"]  # range_warp_specializes: not offered below compute capability 10.0
    assert res["maxnreg_ptx"] == ["168"]


# ------------------------------------------------------------------------------------------------------------
# (4) config validation and bad inputs
# ------------------------------------------------------------------------------------------------------------
def test_config_defaults_and_round_trip():
    assert L.TilingConfig.from_dict(None) == L.DEFAULT_CONFIG == L.TilingConfig()
    assert L.DEFAULT_CONFIG.block_sizes == (128, 256, 64) and L.DEFAULT_CONFIG.num_stages == 1
    assert L.DEFAULT_CONFIG.sumsq == "reload"
    cfg = L.TilingConfig.from_dict({"block_sizes": [128, 128, 64], "num_stages": 4, "l2_groupings": [16],
                                    "sumsq": "reload"})
    assert cfg.block_sizes == (128, 128, 64) and cfg.l2_groupings == (16,)
    assert L.TilingConfig.from_dict(cfg.to_dict()) == cfg
    assert L.TilingConfig.from_dict(cfg) is cfg
    hash(cfg)  # used as a cache key
    h = cfg.to_helion()
    assert h.block_sizes == [128, 128, 64] and h.num_stages == 4 and h.num_warps == 8
    assert h.indexing == ["tensor_descriptor", "tensor_descriptor", "pointer", "tensor_descriptor"]
    assert h.load_eviction_policies == ["", "", "first"]
    assert cfg.to_helion("matmul").indexing == "tensor_descriptor"
    p = L.TilingConfig(sumsq="prepass", sumsq_block_k=128, range_num_stages=(1, 3))
    assert p.to_helion().block_sizes == [128, 256, 128, 64]
    # Helion's range_* lists start with the grid-loop entry, then one per device loop
    assert p.to_helion().range_num_stages == [0, 1, 3] and p.to_helion("matmul").range_num_stages == [0, 3]


def test_config_rowblock_and_persistent_flatten():
    r = L.TilingConfig(sumsq="rowblock", block_sizes=(128, 128, 64), sumsq_block_k=256, num_stages=3,
                       epilogue_subtile=2, range_flattens=(None, True, None))
    h = r.to_helion()
    assert h.block_sizes == [128, 256, 128, 64]  # grid m, loop k_sumsq, loop n, loop k
    assert "l2_groupings" not in h.config  # 1-D grid: Helion has no l2_groupings entry for it
    assert h.indexing == ["pointer", "tensor_descriptor", "tensor_descriptor", "tensor_descriptor"]
    assert h.load_eviction_policies == ["last", "", ""]  # the MMA loops re-read A from L2
    assert h.range_flattens == [None, None, True, None] and h.epilogue_subtile == 2
    g = r.to_helion("matmul")
    assert g.block_sizes == [128, 128, 64] and g.l2_groupings == [8] and g.range_flattens == [None, None]
    assert L.TilingConfig(sumsq="rowblock", sumsq_indexing="tensor_descriptor").to_helion().indexing == \
        "tensor_descriptor"  # separate loops: no CSE hazard, unlike "reload"
    p = L.TilingConfig(pid_type="persistent_interleaved", persistent_flatten=True, maxnreg=168)
    assert p.to_helion("matmul").range_flattens == [True, None]
    assert p.to_helion().range_flattens == [True, None] and p.to_helion().maxnreg == 168
    assert L.TilingConfig.from_dict(r.to_dict()) == r and L.TilingConfig.from_dict(p.to_dict()) == p


@pytest.mark.parametrize(
    "d, match",
    [
        ({"block_size": (128, 128, 64)}, "valid keys: block_sizes"),
        ({"block_sizes": (128, 128)}, "3 entries"),
        ({"block_sizes": (128, 100, 64)}, "powers of two"),
        ({"block_sizes": (8, 128, 64)}, r"\[16, 512\]"),
        ({"num_warps": 6}, "num_warps must be a power of two"),
        ({"num_stages": 0}, "num_stages"),
        ({"indexing": "tma"}, "indexing must be one of"),
        ({"indexing": ("pointer", "pointer")}, "indexing tuple has 2 entries"),
        ({"pid_type": "persistent"}, "pid_type"),
        ({"l2_groupings": (3,)}, "powers of two"),
        ({"l2_groupings": (8, 8)}, "1-tuple"),
        ({"sumsq": "fused"}, "sumsq must be one of"),
        ({"sumsq_indexing": "tma"}, "sumsq_indexing"),
        ({"sumsq": "reload", "sumsq_indexing": "tensor_descriptor"}, "CSE"),
        ({"sumsq": "reload", "indexing": "pointer", "sumsq_eviction": ""}, "CSE"),
        ({"sumsq_eviction": "evict_first"}, "sumsq_eviction"),
        ({"sumsq": "prepass", "range_num_stages": (1, 2, 3)}, "device loop"),
        ({"range_num_stages": (9,)}, "range_num_stages"),
        ({"maxnreg": 0}, "maxnreg"),
        ({"epilogue_subtile": 3}, "epilogue_subtile"),
        ({"sumsq": "rowblock", "range_flattens": (None, True)}, "device loop"),
        ({"persistent_flatten": True}, "persistent pid_type"),
        ({"pid_type": "persistent_blocked", "persistent_flatten": 1}, "persistent_flatten"),
        ({"maxnreg": 128}, "persistent pid_type"),
    ],
)
def test_config_errors(d, match):
    with pytest.raises(ValueError, match=match):
        L.TilingConfig.from_dict(d)


def test_config_type_error():
    with pytest.raises(TypeError):
        L.TilingConfig.from_dict([("num_stages", 3)])


def test_bad_inputs():
    from normfuse.testing import assert_rejects_bad_inputs

    for fn in (L.matmul, L.lazy_rmsnorm_matmul):
        assert_rejects_bad_inputs(fn, torch.float32, {"block_sizes": [48, 64, 64]})
    a, b = torch.randn(8, 16), torch.randn(16, 24)
    for eps in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="eps"):
            L.lazy_rmsnorm_matmul(a, b, eps=eps)
    with pytest.raises(ValueError, match="valid keys"):
        L.lazy_rmsnorm_matmul(a, b, config={"stages": 3})
    with pytest.raises(ValueError, match="unknown op"):
        L.compile_sm90("softmax", a, b)


@needs_codegen
def test_cpu_tensors_need_ref_mode():
    a, b = torch.randn(8, 16), torch.randn(16, 24)
    with pytest.raises(ValueError, match="HELION_INTERPRET"):
        L.matmul(a, b)
    with pytest.raises(ValueError, match="HELION_INTERPRET"):
        L.lazy_rmsnorm_matmul(a, b)


# ------------------------------------------------------------------------------------------------------------
# (5) LayerNorm (lazy_layernorm_matmul): ref mode, tiled interpreter, generated code, sm_90 compile, errors
# ------------------------------------------------------------------------------------------------------------
LN_REF_CODE = r"""
import json
import torch
from kernels_helion import lazy_prenorm as L
from normfuse.techniques import lazy_prenorm as T

res = []
for dtype in ("bf16", "fp16", "fp32"):
    for (M, N, K) in [(1, 72, 72), (33, 48, 200), (130, 24, 40)]:
        for shift in (0.0, 10.0, 100.0):
            for eps in (1e-5, 0.5):
                inp = T.make_inputs(M, N, K, dtype=dtype, seed=M + K, variant="layernorm", mean_shift=shift)
                ref = T.reference(inp, eps, "layernorm")
                tol = T.tolerance(ref, T.unfused_torch(inp, eps, "layernorm"))
                for v in L.LN_SUMSQ_VARIANTS:
                    out = L.lazy_layernorm_matmul(inp["a"], inp["b_folded"], inp["colsum"], inp["beta_b"], eps=eps,
                                                  config={"sumsq": v})
                    res.append(dict(dtype=dtype, shape=[M, N, K], shift=shift, eps=eps, variant=v,
                                    out_shape=list(out.shape), out_dtype=str(out.dtype), **T.compare(out, ref, tol)))
# negative control: no mean correction
inp = T.make_inputs(33, 48, 200, dtype="fp32", seed=1, variant="layernorm", mean_shift=10.0)
ref = T.reference(inp, 1e-5, "layernorm")
out = L.lazy_layernorm_matmul(inp["a"], inp["b_folded"], torch.zeros_like(inp["colsum"]), inp["beta_b"], eps=1e-5)
neg = T.compare(out, ref, T.tolerance(ref, T.unfused_torch(inp, 1e-5, "layernorm")))["ok"]
print(json.dumps(dict(cases=res, negative_control_ok=neg)))
"""


def test_layernorm_ref_mode():
    res = run_python_json(LN_REF_CODE, env={"HELION_INTERPRET": "1"}, timeout=300)
    cases = res["cases"]
    assert len(cases) == 3 * 3 * 3 * 2 * len(L.LN_SUMSQ_VARIANTS)
    bad = [c for c in cases if not c["ok"]]
    assert not bad, bad[:3]
    for c in cases:
        assert c["out_shape"] == c["shape"][:2] and c["out_dtype"] == str(T.torch_dtype(c["dtype"]))
    assert res["negative_control_ok"] is False


# The generated Triton, tile by tile in the Triton interpreter: K tails (the shifted sums must mask the padding,
# which Helion does not do by itself here), TMA and pointer indexing, every formulation, mean-shifted rows.
LN_INTERPRETER_CODE = r"""
import json
import torch
import triton.language as tl
import torch._inductor.runtime.triton_compat as tc
tc.libdevice.rsqrt = lambda x, **kw: tl.math.rsqrt(x)
from kernels_helion import lazy_prenorm as L
from normfuse.techniques import lazy_prenorm as T

def run(inp, cfg, eps=1e-5):
    cfg = L.TilingConfig.from_dict(cfg)
    args = (inp["a"], inp["b_folded"], inp["colsum"], inp["beta_b"], eps)
    bound = L._KERNELS[cfg.kernel_key(L.LN_OP)].bind(args)
    with L._live_args(bound, args):
        hcfg = cfg.to_helion(L.LN_OP)
        code = bound.to_triton_code(hcfg)
        out = bound.compile_config(hcfg)(*args)
    return out, code

rb = {"sumsq": "rowblock", "num_warps": 4}
cases = [((1, 1000, 1000), dict(rb, block_sizes=(16, 128, 64), sumsq_block_k=256, indexing="pointer")),
         ((33, 1000, 1000), dict(rb, block_sizes=(32, 256, 64), sumsq_block_k=128)),
         ((70, 200, 136), dict(rb, block_sizes=(32, 64, 32), num_stages=3, range_flattens=(None, True, None)))]
cases += [((33, 200, 136), {"sumsq": v, "num_warps": 4, "block_sizes": (16, 64, 32), "indexing": ix})
          for v in ("reload", "prepass") for ix in ("pointer", "tensor_descriptor")]
res = []
for shift in (0.0, 100.0):
    for (M, N, K), cfg in cases:
        inp = T.make_inputs(M, N, K, dtype="fp32", seed=M + N + K, variant="layernorm", mean_shift=shift)
        ref = T.reference(inp, 1e-5, "layernorm")
        out, code = run(inp, cfg)
        res.append(dict(shape=[M, N, K], shift=shift, sumsq=cfg["sumsq"], tma="_desc.load(" in code,
                        **T.compare(out, ref, T.tolerance(ref, T.unfused_torch(inp, 1e-5, "layernorm")))))
print(json.dumps(res))
"""


def test_layernorm_triton_interpreter_tiled():
    res = run_python_json(LN_INTERPRETER_CODE, env={"TRITON_INTERPRET": "1"}, timeout=400)
    assert len(res) == 2 * 7
    bad = [c for c in res if not c["ok"]]
    assert not bad, bad
    assert any(c["tma"] for c in res) and not all(c["tma"] for c in res)


@needs_codegen
def test_layernorm_codegen():
    a, b = _cpu(4096, 1024, 1000)  # K tail: the explicit mask must be there
    code = L.triton_code(L.LN_OP, a, b, config={"sumsq": "reload"})
    (body,) = _loop_bodies(code)
    assert body.count("tl.dot(") == 1 and body.count("tl.sum(") == 2  # sum y and sum y^2
    assert re.search(r"= a_desc\.load\(", body) and re.search(r"= tl\.load\(a \+.*evict_first", body)  # 2 A loads
    assert "tl.where(" in body  # the K-padding mask of y = a - shift
    kernel = code[code.index("@triton.jit"):]
    assert re.search(r"= tl\.load\(a \+ \(indices_0 \* 1000 \+ 0 \* 1\)", kernel)  # the shift a[:, 0]
    assert "tl.load(colsum +" in kernel and "tl.load(beta_b +" in kernel
    code = L.triton_code(L.LN_OP, a, b, config={"sumsq": "rowblock", "sumsq_block_k": 256})
    stat, n_body, k_body = _loop_bodies(code)
    assert "tl.dot(" not in stat and stat.count("tl.sum(") == 2 and "evict_last" in stat
    assert "libdevice.rsqrt" not in n_body and k_body.count("tl.dot(") == 1 and "tl.sum(" not in k_body
    with pytest.raises(ValueError, match="not offered"):
        L.triton_code(L.LN_OP, a, b, config={"sumsq": "shared_tile"})


def test_layernorm_config_lists():
    r = L.TilingConfig(sumsq="rowblock", block_sizes=(128, 128, 64), sumsq_block_k=256, epilogue_subtile=2,
                       range_flattens=(None, True, None))
    h = r.to_helion(L.LN_OP)
    assert h.block_sizes == [128, 256, 128, 64] and "l2_groupings" not in h.config
    # a_shift, a_sumsq, a, b, colsum, beta_b, out
    assert h.indexing == ["pointer", "pointer", "tensor_descriptor", "tensor_descriptor", "pointer", "pointer",
                          "tensor_descriptor"]
    assert h.load_eviction_policies == ["", "last", "", "", "", ""]
    assert h.range_flattens == [None, None, True, None]
    h = L.TilingConfig(sumsq="reload").to_helion(L.LN_OP)
    assert h.indexing == ["pointer", "tensor_descriptor", "tensor_descriptor", "pointer", "pointer", "pointer",
                          "tensor_descriptor"]
    assert h.load_eviction_policies == ["", "", "", "first", "", ""] and h.l2_groupings == [8]
    with pytest.raises(ValueError, match="not offered"):
        L.TilingConfig(sumsq="shared_tile").kernel_key(L.LN_OP)
    assert L.TilingConfig(sumsq="shared_tile").kernel_key("lazy_rmsnorm_matmul")  # RMSNorm keeps it


LN_COMPILE_CODE = r"""
import json, re
from pathlib import Path
import torch, yaml
from normfuse import compile_only
compile_only.install(90)
from kernels_helion import lazy_prenorm as L

tiling = yaml.safe_load(Path("configs/tiling/lazy_prenorm_ln_h200.yaml").read_text())["helion"]
res = {}
for (M, N, K) in [(262144, 1024, 1024), (1, 1000, 1000)]:
    a = torch.empty(M, K, dtype=torch.bfloat16)
    b = torch.empty(K, N, dtype=torch.bfloat16)
    for cfg in tiling:
        name = cfg["name"]
        cfg = {k: v for k, v in cfg.items() if k not in ("name", "impls")}
        ck = L.compile_sm90_kernel(L.LN_OP, a, b, config=cfg)
        res[f"{name}/{M}"] = dict(compile_only.summarize(ck), **L.ptxas_usage(ck))
print(json.dumps(res))
"""


def test_layernorm_compile_sm90_shipped():
    res = run_python_json(LN_COMPILE_CODE, timeout=600)
    assert len(res) == 2 * 3
    for name, s in res.items():
        assert s["smem_ok"], (name, s)
        assert s["spill_store_bytes"] == 0 and s["spill_load_bytes"] == 0, (name, s)
        if name.endswith("/262144"):  # (at M=1 Helion clamps BLOCK_M: no wgmma there)
            assert s["ptx_markers"]["wgmma"] > 0 and s["ptx_markers"]["tma_load"] > 0, (name, s)
            # the nested 128x128 row block keeps 2 programs per SM (the flattened one would not: 212 registers)
            assert s["ctas_per_sm"] == (2 if "128x128" in name else 1), (name, s)


def test_layernorm_bad_inputs():
    from normfuse.testing import assert_rejects_bad_inputs

    def f(a, b, config=None):
        n = b.shape[-1] if hasattr(b, "shape") else 16
        return L.lazy_layernorm_matmul(a, b, torch.zeros(n), torch.zeros(n), config=config)

    assert_rejects_bad_inputs(f, torch.float32, {"block_sizes": [48, 64, 64]})
    a, b = torch.randn(8, 16), torch.randn(16, 24)
    cs = torch.zeros(24)
    with pytest.raises(ValueError, match=r"colsum must have shape \[N\]"):
        L.lazy_layernorm_matmul(a, b, torch.zeros(16), cs)
    with pytest.raises(TypeError, match="beta_b must be float32"):
        L.lazy_layernorm_matmul(a, b, cs, cs.double())
    with pytest.raises(TypeError, match="colsum must be a torch.Tensor"):
        L.lazy_layernorm_matmul(a, b, None, cs)
    for eps in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="eps"):
            L.lazy_layernorm_matmul(a, b, cs, cs, eps=eps)
    with pytest.raises(ValueError, match="not offered"):
        L.lazy_layernorm_matmul(a, b, cs, cs, config={"sumsq": "shared_tile"})
    if not IN_REF_MODE:
        with pytest.raises(ValueError, match="HELION_INTERPRET"):
            L.lazy_layernorm_matmul(a, b, cs, cs)
