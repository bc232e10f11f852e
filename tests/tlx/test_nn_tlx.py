"""``normfuse.nn`` in the TLX environment (``.venv-tlx/bin/python -m pytest tests/tlx/test_nn_tlx.py``).

1. CPU: the Triton backward kernel of every drop-in (``kernels_triton/norms_bwd.py``) runs under fbtriton's
   interpreter too and matches torch autograd (RMSNorm and LayerNorm, fp32), and the drop-ins import.
2. GPU (marker ``gpu``): every drop-in with its TLX forward kernel (``dsl="tlx"``) at a benchmark shape in bf16,
   output and gradients against fp64 torch autograd (``normfuse.nn.checks``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from normfuse.nn.checks import CASES, run_case  # noqa: E402
from normfuse.testing import run_python_json  # noqa: E402

_CPU = r"""
import json
import torch
import normfuse.nn  # noqa: F401  (the drop-ins import in this environment)
from kernels_triton import norms_bwd
norms_bwd._DEFAULT_NUM_SMS = 2
g = torch.Generator().manual_seed(0)
x = torch.randn(37, 200, generator=g, dtype=torch.float64) + 0.5
w = 1 + 0.1 * torch.randn(200, generator=g, dtype=torch.float64)
dy = torch.randn(37, 200, generator=g, dtype=torch.float64)
out = {}
for is_rms in (True, False):
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = (torch.nn.functional.rms_norm(xr, (200,), wr, 1e-6) if is_rms
         else torch.nn.functional.layer_norm(xr, (200,), wr, None, 1e-5))
    dx_ref, dw_ref = torch.autograd.grad(y, (xr, wr), dy)
    if is_rms:
        rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-6).float()
        dx, dw = norms_bwd.rms_norm_bwd(dy.float(), x.float(), rstd, w.float())
    else:
        rstd = torch.rsqrt(x.var(-1, unbiased=False) + 1e-5).float()
        dx, dw, _ = norms_bwd.layer_norm_bwd(dy.float(), x.float(), x.mean(-1).float(), rstd, w.float())
    out["rms" if is_rms else "ln"] = max((dx.double() - dx_ref).abs().max().item() / dx_ref.abs().max().item(),
                                         (dw.double() - dw_ref).abs().max().item() / dw_ref.abs().max().item())
print(json.dumps(out))
"""


def test_backward_kernel_runs_in_the_tlx_environment():
    r = run_python_json(_CPU, env={"TRITON_INTERPRET": "1"}, timeout=600)
    assert r["rms"] < 1e-5 and r["ln"] < 1e-5, r


@pytest.mark.gpu
@pytest.mark.parametrize("case", [c for c in CASES if c != "mxnorm_linear_dot_scaled"])
def test_dropin_gradients_bf16_tlx(case):
    rep = run_case(case, "tlx")
    assert all(r["ok"] for r in rep.values()), rep
