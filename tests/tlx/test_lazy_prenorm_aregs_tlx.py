"""Tests of ``kernels_tlx.lazy_prenorm``'s ``TilingConfig.A_FROM_REGS`` (run with ``.venv-tlx/bin/python -m pytest
tests/tlx``): the consumers ldmatrix each [64, 64] A slice once into the wgmma's register A operand and take the
statistics from those registers.

1. Compile-only for sm_90a of every shipped A_FROM_REGS config (RMSNorm and LayerNorm) at the blog shape and the odd
   shapes: ptxas ok, no spills; the register path is really taken (4 ``ldmatrix.x4`` per consumer and K step, the
   wgmma takes a register A operand: ``{%r..}`` instead of a descriptor) and the statistics read no other shared
   memory inside the wgmma windows (no ``ld.shared.v4`` at all: the only shared read of A is the ldmatrix); the
   RMSNorm row sum needs 2 butterfly shuffles per row (the quad of lanes), not the 3 of the blocked layout.
2. Config validation.

Correctness is the GPU self-check (``python -m kernels_tlx.lazy_prenorm --config a_regs ...``; the configs are in
SHIPPED_CONFIGS / SHIPPED_LN_CONFIGS).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from kernels_tlx import lazy_prenorm as ktlx  # noqa: E402
from kernels_tlx.lazy_prenorm import SHIPPED_CONFIGS, SHIPPED_LN_CONFIGS, TilingConfig  # noqa: E402
from normfuse.testing import run_python_json  # noqa: E402

AREGS = {n: c for n, c in SHIPPED_CONFIGS.items() if c.A_FROM_REGS}
AREGS_LN = {n: c for n, c in SHIPPED_LN_CONFIGS.items() if c.A_FROM_REGS}
SHAPES = [(262144, 1024, 1024), (1, 1000, 1000), (129, 264, 8), (17793, 1000, 1000)]  # (M, N, K)

_COMPILE_SCRIPT = r"""
import json, re, sys, torch
from normfuse import compile_only
from normfuse.codestats import ptxas_stats
compile_only.install(90)
from kernels_tlx import lazy_prenorm as K

out = {}
for key, op, cfg, (M, N, Kd) in json.loads(sys.argv[1]):
    a = torch.empty(M, Kd, dtype=torch.bfloat16)
    b = torch.empty(Kd, N, dtype=torch.bfloat16)
    compiled, _ = K._compile_ws(op, a, b, eps=1e-5, cfg=K.TilingConfig.from_dict(cfg))
    ptx = compiled.asm["ptx"]
    try:  # ptxas -v for sm_90a
        st = ptxas_stats(compiled)
    except RuntimeError:  # ptxas failed: reported as ptxas_ok = False
        st = None
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16 \{[^}]*\}, (\S+)", ptx)
    out[key] = {
        "ptxas_ok": st is not None,
        "spill_stores": st and st["spill_st"],
        "ldmatrix_x4": ptx.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16"),
        "wgmma_reg_a": sum(1 for w in wgmma if w.startswith("{")),
        "wgmma_desc_a": sum(1 for w in wgmma if not w.startswith("{")),
        "ld_shared_v4": len(re.findall(r"\bld\.shared\.v4\.", ptx)),
        "shfl_bfly": sorted(int(x) for x in re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, (\d+), 31, -1;", ptx)),
    }
print(json.dumps(out))
"""


def _jobs():
    jobs = []
    for name, cfg in AREGS.items():
        for op in ("matmul", "lazy_rmsnorm_matmul"):
            for shape in SHAPES:
                jobs.append([f"{name}/{op}/{'x'.join(map(str, shape))}", op, cfg.to_dict(), list(shape)])
    for name, cfg in AREGS_LN.items():
        for shape in SHAPES:
            jobs.append([f"{name}/{ktlx.LN_OP}/{'x'.join(map(str, shape))}", ktlx.LN_OP, cfg.to_dict(), list(shape)])
    return jobs


@pytest.fixture(scope="module")
def compiled() -> dict:
    return run_python_json(_COMPILE_SCRIPT, json.dumps(_jobs()), timeout=400)


def test_aregs_configs_shipped():
    assert AREGS and AREGS_LN
    for cfg in {**AREGS, **AREGS_LN}.values():
        assert TilingConfig.from_dict(cfg.to_dict()) == cfg
        assert cfg.BLOCK_K == 64 and cfg.rows_per_consumer == 64 and not cfg.REUSE_RSTD


@pytest.mark.parametrize("key", [j[0] for j in _jobs()])
def test_compile_sm90(compiled, key):
    name, op, _ = key.split("/")
    cfg = {**AREGS, **AREGS_LN}[name]
    s = compiled[key]
    assert s["ptxas_ok"] and s["spill_stores"] == 0, s
    if op == "matmul":  # the GEMM of an A_FROM_REGS config is the plain shared-operand one
        assert s["wgmma_reg_a"] == 0 and s["ldmatrix_x4"] == 0, s
        return
    # the K loop of each consumer: 4 ldmatrix.x4 (= a warp's 16 x 64 bf16 rows) feeding 4 register-A wgmma
    assert s["ldmatrix_x4"] >= 4 * cfg.NUM_CONSUMERS and s["wgmma_reg_a"] >= 4 * cfg.NUM_CONSUMERS, s
    # the statistics read nothing else from shared memory (the in-loop configs read the slice a second time with
    # 4 ld.shared.v4 per step)
    assert s["ld_shared_v4"] == 0, s
    if op == "lazy_rmsnorm_matmul":
        assert s["wgmma_desc_a"] == 0, s  # every wgmma takes A from registers
        assert 4 not in s["shfl_bfly"] and {1, 2} <= set(s["shfl_bfly"]), s  # the row sum stays in the quad


def test_plain_config_reads_a_twice(compiled):
    # control: without A_FROM_REGS the same tile reads the A slice with ld.shared.v4 for the statistics
    out = run_python_json(_COMPILE_SCRIPT, json.dumps([["plain", "lazy_rmsnorm_matmul", TilingConfig().to_dict(),
                                                        [262144, 1024, 1024]]]), timeout=200)["plain"]
    assert out["ld_shared_v4"] > 0 and out["wgmma_reg_a"] == 0 and 4 in out["shfl_bfly"], out


@pytest.mark.parametrize("kw, msg", [
    (dict(A_FROM_REGS=True, REUSE_RSTD=True), "A_FROM_REGS=True needs REUSE_RSTD=False"),
    (dict(A_FROM_REGS=True, STATS_IN_PRODUCER=True, CONSUMER_REGS=200), "A_FROM_REGS=True needs REUSE_RSTD=False"),
    (dict(A_FROM_REGS=True, BLOCK_K=128, NUM_STAGES=2), "needs a [64, 64] A slice"),
])
def test_aregs_validation(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        TilingConfig(**kw)
