"""CPU tests for kernels_helion/norms.py: ref-mode semantics, generated Triton, sm_90 compile-only, errors.

Ref mode and compile-only run in subprocesses (``HELION_INTERPRET`` is read when helion is imported;
``normfuse.compile_only.install(90)`` swaps Triton's driver for the rest of a process). Ref mode checks the math on
whole tensors, not the tiling; the codegen tests check the masks and loop structure the tiling produces. None of
this replaces a GPU correctness check of every benchmarked config.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kernels_helion import norms as K  # noqa: E402
from normfuse.testing import run_python_json  # noqa: E402

IN_REF_MODE = K.ref_mode()
needs_codegen = pytest.mark.skipif(IN_REF_MODE, reason="code generation is unavailable in Helion ref mode")




# ------------------------------------------------------------------------------------------------------------
# (1) ref-mode semantics against the fp32 reference
# ------------------------------------------------------------------------------------------------------------
REF_MODE_CODE = r"""
import json, math
import torch
from kernels_helion import norms as K
from normfuse.techniques import norms as T

FN = {"rmsnorm": K.rms_norm, "layernorm": K.layer_norm}

def call(variant, inp, eps, config=None):
    if variant == "rmsnorm":
        y, rstd = K.rms_norm(inp["x"], inp["weight"], eps=eps, config=config)
        return {"y": y, "rstd": rstd}
    y, mean, rstd = K.layer_norm(inp["x"], inp["weight"], inp["bias"], eps=eps, config=config)
    return {"y": y, "mean": mean, "rstd": rstd}

def stat_err(out, ref):
    # relative error of the fp32 statistics (the mean relative to the row scale 1/rstd)
    e = ((out["rstd"] - ref["rstd"]).abs() / ref["rstd"].abs()).max().item()
    if "mean" in ref:
        e = max(e, ((out["mean"] - ref["mean"]).abs() * ref["rstd"]).max().item())
    return e

def check(name, variant, inp, eps, config=None):
    out = call(variant, inp, eps, config)
    ref = T.reference(variant, inp, eps)
    tol = T.tolerance(ref["y"], T.same_dtype(variant, inp, eps))
    err = (out["y"].float() - ref["y"]).abs().max().item()
    M, N = inp["x"].shape
    return dict(name=name, variant=variant, dtype=str(inp["x"].dtype), shape=[M, N], err=err, tol=tol,
                stat_err=stat_err(out, ref), y_dtype=str(out["y"].dtype), y_shape=list(out["y"].shape),
                stat_dtypes=sorted({str(out[k].dtype) for k in out if k != "y"}),
                stat_shapes=sorted({tuple(out[k].shape) for k in out if k != "y"}) == [(M,)])

res = {"ref_mode": K.ref_mode(), "cases": []}
odd = {"block_sizes": (4,), "reduction_loops": (64,), "num_warps": 4}  # validated, then ignored in ref mode
for variant in T.VARIANTS:
    for dtype in ("bf16", "fp16", "fp32"):
        for (M, N) in [(1, 1), (1, 1000), (7, 4095), (33, 512), (3, 1000)]:
            for affine in (False, True):
                inp = T.make_inputs(M, N, dtype=dtype, affine=affine, seed=M * N)
                for eps in (1e-6, 1e-2):
                    res["cases"].append(check("shapes", variant, inp, eps, odd if M == 33 else None))
    # weight without bias (LayerNorm; RMSNorm has no bias anyway)
    inp = T.make_inputs(5, 1000, dtype="bf16", affine=True, seed=3)
    inp["bias"] = None
    res["cases"].append(check("weight_only", variant, inp, 1e-5))
    # large |x| (fp32 sum of squares still finite; bf16 keeps the exponent range)
    for dtype, scale in (("bf16", 1e15), ("fp16", 1e3), ("fp32", 1e15)):
        inp = T.make_inputs(6, 4095, dtype=dtype, affine=True, seed=11)
        inp["x"] = (inp["x"].float() * scale).to(inp["x"].dtype)
        res["cases"].append(check("large", variant, inp, 1e-6))
# mean-shifted LayerNorm: x + 10 (and + 1000 in fp32) needs the two-pass variance
for dtype, shift in (("bf16", 10.0), ("fp16", 10.0), ("fp32", 10.0), ("fp32", 1000.0)):
    for N in (1000, 4095):
        inp = T.make_inputs(9, N, dtype=dtype, affine=True, seed=N, mean_shift=shift)
        res["cases"].append(check(f"shift{shift:g}", "layernorm", inp, 1e-5))

# NaN in one row: that row (and its statistics) is NaN, every other row is finite and correct
res["nan"] = []
for variant in T.VARIANTS:
    for dtype in ("bf16", "fp32"):
        for affine in (False, True):
            inp = T.make_inputs(6, 1000, dtype=dtype, affine=affine, seed=5)
            inp["x"][2, 17] = float("nan")
            out = call(variant, inp, 1e-5)
            good = [r for r in range(6) if r != 2]
            clean = {k: (v[good] if k == "x" else v) for k, v in inp.items()}
            ref = T.reference(variant, clean, 1e-5)
            tol = T.tolerance(ref["y"], T.same_dtype(variant, clean, 1e-5))
            res["nan"].append(dict(
                variant=variant, dtype=dtype, affine=affine,
                row_all_nan=bool(out["y"][2].isnan().all()),
                stats_nan=all(bool(out[k][2].isnan()) for k in out if k != "y"),
                others_finite=bool(out["y"][good].isfinite().all()),
                others_err=(out["y"][good].float() - ref["y"]).abs().max().item(), tol=tol))
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def ref_results():
    return run_python_json(REF_MODE_CODE, env={"HELION_INTERPRET": "1"})


def test_ref_mode_matches_reference(ref_results):
    res = ref_results
    assert res["ref_mode"] is True
    assert len(res["cases"]) == 2 * 3 * 5 * 2 * 2 + 2 * (1 + 3) + 4 * 2
    bad = [c for c in res["cases"] if not (c["err"] <= c["tol"])]
    assert not bad, f"{len(bad)} cases exceed the spec tolerance, e.g. {bad[:3]}"
    for c in res["cases"]:
        assert c["y_shape"] == c["shape"] and c["y_dtype"] == c["dtype"], c  # y in x.dtype
        assert c["stat_dtypes"] == ["torch.float32"] and c["stat_shapes"], c
        assert c["stat_err"] < 1e-4, c  # fp32 statistics


def test_ref_mode_mean_shift_is_accurate(ref_results):
    # two-pass variance: a +10 / +1000 mean costs nothing against the reference (E[x^2]-mean^2 would lose digits)
    shifted = [c for c in ref_results["cases"] if c["name"].startswith("shift")]
    assert len(shifted) == 8
    for c in shifted:
        assert c["err"] <= c["tol"] and c["stat_err"] < 1e-5, c


def test_ref_mode_nan_stays_in_its_row(ref_results):
    assert len(ref_results["nan"]) == 2 * 2 * 2
    for c in ref_results["nan"]:
        assert c["row_all_nan"] and c["stats_nan"] and c["others_finite"], c
        assert c["others_err"] <= c["tol"], c


# ------------------------------------------------------------------------------------------------------------
# (2) generated Triton
# ------------------------------------------------------------------------------------------------------------
def _kernel_src(code: str) -> str:
    """The @triton.jit function of the generated module, without the host wrapper and Helion's ``# src[...]``
    comments (they quote the Python source, weight/for lines included)."""
    start = code.index("@triton.jit")
    end = code.index("\ndef ", code.index("def ", start) + 4)
    return "\n".join(ln for ln in code[start:end].splitlines() if not ln.lstrip().startswith("#"))


@needs_codegen
def test_codegen_whole_row_and_masks():
    x = torch.empty(7, 1000, dtype=torch.bfloat16)
    cfg = {"block_sizes": (4,), "num_warps": 4}
    for op in K.OPS:
        src = _kernel_src(K.triton_code(op, x, config=cfg))
        assert "tl.range" not in src and "for " not in src, op  # whole row in registers: no loop
        assert src.count("tl.load(x") == 1, op  # x read once
        assert "_RDIM_SIZE_1" in src and "< 1000" in src and "< 7" in src, op  # N tail and M tail masked
        assert "weight" not in src and "bias" not in src, op  # the no-affine specialization
        assert "libdevice.rsqrt" in src
    src = _kernel_src(K.triton_code("layer_norm", x, config=cfg))
    # the padded lanes of (x - mean)^2 are zeroed before the variance sum
    assert re.search(r"tl\.where\(.*mask_1.*\)", src)
    assert src.count("tl.sum(") == 2
    assert src.count("tl.store(") == 3  # y, mean, rstd
    src = _kernel_src(K.triton_code("layer_norm", x, config=cfg, affine=True))
    assert "tl.load(weight" in src and "tl.load(bias" in src


@needs_codegen
def test_codegen_looped_reduction_passes():
    x = torch.empty(16, 32768, dtype=torch.bfloat16)
    cfg = {"reduction_loops": (4096,)}
    rms = _kernel_src(K.triton_code("rms_norm", x, config=cfg, affine=True))
    ln = _kernel_src(K.triton_code("layer_norm", x, config=cfg, affine=True))
    assert rms.count("tl.range(0, 32768, _REDUCTION_BLOCK_1)") == 2  # sum of squares, output
    assert ln.count("tl.range(0, 32768, _REDUCTION_BLOCK_1)") == 3  # sum, centred sum of squares, output
    assert rms.count("tl.load(x") == 2 and ln.count("tl.load(x") == 3
    assert "_REDUCTION_BLOCK_1 = 4096" in K.triton_code("rms_norm", x, config=cfg)
    # a chunk >= next_pow2(N) is the whole row (Helion's rule)
    small = torch.empty(16, 2048, dtype=torch.bfloat16)
    assert "tl.range" not in _kernel_src(K.triton_code("rms_norm", small, config=cfg))


@needs_codegen
def test_codegen_persistent_and_int64_indices():
    x = torch.empty(4096, 1024, dtype=torch.bfloat16)
    src = _kernel_src(K.triton_code("rms_norm", x, config=K.H200_CANDIDATES["persist-r2-w8-x4"]))
    assert re.search(r"for virtual_pid in tl\.range\(tl\.program_id\(0\), total_pids, _NUM_SM \* 4\)", src)
    big = torch.empty(262144, 16384, dtype=torch.bfloat16)  # 2^32 elements: not touched, only bound
    src = _kernel_src(K.triton_code("rms_norm", big))
    assert "tl.int64" in src


# ------------------------------------------------------------------------------------------------------------
# (3) compile-only for sm_90 (fake driver)
# ------------------------------------------------------------------------------------------------------------
COMPILE_CODE = r"""
import json
import torch
from normfuse import compile_only
compile_only.install(90)
from kernels_helion import norms as K

res = {"default": {}, "odd": {}, "candidates": {}}
x = torch.empty(262144, 1024, dtype=torch.bfloat16)
for op in K.OPS:
    for affine in (False, True):
        res["default"][f"{op}/{affine}"] = K.compile_sm90(op, x, affine=affine)
        res["odd"][f"{op}/{affine}"] = K.compile_sm90(op, torch.empty(1, 4095, dtype=torch.bfloat16),
                                                      config={"block_sizes": (4,), "reduction_loops": (1024,),
                                                              "num_warps": 4}, affine=affine)
for N, names in K.H200_CANDIDATES_BY_N.items():
    if N not in (1024, 8192, 32768):
        continue
    x = torch.empty(262144, N, dtype=torch.bfloat16)
    for name in names:
        for op in K.OPS:
            ck = K.compile_sm90_kernel(op, x, config=K.H200_CANDIDATES[name], affine=True)
            res["candidates"][f"{name}/{N}/{op}"] = dict(compile_only.summarize(ck), **K.ptxas_usage(ck))
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def compiled():
    return run_python_json(COMPILE_CODE)


def test_compile_sm90(compiled):
    for group in ("default", "odd"):
        for key, s in compiled[group].items():
            assert s["smem_ok"] and s["shared_bytes"] <= 232448, (key, s)
            assert s["ptx_markers"]["wgmma"] == 0 and s["ptx_markers"]["tma_load"] == 0, (key, s)
    assert compiled["default"]["rms_norm/False"]["num_warps"] == K.DEFAULT_CONFIG.num_warps


def test_compile_sm90_h200_candidates(compiled):
    cands = compiled["candidates"]
    assert len(cands) == 2 * sum(len(K.H200_CANDIDATES_BY_N[n]) for n in (1024, 8192, 32768))
    for key, s in cands.items():
        assert s["smem_ok"], (key, s)
        # within the N range each entry is proposed for: no register spills
        assert s["spill_store_bytes"] == 0 and s["spill_load_bytes"] == 0, (key, s)
        assert s["ctas_per_sm"] >= 1, (key, s)


# ------------------------------------------------------------------------------------------------------------
# (4) configs and input errors
# ------------------------------------------------------------------------------------------------------------
def test_config_defaults_and_round_trip():
    assert K.TilingConfig.from_dict(None) == K.DEFAULT_CONFIG
    assert K.TilingConfig.from_dict(K.DEFAULT_CONFIG) is K.DEFAULT_CONFIG
    for name, d in K.H200_CANDIDATES.items():
        cfg = K.TilingConfig.from_dict(d)
        assert K.TilingConfig.from_dict(cfg.to_dict()) == cfg, name
        assert K.TilingConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg, name  # lists -> tuples
        h = cfg.to_helion()
        assert h.block_sizes == list(cfg.block_sizes) and h.reduction_loops == list(cfg.reduction_loops)
    assert set(K.H200_CANDIDATES_BY_N) == {512, 1024, 2048, 4096, 8192, 16384, 32768}
    assert {n for names in K.H200_CANDIDATES_BY_N.values() for n in names} == set(K.H200_CANDIDATES)
    assert 3 <= len(K.H200_CANDIDATES) <= 6
    h = K.TilingConfig(pid_type="persistent_blocked", num_sm_multiplier=2, maxnreg=128).to_helion()
    assert h.config["num_sm_multiplier"] == 2 and h.config["maxnreg"] == 128


@pytest.mark.parametrize("d, match", [
    ({"block_sizes": (3,)}, "power of two"),
    ({"block_sizes": (512,)}, "power of two"),
    ({"block_sizes": (1, 2)}, "1-tuple"),
    ({"block_sizes": 4}, "1-tuple"),
    ({"reduction_loops": (1000,)}, "power of two"),
    ({"reduction_loops": (8,)}, "power of two"),
    ({"reduction_loops": None}, "1-tuple"),
    ({"num_warps": 3}, "num_warps"),
    ({"num_warps": 64}, "num_warps"),
    ({"num_stages": 0}, "num_stages"),
    ({"num_stages": True}, "num_stages"),
    ({"indexing": "tma"}, "indexing"),
    ({"pid_type": "xyz"}, "pid_type"),
    ({"num_sm_multiplier": 2}, "persistent"),
    ({"maxnreg": 128}, "persistent"),
    ({"pid_type": "persistent_blocked", "maxnreg": 300}, "maxnreg"),
    ({"pid_type": "persistent_blocked", "num_sm_multiplier": 0}, "num_sm_multiplier"),
    ({"BLOCK_M": 4}, "unknown TilingConfig key"),
])
def test_config_errors(d, match):
    with pytest.raises(ValueError, match=match):
        K.TilingConfig.from_dict(d)


def test_config_type_error():
    with pytest.raises(TypeError, match="mapping"):
        K.TilingConfig.from_dict([("num_warps", 4)])


@pytest.mark.parametrize("fn", [K.rms_norm, K.layer_norm])
def test_bad_inputs(fn):
    # normfuse.testing.assert_rejects_bad_inputs is written for two-operand GEMM entry points (inner dimensions,
    # K/N multiples of 8); the norms' contract is normfuse.techniques.norms.check_inputs, exercised here.
    x = torch.randn(8, 64)
    w = torch.ones(64)
    with pytest.raises(TypeError):
        fn(x.numpy())
    with pytest.raises(TypeError):
        fn(x.to(torch.int32))
    with pytest.raises(ValueError, match="2-D"):
        fn(x[None])
    with pytest.raises(ValueError, match="contiguous"):
        fn(torch.randn(8, 128)[:, ::2])
    with pytest.raises(ValueError, match="shape"):
        fn(x, torch.ones(63))
    with pytest.raises(TypeError):
        fn(x, w.numpy())
    with pytest.raises(TypeError, match="dtype"):
        fn(x, w.to(torch.bfloat16))
    with pytest.raises(ValueError, match="eps"):
        fn(x, w, eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        fn(x, w, eps=float("nan"))
    with pytest.raises(ValueError, match="power of two"):
        fn(x, w, config={"block_sizes": (3,)})
    with pytest.raises(ValueError, match="unknown"):
        fn(x, w, config={"rows": 4})
    if fn is K.layer_norm:
        with pytest.raises(ValueError, match="bias"):
            fn(x, w, torch.ones(65))


def test_compile_sm90_rejects_unknown_op():
    with pytest.raises(ValueError, match="unknown op"):
        K.compile_sm90("group_norm", torch.empty(4, 64))


@pytest.mark.skipif(IN_REF_MODE, reason="ref mode accepts CPU tensors")
def test_cpu_tensors_need_ref_mode():
    for fn in (K.rms_norm, K.layer_norm):
        with pytest.raises(ValueError, match="CUDA"):
            fn(torch.randn(4, 64))
