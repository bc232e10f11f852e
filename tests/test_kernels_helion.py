"""CPU tests for kernels_helion/lazy_prenorm.py: ref-mode semantics, generated Triton, sm_90 compile-only, errors.

Ref mode and compile-only run in subprocesses: ``HELION_INTERPRET`` is read when helion is imported, and
``normfuse.compile_only.install(90)`` swaps Triton's driver for the rest of a process. None of this is a GPU
correctness check (the pipeliner miscompile of blocker 1 compiles fine); the GPU run must still compare every
benchmarked config against the reference.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kernels_helion import lazy_prenorm as L  # noqa: E402
from normfuse.techniques import lazy_prenorm as T  # noqa: E402

IN_REF_MODE = L.ref_mode()


def _run_python(code: str, *, interpret: bool, timeout: int = 240) -> dict:
    """Run ``code`` in a fresh interpreter at the repo root; it must print one JSON object on its last line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["HELION_INTERPRET"] = "1"
    else:
        env.pop("HELION_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, \
        f"subprocess failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
res = {"ref_mode": L.ref_mode(), "shim": helion_compat.status(), "mm_ok": mm_ok, "cases": []}
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
    res = _run_python(REF_MODE_CODE, interpret=True)
    assert res["ref_mode"] is True
    # CPU torch 2.13 lacks aten::mm.dtype: the shim fills it in (else no matmul runs in ref mode)
    assert res["mm_ok"]
    assert len(res["cases"]) == 2 * 4 * (2 * 3 * 2 + 1)
    bad = [c for c in res["cases"] if not c["ok"]]
    assert not bad, f"{len(bad)} ref-mode cases exceed the spec tolerance, e.g. {bad[:3]}"
    for c in res["cases"]:
        M, N, _ = c["shape"]
        assert c["out_shape"] == [M, N]
        assert c["out_dtype"] == str(T.torch_dtype(c["dtype"]))


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
res = {"default": {op: L.compile_sm90(op, a, b) for op in L.OPS}, "pipelined": {}, "slots": {}, "odd": {}}
for name, cfg in {
    "matmul_ns3": ("matmul", {"num_stages": 3}),
    "reload_ns3": ("lazy_rmsnorm_matmul", {"sumsq": "reload", "num_stages": 3}),
    "prepass_ns3": ("lazy_rmsnorm_matmul", {"sumsq": "prepass", "num_stages": 3}),
    "shared_tile_ns3": ("lazy_rmsnorm_matmul", {"sumsq": "shared_tile", "num_stages": 3}),
    "reload_ns3_pointer": ("lazy_rmsnorm_matmul", {"sumsq": "reload", "num_stages": 3, "indexing": "pointer"}),
    "reload_ns3_m16": ("lazy_rmsnorm_matmul", {"sumsq": "reload", "num_stages": 3}),  # TMA box > M: pointer A
    "reload_ns4_128x128_persistent": ("lazy_rmsnorm_matmul", {"sumsq": "reload", "num_stages": 4,
        "block_sizes": (128, 128, 64), "pid_type": "persistent_interleaved"}),
}.items():
    x = torch.empty(16, 1024, dtype=torch.bfloat16) if name.endswith("m16") else a
    ck = L.compile_sm90_kernel(cfg[0], x, b, config=cfg[1])
    res["pipelined"][name] = compile_only.summarize(ck)
    res["slots"][name] = slots(ck)
a1 = torch.empty(1, 1000, dtype=torch.bfloat16)
b1 = torch.empty(1000, 1000, dtype=torch.bfloat16)
for variant in L.SUMSQ_VARIANTS:
    res["odd"][variant] = L.compile_sm90("lazy_rmsnorm_matmul", a1, b1, config={"sumsq": variant, "num_stages": 3})
res["odd"]["matmul"] = L.compile_sm90("matmul", a1, b1)
print(json.dumps(res))
"""


def test_compile_sm90():
    res = _run_python(COMPILE_CODE, interpret=False)
    for op, s in res["default"].items():
        assert s["ptx_markers"]["wgmma"] > 0, (op, s)
        assert s["ptx_markers"]["tma_load"] > 0, (op, s)
        assert s["smem_ok"] and 0 < s["shared_bytes"] <= 232448, (op, s)
        assert s["num_warps"] == L.DEFAULT_CONFIG.num_warps
    for name, s in res["pipelined"].items():
        assert s["ptx_markers"]["wgmma"] > 0 and s["smem_ok"], (name, s)
    # The reload/prepass A tile keeps its own num_stages-deep TMA ring, like B: the sum-of-squares load was not
    # merged into the dot operand (CSE) and is not read out of the wgmma's ring buffer.
    for name in ("matmul_ns3", "reload_ns3", "prepass_ns3", "reload_ns3_pointer", "reload_ns3_m16"):
        a_ring, b_ring = res["slots"][name][:2]
        assert a_ring == ["3", "128", "64"] and b_ring == ["3", "64", "256"], (name, res["slots"][name])
    a_ring, b_ring = res["slots"]["reload_ns4_128x128_persistent"][:2]
    assert a_ring[0] == b_ring[0] == "4"
    for name, s in res["odd"].items():  # M=1, K=N=1000: compiles (BLOCK_M is clamped, so no wgmma here)
        assert s["smem_ok"], (name, s)


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
    assert p.to_helion().range_num_stages == [1, 3] and p.to_helion("matmul").range_num_stages == [3]


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
    ],
)
def test_config_errors(d, match):
    with pytest.raises(ValueError, match=match):
        L.TilingConfig.from_dict(d)


def test_config_type_error():
    with pytest.raises(TypeError):
        L.TilingConfig.from_dict([("num_stages", 3)])


def test_bad_inputs():
    a, b = torch.randn(8, 16), torch.randn(16, 24)
    with pytest.raises(ValueError, match="inner dimensions"):
        L.matmul(a, torch.randn(24, 16))
    with pytest.raises(TypeError, match="dtype"):
        L.matmul(a, b.to(torch.bfloat16))
    with pytest.raises(TypeError):
        L.matmul(a.to(torch.int32), b.to(torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        L.lazy_rmsnorm_matmul(torch.randn(16, 8).t(), b)
    with pytest.raises(ValueError, match="multiple of 8"):
        L.matmul(torch.randn(8, 12), torch.randn(12, 16))
    with pytest.raises(ValueError, match="2-D"):
        L.matmul(torch.randn(2, 8, 16), b)
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
