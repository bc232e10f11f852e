"""CPU tests for kernels_helion/naive_fusion.py: ref-mode semantics, the tiling in Triton's interpreter, generated
Triton, sm_90 compile-only, configs and input errors.

Ref mode, the interpreter and compile-only run in subprocesses (``HELION_INTERPRET`` / ``TRITON_INTERPRET`` are
read at import; ``normfuse.compile_only.install(90)`` swaps Triton's driver for the rest of a process). The fp32
reference is local to this file (the technique spec is written elsewhere): ``c = a.float() @ b.float()``, then
the two-pass LayerNorm / RMSNorm in fp32. The tolerance is flash-attention's rule against the unfused PyTorch
path in the input dtype (``a @ b`` rounded, then ``F.layer_norm`` / ``F.rms_norm``). None of this replaces the
GPU check of every shipped config (normfuse/gpu_checks.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kernels_helion import naive_fusion as F  # noqa: E402
from normfuse.testing import run_python_json  # noqa: E402

IN_REF_MODE = F.ref_mode()
needs_codegen = pytest.mark.skipif(IN_REF_MODE, reason="no code generation in Helion ref mode (HELION_INTERPRET=1)")

# Shared by the subprocesses: inputs, the fp32 reference, the same-dtype unfused path and the comparison.
COMMON = r"""
import json, math
import torch
import torch.nn.functional as TF

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

def make(M, K, N, dtype, seed, affine=(False, False), shift=0.0):
    # rows of a with different scales (a wrong or missing rstd shows), b ~ N(shift, 1/K): never zeros
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.rand(M, 1, generator=g) * 4 - 2)
    a = (torch.randn(M, K, generator=g) * scale + 0.25).to(DT[dtype])
    b = (torch.randn(K, N, generator=g) / math.sqrt(K) + shift).to(DT[dtype])
    w = (1 + 0.1 * torch.randn(N, generator=g)).to(DT[dtype]) if affine[0] else None
    bias = (0.1 * torch.randn(N, generator=g)).to(DT[dtype]) if affine[1] else None
    return a, b, w, bias

def reference(op, a, b, w, bias, eps):
    c = a.float() @ b.float()
    if op == "matmul_layernorm":
        mean = c.mean(-1)
        xc = c - mean[:, None]
        rstd = torch.rsqrt((xc * xc).mean(-1) + eps)
        y = xc * rstd[:, None]
    else:
        mean = None
        rstd = torch.rsqrt((c * c).mean(-1) + eps)
        y = c * rstd[:, None]
    if w is not None:
        y = y * w.float()
    if bias is not None:
        y = y + bias.float()
    return y, mean, rstd

def same_dtype(op, a, b, w, bias, eps):
    c = (a.float() @ b.float()).to(a.dtype)  # the unfused GEMM's output, rounded to the input dtype
    if op == "matmul_layernorm":
        return TF.layer_norm(c, (c.shape[-1],), w, bias, eps)
    return TF.rms_norm(c, (c.shape[-1],), w, eps)

def compare(op, out, a, b, w, bias, eps):
    y_ref, mean_ref, rstd_ref = reference(op, a, b, w, bias, eps)
    tol = 2 * (same_dtype(op, a, b, w, bias, eps).float() - y_ref).abs().max().item() \
        + 1e-3 * y_ref.abs().max().item()
    y = out[0]
    err = (y.float() - y_ref).abs().max().item()
    stat = ((out[-1] - rstd_ref).abs() / rstd_ref.abs()).max().item()
    if op == "matmul_layernorm":  # the mean relative to the row's scale 1/rstd
        stat = max(stat, ((out[1] - mean_ref).abs() * rstd_ref).max().item())
    M, N = a.shape[0], b.shape[1]
    return dict(err=err, tol=tol, stat_err=stat, ok=bool(torch.isfinite(y.float()).all()) and err <= tol,
                y_ok=(list(y.shape) == [M, N] and y.dtype == a.dtype),
                stats_ok=all(t.dtype == torch.float32 and list(t.shape) == [M] for t in out[1:]),
                n_out=len(out))
"""


# ------------------------------------------------------------------------------------------------------------
# (1) ref-mode semantics against the fp32 reference
# ------------------------------------------------------------------------------------------------------------
REF_MODE_CODE = COMMON + r"""
from kernels_helion import naive_fusion as F
from normfuse import helion_compat

FN = {"matmul_layernorm": F.matmul_layernorm, "matmul_rmsnorm": F.matmul_rmsnorm}

def call(op, a, b, w, bias, eps, config=None):
    if op == "matmul_layernorm":
        return F.matmul_layernorm(a, b, w, bias, eps=eps, config=config)
    return F.matmul_rmsnorm(a, b, w, eps=eps, config=config)

res = {"ref_mode": F.ref_mode(), "shim": helion_compat.status(), "cases": [], "shift": [], "nan": []}
# holds N = 512 in fp32 too (the default's 3-stage ring of B tiles [64, 256] exceeds 227 KiB in fp32)
wide = {"block_sizes": (64, 32), "num_warps": 8, "num_stages": 2}
for op in FN:
    for dtype in ("bf16", "fp16", "fp32"):
        for (M, K, N) in [(1, 64, 64), (257, 128, 72), (33, 200, 136), (1000, 256, 256), (5, 64, 512), (7, 8, 16)]:
            for affine in ((False, False), (True, False), (True, True)):
                if op == "matmul_rmsnorm" and affine[1]:
                    continue
                a, b, w, bias = make(M, K, N, dtype, seed=M + K + N, affine=affine)
                for eps in (1e-5, 1e-2):
                    cfg = wide if (N == 512 or dtype == "fp32") else None
                    r = compare(op, call(op, a, b, w, bias, eps, cfg), a, b, w, bias, eps)
                    res["cases"].append(dict(r, op=op, dtype=dtype, shape=[M, K, N], affine=affine, eps=eps))
    # a GEMM output whose rows have a large mean: the two-pass variance keeps full accuracy
    for dtype, shift in (("bf16", 0.5), ("fp32", 0.5), ("fp32", 5.0)):
        a, b, w, bias = make(64, 256, 128, dtype, seed=3, affine=(True, True), shift=shift)
        r = compare(op, call(op, a, b, w, bias, 1e-5), a, b, w, bias, 1e-5)
        c = a.float() @ b.float()
        res["shift"].append(dict(r, op=op, dtype=dtype, mean_over_std=(c.mean(-1).abs() / c.std(-1)).min().item()))
    # a NaN in one row of a: that row (and its statistics) is NaN, every other row is finite and correct
    a, b, w, bias = make(6, 64, 128, "bf16", seed=5, affine=(True, True))
    a[2, 17] = float("nan")
    out = call(op, a, b, w, bias, 1e-5)
    good = [r for r in range(6) if r != 2]
    r = compare(op, tuple(t[good] for t in out), a[good], b, w, bias, 1e-5)
    res["nan"].append(dict(r, op=op, row_nan=bool(out[0][2].float().isnan().all()),
                           stats_nan=all(bool(t[2].isnan()) for t in out[1:])))
# ref mode still applies the capacity limit (the sweep records `unsupported` on CPU too)
a, b, _, _ = make(4, 64, 512, "fp32", seed=1)
try:
    F.matmul_layernorm(a, b)
    res["capacity"] = "accepted"
except ValueError as e:
    res["capacity"] = str(e)
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def ref_results():
    return run_python_json(REF_MODE_CODE, env={"HELION_INTERPRET": "1"}, timeout=300)


def test_ref_mode_matches_reference(ref_results):
    res = ref_results
    assert res["ref_mode"] is True
    assert len(res["cases"]) == (3 + 2) * 3 * 6 * 2  # (LN: 3 affine combos, RMS: 2) x dtypes x shapes x eps
    bad = [c for c in res["cases"] if not c["ok"]]
    assert not bad, f"{len(bad)} ref-mode cases exceed the tolerance, e.g. {bad[:3]}"
    for c in res["cases"]:
        assert c["y_ok"] and c["stats_ok"], c  # y in the input dtype, fp32 [M] statistics
        assert c["n_out"] == (3 if c["op"] == "matmul_layernorm" else 2), c
        assert c["stat_err"] < 1e-4, c


def test_ref_mode_large_mean_and_nan(ref_results):
    assert len(ref_results["shift"]) == 6
    for c in ref_results["shift"]:
        assert c["mean_over_std"] > 1.0, c  # the rows really are mean-dominated
        assert c["ok"] and c["stat_err"] < 1e-5, c
    assert len(ref_results["nan"]) == 2
    for c in ref_results["nan"]:
        assert c["row_nan"] and c["stats_nan"] and c["ok"], c


def test_ref_mode_applies_capacity_limit(ref_results):
    assert "MAX_ACC_REGS_PER_THREAD=128" in ref_results["capacity"] and "N=512" in ref_results["capacity"]


# ------------------------------------------------------------------------------------------------------------
# (2) the generated Triton run tile by tile by Triton's interpreter (fp32): the tiling, masks and TMA boxes
# ------------------------------------------------------------------------------------------------------------
INTERPRETER_CODE = COMMON + r"""
import triton.language as tl
import torch._inductor.runtime.triton_compat as tc
tc.libdevice.rsqrt = lambda x, **kw: tl.math.rsqrt(x)  # the interpreter has no libdevice (the GPU keeps it)
from kernels_helion import naive_fusion as F

def run(op, a, b, w, bias, eps, cfg):
    args, tcfg = F._prepare(op, a, b, w, bias, eps, cfg)
    bound = F._KERNELS[op].bind(args)
    with F._live_args(bound, args):
        h = tcfg.to_helion(op, (w is not None, bias is not None))
        code = bound.to_triton_code(h)
        out = bound.compile_config(h)(*args)
    return out, code

res = []
cases = [
    ((33, 72, 72), {"block_sizes": (16, 32), "num_warps": 4, "indexing": "pointer"}),  # M, K, N tails
    ((70, 136, 128), {"block_sizes": (32, 64), "num_warps": 4}),  # TMA for a, b and y; K tail
    ((17, 64, 200), {"block_sizes": (16, 16), "num_warps": 4, "num_stages": 1}),  # N = 200 in a 256 tile
    ((40, 64, 512), {"block_sizes": (16, 32), "num_warps": 4, "num_stages": 1}),  # b, y: pointers (box > 256)
    ((130, 128, 64), F.H200_CANDIDATES["tma-64x64-w8-s2"]),
    ((130, 128, 256), dict(F.H200_CANDIDATES["tma-128x64-w8-s3"], num_stages=1)),  # fp32: 1 stage fits 227 KiB
]
for (M, K, N), cfg in cases:
    for op in ("matmul_layernorm", "matmul_rmsnorm"):
        for affine in ((False, False), (True, True)):
            a, b, w, bias = make(M, K, N, "fp32", seed=M * K + N, affine=affine)
            bias = bias if op == "matmul_layernorm" else None
            out, code = run(op, a, b, w, bias, 1e-5, cfg)
            r = compare(op, out, a, b, w, bias, 1e-5)
            res.append(dict(r, op=op, shape=[M, K, N], affine=affine, tma="_desc.load(" in code))
print(json.dumps(res))
"""


def test_triton_interpreter_tiled_semantics():
    # (persistent pid_types cannot run here: the interpreter's tl.range rejects tl.program_id(0) as its start)
    res = run_python_json(INTERPRETER_CODE, env={"TRITON_INTERPRET": "1"}, timeout=300)
    assert len(res) == 6 * 2 * 2
    bad = [c for c in res if not (c["ok"] and c["stat_err"] < 1e-5)]
    assert not bad, bad
    assert res[4]["tma"] and not res[0]["tma"]  # both indexing paths ran


# ------------------------------------------------------------------------------------------------------------
# (3) generated Triton code
# ------------------------------------------------------------------------------------------------------------
def _cpu(M, K, N, dtype=torch.bfloat16):
    return torch.empty(M, K, dtype=dtype), torch.empty(K, N, dtype=dtype)


def _kernel_src(code: str) -> str:
    """The @triton.jit function without Helion's ``# src[...]`` comments (they quote the Python source)."""
    start = code.index("@triton.jit")
    end = code.index("\ndef ", code.index("def ", start) + 4)
    return "\n".join(ln for ln in code[start:end].splitlines() if not ln.lstrip().startswith("#"))


def _loops(src: str) -> list[tuple[str, str]]:
    """(header, body) of every ``for ... in tl.range(...)`` loop."""
    lines = src.splitlines()
    out = []
    for i, line in enumerate(lines):
        if re.match(r"\s*for \w+ in tl\.range\(", line):
            ind = len(line) - len(line.lstrip())
            body = []
            for nxt in lines[i + 1:]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= ind:
                    break
                body.append(nxt)
            out.append((line.strip(), "\n".join(body)))
    return out


@needs_codegen
@pytest.mark.parametrize("N, bn", [(72, 128), (128, 128), (200, 256), (512, 512), (16, 16)])
def test_codegen_n_tile_is_the_padded_row(N, bn):
    a, b = _cpu(1000, 256, N)
    cfg = {"block_sizes": (16, 64)} if N == 512 else None
    code = F.triton_code("matmul_layernorm", a, b, config=cfg)
    # the N tile = next_pow2(N): one _RDIM_SIZE constexpr set by the host code
    rdim, size = re.search(r"^    (_RDIM_SIZE_\d+) = (\d+)$", code, flags=re.M).groups()
    assert int(size) == bn == F.block_n(N)
    src = _kernel_src(code)
    assert f"acc = tl.full([_BLOCK_SIZE_0, {rdim}], 0.0, tl.float32)" in src
    assert "tl.program_id(1)" not in src  # the grid tiles M only
    bm = 16 if N == 512 else 64
    assert re.search(rf"_launcher\(_helion__matmul_layernorm_kernel, \({-(-1000 // bm)},\)", code)
    ((hdr, body),) = _loops(src)  # one device loop: K
    assert re.search(r"tl\.range\(0, 256, _BLOCK_SIZE_\d\)", hdr)
    assert body.count("tl.dot(") == 1 and "tl.sum(" not in body
    after = src[src.index(body) + len(body):]
    assert after.count("tl.sum(") == 2 and "tl.dot(" not in after  # LayerNorm: two passes, epilogue only
    assert "libdevice.rsqrt" in after
    if N != bn:  # the padded lanes are zeroed before both row sums; y's store is masked at N
        mask = re.search(rf"(mask_\d+) = indices_\d+ < {N}\n", src).group(1)
        assert len(re.findall(rf"tl\.where\(mask_0\[:, None\] & {mask}\[None, :\], ", after)) == 2
        assert re.search(rf"tl\.store\(y \+ .*, mask_0\[:, None\] & {mask}\[None, :\]\)", after)
    rms = _kernel_src(F.triton_code("matmul_rmsnorm", a, b, config=cfg))
    assert rms[rms.index("tl.dot("):].count("tl.sum(") == 1


@needs_codegen
def test_codegen_tma_where_configured():
    # N = 128: a, b and y through tensor descriptors; the b box is [BLOCK_K, 128], the y box [BLOCK_M, 128]
    src = _kernel_src(F.triton_code("matmul_layernorm", *_cpu(4096, 256, 128)))
    assert re.search(r"b_desc = tl\.make_tensor_descriptor\(b, \[256, 128\], \[128, 1\], \[_BLOCK_SIZE_\d, 128\]\)", src)
    assert "y_desc = tl.make_tensor_descriptor(y, [4096, 128], [128, 1], [_BLOCK_SIZE_0, 128])" in src
    assert "a_desc.load(" in src and "b_desc.load(" in src and "y_desc.store(" in src
    assert "tl.load(a" not in src and "tl.load(b" not in src
    # N = 512 (box 512 > 256) and N = 72 (box 128 > N): a keeps TMA, b and y fall back to pointers
    for N, cfg in ((512, {"block_sizes": (16, 64)}), (72, None)):
        src = _kernel_src(F.triton_code("matmul_layernorm", *_cpu(4096, 256, N), config=cfg))
        assert "a_desc.load(" in src and "tl.load(b +" in src and "tl.store(y +" in src and "b_desc" not in src, N
    # per-operand indexing (a, b, y) and all-pointer
    src = _kernel_src(F.triton_code("matmul_layernorm", *_cpu(4096, 256, 128),
                                    config={"indexing": ("pointer", "tensor_descriptor", "pointer")}))
    assert "tl.load(a +" in src and "b_desc.load(" in src and "tl.store(y +" in src and "a_desc" not in src
    src = _kernel_src(F.triton_code("matmul_rmsnorm", *_cpu(4096, 256, 128), config={"indexing": "pointer"}))
    assert "_desc" not in src
    # the statistics are 1-D fp32 pointer stores, masked at M
    src = _kernel_src(F.triton_code("matmul_layernorm", *_cpu(1000, 256, 128)))
    assert "tl.store(mean_out + indices_0 * 1, v_1, mask_0)" in src and "tl.store(rstd_out +" in src


@needs_codegen
def test_codegen_affine_specialization():
    a, b = _cpu(4096, 128, 128)
    for op in ("matmul_layernorm", "matmul_rmsnorm"):
        src = _kernel_src(F.triton_code(op, a, b))
        assert "weight" not in src and "bias" not in src, op  # no dummy tensors, no identity loads
        src = _kernel_src(F.triton_code(op, a, b, affine=True))
        assert "tl.load(weight" in src and ("tl.load(bias" in src) == (op == "matmul_layernorm"), op
    src = _kernel_src(F.triton_code("matmul_rmsnorm", a, b))
    assert src.count("tl.store(") == 1 and "y_desc.store(" in src  # y (TMA) and rstd


@needs_codegen
def test_codegen_persistent_flatten():
    a, b = _cpu(262144, 128, 128)
    src = _kernel_src(F.triton_code("matmul_layernorm", a, b, config=F.H200_CANDIDATES["persist-flat-64x64-w4-s3-x2"]))
    (grid_hdr, grid_body), (k_hdr, _) = _loops(src)
    assert "virtual_pid" in grid_hdr and "_NUM_SM * 2" in grid_hdr and "flatten=True" in grid_hdr
    assert "flatten" not in k_hdr and "tl.sum(" in grid_body
    assert F.TilingConfig(pid_type="persistent_blocked").to_helion().pid_type == "persistent_blocked"


@needs_codegen
def test_codegen_matmul_is_lazy_prenorm_gemm():
    from kernels_helion import lazy_prenorm

    assert F.matmul is lazy_prenorm.matmul
    cfg = F.H200_GEMM_CANDIDATES["gemm-tma-128x64x64-w4-s4"]
    code = F.triton_code("matmul", *_cpu(4096, 128, 64), config=cfg)
    assert "_BLOCK_SIZE_1 = tl.constexpr(64)" in code and "tl.dot(" in code


# ------------------------------------------------------------------------------------------------------------
# (4) compile-only for sm_90 (fake driver)
# ------------------------------------------------------------------------------------------------------------
COMPILE_CODE = r"""
import json
import torch
from normfuse import compile_only
compile_only.install(90)
from kernels_helion import naive_fusion as F

GRID = [(64, 64), (128, 128), (256, 256), (512, 256), (128, 512), (512, 512)]
res = {"candidates": {}, "unsupported": {}, "gemm": {}, "odd": {}}
for name, cfg in F.H200_CANDIDATES.items():
    c = F.TilingConfig.from_dict(cfg)
    for (K, N) in GRID:
        a = torch.empty(262144, K, dtype=torch.bfloat16); b = torch.empty(K, N, dtype=torch.bfloat16)
        key = f"{name}/{K}/{N}"
        try:
            ck = F.compile_sm90_kernel("matmul_layernorm", a, b, config=cfg)
        except ValueError as e:
            res["unsupported"][key] = str(e)
            continue
        res["candidates"][key] = dict(compile_only.summarize(ck), **F.ptxas_usage(ck),
                                      est=c.smem_estimate(N, 2), scf_for=ck.asm["ttgir"].count("scf.for"))
a = torch.empty(262144, 256, dtype=torch.bfloat16); b = torch.empty(256, 256, dtype=torch.bfloat16)
for name, cfg in F.H200_CANDIDATES.items():  # the RMSNorm op and the affine epilogue at one shape
    ck = F.compile_sm90_kernel("matmul_rmsnorm", a, b, config=cfg, affine=True)
    res["candidates"][f"{name}/rms-affine"] = dict(compile_only.summarize(ck), **F.ptxas_usage(ck))
for name, cfg in F.H200_GEMM_CANDIDATES.items():
    res["gemm"][name] = F.compile_sm90("matmul", a, b, config=cfg)
for (M, K, N) in [(1, 64, 64), (257, 128, 72), (1000, 256, 256), (17793, 512, 128), (5, 8, 16)]:
    a = torch.empty(M, K, dtype=torch.bfloat16); b = torch.empty(K, N, dtype=torch.bfloat16)
    for op in ("matmul_layernorm", "matmul_rmsnorm"):
        res["odd"][f"{M}/{K}/{N}/{op}"] = F.compile_sm90(op, a, b, affine=True)
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def compiled():
    return run_python_json(COMPILE_CODE, timeout=600)


def test_compile_sm90_candidates(compiled):
    cands, unsup = compiled["candidates"], compiled["unsupported"]
    # every candidate serves N <= 256; only tma-64x64-w8-s2 holds N = 512 (the others: 256 acc registers/thread)
    assert set(unsup) == {f"{n}/{k}/512" for n in F.H200_CANDIDATES if n != "tma-64x64-w8-s2" for k in (128, 512)}
    assert all("MAX_ACC_REGS_PER_THREAD" in e for e in unsup.values())
    assert len(cands) == len(F.H200_CANDIDATES) * 7 - len(unsup)
    for key, s in cands.items():
        assert s["smem_ok"] and s["ptx_markers"]["wgmma"] > 0 and s["ptx_markers"]["tma_load"] > 0, (key, s)
        assert s["spill_store_bytes"] == 0 and s["spill_load_bytes"] == 0, (key, s)
        assert s["ctas_per_sm"] >= 1, (key, s)
        if "est" in s:  # the capacity estimate is an upper bound, tight once the K loop has >= 2 iterations
            K = int(key.split("/")[1])
            assert s["shared_bytes"] <= s["est"] + 1024, (key, s)
            if K > 64:
                assert s["est"] - s["shared_bytes"] <= 1024, (key, s)
    for (K, N) in [(64, 64), (128, 128), (256, 256)]:
        assert cands[f"tma-64x64-w4-s3/{K}/{N}"]["num_warps"] == 4
    # persistent + persistent_flatten: Triton fused the row-block loop and the K loop into one scf.for
    assert cands["persist-flat-64x64-w4-s3-x2/128/128"]["scf_for"] == 1
    assert cands["tma-64x64-w4-s3/128/128"]["scf_for"] == 1
    for name, s in compiled["gemm"].items():
        assert s["smem_ok"] and s["ptx_markers"]["wgmma"] > 0 and s["ptx_markers"]["tma_load"] > 0, (name, s)


def test_compile_sm90_odd_shapes(compiled):
    assert len(compiled["odd"]) == 10
    for key, s in compiled["odd"].items():  # M = 1: BLOCK_M is clamped, so no wgmma there
        assert s["smem_ok"], (key, s)
        if not key.startswith("1/"):
            assert s["ptx_markers"]["wgmma"] > 0, (key, s)


# ------------------------------------------------------------------------------------------------------------
# (5) configs, capacity and input errors
# ------------------------------------------------------------------------------------------------------------
def test_config_defaults_round_trip_and_helion_lists():
    assert F.TilingConfig.from_dict(None) == F.DEFAULT_CONFIG == F.TilingConfig()
    for name, d in F.H200_CANDIDATES.items():
        cfg = F.TilingConfig.from_dict(d)
        assert F.TilingConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg, name
        hash(cfg)
    c = F.TilingConfig(block_sizes=[128, 32], indexing=["pointer", "tensor_descriptor", "tensor_descriptor"])
    assert c.block_sizes == (128, 32)
    # Helion's memory-op order: a, b, [weight], [bias], y, [mean], rstd; the 1-D ones always use pointers
    assert c.to_helion("matmul_layernorm").indexing == ["pointer", "tensor_descriptor", "tensor_descriptor",
                                                        "pointer", "pointer"]
    assert c.to_helion("matmul_layernorm", (True, True)).indexing == [
        "pointer", "tensor_descriptor", "pointer", "pointer", "tensor_descriptor", "pointer", "pointer"]
    assert c.to_helion("matmul_rmsnorm", (True, False)).indexing == [
        "pointer", "tensor_descriptor", "pointer", "tensor_descriptor", "pointer"]
    h = F.TilingConfig(pid_type="persistent_interleaved", persistent_flatten=True, num_sm_multiplier=2,
                       maxnreg=168).to_helion()
    assert h.range_flattens == [True, None] and h.num_sm_multiplier == 2 and h.maxnreg == 168
    assert h.block_sizes == [64, 64] and "l2_groupings" not in h.config  # 1-D grid
    with pytest.raises(ValueError, match="unknown fused op"):
        F.DEFAULT_CONFIG.to_helion("matmul")


@needs_codegen
def test_helion_config_lists_match_the_kernel():
    # what to_helion relies on: block_sizes (BLOCK_M, BLOCK_K), range lists [grid loop, K loop], the memory-op
    # count per affine combination, and no reduction_loops entry for the loop-carried N dimension
    a, b = _cpu(512, 128, 128)
    w = torch.ones(128, dtype=torch.bfloat16)
    for op, kernel in F._KERNELS.items():
        for affine in ((False, False), (True, False), (True, True)):
            if op == "matmul_rmsnorm" and affine[1]:
                continue
            args = (a, b, w if affine[0] else None, w if affine[1] else None, 1e-5)
            if op == "matmul_rmsnorm":
                args = (a, b, args[2], 1e-5)
            spec = kernel.bind(args).config_spec
            assert len(spec.block_sizes) == 2 and len(spec.range_flattens) == 2, op
            assert len(spec.reduction_loops) == 0, op
            ix = F.TilingConfig(indexing=("pointer", "tensor_descriptor", "pointer")).to_helion(op, affine).indexing
            n_mem = 2 + affine[0] + affine[1] + (3 if op == "matmul_layernorm" else 2)
            assert len(ix) == n_mem, (op, affine)
            kernel.bind(args).to_triton_code(F.TilingConfig(indexing=("pointer", "tensor_descriptor",
                                                                      "pointer")).to_helion(op, affine))


def test_shipped_yaml_matches_module_candidates():
    data = yaml.safe_load((REPO / "configs" / "tiling" / "naive_fusion_h200.yaml").read_text())
    assert set(data) >= {"triton", "helion", "tlx"}
    fused = {e["name"]: e for e in data["helion"] if e.get("impls") == ["fused"]}
    gemm = {e["name"]: e for e in data["helion"] if e.get("impls") == ["gemm"]}
    assert len(fused) + len(gemm) == len(data["helion"]) and 3 <= len(fused) <= 5
    assert set(fused) == set(F.H200_CANDIDATES) and set(gemm) == set(F.H200_GEMM_CANDIDATES)
    from kernels_helion import lazy_prenorm

    for name, e in fused.items():
        d = {k: v for k, v in e.items() if k not in ("name", "impls")}
        assert F.TilingConfig.from_dict(d) == F.TilingConfig.from_dict(F.H200_CANDIDATES[name]), name
    for name, e in gemm.items():
        d = {k: v for k, v in e.items() if k not in ("name", "impls")}
        assert lazy_prenorm.TilingConfig.from_dict(d) == \
            lazy_prenorm.TilingConfig.from_dict(F.H200_GEMM_CANDIDATES[name]), name


def test_capacity_limits():
    assert [F.block_n(n) for n in (8, 16, 24, 64, 72, 128, 200, 256, 264, 512)] == \
        [16, 16, 32, 64, 128, 128, 256, 256, 512, 512]
    c = F.TilingConfig(block_sizes=(128, 64), num_warps=8)
    assert c.acc_regs_per_thread(256) == 128 and c.acc_regs_per_thread(264) == 256
    c.check_capacity(256)
    with pytest.raises(ValueError, match=r"MAX_ACC_REGS_PER_THREAD=128.*holds N <= 256"):
        c.check_capacity(264)
    F.TilingConfig(block_sizes=(64, 64), num_warps=8).check_capacity(512)
    with pytest.raises(ValueError, match="MIN_N=16"):
        F.DEFAULT_CONFIG.check_capacity(8)
    # shared memory: 4 stages x (64x256 + 256x256) bf16 = 640 KiB
    with pytest.raises(ValueError, match="SMEM_LIMIT_BYTES=232448"):
        F.TilingConfig(block_sizes=(64, 256), num_warps=8, num_stages=4).check_capacity(256)
    # through the public functions (any mode: the check precedes the device dispatch)
    a, b = torch.randn(4, 64), torch.randn(64, 512)
    for fn in (F.matmul_layernorm, F.matmul_rmsnorm):
        with pytest.raises(ValueError, match="does not fit"):
            fn(a, b)
        with pytest.raises(ValueError, match="MIN_N"):
            fn(a, torch.randn(64, 8))


@pytest.mark.parametrize("d, match", [
    ({"block_sizes": (64, 64, 64)}, "2 entries"),
    ({"block_sizes": (64, 100)}, "powers of two"),
    ({"block_sizes": (8, 64)}, r"\[16, 256\]"),
    ({"block_sizes": (512, 64)}, r"\[16, 256\]"),
    ({"num_warps": 6}, "num_warps"),
    ({"num_stages": 0}, "num_stages"),
    ({"num_stages": True}, "num_stages"),
    ({"indexing": "tma"}, "indexing"),
    ({"indexing": ("pointer", "pointer")}, "3-tuple"),
    ({"pid_type": "xyz"}, "pid_type"),
    ({"persistent_flatten": True}, "persistent pid_type"),
    ({"pid_type": "persistent_blocked", "persistent_flatten": 1}, "persistent_flatten"),
    ({"num_sm_multiplier": 2}, "persistent"),
    ({"maxnreg": 128}, "persistent"),
    ({"pid_type": "persistent_blocked", "maxnreg": 300}, "maxnreg"),
    ({"epilogue_subtile": 2}, "unknown TilingConfig key"),
    ({"BLOCK_M": 64}, "unknown TilingConfig key"),
])
def test_config_errors(d, match):
    with pytest.raises(ValueError, match=match):
        F.TilingConfig.from_dict(d)


def test_config_type_error():
    with pytest.raises(TypeError, match="mapping"):
        F.TilingConfig.from_dict([("num_warps", 4)])


@pytest.mark.parametrize("fn", [F.matmul_layernorm, F.matmul_rmsnorm])
def test_bad_inputs(fn):
    from normfuse.testing import assert_rejects_bad_inputs

    assert_rejects_bad_inputs(fn, torch.float32, {"block_sizes": (64, 100)})
    a, b = torch.randn(8, 64), torch.randn(64, 64)
    with pytest.raises(ValueError, match=r"shape \[N\]"):
        fn(a, b, torch.ones(63))
    with pytest.raises(TypeError, match="dtype"):
        fn(a, b, torch.ones(64, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="weight"):
        fn(a, b, torch.ones(64).numpy())
    with pytest.raises(ValueError, match="contiguous"):
        fn(a, b, torch.ones(128)[::2])
    with pytest.raises(ValueError, match="eps"):
        fn(a, b, eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        fn(a, b, eps=float("nan"))
    if fn is F.matmul_layernorm:
        with pytest.raises(ValueError, match="bias"):
            fn(a, b, torch.ones(64), torch.ones(65))


def test_compile_sm90_rejects_unknown_op():
    with pytest.raises(ValueError, match="unknown op"):
        F.compile_sm90("matmul_groupnorm", *_cpu(64, 64, 64))


@pytest.mark.skipif(IN_REF_MODE, reason="ref mode accepts CPU tensors")
def test_cpu_tensors_need_ref_mode():
    for fn in (F.matmul_layernorm, F.matmul_rmsnorm):
        with pytest.raises(ValueError, match="CUDA"):
            fn(torch.randn(4, 64), torch.randn(64, 64))
