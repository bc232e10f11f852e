"""The FlashAttention-3 options of the TLX fna_llm kernel (kernels_tlx/fna_llm.py: ``PIPELINE``, ``PINGPONG_PV``,
``WARP_ARRIVE``, ``LPT``), checked in what the sm_90a compile emits (no GPU needed):

1. ``PIPELINE``: two wgmma groups in flight in the KV loop (``wgmma.wait_group 1``: the QKᵀ of tile j+1 waited for
   while the PV of tile j still runs), the QKᵀ A operand read from shared memory (SS wgmma: no register copy of Q;
   the fused op stores its normalized Q there, behind a proxy fence and a warpgroup barrier, named barriers 11/12),
   no register spills (ptxas -v; the prepass fused kernel: 16 bytes, outside the loop), shared memory within the
   H200's limit;
2. ``PINGPONG_PV``: the ping-pong region (``bar.sync 9`` ... ``bar.arrive 10`` of consumer 0) holds both GEMM issues
   of a loop step, without it only the QKᵀ;
3. ``WARP_ARRIVE``: the K/V releases are per-thread mbarrier arrivals (fewer warpgroup ``bar.sync``);
4. ``LPT``: causal only, the heaviest-first remapping of the CTA index (a 64-bit division by the grid size);
5. config validation;
6. GPU (marker ``gpu``): the FA3 configs against the fp32 reference where ``normfuse.gpu_checks`` does not reach
   (B·Hq past the grid's 65535 limit, more than 2^31 elements, the LPT order at several Q tiles), and bit-level
   agreement of PIPELINE with the non-pipelined loop within the flash tolerance.
"""

import re
from pathlib import Path

import pytest
import torch
import yaml

from normfuse import compile_only

if not torch.cuda.is_available():  # process-wide fake driver: only where no GPU test may follow (see test_fna_llm_tlx)
    compile_only.install(90)

from kernels_tlx import fna_llm as K  # noqa: E402
from normfuse.techniques import fna_llm as T  # noqa: E402
import fna_llm_compile as C  # noqa: E402  (tests/tlx/fna_llm_compile.py)
from fna_llm_gpu import check_batch_slices, check_config, check_int64  # noqa: E402  (tests/tlx/fna_llm_gpu.py)

ALL = {c["name"]: {k: v for k, v in c.items() if k != "name"}
       for c in yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/tiling/fna_llm_h200.yaml")
                               .read_text())["tlx"]}
# PERSISTENT: test_fna_llm_persistent_tlx, LAZY_Q and PDL: test_fna_llm_lazyq_tlx
FA3 = {n: c for n, c in ALL.items()
       if c.get("PIPELINE") and not c.get("PERSISTENT") and not c.get("LAZY_Q") and not c.get("PDL")}
assert len(FA3) == 5 and {c["K_NORM"] for c in FA3.values()} == {"prepass", "materialize"}, FA3
@pytest.mark.parametrize("name", list(FA3))
@pytest.mark.parametrize("op", ["qknorm_attention", "attention"])
def test_pipelined_configs_compile(name, op):
    cfg = FA3[name]
    norms = op == "qknorm_attention"
    ptx = C.ptx(cfg, norms, causal=True)
    assert "wgmma.wait_group.sync.aligned 1;" in ptx  # QK of tile j+1 done while PV of tile j runs
    assert len(C.SS_WGMMA.findall(ptx)) > 0  # QKᵀ with Q from shared memory
    if norms:  # normalized Q stored back: proxy fence + one barrier per consumer warpgroup before the first wgmma
        assert "fence.proxy.async" in ptx
        for bar in (K.Q_READY_BARRIER.value, K.Q_READY_BARRIER.value + 1):
            assert re.search(rf"\bbar\.sync\s+{bar},\s*128;", ptx), bar
    # measured: 0 bytes, except the prepass fused kernel (16 B: two scalars parked across the KV loop, outside it)
    assert C.spills(ptx) <= (16 if norms and cfg["K_NORM"] == "prepass" else 0)
    r = K.compile_sm90(op, *T.compile_inputs(1000, 2, 32, "bf16"), config=cfg, causal=False, o_norm=norms)
    assert r["smem_ok"] and r["num_warps"] == 12 and r["ptx_markers"]["setmaxnreg"] > 0, r
    assert (r["pingpong_barriers"] > 0) == cfg["PINGPONG"]


@pytest.mark.parametrize("norms", [True, False])
def test_pipelined_head_dim_64_compiles(norms):
    """D = 64 (the grid-slice GPU check's head dim): same pipeline, no spills."""
    ptx = C.ptx(FA3["bn128-buf2-pipe-pingpong-lpt-mat"], norms, True, shape=(300, 2, 4), D=64, Hkv=2)
    assert "wgmma.wait_group.sync.aligned 1;" in ptx and C.SS_WGMMA.findall(ptx)
    assert C.spills(ptx) == 0


def test_non_pipelined_loop_has_one_wgmma_in_flight():
    ptx = C.ptx(ALL["bn128-buf2-pingpong-mat"], True)
    assert "wgmma.wait_group.sync.aligned 1;" not in ptx and not C.SS_WGMMA.findall(ptx)


def _max_commits_in_pingpong_region(ptx):
    """Largest number of wgmma commit groups between one ``bar.sync 9, 256`` (consumer 0 enters its turn) and the
    next ``bar.arrive 10, 256`` (it hands the turn over)."""
    best = 0
    for m in re.finditer(r"bar\.sync\s+9,\s*256;(.*?)bar\.arrive\s+10,\s*256;", ptx, flags=re.S):
        best = max(best, m.group(1).count("wgmma.commit_group"))
    return best


def test_pingpong_pv_region_covers_both_gemms():
    base = dict(FA3["bn128-buf2-pipe-pingpong-mat"])
    assert _max_commits_in_pingpong_region(C.ptx(base)) == 1
    assert _max_commits_in_pingpong_region(C.ptx({**base, "PINGPONG_PV": True})) == 2


@pytest.mark.parametrize("pipeline", [True, False])
def test_warp_arrive_drops_warpgroup_syncs(pipeline):
    base = {**FA3["bn128-buf2-pipe-pingpong-mat"], "PIPELINE": pipeline}
    n_sync = lambda ptx: len(re.findall(r"\bbar\.sync\s+[23],\s*128;", ptx))  # noqa: E731  (consumer partitions)
    warp, elected = C.ptx(base), C.ptx({**base, "WARP_ARRIVE": False})
    assert n_sync(warp) < n_sync(elected)
    # the empties count all 2 x 128 consumer threads, each of which arrives unpredicated (a count left at 2 with
    # per-thread arrivals, or 256 with one arrival per warpgroup, would hang the producer)
    init256 = lambda ptx: len(re.findall(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], 256;", ptx))  # noqa: E731
    plain = lambda ptx: len(re.findall(r"^\s*mbarrier\.arrive\.shared::cta\.b64 _, ", ptx, flags=re.M))  # noqa: E731
    assert init256(warp) == 2 * K.TilingConfig().NUM_BUFFERS and init256(elected) == 0
    assert plain(warp) >= 2 * K.NUM_MMA_GROUPS and plain(elected) == 0  # a K and a V release per warpgroup


def test_lpt_remaps_causal_only():
    div64 = lambda ptx: len(re.findall(r"\b(?:div|rem)\.[su]64\b", ptx))  # noqa: E731
    lpt = FA3["bn128-buf2-pipe-pingpong-lpt-mat"]
    assert div64(C.ptx(lpt, causal=True)) > 0
    assert div64(C.ptx(lpt, causal=False)) == 0 == div64(C.ptx({**lpt, "LPT": False}, causal=True))


def test_fa3_config_validation():
    with pytest.raises(ValueError, match="PINGPONG_PV"):
        K.TilingConfig(PINGPONG_PV=True)  # needs PIPELINE
    with pytest.raises(ValueError, match="PINGPONG_PV"):
        K.TilingConfig(PIPELINE=True, PINGPONG=False, PINGPONG_PV=True)
    with pytest.raises(ValueError, match="inloop"):
        K.TilingConfig(PIPELINE=True, K_NORM="inloop")
    for key in ("PIPELINE", "LPT", "WARP_ARRIVE"):
        with pytest.raises(ValueError, match=key):
            K.TilingConfig(**{key: 1})
    assert not K.TilingConfig().PIPELINE and not K.TilingConfig().LPT and not K.TilingConfig().WARP_ARRIVE


# ------------------------------------------------------------------------------------------------------------ GPU




@pytest.mark.gpu
@pytest.mark.parametrize("name", list(FA3))
def test_fa3_configs_shapes_gpu(name):
    """Benchmark head layout at several Q tiles (LPT order), S = 1 and a ragged S, o_norm."""
    cfg, bad = FA3[name], []
    for S, B, causal in ((2048, 2, True), (2048, 1, False), (1, 3, True), (333, 2, True), (4097, 1, False)):
        bad += check_config(cfg, S, B, 32, 8, 128, causal, o_norm=S == 333)
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["bn128-buf2-pipe-pingpong-lpt-mat", "bn128-buf2-pipe-coop-mat"])
def test_fa3_grid_slices_gpu(name):
    """B·Hq = 65536 (B = 2048, Hq = 32, S = 16, D = 64): two launches; batches on both sides of the slice checked
    (LPT remaps within each launch's own grid)."""
    bad = check_batch_slices(name, FA3[name], True, ((0, 2), (2046, 2048)))
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
def test_fa3_int64_gpu():
    """q of more than 2^31 elements (B = 2049, Hq = 16, Hkv = 8, S = 512, D = 128), causal, the LPT config."""
    check_int64(FA3["bn128-buf2-pipe-pingpong-lpt-mat"])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_pipelined_matches_non_pipelined_gpu(causal):
    """PIPELINE changes the order of nothing but the exponent's rounding (one FMA): its output stays within a few
    bf16 ulps of the non-pipelined kernel's at the benchmark head layout."""
    inp = T.make_inputs(4096, 1, 32, dtype="bf16", device="cuda", kv_heads=8, head_dim=128, seed=4)
    ref = K.attention(inp["q"], inp["k"], inp["v"], causal=causal, config=ALL["bn128-buf2-pingpong-mat"]).float()
    for name in FA3:
        out = K.attention(inp["q"], inp["k"], inp["v"], causal=causal, config=FA3[name]).float()
        assert torch.allclose(out, ref, atol=2e-2, rtol=2e-2), (name, (out - ref).abs().max().item())
