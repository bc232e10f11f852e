"""``PERSISTENT`` of the TLX fna_llm kernel (kernels_tlx/fna_llm.py), checked in what the sm_90a compile emits (no
GPU needed):

1. the shipped ``-persist-`` configs: one launch of min(#SMs, work tiles) CTAs (132 off the GPU, the H200's count)
   whatever B·Hq (no batch slices at B·Hq = 65536), 3-D TMA loads through descriptors over the whole tensors built
   once per CTA (3 ``tensormap.replace ... global_address``, no 2-D TMA), two Q buffers with full / empty barriers
   (12 single-arrival mbarriers instead of 6), the FA3 pipeline kept (``wgmma.wait_group 1``, SS wgmma), shared
   memory within the H200's limit, and at most 8 bytes of spills (one tile-loop scalar), none inside a KV loop
   (SASS: no local-memory access between the ends of a loop that holds wgmma);
2. the non-pipelined loop and K_NORM = prepass with ``PERSISTENT`` compile too; ``LPT`` changes nothing there
   (the persistent causal order is always heaviest first);
3. config validation: non-bool, ``K_NORM = "inloop"``, a K/V ring that does not fit next to two Q buffers;
4. GPU (marker ``gpu``): the persistent configs against the fp32 reference (both ops, causal and not, S = 2048,
   4097, 333, 1, GQA Hq 32 / Hkv 8, D = 128, o_norm), B·Hq = 65536 (one launch), more than 2^31 elements, and
   agreement with the one-CTA-per-Q-tile kernel (same per-tile arithmetic).
"""

import re
from pathlib import Path

import pytest
import torch
import yaml

from normfuse import compile_only
from normfuse.compile_only import ptx_code

if not torch.cuda.is_available():  # process-wide fake driver: only where no GPU test may follow (see test_fna_llm_tlx)
    compile_only.install(90)

from kernels_tlx import fna_llm as K  # noqa: E402
from normfuse.techniques import fna_llm as T  # noqa: E402
import fna_llm_compile as C  # noqa: E402  (tests/tlx/fna_llm_compile.py)
from fna_llm_gpu import check_batch_slices, check_int64, check_odd_shapes, run  # noqa: E402  (tests/tlx/fna_llm_gpu.py)

ALL = {c["name"]: {k: v for k, v in c.items() if k != "name"}
       for c in yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/tiling/fna_llm_h200.yaml")
                               .read_text())["tlx"]}
PERSIST = {n: c for n, c in ALL.items() if c.get("PERSISTENT") and not c.get("LAZY_Q")}  # LAZY_Q / PDL: own file
assert set(PERSIST) == {"bn128-buf2-pipe-pingpong-persist-mat", "bn128-buf2-pipe-pingpongpv-persist-mat",
                        "bn128-buf2-pipe-coop-persist-mat"}, PERSIST
# each persistent entry and its one-CTA-per-Q-tile twin (the same entry without PERSISTENT)
TWIN = {"bn128-buf2-pipe-pingpong-persist-mat": "bn128-buf2-pipe-pingpong-mat",
        "bn128-buf2-pipe-pingpongpv-persist-mat": "bn128-buf2-pipe-pingpongpv-mat",
        "bn128-buf2-pipe-coop-persist-mat": "bn128-buf2-pipe-coop-mat"}
INIT1 = re.compile(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], 1;")  # single-arrival barriers (fulls, q empties)


@pytest.mark.parametrize("name", list(PERSIST))
@pytest.mark.parametrize("op", ["qknorm_attention", "attention"])
@pytest.mark.parametrize("causal", [True, False])
def test_persistent_configs_compile(name, op, causal):
    cfg, norms = PERSIST[name], op == "qknorm_attention"
    launches, _ = C.launch(cfg, norms, causal)
    (args, grid), = launches
    assert grid == (K.H200_NUM_SMS, 1, 1) and args[-1] == 2 * 32  # 8 Q tiles x 64 (batch, head) > 132
    ptx = C.ptx(cfg, norms, causal)
    # descriptors over the whole [B·H, S, D] tensors, built once per CTA (q, k, v), 3-D loads only
    assert ptx.count("tensormap.replace.tile.global_address") == 3
    assert "cp.async.bulk.tensor.3d" in ptx and "cp.async.bulk.tensor.2d" not in ptx
    # q fulls + q empties for two Q buffers x two warpgroups, K / V fulls; the empties count 256 threads
    assert len(INIT1.findall(ptx)) == 2 * 2 * K.NUM_MMA_GROUPS + 2 * cfg["NUM_BUFFERS"]
    assert len(INIT1.findall(C.ptx(ALL[TWIN[name]], norms, causal))) == K.NUM_MMA_GROUPS + 2 * cfg["NUM_BUFFERS"]
    assert "wgmma.wait_group.sync.aligned 1;" in ptx and C.SS_WGMMA.findall(ptx)
    if norms:  # the normalized Q stored back, per tile, behind the proxy fence and the warpgroup barriers
        assert "fence.proxy.async" in ptx
        for bar in (K.Q_READY_BARRIER.value, K.Q_READY_BARRIER.value + 1):
            assert re.search(rf"\bbar\.sync\s+{bar},\s*128;", ptx), bar
    spill, in_loop = C.sass_spills(ptx)
    assert spill <= 8 and not in_loop, (spill, in_loop)  # measured: 8 bytes causal, 4 / 0 non-causal
    r = K.compile_sm90(op, *T.compile_inputs(1000, 2, 32, "bf16"), config=cfg, causal=causal, o_norm=norms)
    assert r["smem_ok"] and r["num_warps"] == 12 and r["ptx_markers"]["setmaxnreg"] > 0, r
    assert r["shared_bytes"] >= 2 * 128 * 128 * 2 + 2 * 2 * 128 * 128 * 2  # two Q tiles + the K/V ring
    assert (r["pingpong_barriers"] > 0) == cfg["PINGPONG"]


def test_persistent_grid_is_one_launch():
    """B·Hq = 65536 (past the 65535 limit of grid axis y): one launch of 132 CTAs over all (batch, head) pairs, not
    two slices; few work tiles: one CTA per tile."""
    cfg = PERSIST["bn128-buf2-pipe-coop-persist-mat"]
    launches, _ = C.launch(cfg, False, True, shape=(16, 2048, 32), D=64)
    (args, grid), = launches
    assert grid == (K.H200_NUM_SMS, 1, 1) and args[-1] == 65536 and args[0].shape[0] == 2048
    assert len(C.launch(ALL[TWIN["bn128-buf2-pipe-coop-persist-mat"]], False, True, shape=(16, 2048, 32), D=64)[0]) == 2
    (args, grid), = C.launch(cfg, True, False, shape=(300, 1, 2))[0]
    assert grid == (3 * 2, 1, 1) and args[-1] == 2


@pytest.mark.parametrize("norms", [True, False])
def test_persistent_head_dim_64_and_three_buffers(norms):
    """D = 64 (the grid-slice check's head dim): a 3-deep K/V ring fits next to the two Q buffers; no spills in the
    KV loop."""
    cfg = {**PERSIST["bn128-buf2-pipe-pingpong-persist-mat"], "NUM_BUFFERS": 3}
    ptx = C.ptx(cfg, norms, True, shape=(300, 2, 4), D=64)
    assert "cp.async.bulk.tensor.3d" in ptx and "wgmma.wait_group.sync.aligned 1;" in ptx
    spill, in_loop = C.sass_spills(ptx)
    assert spill <= 8 and not in_loop, (spill, in_loop)


@pytest.mark.parametrize("base", ["bn128-buf2-pingpong-mat", "bn128-buf2-pipe-pingpong"])
def test_persistent_other_loops_compile(base):
    """The non-pipelined loop and the pipelined prepass column scale with PERSISTENT (not shipped): they compile
    and fit; spills bounded."""
    cfg = {**ALL[base], "PERSISTENT": True, "WARP_ARRIVE": True}
    ptx = C.ptx(cfg, True, True)
    assert ptx.count("tensormap.replace.tile.global_address") == 3 and "cp.async.bulk.tensor.3d" in ptx
    assert len(INIT1.findall(ptx)) == 2 * 2 * K.NUM_MMA_GROUPS + 2 * cfg["NUM_BUFFERS"]
    spill, in_loop = C.sass_spills(ptx)
    # measured: the non-pipelined loop none in the loop; the pipelined prepass loop (rstd_k column scale, not
    # shipped) 12 bytes, one local reload per KV step per consumer warpgroup (hence not in the timed entries)
    assert spill <= 16 and len(in_loop) <= (2 if cfg.get("PIPELINE") else 0), (spill, in_loop)
    r = K.compile_sm90("qknorm_attention", *T.compile_inputs(1000, 2, 32, "bf16"), config=cfg, causal=True)
    assert r["smem_ok"], r


def test_persistent_causal_order_is_lpt():
    """PERSISTENT's causal tile order is always heaviest first: LPT changes nothing in the kernel."""
    cfg = PERSIST["bn128-buf2-pipe-pingpong-persist-mat"]
    assert ptx_code(C.ptx({**cfg, "LPT": True})) == ptx_code(C.ptx(cfg))  # code only: debug info names the path


def test_persistent_config_validation():
    with pytest.raises(ValueError, match="PERSISTENT"):
        K.TilingConfig(PERSISTENT=1)
    with pytest.raises(ValueError, match="PERSISTENT.*inloop"):
        K.TilingConfig(PERSISTENT=True, K_NORM="inloop")
    assert not K.TilingConfig().PERSISTENT
    with pytest.raises(ValueError, match="shared memory"):  # 2 x 32 KiB of Q + 3 x 64 KiB of K/V > 227 KiB
        C.launch({**PERSIST["bn128-buf2-pipe-pingpong-persist-mat"], "NUM_BUFFERS": 3})
    C.launch({**PERSIST["bn128-buf2-pipe-pingpong-persist-mat"], "NUM_BUFFERS": 3}, shape=(300, 2, 4), D=64)  # fits


# ------------------------------------------------------------------------------------------------------------ GPU




@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PERSIST))
def test_persistent_configs_shapes_gpu(name):
    """Benchmark head layout (GQA 32 / 8, D = 128) at several work tiles per CTA, S = 1, ragged S, o_norm; D = 64
    with fewer tiles than SMs."""
    bad = check_odd_shapes(PERSIST[name])
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["bn128-buf2-pipe-pingpong-persist-mat", "bn128-buf2-pipe-coop-persist-mat"])
@pytest.mark.parametrize("causal", [True, False])
def test_persistent_bh_65536_gpu(name, causal):
    """B·Hq = 65536 (B = 2048, Hq = 32, S = 16, D = 64): one launch over all (batch, head) pairs; batches at both
    ends checked."""
    bad = check_batch_slices(name, PERSIST[name], causal, ((0, 2), (1023, 1025), (2046, 2048)))
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
def test_persistent_int64_gpu():
    """q of more than 2^31 elements (B = 2049, Hq = 16, Hkv = 8, S = 512, D = 128), causal: the 3-D descriptors
    and the 64-bit output offsets."""
    check_int64(PERSIST["bn128-buf2-pipe-pingpong-persist-mat"])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_persistent_matches_one_tile_per_cta_gpu(causal):
    """Each work tile runs the same arithmetic as the one-CTA-per-Q-tile kernel: expected bit-identical; allowed
    an ulp where ptxas schedules differently (B = 8: several tiles per CTA at S = 4096)."""
    inp = T.make_inputs(4096, 8, 32, dtype="bf16", device="cuda", kv_heads=8, head_dim=128, seed=4)
    for name, twin in TWIN.items():
        for impl in ("fused", "attention"):
            outs = [run(impl, inp, causal, cfg).float() for cfg in (PERSIST[name], ALL[twin])]
            d = (outs[0] - outs[1]).abs().max().item()
            assert d <= 1e-2, (name, impl, d)
