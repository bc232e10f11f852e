"""Issue 15 ("bad input and edge shapes") for the TLX norms and GEMM fusions (TLX venv:
``.venv-tlx/bin/python -m pytest tests/tlx/test_bad_inputs_gemm_tlx.py``); Triton and Helion:
``tests/test_bad_inputs_gemm.py``, which runs the same contract cases (``normfuse.testing.contract_cases``).

CPU: the one contract across DSLs (item 7; TLX has no interpreter, so an accepted call is one that passes every
check and is then refused only for not being on a CUDA device), inputs that require grad (issue 14), misaligned
GEMM operands refused before anything is built (item 5), ``ConfigError`` for bad configs, and the fp32 input the
TLX norms now take like the other DSLs (compile-only for sm_90).
GPU (``@pytest.mark.gpu``): the contract on CUDA (misaligned views launch or are refused, the context survives),
outputs past 2^31 elements with the default configs (item 3), every shipped LayerNorm config on mean-shifted rows
(item 6).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from normfuse import gpu_checks  # noqa: E402
from normfuse.testing import CONTRACT_TECHNIQUES, contract_cases, run_contract, run_python_json  # noqa: E402
from normfuse.tiling import ConfigError  # noqa: E402

_ON_CPU = r"must be CUDA tensors"  # the wrappers' last check before building descriptors or launching


def _module(technique):
    import importlib

    return importlib.import_module(f"kernels_tlx.{technique}")


@pytest.mark.parametrize("technique", CONTRACT_TECHNIQUES)
def test_contract_cpu(technique):
    """Every contract case has the outcome Triton and Helion give it: the same exception class with a message
    naming the constraint, or accepted (here: validated, then refused only for the CPU device)."""
    res = run_contract(_module(technique), technique, dtype=torch.float16, launch_error=_ON_CPU)
    assert set(res) == {c.id for c in contract_cases(technique)}
    bad = [f for f in res.values() if f]
    assert not bad, "\n".join(bad)


def test_forward_only_cpu():
    """Issue 14: every public TLX wrapper raises NotImplementedError for inputs that require grad (grad mode on),
    and runs validation-wise with grad mode off (the autograd drop-ins call them that way)."""
    for technique in CONTRACT_TECHNIQUES:
        res = run_contract(_module(technique), technique, dtype=torch.float16, launch_error=_ON_CPU,
                           only=lambda i: "requires_grad" in i)
        assert len(res) >= 2 and not any(res.values()), res
        with torch.no_grad():
            res = run_contract(_module(technique), technique, dtype=torch.float16, launch_error=_ON_CPU,
                               only=lambda i: i.startswith("valid"))
        assert res and not any(res.values()), res


@pytest.mark.parametrize("technique, bad", [("norms", {"num_warps": 3}), ("naive_fusion", {"NUM_STAGES": 0}),
                                            ("multi_cta", {"CLUSTER_SIZE": 3}), ("lazy_prenorm", {"NUM_STAGES": 0})])
def test_config_errors(technique, bad):
    """Unknown keys and bad values are ConfigError (a ValueError); a config that cannot serve one N is not."""
    cls = _module(technique).TilingConfig
    with pytest.raises(ConfigError, match="unknown TilingConfig key"):
        cls.from_dict({"BLOCK_Q": 64})
    with pytest.raises(ConfigError, match=next(iter(bad))):
        cls.from_dict(bad)
    if technique == "norms":  # valid config, N too wide for its registers: the sweep's 'unsupported'
        with pytest.raises(ValueError) as e:
            cls.from_dict({"ROWS": 4, "num_warps": 4}).block_n(32768)
        assert not isinstance(e.value, ConfigError)


_FP32_NORMS = r"""
import json, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import norms
out = {}
for name in ("default", "cluster2"):
    for op in norms.OPS:
        s = norms.compile_sm90(op, torch.empty(64, 8192, dtype=torch.float32), config=norms.SHIPPED_CONFIGS[name],
                               affine=True)
        out[f"{name}/{op}"] = dict(smem_ok=s["smem_ok"], spills=s["ptxas"]["spill_stores"],
                                   ld=s["ptx_markers"].get("ld_global", None), st_async=s["ptx_extra"]["st_async"])
print(json.dumps(out))
"""


def test_norms_take_fp32_like_the_other_dsls():
    """fp32 x (and an fp32 weight/bias) is part of the norms' contract in every DSL: the TLX plain and cluster
    kernels compile for sm_90 with it (plain loads, fp32 math either way)."""
    res = run_python_json(_FP32_NORMS, timeout=900)
    assert len(res) == 4
    for key, s in res.items():
        assert s["smem_ok"], (key, s)
    assert res["cluster2/rms_norm"]["st_async"] > 0 and res["default/rms_norm"]["st_async"] == 0


# ------------------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("technique", CONTRACT_TECHNIQUES)
def test_contract_gpu(technique):
    """The contract on CUDA in bf16 with the default configs: misaligned GEMM operands refused before launch,
    misaligned x / affine / epilogue vectors give the aligned output, the CUDA context survives every case."""
    res = run_contract(_module(technique), technique, dtype=torch.bfloat16, device="cuda")
    bad = [f for f in res.values() if f]
    assert not bad, "\n".join(bad)
    torch.zeros(8, device="cuda").add_(1).sum().item()


@pytest.mark.gpu
@pytest.mark.parametrize("technique, variant", [(t, v) for t in ("norms", "naive_fusion", "multi_cta", "lazy_prenorm")
                                                for v in ("rmsnorm", "layernorm")])
def test_large_output_gpu(technique, variant):
    """Item 3: outputs past 2^31 elements with the default TLX config (first and last rows checked)."""
    failures = gpu_checks.check_large_output("tlx", technique, variant)
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("dsl, check, name", gpu_checks.mean_shift_params(("tlx",)))
def test_mean_shifted_rows_gpu(dsl, check, name):
    """Item 6: every shipped TLX LayerNorm config on rows whose mean is 10 and 1000 std (Lazy LayerNorm: 10 and
    100), bf16, against the fp32 reference with the spec's 3-way tolerance."""
    failures = gpu_checks.check_mean_shifted(dsl, check, name)
    assert not failures, "\n".join(failures)
