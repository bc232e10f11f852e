"""``LAZY_Q`` of the TLX fna_llm kernel (kernels_tlx/fna_llm.py): Lazy Pre-Norm on the rows of QKᵀ —
``rmsnorm(q)·γq · k_nᵀ = rstd_q ⊙ (q · (γq ⊙ k_n)ᵀ)``: the wgmma reads the raw Q tile, rstd_q (from the same tile in
shared memory; before the tile's first QKᵀ with ``PINGPONG``, while it runs without) scales the scores' rows
inside the softmax's FMA, γq is folded into the materialized k_n. Checked without a GPU in what the sm_90a
compile emits:

1. the shipped ``-lazyq`` configs compile for both ops and variants; the fused kernel has no normalize-and-store
   of Q (no proxy fence, no ``Q_READY_BARRIER`` warpgroup barriers), keeps the SS wgmma, spills at most 8 bytes
   and none in a KV loop, and its KV loops have the plain attention's instruction counts within 16 (measured: 8;
   the per-row scale costs nothing per score: the row sums land in the accumulator's row layout,
   ``Q_ROWS_LAYOUT``);
2. the K pre-pass of a ``LAZY_Q`` config folds q_weight (``FOLD_QW``), the others do not; ``attention`` ignores it;
   rstd_q is computed before the tile's first QKᵀ with ``PINGPONG`` (``LAZY_Q_EARLY``), while it runs otherwise;
3. config validation (``LAZY_Q`` needs ``PIPELINE`` and ``K_NORM = "materialize"``; a bool);
4. GPU (marker ``gpu``): the fused op against the fp32 reference (causal and not, S = 1, ragged S, o_norm, GQA,
   D = 64 and 128), more than 2^31 elements, and agreement with the normalize-and-store kernel.

``PDL`` (programmatic dependent launch of the attention kernel after the K pre-pass; ``-pdl`` entries): on CPU, the
pre-pass triggers its dependents (``griddepcontrol.launch_dependents``), the fused kernel waits once before its K
loads (``griddepcontrol.wait``, in the producer) and is launched with ``launch_pdl``, the plain attention does
neither, PDL needs ``K_NORM = "materialize"``; on the GPU, the ``-pdl`` entries at the odd shapes and bit-identical
to their twins without PDL, eagerly and replayed in a CUDA graph.

``K_NORM_PRODUCER`` (no K pre-pass; ``-kprod`` entries): on CPU, the compile has no pre-pass kernel, the producer's
in-place K scale and Q weight fold (named barrier ``K_READY_BARRIER``, proxy fences) leave the consumers' KV loops
as their ``-prodq`` twins', no spills in a KV loop; config validation; on the GPU, the odd shapes, > 2^31 elements
and agreement with the ``-prodq`` twins. ``K_RSTD_PRODUCER`` (``-krstd``: the producer computes rstd_k beside the
raw tile's QKᵀ, the softmax scales S's columns): the same checks, its KV loops the twin's plus the column scale.

``GRID_PREPASS`` (``-grid`` entries: the K pre-pass inside the attention kernel, a cooperative launch with a grid
barrier): on CPU, no pre-pass kernel, the cooperative launch, one arrival and one release on the barrier state with
a proxy fence on either side, the consumers' KV loops equal to their ``-prodq`` twin's; config validation; on the
GPU, the odd shapes, > 2^31 elements, bit-identical outputs to the twin (the same k_n, the same attention) eagerly
and over CUDA-graph replays, and the barrier state back at count 0 with its generation one further per launch.
"""

import re
from pathlib import Path

import pytest
import torch
import yaml

from normfuse import compile_only
from normfuse.compile_only import ptx_code
from normfuse.scratch import poisoned_scratch

if not torch.cuda.is_available():  # process-wide fake driver: only where no GPU test may follow (see test_fna_llm_tlx)
    compile_only.install(90)

from kernels_tlx import fna_llm as K  # noqa: E402
from normfuse.techniques import fna_llm as T  # noqa: E402
from fna_llm_gpu import capture, check_config, check_int64, check_odd_shapes, run  # noqa: E402  (tests/tlx/)

import fna_llm_compile as C  # noqa: E402  (tests/tlx/fna_llm_compile.py)

ALL = {c["name"]: {k: v for k, v in c.items() if k != "name"}
       for c in yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/tiling/fna_llm_h200.yaml")
                               .read_text())["tlx"]}
LAZY = {n: c for n, c in ALL.items() if c.get("LAZY_Q") and not c.get("PDL") and not c.get("RSTD_Q_PRODUCER")}
assert set(LAZY) == {"bn128-buf2-pipe-pingpong-lpt-mat-lazyq", "bn128-buf2-pipe-pingpong-persist-mat-lazyq",
                     "bn128-buf2-pipe-coop-persist-mat-lazyq"}, LAZY
PRODQ = {n: c for n, c in ALL.items() if c.get("RSTD_Q_PRODUCER") and not any(
         c.get(o) for o in ("K_NORM_PRODUCER", "K_RSTD_PRODUCER", "GRID_PREPASS", "PDL"))}
assert set(PRODQ) == {f"{n}-prodq" for n in ("bn128-buf2-pipe-pingpong-persist-mat-lazyq",
                                             "bn128-buf2-pipe-coop-persist-mat-lazyq")}, PRODQ
assert all(PRODQ[n] == {**LAZY[n.removesuffix("-prodq")], "RSTD_Q_PRODUCER": True} for n in PRODQ)
KPROD = {n: c for n, c in ALL.items() if c.get("K_NORM_PRODUCER")}  # each a PRODQ entry plus "-kprod"
assert set(KPROD) == {f"{n}-kprod" for n in PRODQ}, KPROD
assert all(KPROD[n] == {**PRODQ[n.removesuffix("-kprod")], "K_NORM_PRODUCER": True} for n in KPROD)
KRSTD = {n: c for n, c in ALL.items() if c.get("K_RSTD_PRODUCER")}  # each a PRODQ entry plus "-krstd"
assert set(KRSTD) == {f"{n}-krstd" for n in PRODQ}, KRSTD
assert all(KRSTD[n] == {**PRODQ[n.removesuffix("-krstd")], "K_RSTD_PRODUCER": True} for n in KRSTD)
GRID = {n: c for n, c in ALL.items() if c.get("GRID_PREPASS")}  # each a PRODQ entry plus "-grid"
assert set(GRID) == {f"{n}-grid" for n in PRODQ}, GRID
assert all(GRID[n] == {**PRODQ[n.removesuffix("-grid")], "GRID_PREPASS": True} for n in GRID)
PDL = {n: c for n, c in ALL.items() if c.get("PDL")}  # each the same entry without PDL plus "-pdl"
assert set(PDL) == {f"{n}-pdl" for n in ("bn128-buf2-pipe-pingpong-persist-mat-lazyq",
                                         "bn128-buf2-pipe-coop-persist-mat-lazyq",
                                         "bn128-buf2-pipe-pingpong-lpt-mat", *PRODQ)}, PDL
Q_READY = re.compile(rf"\bbar\.sync\s+(?:{K.Q_READY_BARRIER.value}|{K.Q_READY_BARRIER.value + 1}),")
K_READY = re.compile(rf"\bbar\.sync\s+{K.K_READY_BARRIER.value},")  # the producer's barrier after its stores
# GRID_PREPASS, in program order before the producer's register release (``setmaxnreg.dec``, the start of its task
# in the warp-specialized region): the k_n stores, a proxy fence, the producer warpgroup's barrier, the elected
# thread's read of gen, its arrival, the last arrival's reset and release, the others' acquire spin (with the
# broadcast's own barrier), the barrier after the wait, and the proxy fence before the TMA loads, with no spin load
# and no setmaxnreg between that barrier and the fence, nor between the fence and the release
GRID_SEQUENCE = re.compile(
    r"st\.global.*?fence\.proxy\.async\.global.*?bar\.sync\s+0, 128;.*?ld\.global\.gpu\.relaxed.*?"
    r"atom\.global\.gpu\.acq_rel\.add.*?atom\.global\.gpu\.relaxed\.exch.*?atom\.global\.gpu\.release\.add"
    r".*?ld\.global\.gpu\.acquire.*?bar\.sync\s+0, 128;.*?bar\.sync\s+0, 128;"
    r"(?:(?!setmaxnreg|ld\.global\.gpu\.acquire).)*?fence\.proxy\.async\.global(?:(?!setmaxnreg).)*?setmaxnreg\.dec",
    re.S)


@pytest.mark.parametrize("name", list(LAZY))
@pytest.mark.parametrize("causal", [True, False])
def test_lazyq_configs_compile(name, causal):
    cfg = LAZY[name]
    fused, attn = C.ptx(cfg, True, causal), C.ptx(cfg, False, causal)
    store = C.ptx({**cfg, "LAZY_Q": False}, True, causal)  # the normalize-and-store twin
    assert "fence.proxy.async" in store and Q_READY.search(store)
    assert not Q_READY.search(fused) and fused.count("fence.proxy.async") == attn.count("fence.proxy.async")
    assert C.SS_WGMMA.findall(fused) and "wgmma.wait_group.sync.aligned 1;" in fused
    spill, in_loop = C.sass_spills(fused)
    assert spill <= 8 and not in_loop, (spill, in_loop)  # measured: 8 bytes causal persistent, else 0
    lf, la = C.sass_loops(fused), C.sass_loops(attn)
    assert len(lf) == len(la) and all(abs(f - a) <= 16 for f, a in zip(lf, la)), (lf, la)  # measured: <= 8
    r = K.compile_sm90("qknorm_attention", *T.compile_inputs(1000, 2, 32, "bf16"), config=cfg, causal=causal,
                       o_norm=True)
    assert r["smem_ok"] and r["num_warps"] == 12 and r["k_prepass"] == "_k_norm_kernel", r
    assert ptx_code(attn) == ptx_code(C.ptx({**cfg, "LAZY_Q": False}, False, causal))  # attention ignores LAZY_Q


def test_lazyq_prepass_folds_q_weight():
    q, k, v, qw, kw = T.compile_inputs(300, 1, 4, "bf16")
    for lazy in (True, False):
        cfg = {**LAZY["bn128-buf2-pipe-pingpong-persist-mat-lazyq"], "LAZY_Q": lazy}
        _, _, kwd, (kernel, args, _, pre_kw) = K._prepare(q, k, v, qw, kw, None, True, 1e-6, cfg, True,
                                                          need_cuda=False)
        assert kernel is K._k_norm_kernel and args[1] is kw and pre_kw["FOLD_QW"] is lazy and kwd["LAZY_Q"] is lazy
        assert kwd["LAZY_Q_EARLY"] is cfg["PINGPONG"]  # ping-pong: rstd_q before the first QKᵀ, outside the turn
        assert (args[5] is qw) is lazy
    _, _, kwd, pre = K._prepare(q, k, v, None, None, None, True, 1e-6, LAZY["bn128-buf2-pipe-pingpong-lpt-mat-lazyq"],
                                False, need_cuda=False)
    assert pre is None and kwd["LAZY_Q"] is False  # attention: no pre-pass, no row scale


def test_probe_rstd_q_ablations_compile():
    """The breakdown probe's ``PROBE_RSTD_Q`` (tools/fna_llm_breakdown_probe.py --ablations): 0 is the kernel as
    shipped, 1 (no rstd_q) compiles to the plain attention's KV loops (the row scale of 1 folds away), 2 reads rstd_q
    from global memory (a ``tt.load`` per consumer warpgroup) and keeps the KV loops free of spills."""
    cfg = LAZY["bn128-buf2-pipe-pingpong-persist-mat-lazyq"]
    launches, kwd = C.launch(cfg, True, False)
    (args, grid), = launches
    compiled = {m: K._fna_llm_ws_kernel.warmup(*args, grid=grid, **kwd, PROBE_RSTD_Q=m) for m in (0, 1, 2)}
    assert ptx_code(compiled[0].asm["ptx"]) == ptx_code(C.ptx(cfg, True, False))
    assert C.sass_loops(compiled[1].asm["ptx"]) == C.sass_loops(C.ptx(cfg, False, False))
    loads = {m: len(re.findall(r"\btt\.load\b", c.asm["ttgir"])) for m, c in compiled.items()}
    assert loads == {0: 0, 1: 0, 2: 2}, loads  # one rstd_q load per consumer warpgroup
    spill, in_loop = C.sass_spills(compiled[2].asm["ptx"])
    assert spill <= 8 and not in_loop, (spill, in_loop)


@pytest.mark.parametrize("name", list(PRODQ))
@pytest.mark.parametrize("causal", [True, False])
def test_prodq_configs_compile(name, causal):
    """``RSTD_Q_PRODUCER``: the consumers read rstd_q back in the accumulator's row layout — their KV loops keep the
    plain attention's instruction counts (measured: equal non-causal, +2 causal), no new spills; the producer's sums
    of squares put the shared-memory reads there; attention ignores the option."""
    cfg = PRODQ[name]
    fused, attn = C.ptx(cfg, True, causal), C.ptx(cfg, False, causal)
    twin = C.ptx(LAZY[name.removesuffix("-prodq")], True, causal)
    la, lf = C.sass_loops(attn), C.sass_loops(fused)
    assert all(abs(f - a) <= 4 for f, a in zip(lf[:2], la[:2])), (lf, la)  # the two consumer warpgroups' KV loops
    spill, in_loop = C.sass_spills(fused)
    assert spill <= 8 and not in_loop, (spill, in_loop)
    assert spill <= C.sass_spills(twin)[0]
    assert ptx_code(attn) == ptx_code(C.ptx({**cfg, "RSTD_Q_PRODUCER": False}, False, causal))


@pytest.mark.parametrize("name", list(KPROD))
@pytest.mark.parametrize("causal", [True, False])
def test_kprod_configs_compile(name, causal):
    """``K_NORM_PRODUCER``: no K pre-pass kernel; the producer scales the landed K tile in place (its stores, a
    proxy fence and its own named barrier before it releases the tile) and folds the weights into the Q tile; the
    consumers' KV loops stay their ``-prodq`` twin's (measured: +1…+8 SASS instructions), spills stay at most 32
    bytes (measured: 8 non-causal, 28 causal) and none in a KV loop; attention ignores the option."""
    cfg = KPROD[name]
    fused, attn = C.ptx(cfg, True, causal), C.ptx(cfg, False, causal)
    twin = C.ptx(PRODQ[name.removesuffix("-kprod")], True, causal)
    lf, lt = C.sass_loops(fused), C.sass_loops(twin)
    assert len(lf) == len(lt) and all(abs(f - t) <= 8 for f, t in zip(lf, lt)), (lf, lt)
    spill, in_loop = C.sass_spills(fused)
    assert spill <= 32 and not in_loop, (spill, in_loop)
    # after the K tile's stores (in the KV loop and after it) and each consumer warpgroup's Q tile's
    assert len(K_READY.findall(fused)) == 2 + K.NUM_MMA_GROUPS and not K_READY.search(twin)
    lines = fused.splitlines()  # each of those barriers follows a proxy fence after the last shared-memory store
    for i in (i for i, line in enumerate(lines) if K_READY.search(line)):
        last_store = max(j for j in range(i) if "st.shared" in lines[j])
        assert any("fence.proxy.async" in lines[j] for j in range(last_store, i)), lines[last_store:i + 1]
    r = K.compile_sm90("qknorm_attention", *T.compile_inputs(1000, 2, 32, "bf16"), config=cfg, causal=causal)
    assert "k_prepass" not in r and r["smem_ok"], r
    assert ptx_code(attn) == ptx_code(C.ptx({**cfg, "K_NORM_PRODUCER": False}, False, causal))


@pytest.mark.parametrize("name", list(KRSTD))
@pytest.mark.parametrize("causal", [True, False])
def test_krstd_configs_compile(name, causal):
    """``K_RSTD_PRODUCER``: no K pre-pass kernel; the consumers' KV loops are their ``-prodq`` twin's plus the
    column scale (one multiply per score, 64 per thread and step, and the rstd_k load; measured +84…+93 SASS
    instructions), no spills in a KV loop (at most 32 bytes elsewhere; measured 8 non-causal, 28 causal), the four
    producer barriers (``K_READY_BARRIER``: each consumer warpgroup's Q tile, rstd_k in and after the KV loop);
    attention ignores the option."""
    cfg = KRSTD[name]
    fused, attn = C.ptx(cfg, True, causal), C.ptx(cfg, False, causal)
    twin = C.ptx(PRODQ[name.removesuffix("-krstd")], True, causal)
    lf, lt = C.sass_loops(fused), C.sass_loops(twin)
    assert all(64 <= f - t <= 100 for f, t in zip(lf[:2], lt[:2])), (lf, lt)  # the two consumer warpgroups
    spill, in_loop = C.sass_spills(fused)
    assert spill <= 32 and not in_loop, (spill, in_loop)
    # after each consumer warpgroup's Q tile's stores and rstd_k's (in the KV loop and after it)
    assert len(K_READY.findall(fused)) == 2 + K.NUM_MMA_GROUPS and not K_READY.search(twin)
    r = K.compile_sm90("qknorm_attention", *T.compile_inputs(1000, 2, 32, "bf16"), config=cfg, causal=causal)
    assert "k_prepass" not in r and r["smem_ok"], r
    assert ptx_code(attn) == ptx_code(C.ptx({**cfg, "K_RSTD_PRODUCER": False}, False, causal))


def test_probe_kprod_compiles():
    """The breakdown probe's ``PROBE_KPROD = 1`` (tools/fna_llm_breakdown_probe.py --kprod): the producer keeps the
    sums of squares but stores no scaled K tile — fewer shared-memory stores than the kernel as shipped, the
    consumers' KV loops unchanged."""
    cfg = KPROD["bn128-buf2-pipe-coop-persist-mat-lazyq-prodq-kprod"]
    launches, kwd = C.launch(cfg, True, False)
    (args, grid), = launches
    probe = K._fna_llm_ws_kernel.warmup(*args, grid=grid, **kwd, PROBE_KPROD=1).asm["ptx"]
    shipped = C.ptx(cfg, True, False)
    stores = [len(re.findall(r"\bst\.shared", p)) for p in (probe, shipped)]
    assert stores[0] < stores[1], stores
    assert C.sass_loops(probe)[:2] == C.sass_loops(shipped)[:2]


@pytest.mark.parametrize("name", list(GRID))
@pytest.mark.parametrize("causal", [True, False])
def test_grid_configs_compile(name, causal):
    """``GRID_PREPASS``: no pre-pass kernel; a cooperative launch whose kernel, before its warp-specialized region,
    stores k_n, reads the barrier's generation, arrives once (acq_rel), resets and releases once, spins with acquire
    loads, and fences the async proxy before the arrival and after the wait, in that order (``GRID_SEQUENCE``); the
    consumers' KV loops are their ``-prodq`` twin's, no spills in a KV loop; attention ignores the option."""
    cfg = GRID[name]
    fused, attn = C.ptx(cfg, True, causal), C.ptx(cfg, False, causal)
    twin = C.ptx(PRODQ[name.removesuffix("-grid")], True, causal)
    assert C.sass_loops(fused) == C.sass_loops(twin)
    spill, in_loop = C.sass_spills(fused)
    assert spill <= 8 and not in_loop, (spill, in_loop)
    counts = {k: len(re.findall(p, fused)) for k, p in (
        ("arrive", r"atom\.global\.gpu\.acq_rel\.add"), ("reset", r"atom\.global\.gpu\.relaxed\.exch"),
        ("release", r"atom\.global\.gpu\.release\.add"), ("spin", r"ld\.global\.gpu\.acquire"),
        ("fence", r"fence\.proxy\.async\.global"))}
    assert counts["spin"] >= 1 and {**counts, "spin": 1} == dict(arrive=1, reset=1, release=1, spin=1, fence=2), counts
    assert GRID_SEQUENCE.search(fused)
    assert "atom.global" not in twin and "fence.proxy.async.global" not in twin
    q, k, v, qw, kw = T.compile_inputs(1000, 2, 32, "bf16")
    _, _, kwd, pre = K._prepare(q, k, v, qw, kw, None, causal, 1e-6, cfg, True, need_cuda=False)
    assert pre is None and kwd["GRID_PREPASS"] and kwd["launch_cooperative_grid"] and kwd["SYNC"].shape == (2,)
    _, _, kwd, pre = K._prepare(q, k, v, None, None, None, causal, 1e-6, cfg, False, need_cuda=False)
    assert pre is None and not kwd["GRID_PREPASS"] and "launch_cooperative_grid" not in kwd
    assert ptx_code(attn) == ptx_code(C.ptx({**cfg, "GRID_PREPASS": False}, False, causal))


def test_grid_config_validation():
    base = GRID["bn128-buf2-pipe-coop-persist-mat-lazyq-prodq-grid"]
    K.TilingConfig.from_dict(base)
    with pytest.raises(ValueError, match="GRID_PREPASS must be a bool"):
        K.TilingConfig.from_dict({**base, "GRID_PREPASS": 1})
    with pytest.raises(ValueError, match="GRID_PREPASS needs PERSISTENT and K_NORM materialize"):
        K.TilingConfig(PIPELINE=True, K_NORM="materialize", GRID_PREPASS=True)
    with pytest.raises(ValueError, match="GRID_PREPASS needs PERSISTENT and K_NORM materialize"):
        K.TilingConfig(PERSISTENT=True, K_NORM="prepass", GRID_PREPASS=True)
    for other in ("PDL", "K_NORM_PRODUCER", "K_RSTD_PRODUCER"):
        with pytest.raises(ValueError, match="GRID_PREPASS excludes PDL, K_NORM_PRODUCER and K_RSTD_PRODUCER"):
            K.TilingConfig.from_dict({**base, other: True})
    K.TilingConfig(PERSISTENT=True, K_NORM="materialize", GRID_PREPASS=True)  # without LAZY_Q: k_n carries γk only


def test_krstd_config_validation():
    base = KRSTD["bn128-buf2-pipe-coop-persist-mat-lazyq-prodq-krstd"]
    K.TilingConfig.from_dict(base)
    with pytest.raises(ValueError, match="K_RSTD_PRODUCER needs RSTD_Q_PRODUCER"):
        K.TilingConfig.from_dict({**base, "RSTD_Q_PRODUCER": False})
    with pytest.raises(ValueError, match="K_RSTD_PRODUCER excludes K_NORM_PRODUCER"):
        K.TilingConfig.from_dict({**base, "K_NORM_PRODUCER": True})
    with pytest.raises(ValueError, match="K_RSTD_PRODUCER excludes PDL"):
        K.TilingConfig.from_dict({**base, "PDL": True})


def test_kprod_config_validation():
    base = KPROD["bn128-buf2-pipe-coop-persist-mat-lazyq-prodq-kprod"]
    K.TilingConfig.from_dict(base)
    with pytest.raises(ValueError, match="K_NORM_PRODUCER must be a bool"):
        K.TilingConfig.from_dict({**base, "K_NORM_PRODUCER": 1})
    with pytest.raises(ValueError, match="K_NORM_PRODUCER needs RSTD_Q_PRODUCER"):
        K.TilingConfig.from_dict({**base, "RSTD_Q_PRODUCER": False})
    with pytest.raises(ValueError, match="K_NORM_PRODUCER excludes PDL"):
        K.TilingConfig.from_dict({**base, "PDL": True})


def test_lazyq_config_validation():
    with pytest.raises(ValueError, match="LAZY_Q"):
        K.TilingConfig(LAZY_Q=1)
    with pytest.raises(ValueError, match="LAZY_Q needs PIPELINE"):
        K.TilingConfig(LAZY_Q=True, K_NORM="materialize")
    with pytest.raises(ValueError, match="LAZY_Q needs PIPELINE"):
        K.TilingConfig(LAZY_Q=True, PIPELINE=True, K_NORM="prepass")
    assert not K.TilingConfig().LAZY_Q
    for bad in (dict(LAZY_Q=True, PIPELINE=True, K_NORM="materialize", RSTD_Q_PRODUCER=True),  # not PERSISTENT
                dict(PIPELINE=True, PERSISTENT=True, K_NORM="materialize", RSTD_Q_PRODUCER=True)):  # not LAZY_Q
        with pytest.raises(ValueError, match="RSTD_Q_PRODUCER needs LAZY_Q and PERSISTENT"):
            K.TilingConfig(**bad)
    with pytest.raises(ValueError, match="RSTD_Q_PRODUCER must be a bool"):
        K.TilingConfig(RSTD_Q_PRODUCER="yes")
    C.launch({**LAZY["bn128-buf2-pipe-coop-persist-mat-lazyq"]}, norms=True)  # valid


@pytest.mark.parametrize("name", list(PDL))
def test_pdl_configs_compile(name):
    cfg = PDL[name]
    q, k, v, qw, kw = T.compile_inputs(1000, 2, 32, "bf16")
    _, launches, kwd, (kernel, args, grid, pre_kw) = K._prepare(q, k, v, qw, kw, None, True, 1e-6, cfg, True,
                                                                need_cuda=False)
    assert kwd["PDL"] and kwd["launch_pdl"] and pre_kw["PDL_TRIGGER"], (kwd, pre_kw)
    assert kernel.warmup(*args, grid=grid, **pre_kw).asm["ptx"].count("griddepcontrol.launch_dependents") == 1
    fused, attn = C.ptx(cfg, True, True), C.ptx(cfg, False, True)
    assert fused.count("griddepcontrol.wait") == 1 and "griddepcontrol" not in attn
    twin = C.ptx({**cfg, "PDL": False}, True, True)
    assert "griddepcontrol" not in twin
    spill, in_loop = C.sass_spills(fused)
    assert spill <= 8 and not in_loop, (spill, in_loop)
    _, _, kwd, pre = K._prepare(q, k, v, None, None, None, True, 1e-6, cfg, False, need_cuda=False)
    assert pre is None and not kwd["PDL"] and not kwd["launch_pdl"]  # attention: no pre-pass, no dependency


def test_pdl_config_validation():
    with pytest.raises(ValueError, match="PDL"):
        K.TilingConfig(PDL=1)
    with pytest.raises(ValueError, match="PDL needs K_NORM materialize"):
        K.TilingConfig(PDL=True, K_NORM="prepass")
    assert not K.TilingConfig().PDL


# ------------------------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(LAZY))
def test_lazyq_configs_shapes_gpu(name):
    """Benchmark head layout (GQA 32 / 8, D = 128), S = 1, ragged S (zero-filled Q rows past S: rstd_q of a zero
    row is finite), o_norm; D = 64; Hq = Hkv."""
    bad = check_odd_shapes(LAZY[name])
    assert not bad, "\n".join(bad)


def _odd_shapes_and_twin(cfg: dict, twin: dict) -> None:
    """``cfg`` at the odd shapes, then against ``twin`` (the same math another way) at S = 2048, B = 2: both within
    the flash tolerance of the fp32 reference and of each other (asserts)."""
    bad = check_odd_shapes(cfg)
    assert not bad, "\n".join(bad)
    inp = T.make_inputs(2048, 2, 32, dtype="bf16", device="cuda", kv_heads=8, head_dim=128, seed=9)
    for causal in (True, False):
        out, ref_twin = run("fused", inp, causal, cfg), run("fused", inp, causal, twin)
        r = T.check("fused", out, inp, 1e-6, "causal" if causal else "noncausal")
        assert r["ok"], r
        assert (out.float() - ref_twin.float()).abs().max().item() <= r["tol"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PRODQ))
def test_prodq_configs_gpu(name):
    """The ``-prodq`` entries (ragged S: zero Q rows past S get a finite rstd_q from the producer too) against
    their consumer-side twins: the sums of squares only added in another order."""
    _odd_shapes_and_twin(PRODQ[name], LAZY[name.removesuffix("-prodq")])


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(KPROD) + list(KRSTD))
def test_k_in_kernel_configs_gpu(name):
    """The ``-kprod`` and ``-krstd`` entries (no K pre-pass; ragged S: the zero K rows past S stay zero after the
    in-place scale, or get rstd_k = 1/sqrt(eps) and are masked) against their ``-prodq`` twins (K pre-pass); and
    more than 2^31 elements of q (64-bit offsets)."""
    cfg = {**KPROD, **KRSTD}[name]
    _odd_shapes_and_twin(cfg, PRODQ[name.rsplit("-", 1)[0]])
    check_int64(cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GRID))
def test_grid_configs_gpu(name):
    """The ``-grid`` entries at the odd shapes and > 2^31 elements, and bit-identical to their ``-prodq`` twins (the
    same k_n arithmetic, the same attention kernel): eagerly, the ``-grid`` call first and its k_n NaN-filled before
    the kernel writes it (``normfuse.scratch.poisoned_scratch``: a k_n row never written, or read before its owner
    CTA wrote it, shows as NaN; the second only if the race happens), and in three replays of one CUDA graph, each on
    new K values copied into the captured input (a k_n not rewritten by the replay would be the previous one); after
    each launch the barrier state reads count 0 and a generation one further."""
    cfg, twin = GRID[name], PRODQ[name.removesuffix("-grid")]
    with poisoned_scratch():
        bad = check_odd_shapes(cfg)
        assert not bad, "\n".join(bad)
        check_int64(cfg)
    inp = T.make_inputs(2048, 2, 32, dtype="bf16", device="cuda", kv_heads=8, head_dim=128, seed=11)
    run("fused", inp, True, cfg)  # compiled, and the barrier state allocated, outside the capture below
    sync = K._grid_sync_state(inp["q"].device)
    for causal in (True, False):
        gen = sync[1].item()
        with poisoned_scratch():
            got = run("fused", inp, causal, cfg)
        torch.cuda.synchronize()
        assert sync.tolist() == [0, gen + 1], (sync.tolist(), gen)
        assert torch.equal(got, run("fused", inp, causal, twin))
        graph, out = capture(lambda: run("fused", inp, causal, cfg))
        gen = sync[1].item()
        for i in range(3):
            new = T.make_inputs(2048, 2, 32, dtype="bf16", device="cuda", kv_heads=8, head_dim=128, seed=20 + i)
            inp["k"].copy_(new["k"])
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, run("fused", inp, causal, twin)), i
        assert sync.tolist() == [0, gen + 3], (sync.tolist(), gen)


@pytest.mark.gpu
def test_lazyq_int64_gpu():
    check_int64(LAZY["bn128-buf2-pipe-pingpong-persist-mat-lazyq"])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_lazyq_agrees_with_normalized_q_gpu(causal):
    """Same math as normalizing the Q tile (rounded to bf16) before the dot: the outputs differ by less than the
    flash tolerance, and the raw-Q product is not further from the fp32 reference than the rounded one (2x
    slack)."""
    inp = T.make_inputs(2048, 2, 32, dtype="bf16", device="cuda", kv_heads=8, head_dim=128, seed=5)
    cfg = LAZY["bn128-buf2-pipe-pingpong-persist-mat-lazyq"]
    lazy, store = run("fused", inp, causal, cfg), run("fused", inp, causal, {**cfg, "LAZY_Q": False})
    variant = "causal" if causal else "noncausal"
    r_lazy, r_store = T.check("fused", lazy, inp, 1e-6, variant), T.check("fused", store, inp, 1e-6, variant)
    assert r_lazy["ok"] and r_store["ok"], (r_lazy, r_store)
    assert r_lazy["max_abs_err"] <= 2 * r_store["max_abs_err"] + 1e-3, (r_lazy, r_store)
    assert (lazy.float() - store.float()).abs().max().item() <= r_lazy["tol"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PDL))
def test_pdl_configs_gpu(name):
    """The ``-pdl`` entries at the benchmark head layout and odd shapes, and bit-identical to the same entry without
    PDL (same kernels; only the launch order relaxes), eagerly and replayed in a CUDA graph three times. The twin's
    outputs are computed first: in the only GPU run of the previous order (twin compiled last) the twin's compile
    failed in fbtriton's code generator ("region_replica_id_stack is not restored"; not reproduced compiling the
    same sequence on the CPU), results/gpu_tests/20261201_h200_issue13_s3/INDEX.md."""
    cfg = PDL[name]
    inp = T.make_inputs(4096, 2, 32, dtype="bf16", device="cuda", kv_heads=8, head_dim=128, seed=7)
    want = {causal: run("fused", inp, causal, {**cfg, "PDL": False}) for causal in (True, False)}
    bad = []
    for S, B, causal in ((2048, 2, True), (1, 3, True), (333, 2, False), (4097, 1, True)):
        bad += check_config(cfg, S, B, 32, 8, 128, causal, o_norm=S == 333)
    assert not bad, "\n".join(bad)
    for causal in (True, False):
        assert torch.equal(run("fused", inp, causal, cfg), want[causal])
        g, out = capture(lambda: run("fused", inp, causal, cfg))
        for _ in range(3):
            out.zero_()
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want[causal]), causal
