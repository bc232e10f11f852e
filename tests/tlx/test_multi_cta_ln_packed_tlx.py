"""CPU numerics of the LN_PACKED epilogue helpers of ``kernels_tlx.multi_cta`` (TLX venv: ``.venv-tlx/bin/python -m
pytest tests/tlx/test_multi_cta_ln_packed_tlx.py``).

The helpers are plain Triton functions, so they run in the Triton interpreter (``TRITON_INTERPRET=1``, in a
subprocess: the interpreter flag must be set before triton is imported, and the compile-only tests of this
directory import it without). Checked: ``_pack_f32x2`` / ``_unpack_f32x2`` round-trip fp32 bit patterns exactly
(the low word is the first value); ``_ln_partials_full`` gives the row sum and the centred sum of squares of a
``[64, 256]`` tile; and the kernel's EVEN_N Chan merge of C = 4 and 8 such slices (written out here in fp32 as in
the kernel) keeps rstd to 1e-5 relative for rows whose mean is ~10^3 times their spread, where the one-pass
``E[x^2] - mean^2`` in fp32 is off by orders of magnitude. The kernel itself (DSMEM exchange, barrier phases) is
checked on the GPU by ``python -m kernels_tlx.multi_cta``; its compile-only checks are in test_multi_cta_tlx.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

_SCRIPT = r"""
import json, sys, torch
import triton, triton.language as tl
from kernels_tlx import multi_cta as km

@triton.jit
def _probe(x_ptr, lo_ptr, hi_ptr, word_ptr, a_ptr, b_ptr, p0_ptr, p1_ptr, R: tl.constexpr, W: tl.constexpr):
    rows = tl.arange(0, R)
    w = km._pack_f32x2(tl.load(lo_ptr + rows), tl.load(hi_ptr + rows))
    tl.store(word_ptr + rows, w)
    a, b = km._unpack_f32x2(w)
    tl.store(a_ptr + rows, a)
    tl.store(b_ptr + rows, b)
    x = tl.load(x_ptr + rows[:, None] * W + tl.arange(0, W)[None, :])
    p0, p1 = km._ln_partials_full(x, R, W)
    tl.store(p0_ptr + rows, p0)
    tl.store(p1_ptr + rows, p1)

R, W = 64, 256
g = torch.Generator().manual_seed(0)
out = {}
lo = torch.randn(R, generator=g) * 1e3
hi = torch.randn(R, generator=g) * 1e-3
lo[0], hi[0], lo[1], hi[1] = -0.0, float("inf"), float("-inf"), 1e-40  # sign, infinities, a denormal
res = {}
for C in (4, 8):
    shift = 1000.0
    std = 0.5 + torch.rand(R, 1, generator=g, dtype=torch.float64)
    x = torch.randn(R, C * W, generator=g, dtype=torch.float64) * std
    x = (x + shift * (1 + torch.rand(R, 1, generator=g, dtype=torch.float64))).float()
    parts = []
    for r in range(C):
        sl = x[:, r * W:(r + 1) * W].contiguous()
        word = torch.empty(R, dtype=torch.int64)
        a, b, p0, p1 = (torch.empty(R) for _ in range(4))
        _probe[(1,)](sl, lo, hi, word, a, b, p0, p1, R, W)
        parts.append((p0, p1))
        if r == 0:
            u = word.view(torch.int64)
            res["roundtrip"] = bool(torch.equal(a.view(torch.int32), lo.view(torch.int32))
                                    and torch.equal(b.view(torch.int32), hi.view(torch.int32)))
            res["low_word"] = bool(torch.equal((u & 0xFFFFFFFF).to(torch.int32), lo.view(torch.int32)))
            ref = sl.double()
            res["p0_err"] = ((p0.double() - ref.sum(1)).abs() / ref.abs().sum(1)).max().item()
            m2 = ((ref - ref.mean(1, keepdim=True)) ** 2).sum(1)
            res["p1_err"] = ((p1.double() - m2).abs() / m2).max().item()
    # the kernel's EVEN_N merge, in fp32 and in rank order
    N = C * W
    total = torch.zeros(R)
    for p0, _ in parts:
        total = total + p0
    mean = total * (1.0 / N)
    m2 = torch.zeros(R)
    for p0, p1 in parts:
        dm = p0 * (1.0 / W) - mean
        m2 = m2 + (p1 + W * dm * dm)
    eps = 1e-5
    rstd = torch.rsqrt(m2 / N + eps)
    xd = x.double()
    ref_rstd = torch.rsqrt(xd.var(1, unbiased=False) + eps)
    naive = torch.rsqrt(((x * x).sum(1) / N - (x.sum(1) / N) ** 2).clamp_min(0) + eps)
    res[f"rstd_err_c{C}"] = ((rstd.double() - ref_rstd).abs() / ref_rstd).max().item()
    res[f"naive_rstd_err_c{C}"] = ((naive.double() - ref_rstd).abs() / ref_rstd).max().item()
    res[f"mean_err_c{C}"] = ((mean.double() - xd.mean(1)).abs() / xd.std(1)).max().item()
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def probe():
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        pytest.fail(f"interpreter subprocess failed (rc={p.returncode})\n--- stderr\n{p.stderr[-6000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_pack_unpack_bit_exact(probe):
    assert probe["roundtrip"] and probe["low_word"], probe


def test_partials_of_a_full_slice(probe):
    assert probe["p0_err"] < 1e-5, probe  # relative to sum |x|
    assert probe["p1_err"] < 1e-3, probe  # centred sum of squares, mean 1000-2000x the spread


@pytest.mark.parametrize("C", [4, 8])
def test_even_n_chan_merge_is_robust(probe, C):
    assert probe[f"rstd_err_c{C}"] < 1e-5, probe
    assert probe[f"mean_err_c{C}"] < 1e-3, probe  # in units of the row's std
    assert probe[f"naive_rstd_err_c{C}"] > 100 * probe[f"rstd_err_c{C}"], probe  # what the merge avoids
