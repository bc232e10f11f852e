"""GPU checks of the ``normfuse.nn`` drop-ins (marker ``gpu``; skipped without CUDA; run on the device with
``make test-gpu PYTEST_ARGS="-k nn_"`` or ``python -m pytest -q -m gpu tests/test_nn_gpu.py``).

1. Every drop-in at a benchmark shape in bf16 (``normfuse.nn.checks``: the Llama 3 8B QKV projection, multi-CTA /
   naive-fusion widths, causal 4K GQA attention, the blog's ``gdpa`` point, MXNorm with both GEMMs): output and all
   gradients against fp64 torch autograd by the flash-attention rule, forward kernels in Triton and Helion (TLX:
   ``tests/tlx/test_nn_tlx.py``); the backward kernels are Triton in every case.
2. The layer benchmark's training step is CUDA-graph capturable (a small Llama-style layer, eager, both variants
   through ``layer_rows`` with the real ``bench_graph_interleaved``, two rounds).
"""

from __future__ import annotations

import pytest
import torch

from normfuse.nn.checks import CASES, run_case

pytestmark = pytest.mark.gpu

_HELION = ("lazy_qkv", "linear_rmsnorm_multi_cta", "linear_layernorm_naive", "qknorm_attention", "gdpa",
           "mxnorm_linear_dequant")


@pytest.mark.parametrize("case", CASES)
def test_dropin_gradients_bf16_triton(case):
    rep = run_case(case, "triton")
    assert all(r["ok"] for r in rep.values()), rep


@pytest.mark.parametrize("case", _HELION)
def test_dropin_gradients_bf16_helion(case):
    import normfuse.helion_compat  # noqa: F401  (before helion: torch 2.11 on the GPU host)

    rep = run_case(case, "helion")
    assert all(r["ok"] for r in rep.values()), rep


def test_layer_step_is_capturable(tmp_path):
    from dataclasses import replace

    from experiments.layer_bench import LayerConfig, Runtime, layer_rows

    cfg = LayerConfig(hidden=512, n_heads=4, n_kv_heads=2, head_dim=128, ffn=1024)
    rt = Runtime(device="cuda", dtype=torch.bfloat16, compile=lambda f: f)
    for qk in (False, True):
        rows = layer_rows(rt, replace(cfg, qk_norm=qk), 2048, 1024, "triton", None, 2, {"tokens": 2048})
        assert {r["name"]: r["status"] for r in rows} == {"torch_compile": "ok", "dropin": "ok"}, rows
        assert all(r["p50_ms"] > 0 for r in rows)
