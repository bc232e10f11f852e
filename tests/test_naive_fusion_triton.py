"""Tests of ``kernels_triton.naive_fusion`` (GEMM + full-row LayerNorm / RMSNorm epilogue) on a CPU-only machine.

1. Semantics under ``TRITON_INTERPRET=1`` (fp32/fp16) against ``normfuse.techniques.naive_fusion``'s fp32 reference
   and tolerance, for the three schedules (tile, persistent with resident B, persistent flattened), both variants,
   with and without affine: M = 1, N not a power of two (72, 264: masked padding columns, two 256-column halves),
   N = 512, K tails (K not a multiple of BLOCK_K), a persistent grid smaller than the tile count (the loop runs);
   mean-shifted rows for LayerNorm (with a negative control showing E[x^2] - mean^2 would fail); a NaN in one row
   staying in that row; eps honoured; a plain GEMM failing the fused check. One subprocess (the flag must be set
   before triton is imported), shared through a module fixture.
2. Compile-only for sm_90 (fake driver, subprocess): every shipped Triton config of
   ``configs/tiling/naive_fusion_h200.yaml`` at every shape of the blog grid either compiles (wgmma + TMA in the
   PTX, shared memory within the limit and equal to ``smem_bytes`` up to the barriers) or raises ValueError naming
   its limit; every grid shape is served by some fused config; the TTGIR of the resident-B schedule loads B once,
   outside the row-block loop, and pipelines A.
3. Config validation, launch limits and bad-input errors (in-process: raised before any launch).

None of this measures speed or catches a GPU-only miscompile: that is the GPU check (normfuse.gpu_checks).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kernels_triton import naive_fusion as knf  # noqa: E402
from kernels_triton.naive_fusion import DEFAULT_CONFIG, MAX_N, TilingConfig, launch_params  # noqa: E402
from normfuse.testing import assert_rejects_bad_inputs, run_python_json  # noqa: E402

TILING = yaml.safe_load((REPO / "configs" / "tiling" / "naive_fusion_h200.yaml").read_text())
GRID = [(262144, N, K) for K in (64, 128, 256) for N in (64, 128, 256, 512)]  # configs/shape/naive_fusion_grid.yaml


def _fused_configs():
    return [{k: v for k, v in c.items() if k not in ("name", "impls")} | {"_name": c["name"]}
            for c in TILING["triton"] if c.get("impls") == ["fused"]]


# --------------------------------------------------------------------------------------------------------
# 1. interpreter semantics
# --------------------------------------------------------------------------------------------------------
_INTERP_SCRIPT = r"""
import json, os
assert os.environ.get("TRITON_INTERPRET") == "1"
import torch
from normfuse.techniques import naive_fusion as T
from kernels_triton import naive_fusion as knf
from kernels_triton.naive_fusion import matmul_layernorm, matmul_rmsnorm, matmul, launch_params

knf._DEFAULT_NUM_SMS = 2  # off-GPU SM count: persistent grids of 2-4 programs, smaller than the tile counts
EPS = {"layernorm": 1e-5, "rmsnorm": 1e-6}
SCHEDULES = {  # name -> config; BLOCK_M 16/32 keeps the interpreter fast
    "tile": dict(BLOCK_M=16, BLOCK_K=32, num_warps=4, num_stages=2),
    "resident": dict(BLOCK_M=16, BLOCK_K=None, num_warps=4, num_stages=2, PERSISTENT=True),
    "flat": dict(BLOCK_M=32, BLOCK_K=16, num_warps=4, num_stages=2, PERSISTENT=True, PROGRAMS_PER_SM=2),
}


def run(variant, inp, eps, cfg):
    if variant == "layernorm":
        return matmul_layernorm(inp["a"], inp["b"], inp["weight"], inp["bias"], eps=eps, config=cfg)
    return matmul_rmsnorm(inp["a"], inp["b"], inp["weight"], eps=eps, config=cfg)


def check(variant, inp, eps, cfg, rows=None):
    out = run(variant, inp, eps, cfg)
    a = inp["a"]
    M, N = a.shape[0], inp["b"].shape[1]
    assert out[0].dtype == a.dtype and out[0].shape == (M, N), (out[0].dtype, out[0].shape)
    assert len(out) == (3 if variant == "layernorm" else 2)
    assert all(s.dtype == torch.float32 and s.shape == (M,) for s in out[1:])
    if rows is not None:  # check a subset of rows (the others hold a planted NaN)
        inp = {**inp, "a": a[rows]}
        out = tuple(t[rows] for t in out)
    r = T.check("fused", out, inp, eps, variant)
    p = launch_params(M, N, a.shape[1], a.dtype, cfg, num_sms=knf._DEFAULT_NUM_SMS)
    return out, dict(variant=variant, shape=[M, N, a.shape[1]], dtype=str(a.dtype).split(".")[-1], cfg=cfg,
                     schedule=p["SCHEDULE"], programs=p["grid"][0], tiles=p["tiles"], split=p["SPLIT"], **r)


# (M, N, K): M = 1; N = 72 (padding columns masked); several row blocks with a partial last one; N = 264 (two halves,
# the second mostly padding), K tail; N = 512 (two full halves); K = 40 (tail of every K step size used)
CASES = [(1, 64, 64), (37, 72, 40), (50, 264, 24), (33, 512, 32), (70, 128, 72)]
results = {"basic": [], "shift": [], "nan": [], "eps": [], "gemm": []}
for dtype in ("fp32", "fp16"):
    for M, N, K in CASES:
        for affine in (False, True):
            inp = T.make_inputs(M, N, K, dtype=dtype, affine=affine, seed=M + N + K)
            for sched, cfg in SCHEDULES.items():
                for variant in ("layernorm", "rmsnorm"):
                    _, r = check(variant, inp, EPS[variant], cfg)
                    results["basic"].append(dict(label=sched, affine=affine, **r))
        # the plain GEMM of this DSL (lazy_prenorm.matmul re-exported)
        inp = T.make_inputs(M, N, K, dtype=dtype, seed=1)
        c = matmul(inp["a"], inp["b"], config=dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=2))
        results["gemm"].append(dict(shape=[M, N, K], dtype=dtype, **T.check("gemm", c, inp, 1e-5)))

    # mean-shifted rows (|mean| ~ 10 std): two-pass statistics stay within the tolerance
    for sched, cfg in SCHEDULES.items():
        for affine in (False, True):
            inp = T.make_inputs(45, 136, 48, dtype=dtype, affine=affine, seed=5, mean_shift=10.0)
            _, r = check("layernorm", inp, 1e-5, cfg)
            results["shift"].append(dict(shift=10.0, affine=affine, label=sched, **r))

# fp32, |mean| ~ 3000 std: the kernels still pass; the one-pass E[x^2] - mean^2 (fp32) must FAIL the same check
inp = T.make_inputs(45, 136, 48, dtype="fp32", seed=6, mean_shift=3000.0)
for sched, cfg in SCHEDULES.items():
    _, r = check("layernorm", inp, 1e-5, cfg)
    results["shift"].append(dict(shift=3000.0, affine=False, label=sched, **r))
acc = inp["a"] @ inp["b"]
m = acc.mean(-1)
var_one_pass = (acc * acc).mean(-1) - m * m
rstd1 = torch.rsqrt(var_one_pass.clamp_min(0) + 1e-5)
one_pass = (acc - m[:, None]) * rstd1[:, None]
negative_control_ok = T.check("fused", (one_pass, m, rstd1), inp, 1e-5, "layernorm")["ok"]

# NaN in one row (row 2): that row's y and statistics are NaN, every other row finite and correct
for dtype in ("fp32", "fp16"):
    for sched, cfg in SCHEDULES.items():
        for variant in ("layernorm", "rmsnorm"):
            inp = T.make_inputs(19, 72, 40, dtype=dtype, affine=True, seed=9)
            inp["a"][2, 7] = float("nan")
            others = [i for i in range(19) if i != 2]
            out = run(variant, inp, EPS[variant], cfg)
            _, r = check(variant, inp, EPS[variant], cfg, rows=others)
            nan_row = all(bool(torch.isnan(t[2]).all()) for t in out)
            others_finite = all(bool(torch.isfinite(t[others]).all()) for t in out)
            results["nan"].append(dict(nan_row_all_nan=nan_row, others_finite=others_finite, label=sched, **r))

# eps is honoured (0.5 changes the answer visibly)
inp = T.make_inputs(9, 64, 32, dtype="fp32", seed=4)
for sched, cfg in SCHEDULES.items():
    for variant in ("layernorm", "rmsnorm"):
        _, r = check(variant, inp, 0.5, cfg)
        results["eps"].append(dict(label=sched, **r))
        wrong = T.check("fused", run(variant, inp, 1e-5, cfg), inp, 0.5, variant)["ok"]
        results["eps"][-1]["wrong_eps_ok"] = wrong

# negative control: the plain GEMM output (with the kernel's own statistics) must FAIL the fused check
inp = T.make_inputs(37, 72, 72, dtype="fp32", seed=2)
y, mean, rstd = matmul_layernorm(inp["a"], inp["b"], eps=1e-5, config=SCHEDULES["tile"])
gemm_as_fused_ok = T.check("fused", (inp["a"] @ inp["b"], mean, rstd), inp, 1e-5, "layernorm")["ok"]
print(json.dumps(dict(results=results, negative_control_ok=negative_control_ok, gemm_as_fused_ok=gemm_as_fused_ok)))
"""


@pytest.fixture(scope="module")
def interp():
    return run_python_json(_INTERP_SCRIPT, env={"TRITON_INTERPRET": "1"}, timeout=600)


def _bad(rows):
    return [r for r in rows if not r["ok"]]


def test_interpreter_basic(interp):
    rows = interp["results"]["basic"]
    assert len(rows) == 2 * 5 * 2 * 3 * 2
    assert not _bad(rows), json.dumps(_bad(rows), indent=1)
    # the cases exercise what they claim: every schedule, two halves, persistent grids that loop
    assert {r["schedule"] for r in rows} == {"tile", "resident", "flat"}
    assert {r["label"] for r in rows if r["schedule"] == "resident"} == {"resident"}
    assert {r["split"] for r in rows} == {1, 2}
    persistent = [r for r in rows if r["schedule"] != "tile"]
    assert any(r["programs"] < r["tiles"] for r in persistent)
    # the statistics were checked (both, for LayerNorm)
    assert all("rstd_rel_err" in r for r in rows)
    assert all("mean_rel_err" in r for r in rows if r["variant"] == "layernorm")


def test_interpreter_gemm(interp):
    rows = interp["results"]["gemm"]
    assert len(rows) == 2 * 5 and not _bad(rows), json.dumps(_bad(rows), indent=1)


def test_interpreter_mean_shift(interp):
    rows = interp["results"]["shift"]
    assert len(rows) == 2 * 3 * 2 + 3 and not _bad(rows), json.dumps(_bad(rows), indent=1)
    assert interp["negative_control_ok"] is False, "the shift check cannot tell one-pass variance from two-pass"


def test_interpreter_nan_stays_in_its_row(interp):
    rows = interp["results"]["nan"]
    assert len(rows) == 2 * 3 * 2
    bad = [r for r in rows if not (r["ok"] and r["nan_row_all_nan"] and r["others_finite"])]
    assert not bad, json.dumps(bad, indent=1)


def test_interpreter_eps(interp):
    rows = interp["results"]["eps"]
    assert len(rows) == 3 * 2 and not _bad(rows), json.dumps(_bad(rows), indent=1)
    assert not any(r["wrong_eps_ok"] for r in rows), "the check cannot tell eps=1e-5 from eps=0.5"
    assert interp["gemm_as_fused_ok"] is False, "the check cannot tell a missing norm from a correct kernel"


# --------------------------------------------------------------------------------------------------------
# 2. compile-only for sm_90
# --------------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, sys, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_triton.naive_fusion import compile_sm90, compile_sm90_kernel, launch_params

configs, grid = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = []
for cfg in configs:
    name = cfg.pop("_name")
    for M, N, K in grid:
        a, b = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(K, N, dtype=torch.bfloat16)
        try:
            p = launch_params(M, N, K, torch.bfloat16, cfg)
        except ValueError as e:
            out.append(dict(name=name, shape=[M, N, K], error=str(e)))
            continue
        affine = (N + K) % 128 == 0  # half the shapes with weight and bias
        s = compile_sm90("matmul_layernorm", a, b, config=cfg, affine=affine)
        r = compile_sm90("matmul_rmsnorm", a, b, config=cfg, affine=affine)
        out.append(dict(name=name, shape=[M, N, K], schedule=p["SCHEDULE"], smem_est=p["smem"], ln=s, rms=r))

# TTGIR of the resident-B schedule (K = 64, N = 512: two B halves) and of the flattened one
ttgir = {}
for sched, (N, K) in {"resident": (512, 64), "flat": (256, 256)}.items():
    a, b = torch.empty(262144, K, dtype=torch.bfloat16), torch.empty(K, N, dtype=torch.bfloat16)
    cfg = dict(BLOCK_M=64, BLOCK_K=64, num_warps=8, num_stages=3, PERSISTENT=True)
    ttgir[sched] = compile_sm90_kernel("matmul_layernorm", a, b, config=cfg).asm["ttgir"]
gemm = []  # the shipped [gemm] entries: kernels_triton.lazy_prenorm.matmul's TilingConfig
for cfg in json.loads(sys.argv[3]):
    for M, N, K in ((262144, 64, 64), (262144, 512, 256)):
        s = compile_sm90("matmul", torch.empty(M, K, dtype=torch.bfloat16), torch.empty(K, N, dtype=torch.bfloat16),
                         config=cfg)
        gemm.append(dict(cfg=cfg, shape=[M, N, K], summary=s))
print(json.dumps(dict(out=out, ttgir=ttgir, gemm=gemm)))
"""


@pytest.fixture(scope="module")
def compiled():
    gemm = [{k: v for k, v in c.items() if k not in ("name", "impls")} for c in TILING["triton"]
            if c["impls"] == ["gemm"]]
    return run_python_json(_COMPILE_SCRIPT, json.dumps(_fused_configs()), json.dumps(GRID), json.dumps(gemm),
                           timeout=600)


def test_compile_sm90_shipped_configs(compiled):
    from normfuse.compile_only import SMEM_LIMIT_BYTES

    rows = compiled["out"]
    assert len(rows) == len(_fused_configs()) * len(GRID)
    for r in rows:
        if "error" in r:  # a config that cannot hold the row says which limit
            assert any(w in r["error"] for w in ("registers", "shared memory", "MAX_N")), r
            continue
        for op in ("ln", "rms"):
            s = r[op]
            assert s["ptx_markers"]["wgmma"] > 0 and s["ptx_markers"]["tma_load"] > 0, r
            assert s["smem_ok"] and s["shared_bytes"] <= SMEM_LIMIT_BYTES, r
            # the estimate used to reject configs is close to the compiled size: at most the barriers below it
            assert -2048 <= s["shared_bytes"] - r["smem_est"] <= 128, r
    # every shape of the blog grid is served by at least one fused config, and N = 512 by the tile schedule
    served = {tuple(r["shape"]) for r in rows if "error" not in r}
    assert served == {tuple(s) for s in GRID}
    assert {(r["shape"][1], r["schedule"]) for r in rows if "error" not in r} >= {(512, "tile"), (512, "resident")}
    assert {r["schedule"] for r in rows if "error" not in r} == {"tile", "resident", "flat"}
    assert len(compiled["gemm"]) == 2 * sum(c["impls"] == ["gemm"] for c in TILING["triton"]) >= 2
    for g in compiled["gemm"]:
        s = g["summary"]
        assert s["ptx_markers"]["wgmma"] > 0 and s["ptx_markers"]["tma_load"] > 0 and s["smem_ok"], g


def _for_bodies(ttgir: str) -> list[str]:
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


def test_compile_sm90_resident_b_loaded_once(compiled):
    ttgir = compiled["ttgir"]["resident"]
    loops = _for_bodies(ttgir)
    assert len(loops) == 1, "the resident schedule has one loop (over row blocks)"
    loop = loops[0]
    b_loads = [x for x in ttgir.splitlines() if "async_tma_copy_global_to_local %b_desc" in x]
    assert len(b_loads) == 2 and not any(x in loop for x in b_loads), "B halves must be loaded once, before the loop"
    assert "async_tma_copy_global_to_local %a_desc" in loop, "A must be prefetched inside the pipelined loop"
    assert "3x64x64xbf16" in ttgir, "A ring of num_stages = 3 slots"
    assert loop.count("ttng.warp_group_dot ") == 2 and "async_tma_copy_local_to_global %y_desc" in loop


def test_compile_sm90_flattened_loop(compiled):
    loops = [b for b in _for_bodies(compiled["ttgir"]["flat"]) if "ttng.warp_group_dot " in b]
    assert loops and all(b.count("scf.for") == 1 for b in loops), "row-block and K loops flattened into one"
    assert any("async_tma_copy_local_to_global %y_desc" in b for b in loops), "the epilogue sits in the flat loop"


# --------------------------------------------------------------------------------------------------------
# 3. configs, launch limits and input validation
# --------------------------------------------------------------------------------------------------------
def test_config_validation():
    assert TilingConfig.from_dict(None) == DEFAULT_CONFIG
    c = TilingConfig.from_dict({"BLOCK_M": 128, "BLOCK_K": None, "PERSISTENT": True, "PROGRAMS_PER_SM": 2})
    assert TilingConfig.from_dict(c.to_dict()) == c
    for bad in ({"BLOCK_M": 48}, {"BLOCK_M": 8}, {"BLOCK_M": 512}, {"BLOCK_K": 100}, {"BLOCK_K": 1024},
                {"num_warps": 32}, {"num_warps": 6}, {"num_stages": 0}, {"PERSISTENT": 1}, {"PROGRAMS_PER_SM": 0},
                {"PROGRAMS_PER_SM": 9}, {"BLOCK_M": 64.0}, {"BLOCK_M": None}, {"num_warps": True}):
        with pytest.raises(ValueError):
            TilingConfig.from_dict(bad)
    with pytest.raises(ValueError, match="valid keys"):
        TilingConfig.from_dict({"BLOCK_N": 64})  # BLOCK_N is the whole row, not a field
    with pytest.raises(TypeError):
        TilingConfig.from_dict([("BLOCK_M", 64)])
    for c in TILING["triton"]:  # every shipped entry is a valid config of the module it targets
        fields = {k: v for k, v in c.items() if k not in ("name", "impls")}
        if c["impls"] == ["fused"]:
            TilingConfig.from_dict(fields)
        else:
            from kernels_triton.lazy_prenorm import TilingConfig as GemmConfig

            assert c["impls"] == ["gemm"]
            GemmConfig.from_dict(fields)
    assert 3 <= len(TILING["triton"]) <= 8 and "helion" in TILING and "tlx" in TILING  # sections of the others


def test_launch_params_limits():
    bf16 = torch.bfloat16
    p = launch_params(262144, 512, 64, bf16, dict(BLOCK_M=64, num_warps=8))
    assert (p["BLOCK_N"], p["SUB_N"], p["SPLIT"], p["acc_regs"], p["SCHEDULE"]) == (512, 256, 2, 128, "tile")
    p = launch_params(1000, 72, 40, bf16, dict(BLOCK_M=64, num_warps=4))
    assert (p["BLOCK_N"], p["SUB_N"], p["SPLIT"], p["grid"]) == (128, 128, 1, (16,))
    assert launch_params(10, 8, 8, bf16)["BLOCK_N"] == 16
    with pytest.raises(ValueError, match="MAX_N=512"):
        launch_params(64, 520, 64, bf16)
    with pytest.raises(ValueError, match="registers per thread"):
        launch_params(64, 512, 64, bf16, dict(BLOCK_M=128, num_warps=8))
    with pytest.raises(ValueError, match="registers per thread"):
        launch_params(64, 256, 64, bf16, dict(BLOCK_M=64, num_warps=2))
    with pytest.raises(ValueError, match="shared memory"):
        launch_params(64, 512, 256, bf16, dict(BLOCK_M=64, BLOCK_K=64, num_stages=4))
    with pytest.raises(ValueError, match="K <= 256"):
        launch_params(64, 64, 512, bf16, dict(BLOCK_K=None, PERSISTENT=True))
    # persistent: resident B when K fits one step, else flattened; grid capped by SMs x occupancy
    p = launch_params(262144, 64, 64, bf16, dict(BLOCK_M=64, BLOCK_K=64, PERSISTENT=True, PROGRAMS_PER_SM=2),
                      num_sms=132)
    assert p["SCHEDULE"] == "resident" and p["grid"] == (264,) and p["occupancy"] >= 2
    p = launch_params(262144, 512, 64, bf16, dict(BLOCK_M=64, BLOCK_K=64, PERSISTENT=True, PROGRAMS_PER_SM=2),
                      num_sms=132)
    assert p["occupancy"] == 1 and p["grid"] == (132,)  # 120 KiB of smem and ~192 registers: one per SM
    p = launch_params(262144, 128, 128, bf16, dict(BLOCK_M=64, BLOCK_K=64, PERSISTENT=True), num_sms=132)
    assert p["SCHEDULE"] == "flat"
    assert launch_params(100, 64, 64, bf16, dict(BLOCK_M=64, PERSISTENT=True), num_sms=132)["grid"] == (2,)
    assert MAX_N == 512


def test_gpu_check_shapes_are_served():
    """The odd shapes of normfuse.gpu_checks are served by some shipped fused config (the GPU test is not empty)."""
    from normfuse.gpu_checks import CHECKS

    _, shapes, variants, _ = CHECKS["naive_fusion"]
    assert set(variants) == {"layernorm", "rmsnorm"}
    for M, N, K in shapes:
        ok = 0
        for cfg in _fused_configs():
            cfg.pop("_name")
            try:
                launch_params(M, N, K, torch.bfloat16, cfg)
                ok += 1
            except ValueError:
                pass
        assert ok >= 1, (M, N, K)


@pytest.mark.parametrize("op", ["matmul_layernorm", "matmul_rmsnorm"])
def test_bad_inputs(op, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    fn = getattr(knf, op)
    assert_rejects_bad_inputs(fn, torch.float16, {"BLOCK_M": 48})
    a, b = torch.randn(16, 32).half(), torch.randn(32, 64).half()
    w = torch.ones(64, dtype=torch.float16)
    with pytest.raises(ValueError, match="shape"):
        fn(a, b, torch.ones(63, dtype=torch.float16))
    with pytest.raises(TypeError):
        fn(a, b, w.to(torch.int32))
    with pytest.raises(TypeError):
        fn(a, b, w.tolist())
    if op == "matmul_layernorm":
        with pytest.raises(ValueError, match="shape"):
            fn(a, b, w, torch.zeros(65, dtype=torch.float16))
    for eps in (0.0, -1.0, float("nan"), float("inf"), True, "1e-5"):
        with pytest.raises(ValueError, match="eps"):
            fn(a, b, eps=eps)
    with pytest.raises(ValueError, match="valid keys"):
        fn(a, b, config={"BLOCK": 128})
    with pytest.raises(TypeError):
        fn(a, b, config=42)
    with pytest.raises(ValueError, match="MAX_N"):
        fn(torch.randn(16, 32).half(), torch.randn(32, 1024).half())
    with pytest.raises(ValueError, match="CUDA"):  # valid CPU inputs, but not under the interpreter
        fn(a, b)


def test_compile_sm90_rejects_unknown_op():
    with pytest.raises(ValueError, match="unknown op"):
        knf.compile_sm90_kernel("matmul_groupnorm", torch.empty(4, 64, dtype=torch.bfloat16),
                                torch.empty(64, 64, dtype=torch.bfloat16))
