"""The MXFP8 GEMM consumer (``kernels_triton.mxfp8_gemm``) and the chain script (``experiments.mxnorm_gemm``) on CPU:
sm_90 compile-only (``tl.dot_scaled`` lowers to a bf16 wgmma on Hopper: the emulation the docs describe), config and
input validation, the script's plan and its refusal without a GPU. Numerics need the GPU (the 3.6 interpreter
cannot run dot_scaled); the script checks every config against ``mxfp8_gemm.reference`` before timing it."""

import pytest
import torch

from kernels_triton import mxfp8_gemm as g
from normfuse.testing import run_python_json

_COMPILE = r"""
import json, re
from normfuse import compile_only
compile_only.install(90)
from kernels_triton import mxfp8_gemm as g
out = {}
for name, cfg in g.CONFIGS.items():
    ck = g.compile_sm90_kernel(8192, 6144, 4096, cfg)
    ptx = ck.asm["ptx"]
    out[name] = {"wgmma": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.\w+\.(\w+\.\w+\.\w+)", ptx))),
                 "shared": int(ck.metadata.shared)}
print(json.dumps(out))
"""


def test_dot_scaled_compiles_to_bf16_wgmma_on_sm90():
    out = run_python_json(_COMPILE, timeout=600)
    assert set(out) == set(g.CONFIGS)
    for name, r in out.items():
        assert r["wgmma"] == ["f32.bf16.bf16"], (name, r)  # emulated: no fp8 / MX MMA on Hopper
        assert r["shared"] <= 232448


def test_reference_is_dequantized_matmul():
    from normfuse import mxfp8

    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    w = torch.randn(96, 256, generator=torch.Generator().manual_seed(1))
    a, sa = mxfp8.quantize(x)
    b, sb = mxfp8.quantize(w)
    ref = g.reference(a, sa, b, sb)
    assert torch.allclose(ref, mxfp8.dequantize(a, sa) @ mxfp8.dequantize(b, sb).T)
    exact = x @ w.T
    assert 0.01 < ((ref - exact).norm() / exact.norm()).item() < 0.08  # MXFP8 (3-bit mantissa) error, not garbage


def test_validation():
    a = torch.zeros(64, 256, dtype=torch.float8_e4m3fn)
    s = torch.zeros(64, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="multiple of BLOCK_K"):
        g.mxfp8_matmul(a[:, :96].contiguous(), s[:, :3].contiguous(), a[:, :96].contiguous(), s[:, :3].contiguous())
    with pytest.raises(ValueError, match=r"\[N, K\]"):
        g.mxfp8_matmul(a, s, a[:, :128].contiguous(), s[:, :4].contiguous())
    with pytest.raises(ValueError, match="uint8"):
        g.mxfp8_matmul(a, s.float(), a, s)
    with pytest.raises(TypeError):
        g.mxfp8_matmul(a.float(), s, a, s)
    for bad in ({"BLOCK_K": 16}, {"num_warps": 2}, {"GROUP_M": 0}, {"num_stages": 9}):
        with pytest.raises(ValueError):
            g.TilingConfig.from_dict(bad)


def test_chain_script_plan_and_no_gpu(capsys):
    from experiments import mxnorm_gemm

    p = mxnorm_gemm.plan((8192,))
    assert {r["N"] for r in p if r["kind"] == "gemm"} == {6144, 28672}
    assert len([r for r in p if r["kind"] == "norm_cast"]) == 4
    mxnorm_gemm.main(["--plan", "--tokens", "8192"])
    assert "gate_up" in capsys.readouterr().out
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA device"):
            mxnorm_gemm.main(["--tokens", "8192"])


def test_write_pairs_each_norm_cast_with_the_gemms_of_its_token_count(tmp_path):
    """The chain table pairs every correct norm+cast with every correct GEMM of the same T (cuBLAS bf16 is the
    unquantized reference, not a consumer); failed rows stay in results.csv and out of the chain."""
    import pandas as pd

    from experiments import mxnorm_gemm as mg

    rows = [{"T": 8, "kind": "norm_cast", "impl": "a", "ok": True, "p50_ms": 1.0},
            {"T": 8, "kind": "norm_cast", "impl": "b", "ok": False, "error": "ValueError: x"},
            {"T": 16, "kind": "norm_cast", "impl": "a", "ok": True, "p50_ms": 2.0},
            {"T": 8, "N": 4, "layer": "qkv", "kind": "gemm", "impl": "g", "ok": True, "p50_ms": 3.0},
            {"T": 8, "N": 4, "layer": "qkv", "kind": "gemm", "impl": "cublas_bf16", "ok": True, "p50_ms": 2.0},
            {"T": 16, "N": 4, "layer": "qkv", "kind": "gemm", "impl": "g", "ok": True, "p50_ms": 6.0}]
    out = mg._write(rows, [8, 16], tmp_path)
    ch = pd.read_csv(out / "chain.csv")
    assert sorted(zip(ch["T"], ch["normcast_share_%"].round(1))) == [(8, 25.0), (16, 25.0)]
    assert len(pd.read_csv(out / "results.csv")) == len(rows)
