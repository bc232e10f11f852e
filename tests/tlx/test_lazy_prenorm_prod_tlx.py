"""CPU checks of the Lazy RMSNorm cluster form's STATS_IN_PRODUCER option (TLX venv: ``.venv-tlx/bin/python -m pytest
tests/tlx/test_lazy_prenorm_prod_tlx.py``): the per-row sum a^2 taken by the producer warpgroup from the ring, handed
to the consumers per M-tile through double-buffered shared memory, the consumers running the plain GEMM loop.

- Config validation: an option of the cluster form with two consumers, not with STATS_ELEMENTWISE / MULTICAST_A /
  PINGPONG / EPILOGUE_OVERLAP / STORE_DIRECT; ``lazy_rmsnorm_matmul`` only (the other fused ops raise,
  ``matmul_cluster`` runs the GEMM without it); the launch flags; ``kernels_tlx.lazy_prenorm``'s configs pass it on.
- Compile-only for sm_90a at the benchmark shapes (c2 at N = 512, c4 and the two-tile c2 at N = 1024): no spills,
  the ring's ``empty`` barriers count one more arrival (the producer), the consumers' code holds no shared-memory
  load of A and no FMA (the statistic's sit in the producer's code only), the producer keeps >= 80 registers.

Compile-only cannot see wrong sums: ``python -m kernels_tlx.lazy_prenorm --quick --no-bench --config
cluster_c2_defer_prod_asm --config cluster_c4_defer_prod_asm --config cluster_c2_t2_prod_asm`` on the H200 is the
correctness test (odd shapes), and so is ``tests/tlx/test_kernels_tlx.py``'s GPU check of every shipped config
(``make test-gpu``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from kernels_tlx import lazy_prenorm as lp  # noqa: E402
from kernels_tlx import multi_cta as km  # noqa: E402
from normfuse.compile_only import SMEM_LIMIT_BYTES  # noqa: E402
from normfuse.testing import run_python_json_parallel  # noqa: E402

PROD = ("cluster_c2_defer_prod_asm", "cluster_c4_defer_prod_asm", "cluster_c2_t2_prod_asm")


def test_configs_and_validation():
    for name in PROD:
        cfg = lp.SHIPPED_CONFIGS[name].cluster_config()
        assert cfg.STATS_IN_PRODUCER and cfg.STATS_UNPACK_ASM and not cfg.STATS_ELEMENTWISE, name
        assert cfg.CONSUMER_REGS == 208, name
    with pytest.raises(ValueError, match="STATS_IN_PRODUCER=True needs CLUSTER_SIZE > 1"):
        km.TilingConfig(CLUSTER_SIZE=1, STATS_IN_PRODUCER=True)
    for other in ("STATS_ELEMENTWISE", "MULTICAST_A", "PINGPONG", "STORE_DIRECT"):
        with pytest.raises(ValueError, match=f"STATS_IN_PRODUCER=True with {other}=True"):
            km.TilingConfig(CLUSTER_SIZE=2, STATS_IN_PRODUCER=True, **{other: True})
    with pytest.raises(ValueError, match="STATS_IN_PRODUCER=True with STATS_ELEMENTWISE=True"):
        lp.TilingConfig(CLUSTER_SIZE=2, STATS_IN_PRODUCER=True, STATS_ELEMENTWISE=True)  # at construction
    # STATS_UNPACK_ASM widens the producer's terms too
    assert km.TilingConfig(CLUSTER_SIZE=2, STATS_IN_PRODUCER=True, STATS_UNPACK_ASM=True).STATS_UNPACK_ASM


def test_launch_flags_and_rejects():
    cfg = lp.SHIPPED_CONFIGS["cluster_c2_defer_prod_asm"].cluster_config()
    a = torch.empty(256, 64, dtype=torch.bfloat16)
    b = torch.empty(64, 512, dtype=torch.bfloat16)
    *_, kw = km._prepare(a, b, None, None, 1e-6, "lazy_rms", cfg, need_cuda=False)
    assert kw["SS_PROD"] is True and kw["UNPACK_ASM"] is True and "SS_2D" not in kw
    *_, kw = km._prepare(a, b, None, None, 1e-6, "none", cfg, need_cuda=False)
    assert "SS_PROD" not in kw  # matmul_cluster: the same GEMM as without the option
    for norm, op in (("rms", "matmul_rmsnorm"), ("layer", "matmul_layernorm"), ("lazy_layer", "lazy_layernorm_matmul")):
        with pytest.raises(ValueError, match=f"STATS_IN_PRODUCER=True applies to lazy_rmsnorm_matmul only .* got {op}"):
            km._prepare(a, b, None, None, 1e-6, norm, cfg, need_cuda=False)


_SCRIPT = r"""
import json, re, sys
from normfuse import compile_only
compile_only.install(90)
from normfuse.testing import compile_lazy_cluster_pairs


def measure(cfg, ptx):
    inits = [int(x) for x in re.findall(r"mbarrier\.init\.shared::cta\.b64 \[[^\]]+\], (\d+);", ptx)]
    # the PTX of each task starts at its setmaxnreg: the producer's (the first .dec) and the two consumers'
    # (.inc to CONSUMER_REGS); per task the A-slice loads of the statistic (ld.shared.v4) and its FMAs
    lines = ptx.splitlines()
    marks = [i for i, l in enumerate(lines) if "setmaxnreg" in l] + [len(lines)]
    regions = [(lines[a], "\n".join(lines[a:b])) for a, b in zip(marks, marks[1:])]
    prod = next(text for head, text in regions if ".dec" in head)
    cons = [text for head, text in regions if head.strip().endswith("\t%d;" % cfg.CONSUMER_REGS)]
    return {"inits": inits, "n_consumers": len(cons),
            "consumer_lds_v4": sum(t.count("ld.shared.v4") for t in cons),
            "consumer_fma": sum(t.count("fma.rn.f32") for t in cons),
            "producer_lds_v4": prod.count("ld.shared.v4"), "producer_fma": prod.count("fma.rn.f32"),
            "producer_regs": int(re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32 \t(\d+);", ptx).group(1))}


print(json.dumps(compile_lazy_cluster_pairs(json.loads(sys.argv[1]), ("new", "base"), measure)))
"""


@pytest.fixture(scope="module")
def compiled():
    jobs = [("cluster_c2_defer_prod_asm", "cluster_c2_defer_elem_asm", 512, 2048),
            ("cluster_c4_defer_prod_asm", "cluster_c4_defer_elem", 1024, 512),
            ("cluster_c2_t2_prod_asm", "cluster_c2_t2_elem_asm", 1024, 1024)]
    return run_python_json_parallel(_SCRIPT, jobs, timeout=400)


def test_compile(compiled):
    assert len(compiled) == 3
    for key, r in compiled.items():
        new, base = r["new"], r["base"]
        assert new["smem"] <= SMEM_LIMIT_BYTES, (key, new["smem"])
        assert new["ptxas"]["spill_stores"] == 0 == new["ptxas"]["spill_loads"], (key, new["ptxas"])
        # the ring's empty barriers (3 stages): one more arrival, the producer's
        assert base["inits"].count(2) >= 3 and new["inits"].count(3) == 3, (key, new["inits"], base["inits"])
        assert new["n_consumers"] == base["n_consumers"] == 2, key
        # the consumers' K loop without the statistic; the producer's with it
        assert base["consumer_lds_v4"] > 0 and base["consumer_fma"] > 0 and base["producer_lds_v4"] == 0, (key, base)
        # (4 128-bit loads of a [64, 64] slice per consumer and K loop: two loops with TILES_PER_CTA = 2, whose
        # parked tile's own loads stay)
        tiles = 2 if "_t2_" in key else 1
        assert new["consumer_lds_v4"] == base["consumer_lds_v4"] - 4 * 2 * tiles and new["consumer_fma"] == 0, \
            (key, new, base)
        assert new["producer_lds_v4"] > 0 and new["producer_fma"] > 0, (key, new)
        assert new["producer_regs"] >= 80 > base["producer_regs"], (key, new["producer_regs"], base["producer_regs"])
