"""``kernels_tlx.fna`` (FlashNormAttention gdpa: warp-specialized single CTA over all heads, or CLUSTER=True: a
cluster of H CTAs, one head each, exchanging per-token partial sums through DSMEM) without a GPU: sm_90a
compile-only with wgmma, TMA (cp.async.bulk.tensor), mbarrier and setmaxnreg (single CTA) or the cluster protocol
(cluster shape H, mapa, predicated st.async ... complete_tx, armed byte counts, barrier.cluster,
fence.mbarrier_init, no ptxas spills) asserted for every shipped config and H = 2/3/4 (and D = 64); config and
input validation; on a GPU (marker ``gpu``) every shipped config against the fp32 reference at odd shapes and
the NaN/Inf isolation check."""

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
from kernels_tlx.multi_cta import _ptx_extras
from normfuse.codestats import ptxas_info
import yaml
res = []
for entry in yaml.safe_load(Path("configs/tiling/fna_h200.yaml").read_text())["tlx"]:
    cfg = dict(entry)
    name = cfg.pop("name")
    for H, D in ((2, 128), (3, 128), (4, 128), (3, 64)):
        ck = kt.compile_sm90_kernel("gdpa", *T.compile_inputs(1000, H, D, "bf16"), config=cfg)
        ptx = ck.asm["ptx"]
        s = compile_only.summarize(ck)
        s["ptx_extra"] = _ptx_extras(ptx)
        s["st_async_unpredicated"] = len(re.findall(r"^\s*st\.async", ptx, re.M))
        s["expect_tx_bytes"] = sorted({int(v) for v in re.findall(r"mbarrier\.arrive\.expect_tx[^\n]*, (\d+);", ptx)})
        if cfg.get("CLUSTER"):
            s["ptxas"] = ptxas_info(ptx)
        res.append(dict(name=name, H=H, D=D, cluster=bool(cfg.get("CLUSTER")), **s))
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def compiled():
    return run_python_json(_COMPILE, timeout=900)


def test_compile_sm90_markers(compiled):
    res = [r for r in compiled if not r["cluster"]]
    assert len(res) == 3 * 4
    for r in res:
        m = r["ptx_markers"]
        assert m["wgmma"] >= 2 * r["H"], r              # S = ln_q K^T and P V per head
        assert m["tma_load"] >= 2 * r["H"], r           # K_h and V_h by TMA
        assert m["mbarrier"] > 0 and m["setmaxnreg"] > 0, r
        assert r["smem_ok"] and r["num_warps"] == 8, r  # producer + consumer warpgroups
        assert r["cluster_dims"] in ([], [1, 1, 1]) and m["mapa"] == 0 and r["ptx_extra"]["st_async"] == 0, r


def test_compile_sm90_cluster_protocol(compiled):
    res = [r for r in compiled if r["cluster"]]
    assert len(res) >= 4, "configs/tiling/fna_h200.yaml ships no CLUSTER entry"
    for r in res:
        H, m, ex = r["H"], r["ptx_markers"], r["ptx_extra"]
        assert r["cluster_dims"] == [H, 1, 1] and ex["reqnctapercluster"].replace(" ", "") == f"{H},1,1", r
        assert m["wgmma"] >= 2 and m["tma_load"] == 2, r       # one head per CTA: K_h, V_h by TMA; two dots
        assert r["num_warps"] == 4 and m["setmaxnreg"] == 0, r  # one warpgroup, no warp specialization
        assert r["smem_ok"] and r["shared_bytes"] <= 227 * 1024, r
        # DSMEM: the 3 partial vectors (sum, M2, sum r^2) to each of the H - 1 peers (statically unrolled over
        # all H ranks, the own rank skipped at run time), remote addresses by mapa, every st.async predicated to
        # one owner thread per row (replicated threads would push extra bytes past the armed count)
        assert ex["st_async"] > 0 and ex["st_async"] % (3 * H) == 0 and m["mapa"] >= ex["st_async"], r
        assert r["st_async_unpredicated"] == 0, r
        assert sorted(r["expect_tx_bytes"]) == sorted({64 * 4 * (H - 1), 2 * 64 * 4 * (H - 1),
                                                      2 * 128 * r["D"] * 2}), r  # recv[1], recv[0], K_h + V_h
        assert ex["fence_mbarrier_init"] >= 1 and ex["cluster_ctarank"] >= 1, r
        assert ex["barrier_cluster_arrive"] == ex["barrier_cluster_wait"] == 2, r  # entry + exit rendezvous
        assert ex["mbarrier_try_wait"] >= 3, r  # K/V, both exchanges
        assert r["ptxas"]["spill_stores"] == 0 and r["ptxas"]["spill_loads"] == 0, r  # one head per CTA


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
    with pytest.raises(ValueError, match="NUM_BUFFERS must be 1"):
        kt.gdpa(q, k, v, o, 20, config={"CLUSTER": True})  # NUM_BUFFERS defaults to 2
    with pytest.raises(ValueError, match="CLUSTER must be a bool"):
        kt.TilingConfig(CLUSTER=1, NUM_BUFFERS=1)


def test_cluster_heads_limit():
    from kernels_tlx import fna as kt

    cfg = kt.TilingConfig.from_dict({"CLUSTER": True, "NUM_BUFFERS": 1})
    for H in (2, 3, 4, 8):
        cfg.check_heads(H)
    for H in (1, 9, 16):
        with pytest.raises(ValueError, match=r"H = %d is not supported: H must be in 2\.\.8 .*portable" % H):
            cfg.check_heads(H)
    kt.TilingConfig().check_heads(1)  # the single-CTA kernel has no cluster
    assert kt.TilingConfig().CLUSTER is False  # default: existing configs unchanged


@pytest.mark.gpu
@pytest.mark.parametrize("check", ["odd_shapes", "nan_isolation"])
def test_shipped_configs_correct_gpu(check):
    """Every shipped config at the odd shapes, and NaN/Inf isolation between sequences (two tests: see
    tools/gpu_tests_parallel.py)."""
    from normfuse.gpu_checks import check_all, check_fna_isolation

    failures = check_fna_isolation("tlx") if check == "nan_isolation" else check_all("tlx", "fna")
    assert not failures, "\n".join(failures)
