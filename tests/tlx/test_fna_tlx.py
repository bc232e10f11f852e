"""``kernels_tlx.fna`` (FlashNormAttention gdpa, warp-specialized single CTA over all heads) without a GPU:
sm_90a compile-only with wgmma, TMA (cp.async.bulk.tensor), mbarrier and setmaxnreg asserted for every shipped
config and H = 2/3/4 (and D = 64); config and input validation; on a GPU (marker ``gpu``) every shipped config
against the fp32 reference at odd shapes and the NaN/Inf isolation check."""

from __future__ import annotations

import pytest

from normfuse.testing import run_python_json

_COMPILE = r"""
import json, re
from pathlib import Path
from normfuse import compile_only
compile_only.install(90)
from normfuse.techniques import fna as T
from kernels_tlx import fna as kt
# the tlx entries of configs/tiling/fna_h200.yaml (no yaml module in this environment: one flow mapping per line)
text = Path("configs/tiling/fna_h200.yaml").read_text().split("tlx:")[1]
entries = re.findall(r"\{name: ([\w-]+), NUM_BUFFERS: (\d+), CONSUMER_REGS: (\d+)\}", text)
res = []
for name, nb, regs in entries:
    cfg = {"NUM_BUFFERS": int(nb), "CONSUMER_REGS": int(regs)}
    for H, D in ((2, 128), (3, 128), (4, 128), (3, 64)):
        s = kt.compile_sm90("gdpa", *T.compile_inputs(1000, H, D, "bf16"), config=cfg)
        res.append(dict(name=name, H=H, D=D, **s))
print(json.dumps(res))
"""


def test_compile_sm90_markers():
    res = run_python_json(_COMPILE, timeout=900)
    assert len(res) == 3 * 4
    for r in res:
        m = r["ptx_markers"]
        assert m["wgmma"] >= 2 * r["H"], r              # S = ln_q K^T and P V per head
        assert m["tma_load"] >= 2 * r["H"], r           # K_h and V_h by TMA
        assert m["mbarrier"] > 0 and m["setmaxnreg"] > 0, r
        assert r["smem_ok"] and r["num_warps"] == 8, r  # producer + consumer warpgroups


def test_bad_inputs_and_config():
    from kernels_tlx import fna as kt
    from normfuse.techniques import fna as T

    inp = T.make_inputs(20, 2, 32, dtype="fp16", batch=3, kv_len=16, seed=0)
    q, k, v, o = inp["q"], inp["k"], inp["v"], inp["q_offsets"]
    with pytest.raises(ValueError, match="NUM_BUFFERS"):
        kt.gdpa(q, k, v, o, 20, config={"NUM_BUFFERS": 4})
    with pytest.raises(ValueError, match="CONSUMER_REGS"):
        kt.gdpa(q, k, v, o, 20, config={"CONSUMER_REGS": 230})
    f32 = T.make_inputs(20, 2, 32, dtype="fp32", batch=3, kv_len=16, seed=0)
    with pytest.raises(TypeError, match="bf16/fp16"):
        kt.gdpa(f32["q"], f32["k"], f32["v"], f32["q_offsets"], 20)
    with pytest.raises(ValueError, match="lengths"):
        kt.gdpa(q, k, v, o, 5)


@pytest.mark.gpu
def test_shipped_configs_correct_gpu():
    from normfuse.gpu_checks import check_all, check_fna_isolation

    failures = check_all("tlx", "fna") + check_fna_isolation("tlx")
    assert not failures, "\n".join(failures)
