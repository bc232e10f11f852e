r"""Multi-CTA Norm Fusion in TLX for the H200 (sm_90): ``Y = norm(A @ B)`` (RMSNorm or LayerNorm over the rows of
the GEMM output, optional affine) in one warp-specialized TMA + wgmma GEMM whose epilogue row reduction spans a
thread-block cluster; the per-row partial statistics are exchanged through distributed shared memory (DSMEM).

Math (``normfuse.techniques.multi_cta``; fp32 statistics from the fp32 accumulator, output in the input dtype)::

    RMSNorm:   rstd = rsqrt(sum_j C_ij^2 / N + eps);      Y = C * rstd (* weight)
    LayerNorm: mean = sum_j C_ij / N; rstd = rsqrt(sum_j (C_ij - mean)^2 / N + eps); Y = (C - mean) * rstd (* w + b)

**Cluster layout.** A cluster of ``C = CLUSTER_SIZE`` CTAs (1, 2, 4, 8 portable; 16 non-portable) owns one
``BLOCK_M``-row M-tile at a time and splits N: CTA ``rank`` (``tlx.cluster_cta_rank()``) computes the
``[BLOCK_M, BLOCK_N]`` tile at columns ``[rank * BLOCK_N, (rank + 1) * BLOCK_N)`` over the full K (with
``TILES_PER_CTA`` = T = 2: two such tiles, one after the other, at ``[rank * 2 BLOCK_N, (rank + 1) * 2 BLOCK_N)``,
section "TILES_PER_CTA" below; RECOMPUTE_TILES: 2 or 4 tiles, each computed twice, section "RECOMPUTE_TILES"). So
``C * T * BLOCK_N >= N`` is required (``BLOCK_N <= 256``: wgmma N and the
register accumulator), i.e. N <= 2048 with portable clusters and one tile, 4096 with 16-CTA clusters or with
8-CTA clusters and two tiles; and every rank must own at least one column (``cdiv(N, T * BLOCK_N) == C``).
``TilingConfig.block_n`` checks both and raises ValueError naming the limit. The grid is 1-D, ``num_clusters * C`` CTAs launched with ``ctas_per_cga=(C, 1, 1)`` (fbtriton
groups consecutive CTAs into a cluster): ``cluster_id = program_id // C``. Persistent (default): ``num_clusters``
is the number of co-resident clusters (``cuOccupancyMaxActiveClusters``; a GPC holds only whole clusters, so this
is not ``#SMs / C``) and cluster ``g`` walks M-tiles ``g, g + num_clusters, ...`` -- every CTA of a cluster the
same sequence. Non-persistent: one M-tile per cluster.

**Per CTA** (12 warps; the ring protocol is the one of ``kernels_tlx/lazy_prenorm.py``):

- Producer (``"default"`` task, 4 warps): per K step, wait ``empty[s]``, arm ``full[s]`` with the stage's bytes
  (``mbarrier.arrive.expect_tx``), TMA-load the A tile (one box per consumer, ``[BLOCK_M / NUM_CONSUMERS,
  BLOCK_K]``) and this CTA's ``[BLOCK_K, BLOCK_N]`` B tile. Out-of-bounds parts are zero-filled (so the
  accumulator columns past N are exactly 0 and add nothing to the row sums); an A box wholly below row M gets its
  row clamped to M - 1 (finite values, never stored), as in the Lazy Pre-Norm kernel.
- ``MULTICAST_A`` (C in 2..8): all C CTAs of a cluster need the same A tile, so each loads 1/C of every consumer's
  A box (``[BLOCK_M / NUM_CONSUMERS / C, BLOCK_K]`` rows ``rank * R ...``) and multicasts it into the same slot of
  all C CTAs (``cp.async.bulk.tensor ... .multicast::cluster``): L2->SM traffic for A drops C-fold. Each CTA's
  ``full[s]`` still expects the whole stage (its B + all C slices of A). Because a CTA's TMA now writes into its
  peers' slots, a slot may be refilled only when *every* consumer of the cluster has released it: ``empty[s]``
  then counts ``NUM_CONSUMERS * C`` arrivals, and each consumer arrives on ``empty[s]`` of every CTA of the
  cluster (``mbarrier.arrive.shared::cluster`` via ``mapa``). Peer bytes for use ``u`` of a slot can land before
  this CTA's ``expect_tx`` for use ``u`` (the tx-count goes transiently negative, legal in PTX), never before its
  use ``u - 1`` completed: the peer issued them after its ``empty[s]`` saw all consumers release use ``u - 1``.
- Consumers (``NUM_CONSUMERS`` replicated 4-warp tasks, ``setmaxnreg``): each owns ``BLOCK_M / NUM_CONSUMERS``
  = 64 rows; per K step wgmma into the fp32 register accumulator (``async_dot_wait(1)`` pipelining, slots
  released one step late). Then the **epilogue**:

  1. per-row partials of this CTA's column slice, fp32: RMSNorm ``p0 = sum(acc^2)``; LayerNorm
     ``p0 = sum(acc)`` and ``p1 = sum over valid columns of (acc - p0 / n_r)^2`` (n_r = columns this rank
     owns: ``min(BLOCK_N, N - rank * BLOCK_N)``);
  2. DSMEM all-to-all (C > 1, below): every CTA of the cluster obtains all C partials of its rows;
  3. rank-order combine (deterministic: every CTA adds the same fp32 values in the same order, so all ranks
     hold bit-identical statistics, and repeated runs give bit-identical output): RMSNorm ``rstd = rsqrt(sum_r
     p0_r / N + eps)``; LayerNorm, **Chan's parallel merge** of (n_r, mean_r = p0_r / n_r, M2_r = p1_r):
     ``mean = sum_r p0_r / N``, ``M2 = sum_r (M2_r + n_r (mean_r - mean)^2)``, ``rstd = rsqrt(M2 / N + eps)``.
     One exchange, two statistics, and no ``E[x^2] - mean^2`` cancellation (each term is >= 0; a row whose mean
     is 1000x its spread keeps full accuracy). The alternatives -- two exchanges (mean first, then the centred
     sum: one more cluster round trip per tile) or one exchange of (sum, sum of squares) as Meta's kernel does
     (catastrophic cancellation when |mean| >> std) -- are worse;
  4. normalize the fp32 accumulator (``(acc - mean) * rstd``), optional affine (loaded per tile, masked at N),
     cast, TMA store (rows past M / columns past N are clipped; a consumer whose rows all lie past M skips it);
     rank 0 writes ``mean`` / ``rstd`` (fp32 [M], rows < M).

**LN_PACKED** (``TilingConfig.LN_PACKED``, LayerNorm only; shipped as ``c4_lnpack`` / ``c8_lnpack``). The default
LayerNorm epilogue costs ~3x RMSNorm's fp32 instructions (sm_90a PTX at c4, N = 1024: 1674 vs 550): a column-mask
compare + select per element, ``(acc - mean) * rstd`` as two operations, and two fp32 DSMEM stores per peer
(each behind its own warpgroup barrier). LN_PACKED keeps the same two-pass statistics and Chan merge (exact
centring, no cancellation), but (a) when the row fills the cluster (``N == C * BLOCK_N``, passed as the constexpr
EVEN_N: every rank owns BLOCK_N columns) drops the mask and divides by the power of 2 exactly (``* 1 / BLOCK_N``);
(b) packs (sum, M2) into one int64 word per row: one ``st.async ... .b64`` per peer into one slot array (same
bytes, same barrier, same WAR argument as below); (c) writes ``acc * rstd - mean * rstd`` (one FMA). Measured on the
PTX: 1182 fp32 instructions at c4 (-29 %), no selects, as many warpgroup barriers as RMSNorm. Ragged N keep the
masked statistics (with the packed exchange and the FMA). Results differ from the default epilogue only by fp32
rounding: the exact ``* 1 / BLOCK_N`` replaces ``div.full.f32`` (approximate, <= 2 ulp) and the output is one FMA.

**STORE_DEFER** (``TilingConfig.STORE_DEFER``; in ``c*_defer_lnpack`` and every ``*_pp*`` config). The compiler's
tensor-descriptor store (``c_desc.store``) issues the TMA store and waits at once for it to finish reading shared
memory (``cp.async.bulk.wait_group.read 0``), so every tile pays the store's shared-memory read in its epilogue.
STORE_DEFER stages the tile in an explicit buffer per consumer (``out_bufs[cid]``, [64, BLOCK_N], the same 32 KB
per consumer at BLOCK_N = 256 that the compiler allocates) and issues ``tlx.async_descriptor_store``; the wait
for it moves to the end of the *next* tile's mainloop (one bulk group pending at most per consumer), plus one
before exit. A second staging buffer per consumer does not fit: 3 stages x 48 KB + 2 x 64 KB > 227 KB at
BLOCK_N = 256. The wait sits right after the mainloop rather than just before the ``local_store``: the warpgroup
barrier that follows it otherwise splits the normalization from the store and ptxas spills (1 KB at N = 264 with
affine). Same values stored: bit-identical to the config without it.

**PINGPONG** (``TilingConfig.PINGPONG``, NUM_CONSUMERS = 2; ``c*_pp*``). In the default (cooperative) schedule
both consumers compute the same M-tile (64 rows each) at the same time, so the tensor cores idle through every
epilogue and exchange wait. With PINGPONG consumer ``cid`` still owns rows ``[64 cid, 64 cid + 64)`` of each
128-row M-tile of the cluster's walk -- the same tiles, rows, exchange slots and barriers as before, so the
per-consumer DSMEM protocol above is unchanged (slots and ``recv[b][cid]`` are per consumer; all CTAs walk the
same M-tiles, each consumer its own 64-row half) -- but the two halves are computed one after the other:

- the producer loads consumer 0's ``k_tiles`` stages (its ``[64, BLOCK_K]`` A box + the B tile), then consumer
  1's; ring slot s holds one A box (``a_bufs[s]``) and is released by one consumer (``empty`` counts 1);
  consumer ``cid`` takes ring steps ``(2 i + cid) k_tiles ...`` of its i-th M-tile;
- named barriers order the mainloops (the TLX ping-pong GEMM tutorial): consumer 0 waits on barrier 9 before
  its mainloop and, once all its wgmma are issued, arrives on 10; consumer 1 waits on 10 and arrives on 9
  (plus once at the start; consumer 0 consumes that extra arrival before exit). 256 threads each (both
  warpgroups); the compiler uses 0-3 for its own barriers. So while one warpgroup runs its epilogue (statistics,
  DSMEM exchange and its wait, normalization, store) the other's wgmma run.

Cost: B is loaded once per 64 rows instead of per 128 (L2 -> SM traffic for B doubles; A unchanged) and a stage
is 40 KB (3 stages: 197 KB with LayerNorm at c4). Registers as before: 64 x 256 fp32 accumulator = 128 per
thread, ptxas reports no spills at the benchmark shapes (tests/tlx/test_multi_cta_pingpong_tlx.py). With
``matmul_cluster`` (NORM "none") the same schedule is a ping-pong GEMM: the self-check prints the fused kernel's
hidden share both vs the Lazy Pre-Norm GEMM and vs the better of that and this same-schedule GEMM.

**TILES_PER_CTA** (``TilingConfig.TILES_PER_CTA`` = 2; ``c*_t2*``). A Hopper CTA holds at most a 128 x 256 fp32
accumulator in registers, so one tile per CTA needs C = N / 256 (c4 at N = 1024, c8 at 2048), and a GPC holds only
whole clusters: on the H200 30 clusters of 4 (or 15 of 8) are co-resident, 120 of the 132 SMs, against 66 clusters
of 2 (all 132). With two tiles per CTA, CTA ``rank`` owns columns ``[2 rank BLOCK_N, 2 (rank + 1) BLOCK_N)``: the
producer streams A and the first tile's B for all K steps, then A again with the second tile's B (the same ring);
the consumers run the first mainloop, take that tile's fp32 partials (RMSNorm sum x^2; LayerNorm (sum, centred sum
of squares), merged with the second tile's by Chan's formula, a tile wholly past N weighing 0), wait for the
previous M-tile's last store to finish reading ``out_bufs[cid]`` and park the tile there as the output dtype; the
second accumulator restarts at 0 in the same registers (a select on the run-time-false ``K < 0``: with a zero
constant ptxas spilled the zeros, 3 KB). After the second mainloop the one DSMEM exchange of the M-tile runs as
above (with ``W = 2 BLOCK_N`` columns per rank), the parked tile is normalized in place in 64-column chunks
(bf16 in, fp32 math, bf16 out: one rounding more than the register tile, the precision the unfused pair has) and
TMA-stored, the register tile is normalized and, once that store has read the buffer, staged there and stored;
its wait moves behind the next M-tile's first mainloop. Lazy RMSNorm: CTA ``rank`` sums a^2 in its tile j over K
steps ``ki % (2 C) == 2 rank + j``, so the cluster's 2 C passes over A cover every K step once. Shared memory: the
ring + one [64, BLOCK_N] buffer per consumer (the compiler's staging buffer is not used), 215-222 KB at BLOCK_N =
256. Limits: no PINGPONG / MULTICAST_A / EPILOGUE_SUBTILE / STORE_DEFER, not Lazy LayerNorm; with an affine
weight and bias ptxas spills 2-5 KB (the benchmarks have none).

**EPILOGUE_OVERLAP** (``TilingConfig.EPILOGUE_OVERLAP``; ``c*_ovl*``). Even with the deferred store the tensor cores
idle through every M-tile's epilogue: the exchange wait, the normalization and the staging of the tile. With
EPILOGUE_OVERLAP a consumer ends an M-tile with only what needs the fp32 accumulator: the per-row partials (sent
through DSMEM at once, the same slots, bytes and double-buffer WAR argument as above: each CTA still sends tile t + 1
only after its wait for tile t) and the *un-normalized* tile parked in shared memory as the output dtype (one
``[64, BLOCK_N]`` buffer per consumer and column tile, ``out_bufs[j * NUM_CONSUMERS + cid]``). The rest is deferred
into the next M-tile's first mainloop, one step per K step, each issued after that step's wgmma and slot release
(a step that held back the release delayed the ring's refill: with 3 stages and ``async_dot_wait(1)`` the producer
runs one slot ahead): step 0 waits for the peers' partials and combines them in rank order (rank 0 writes mean /
rstd), steps 1 ... TILES * BLOCK_N / 64 normalize one 64-column chunk of a parked tile in place (fp32 math) and,
after a tile's last chunk, issue its TMA store. Steps a short K loop has no room for run after it; the last M-tile's
after the walk. Before a tile is parked again, ``cp.async.bulk.wait_group.read 0``. Every output element is rounded
to the output dtype once before its normalization (the unfused GEMM + norm does the same). Shared memory: one tile
per CTA needs the STORE_DEFER buffer only; two need 128 KB of parked tiles, which leaves room for a 3-stage
``BLOCK_K = 32`` ring only (``c2_t2_ovl_lnpack``; ``c2_t2_bk32_lnpack`` is the same ring without the overlap).
RMSNorm and LayerNorm (LN_PACKED); not PINGPONG / MULTICAST_A / EPILOGUE_SUBTILE / Lazy Pre-Norm. Measured on the
H200 it is slower than the immediate epilogue (the parked form's extra shared-memory passes cost more than the
mainloop hides: docs/results/multi_cta.md, "EPILOGUE_OVERLAP"); ``PROBE_OVL`` is the ablation constexpr of
``tools/multi_cta_overlap_probe.py``.

**STORE_DIRECT** (``TilingConfig.STORE_DIRECT``; ``c*_direct*``). The normalized register tile goes to global memory
with no shared-memory pass: each consumer thread stores its two adjacent columns (one bf16x2 word) per row with a
32-bit ``st.global`` written as inline PTX (``_store_direct``), in the wgmma accumulator layout; a plain
``tl.store`` gets a coalesced layout from the compiler, i.e. a ``convert_layout`` through shared memory, plus its
scratch buffer. A warp's store then covers 16 bytes of each of 8 rows (half a 32-byte sector each), against the TMA
store's full lines. Rows past M and columns past N get address 0 and are skipped (N % 8 == 0, so a pair is wholly
in or out). One tile per CTA drops the 64 KB staging tile (``c4_direct_s4_lnpack``: a 4-stage ring in its place);
two tiles keep the parked buffer, whose chunks are stored (coalesced ``tl.store``) from the registers they are
normalized in, so the parked tile crosses shared memory twice instead of four times. RMSNorm, LayerNorm and
``matmul_cluster``; not PINGPONG / MULTICAST_A / EPILOGUE_SUBTILE / STORE_DEFER / EPILOGUE_OVERLAP / Lazy Pre-Norm.
Measured on the H200 it is slower than the staged TMA store, by 46-127 points of the norm's time at N = 1024
(docs/results/multi_cta.md, "STORE_DIRECT"): kept opt-in, as the record of that result.

**FILL_IDLE_SMS** (``TilingConfig.FILL_IDLE_SMS``; ``c*_defer_lnpack_fill*``). A GPC holds only whole clusters, so
the persistent c4 / c8 grids hold 120 of the H200's 132 SMs, while the two-tile c2 kernel fills all 132 (66
clusters: so the idle SMs come in pairs of one GPC). With the option the cluster kernel takes the first ``M -
m_fill`` rows and runs ``griddepcontrol.launch_dependents`` at its start. The last ``m_fill`` rows (a multiple of
BLOCK_M: the idle SMs' share at FILL_RATE_PCT of a cluster SM's rate, ``fill_split``, which the self-check prints
per shape) go to ``fill_config()``: half the cluster size with two tiles per CTA (c2_t2 for c4, c4_t2 for c8), the
same columns per cluster, or with FILL_RECOMPUTE 2-CTA clusters of the RECOMPUTE_TILES kernel with C / 2 tiles each
(below). The filler is launched with ``launch_pdl`` as a persistent grid of as many of its clusters as the idle SMs
hold. It may start once every CTA of the cluster grid is resident, so it lands on the idle SMs; its producer ends
with ``griddepcontrol.wait``, so it completes only after the cluster grid. The two grids write disjoint row blocks
of y / mean / rstd. Each row is computed by one kernel only, so the last ``m_fill`` rows round as the filler's
(``c2_t2_lnpack``'s parked tile), not as the cluster kernel's, and which rows those are depends on M and on the
GPU's SM count and occupancy (bitwise repeatable on one GPU). ``_run_filled``; the Lazy Pre-Norm form of the idea is
in ``kernels_tlx.lazy_prenorm`` (its filler is a one-CTA kernel). Whether the filler's clusters fit the idle SMs is
the hardware's: a filler cluster that does not fit waits for a cluster CTA to exit (correct, but late: measured for
c8's 4-CTA filler, docs/results/multi_cta.md).

**RECOMPUTE_TILES** (``TilingConfig.RECOMPUTE_TILES``; ``c*_rc*``; its own kernel, ``_recompute_norm_kernel``). The
filler of a c8 grid must run on the pairs of SMs it leaves idle, i.e. on 2-CTA clusters covering N = 2048: four
256-wide tiles per CTA, whose three parked tiles would not fit beside the ring. Instead each CTA computes its tiles
twice per M-tile: a statistics pass keeps only each tile's per-row (sum, centred sum of squares) (RMSNorm: sum of
squares), merged over the tiles by Chan's formula; one LN_PACKED DSMEM exchange (same slots, barriers and WAR
argument as below); an output pass recomputes each tile, normalizes it (one FMA) and TMA-stores it through one
staging buffer per consumer. The producer streams the ring for both passes (2 x TILES x K steps per M-tile). Twice
the GEMM's work, one tile's shared memory. RMSNorm and LayerNorm only, none of the other options. Measured on an
H100 (docs/results/multi_cta.md, "The recompute filler"): alone it is 2x the GEMM, as built; as the c8 grid's
filler at rate 50 / 60 it lifts N = 2048 by 6-25 points over c8 + STORE_DEFER (three H100s).

**LN_ONEPASS** (``TilingConfig.LN_ONEPASS``; ``c*_lnpack1p*``; LayerNorm with LN_PACKED). With the filler, what
LayerNorm still costs over RMSNorm at N = 1024 is epilogue arithmetic: per accumulator element the centred
partials take an add (the sum), a subtract and an FMA (the centred square), and the second pass waits for the
first's row reduction. LN_ONEPASS takes each tile's ``(sum, sum of squares)`` in one pass (an add and an FMA, no
dependency between them) and forms ``M2 = sum x^2 - (sum x)^2 / n`` per tile, clamped at 0; the packed exchange,
the Chan merge over tiles and CTAs and the one-FMA output are unchanged. The difference of squares cancels when
``|mean| >> std`` within a 256-column tile (relative error of M2 about ``2^-24 * (mean / std)^2``: an fp32 model
of the arithmetic gives 1e-4 on rstd at ratio 30 and 1e-3 at 100, tests/tlx/test_multi_cta_onepass_tlx.py).
TensorRT-LLM's LayerNorm kernels offer the same trade (``USE_DIFF_OF_SQUARES``). Measured on an H100
(docs/results/multi_cta.md, "One-pass LayerNorm partials"): +2.9-3.3 points of "% hidden" at N = 1024, K = 512
and +0.7-3.4 at K >= 1024 (the c4 grid with its filler), +2.7-9.6 at N = 2048 (c8 with the recompute filler), i.e. what the centring pass costs;
but the GPU self-check's rows at mean shift 30 (extreme rows near 120 std) read rstd errors of 1.1-1.4e-3, over its
1e-3 bound (y within tolerance; 2-4e-6 with the centred form). Opt-in, outside the repository's precision bar: an
ablation, not a shipped default.

**STATS_ELEMENTWISE** (``TilingConfig.STATS_ELEMENTWISE``; Lazy Pre-Norm). Nsight Compute on the H200
(docs/results/lazy_prenorm.md, "Where the statistic's time goes") counted the statistic of the c2 cluster form at
K = 2048 as 65 % more warp instructions than its GEMM: at each K step a CTA owns, the row sum of the squared [64, 64] A slice ends in 3
shuffle + add levels per row (12 SHFL per warp), on top of the 4 shared loads, the widening of 32 bf16 values (48
instructions) and 32 FMAs. Measured (docs/results/lazy_prenorm.md): +5-14 points for c2 at N = 512, +3-15 for the
two-tile c2 at N = 1024, about +1 for c4, and -1 to -6 for c8 (not profiled). **STATS_UNPACK_ASM**
widens each packed bf16 pair with inline-PTX ``shl.b32`` / ``and.b32`` (``_widen_bf16``) instead of the compiler's
PRMT + 2 IMAD.U32: +0-1 point at N = 512, +2.6-3.5 at N = 1024 (RMSNorm), +3.3-4.1 for Lazy LayerNorm's c2. With the option the
squares accumulate elementwise in a [64, BLOCK_K] fp32 register tile carried through the K loop (and through both
tiles' loops with TILES_PER_CTA = 2), and one ``tl.sum`` per M-tile reduces it; Lazy LayerNorm carries two such
tiles (the shifted ``y`` and ``y^2``).

**LN_RANK1_MMA** (``TilingConfig.LN_RANK1_MMA``; Lazy Pre-Norm LayerNorm). Profiled on the H200
(docs/results/lazy_prenorm_ln.md, "The rank-1 correction as a wgmma"), the LayerNorm cluster kernel ran 1.33x the
RMSNorm one's cycles at (K, N) = (512, 1024), and about half of the difference was its fp32 epilogue ``acc * rstd - rm * colsum + beta_b``, with the two
vectors loaded per column quarter and tile. The option adds ``A_ext @ B_ext = -mean ⊗ colsum + (1/rstd) ⊗ beta_b`` to the
accumulator with one more m64 k16 wgmma per tile, as ``kernels_tlx.lazy_prenorm`` does in its LN_EPILOGUE_MMA
epilogue (``_lp._ln_a_ext`` / ``_lp._ln_b_ext``: input-dtype splits). B_ext depends only on the rank's columns, so
consumer 0 builds it once per kernel into a [16, BLOCK_N] buffer and arrives on ``bext_bar``, which both consumers
wait for before their first tile. A_ext ([64, 16], built in the wgmma A-fragment layout so that the statistics
stay in the accumulator's rows) is stored into the first [64, 64] of the consumer's own staging buffer, free
between the previous store's wait and this tile's store; hence STORE_DEFER is required (a register operand the
compiler staged itself would need 4 KB more shared memory, which c4 has not got). The epilogue then scales by rstd,
as RMSNorm's.
Measured: +13-28 percentage points of hidden_dsl for c2 at N = 512 (>= 70 % in all three cells), +16-57 for c4
at N = 1024; c8 fits only with a 2-stage ring, which costs far more than the option saves (N = 2048: -181 to -468 %
against -24 to -338 % for the 3-stage kernel without it).
**LN_SHIFT_PREFETCH** loads the next M-tile's per-row shift ``A[:, 0]`` at the end of this tile's K loop instead of
at its start: measured slower where resolved (1.8 points for c2 at (1024, 512), 8.4 for c4 at (512, 1024); within
noise in the other cells), kept opt-in as the record of that result.
**STATS_IN_PRODUCER** (``TilingConfig.STATS_IN_PRODUCER``; Lazy RMSNorm). On Hopper the wgmma accumulators live in
the consumer warps' registers, and the statistic's loads, widening and FMAs share those warps' instruction stream
(Blackwell's tcgen05 keeps the accumulator in tensor memory instead). With the option the producer warpgroup, whose
four warps otherwise only issue TMA loads (one thread does), reads this CTA's statistic steps of both consumers'
A slices from the ring, ``NUM_STAGES - 1`` steps behind its loads (``_producer_with_sumsq``: row sums, no
elementwise tile, with the registers the consumers leave), and hands each M-tile's partials to the consumers
through ``ss_bufs`` (two sets, ``ss_full`` / ``ss_empty``), where the exchange below completes them. Measured on
the H200 (docs/results/lazy_prenorm.md, "The statistic in the producer warpgroup"): 26-64 points of hidden_dsl slower
than the statistic in the consumers; the producer's one instruction stream now paces the ring's loads. A negative
result, kept opt-in.
**LN_SHIFT_SMEM** reads the shift ``A[:, 0]`` from the tile's first A slice in shared memory, at the first K step
and after that step's wgmma is issued, instead of from global memory before the K loop. The profile of the c4 kernel
with LN_RANK1_MMA at (K, N) = (512, 1024) put about 4 % of the consumer warps' samples on the shift's global load
(long-scoreboard stalls at its bf16 widening). The same values, so the same results (a GPU test asserts it).
Measured slower on the H200 (docs/results/lazy_prenorm_ln.md, "The shift from shared memory"): the column's
extraction and the shift's layout conversions cost more than the load's latency did. Kept opt-in, as LN_SHIFT_PREFETCH.

**DSMEM exchange protocol** (C > 1; per consumer ``cid`` and per tile ``t`` of this CTA's walk; NB = 2 buffers):

- Every CTA holds, per (buffer ``b``, consumer, statistic), C fp32 slots of ``[64]`` (slot ``r`` receives rank
  ``r``'s partial of these 64 rows) and one mbarrier ``recv[b][cid]`` (arrive count 1).
- Tile t uses buffer ``b = t % 2``, use ``u = t // 2``: ``barrier_expect_bytes(recv, NSTAT * 64 * 4 * (C - 1))``
  (this arrival is the barrier's only one; the phase completes when the C - 1 peers' bytes have all landed),
  ``local_store`` of the own partial into the own slot, then for each peer ``p != rank``:
  ``async_remote_shmem_store(slot[rank], partial, p, recv)`` = ``st.async.shared::cluster.mbarrier::complete_tx``
  into ``mapa(slot[rank], p)`` completing on ``mapa(recv, p)`` (one store per row, issued by one thread of each
  4-thread row quad: 64 x 4 bytes per peer and statistic, matching the armed count); then
  ``barrier_wait(recv, u & 1)`` and the rank-order combine of the C slots.
- Arming order: a peer's bytes for use u may arrive before this CTA's ``expect_tx`` of use u (legal: the
  tx-count goes negative and the phase cannot complete before the arrival), but never before use u - 1 of that
  barrier completed -- see the WAR argument next.
- Reuse (WAR) without a "slot free" barrier: CTA s writes into peer p's buffer b at tile t only after s
  completed its tile t - 1 exchange, which needed p's tile t - 1 partial, which p sent after finishing (reading)
  its tile t - 2 slots -- the previous use of buffer b. Double buffering is therefore sufficient (one buffer is
  not: a peer may write tile t + 1 into a slot this CTA is still reading for tile t). The release semantics of
  ``complete_tx`` and the acquire of ``mbarrier.try_wait`` carry this order across CTAs.
- Start: all barriers are initialized, then ``fence.mbarrier_init.release.cluster`` + ``barrier.cluster`` in all
  warps (the warp-specialize lowering runs the worker warps through it too) before any remote access.
- Exit: every task ends with ``barrier.cluster.arrive/wait``, so no CTA leaves while a peer may still store
  into its shared memory or arrive on its barriers (the multicast releases target peers' ``empty`` barriers).

All CTAs of a cluster execute the same (tile, k) sequence, so the barrier phases agree; no CTA waits on another
cluster, and co-residency within a cluster is guaranteed by the hardware (a cluster is scheduled as a unit).

Checks: ``tests/tlx/test_multi_cta_tlx.py`` compiles every shipped config for sm_90a on CPU and asserts the
protocol in the PTX (cluster dims, ``mapa``, ``st.async ... complete_tx``, ``barrier.cluster``, ``wgmma``,
``cp.async.bulk.tensor`` with ``.multicast::cluster`` for MULTICAST_A, ``setmaxnreg``, shared memory under 227 KB,
no spills). Compile-only does not catch deadlocks, barrier-phase bugs or numerics: the H200 self-check is
``python -m kernels_tlx.multi_cta [--quick]`` (every shipped config vs the fp32 reference at odd shapes, bitwise
determinism across launches, hang timeout).

Sources: PyTorch blog, "Towards Free Normalization" (2026-07-10),
https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ; Meta's
Blackwell kernels https://github.com/facebookresearch/ads_model_kernel_library/tree/main/multi_cta_norm_fusion ;
TLX (fbtriton), https://github.com/facebookexperimental/triton (tutorials ``hopper_gemm_ws.py``: WS GEMM and
multicast TMA; ``blackwell-multi-cta-layernorm_test.py``: DSMEM exchange); Chan, Golub, LeVeque, "Updating
formulae and a pairwise algorithm for computing sample variances" (1979). The code is written for this repo.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels_tlx import lazy_prenorm as _lp
from normfuse.codestats import ptxas_info
from normfuse.techniques import multi_cta as _spec
from normfuse.tiling import TilingConfigBase
from normfuse.validate import check_eps, check_forward_only

SMEM_LIMIT_BYTES = _lp.SMEM_LIMIT_BYTES
H200_NUM_SMS = 132
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
CLUSTER_SIZES = (1, 2, 4, 8, 16)  # 8 = Hopper's portable limit; 16 needs the non-portable attribute (set here)
MAX_BLOCK_N = 256  # wgmma N / TMA box / register accumulator
MIN_BLOCK_N = 32
OPS = ("matmul_rmsnorm", "matmul_layernorm", "matmul", "lazy_rmsnorm_matmul", "lazy_layernorm_matmul")
_NORM_OF_OP = {"matmul_rmsnorm": "rms", "matmul_layernorm": "layer", "lazy_rmsnorm_matmul": "lazy_rms",
               "lazy_layernorm_matmul": "lazy_layer"}
_PRODUCER_WARPS = _lp._PRODUCER_WARPS
_NUM_DSMEM_BUFFERS = 2  # double-buffered exchange slots (see the module docstring: sufficient for WAR)
# PINGPONG named barriers (256 threads: both consumer warpgroups): consumer 0 waits on _PP_BAR0 before its
# mainloop, consumer 1 on _PP_BAR1; the compiler takes 0-3 for its own CTA / partition barriers (as fna_llm)
_A_EXT_LAYOUT = tlx.layout(shape=((4, 8, 4), (2, 2, 2)), stride=((2, 16, 256), (1, 128, 8)))
_PP_BAR0 = tl.constexpr(9)
_PP_BAR1 = tl.constexpr(10)

# The plain GEMM of this DSL (the 'gemm' impl): the Lazy Pre-Norm module's warp-specialized TMA + wgmma GEMM
# (94-105 % of cuBLAS on the H200); it takes kernels_tlx.lazy_prenorm.TilingConfig configs.
matmul = _lp.matmul


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


def _wider_hint(C: int, T: int, N: int) -> str:
    """The fix for a row too wide for CLUSTER_SIZE C with TILES_PER_CTA T (``TilingConfig.block_n``'s message)."""
    if N > 16 * MAX_BLOCK_N:
        return f": N > {16 * MAX_BLOCK_N} is not supported (no cluster covers it)"
    opts = []
    if C < 16:
        opts.append("a larger CLUSTER_SIZE")
    if T == 1 and C <= 8:
        opts.append("TILES_PER_CTA=2")
    return ": use " + " or ".join(opts) if opts else ""


@dataclass(frozen=True)
class TilingConfig(TilingConfigBase):
    """Tiling of the TLX multi-CTA fused kernel.

    Fields:
        BLOCK_M: rows of an M-tile (= 64 * NUM_CONSUMERS: one m64 wgmma row slice per consumer warpgroup).
        BLOCK_N: columns per CTA tile (power of 2 in [32, 256]), or None: ``next_pow2(cdiv(N, CLUSTER_SIZE *
            TILES_PER_CTA))`` (at least 32) for the N at hand. Must satisfy ``CLUSTER_SIZE * TILES_PER_CTA * BLOCK_N
            >= N`` and ``cdiv(N, TILES_PER_CTA * BLOCK_N) == CLUSTER_SIZE`` (checked by ``block_n(N)``).
        BLOCK_K: K step (power of 2 in [16, 128]).
        CLUSTER_SIZE: CTAs per cluster along N, one of 1, 2, 4, 8 (portable) or 16 (non-portable: this module
            sets ``CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`` before the first launch). 1 = no cluster
            (the whole row in one CTA: N <= 256).
        NUM_STAGES: depth of the (A, B) shared-memory ring (>= 2).
        NUM_CONSUMERS: consumer warpgroups (1 or 2), each owning 64 rows.
        PERSISTENT: grid = the co-resident clusters, each walking M-tiles (True), or one cluster per M-tile.
        MULTICAST_A: TMA-multicast the A tile across the cluster (CLUSTER_SIZE in 2..8); see the module docstring.
        EPILOGUE_SUBTILE: store the output tile as two halves (halves the epilogue staging smem).
        CONSUMER_REGS: ``setmaxnreg`` count per consumer thread (multiple of 8).
        LN_PACKED: LayerNorm epilogue variant (RMSNorm unchanged): each CTA's per-row (sum, centred sum of
            squares) travel as ONE 64-bit DSMEM store per peer (half the ``st.async`` and warpgroup barriers), the
            statistics skip the column mask when the row fills the cluster
            (``N == CLUSTER_SIZE * BLOCK_N``, a constexpr) and then use the exact power-of-2 ``1 / BLOCK_N``,
            and the output is one FMA per element (``acc * rstd - mean
            * rstd``). Same Chan merge, so the same robustness to |mean| >> std; results differ from the default
            epilogue only by fp32 rounding (exact power-of-2 scaling instead of ``div.full``, the FMA). See
            "LN_PACKED" in the module docstring.
        STORE_DEFER: the output tile goes through an explicit per-consumer shared-memory staging buffer
            ``[64, BLOCK_N]`` and a TLX TMA store whose completion is waited for (``cp.async.bulk.wait_group.read
            0``) only just before that buffer is rewritten by the next tile's epilogue (and once before exit),
            instead of right after the store: the store drains while the next tile's mainloop runs. Same shared
            memory as the compiler's staging buffer (double-buffering it does not fit 227 KB at BLOCK_N = 256 with
            3 stages). Bit-identical results. Not with EPILOGUE_SUBTILE. See "STORE_DEFER" in the module docstring.
        PINGPONG: ping-pong consumers (CUTLASS ``KernelTmaWarpSpecializedPingpong``; NUM_CONSUMERS = 2): each
            consumer warpgroup owns whole output tiles of its own -- rows ``[64 cid, 64 cid + 64)`` of each
            128-row M-tile, i.e. the 64 x BLOCK_N tiles alternate between the two -- and the producer feeds the two
            alternately (ring stage = one ``[64, BLOCK_K]`` A box + the ``[BLOCK_K, BLOCK_N]`` B tile, so B is
            loaded once per 64 rows: twice the cooperative L2 -> SM traffic for B). The two mainloops are ordered
            by named barriers 9 / 10, so one warpgroup's epilogue and DSMEM exchange run while the other's wgmma
            keeps the tensor cores busy. Bit-identical results (same per-row math). Not with MULTICAST_A. See
            "PINGPONG" in the module docstring.
        TILES_PER_CTA: BLOCK_N-column tiles each CTA computes one after the other (1 or 2), so that a cluster of
            half the size covers the row (c2 at N = 1024, c4 at 2048, BLOCK_N = 256). With 2, the first tile's
            per-row partial statistics are taken from its fp32 accumulator, and the tile waits in shared memory
            as the output dtype (the "parked" tile, [64, BLOCK_N] per consumer) while the second is computed; one
            exchange per M-tile covers both. The parked buffer doubles as the output staging buffer, and its TMA
            stores drain under the next mainloop (as STORE_DEFER, implied). RMSNorm, LayerNorm, ``matmul_cluster``
            and Lazy RMSNorm (each CTA sums a^2 over K steps ``ki % (2 C) == 2 rank + j`` in its tile j); not Lazy
            LayerNorm, PINGPONG, MULTICAST_A, EPILOGUE_SUBTILE or STORE_DEFER. See "TILES_PER_CTA" in the module
            docstring.
        EPILOGUE_OVERLAP: each M-tile's tiles are parked in shared memory un-normalized (output dtype, one
            [64, BLOCK_N] buffer per consumer and tile: TILES_PER_CTA of them), their statistics sent through
            DSMEM, and the exchange wait, normalization and TMA stores run during the *next* M-tile's first
            mainloop, one 64-column chunk per K step while its wgmma run. RMSNorm and LayerNorm (needs
            LN_PACKED=True); ``matmul_cluster`` runs the kernel without it. Not with PINGPONG / MULTICAST_A /
            EPILOGUE_SUBTILE / STORE_DEFER (implied), not Lazy Pre-Norm. See "EPILOGUE_OVERLAP" in the module
            docstring.
        STORE_DIRECT: the output tile is written from registers by 32-bit ``st.global`` (each thread's two adjacent
            columns of the wgmma accumulator layout, inline PTX: a ``tl.store`` would convert the tile to a coalesced
            layout through shared memory), with no staging buffer and no TMA store; with TILES_PER_CTA = 2 the
            parked tile's chunks are stored (coalesced) from the registers they are normalized in. One tile per
            CTA frees the staging tile's shared memory (room for NUM_STAGES = 4). The same per-element math and rounding. Not with
            PINGPONG / MULTICAST_A / EPILOGUE_SUBTILE / STORE_DEFER / EPILOGUE_OVERLAP, not Lazy Pre-Norm. Measured
            slower than the staged store on the H200 (docs/results/multi_cta.md, "STORE_DIRECT"). See "STORE_DIRECT"
            in the module docstring.
        STATS_ELEMENTWISE: Lazy Pre-Norm only: the K loop accumulates ``a^2`` (LayerNorm: ``y = a - shift`` and
            ``y^2``) elementwise in [64, BLOCK_K] fp32 register tiles (BLOCK_K / 2 more registers per consumer thread
            and statistic: 32 / 64 at BLOCK_K = 64) and reduces them across threads once per M-tile, instead of a
            cross-thread row sum (shuffles) at every K step it owns. The sums are the same fp32 terms in another
            association order (results differ by rounding only). ``matmul_cluster`` runs the same GEMM without it;
            ``matmul_rmsnorm`` / ``matmul_layernorm`` raise ValueError. See "STATS_ELEMENTWISE" in the module
            docstring.
        STATS_UNPACK_ASM: with STATS_ELEMENTWISE or STATS_IN_PRODUCER, bf16 inputs: the statistic widens each packed bf16 pair of the A
            slice to fp32 with two integer instructions (inline PTX ``shl.b32`` / ``and.b32``: exact) instead of the
            compiler's three (PRMT + 2 IMAD.U32, counted by Nsight Compute). fp16 inputs keep the ordinary
            conversion; ``matmul_cluster`` ignores it. See "STATS_ELEMENTWISE" in the module docstring.
        LN_RANK1_MMA: Lazy Pre-Norm LayerNorm only (``lazy_layernorm_matmul``): the epilogue's rank-1 correction
            ``-mean ⊗ colsum + (1/rstd) ⊗ beta_b`` is added to the accumulator by one more m64 k16 wgmma per tile
            (A: the per-row ``-shift``, ``-d``, ``1/rstd`` as input-dtype splits, staged in the consumer's STORE_DEFER
            buffer; B: the split colsum / beta_b of this rank's columns, a [16, BLOCK_N] shared buffer written once
            per kernel by consumer 0), and
            the epilogue then only scales by rstd, as RMSNorm's; instead of per-tile colsum / beta_b loads and two
            fp32 vector terms per element. The same operands as ``kernels_tlx.lazy_prenorm``'s LN_EPILOGUE_MMA
            (results differ from the fp32 epilogue by rounding). Needs STORE_DEFER=True (the A operand's staging),
            BLOCK_N >= 64 and CLUSTER_SIZE > 1; 16 * BLOCK_N * itemsize more shared memory (8 KB at BLOCK_N = 256,
            bf16: c8 fits only with NUM_STAGES = 2). ``matmul_cluster`` ignores it; the other ops raise ValueError
            when called. See "LN_RANK1_MMA" in the module docstring.
        LN_SHIFT_PREFETCH: Lazy Pre-Norm LayerNorm only: each consumer loads the next M-tile's per-row shift
            ``A[:, 0]`` from global memory at the end of this tile's K loop (its latency hides behind the epilogue)
            instead of at the start of the tile, before its first statistic step. The same values. Measured slower on
            the H200 (docs/results/lazy_prenorm_ln.md, "LN_RANK1_MMA"): a negative result, kept opt-in. Needs
            CLUSTER_SIZE > 1.
            ``matmul_cluster`` ignores it; the other ops raise ValueError when called.
        STATS_IN_PRODUCER: Lazy Pre-Norm RMSNorm only (``lazy_rmsnorm_matmul``): the producer warpgroup, whose warps
            otherwise only issue the TMA loads, takes this CTA's share of the per-row sum a^2 from the ring (a lagged
            flat loop, ``_producer_with_sumsq``) and hands each M-tile's partials to the consumers through
            double-buffered shared memory; the consumers run the plain GEMM loop. The same fp32 terms summed in
            another order. Needs CLUSTER_SIZE > 1 and NUM_CONSUMERS = 2; excludes STATS_ELEMENTWISE, MULTICAST_A,
            PINGPONG, EPILOGUE_OVERLAP, STORE_DIRECT. The producer gets the registers the consumers leave
            (88 at CONSUMER_REGS = 208). Measured far slower (docs/results/lazy_prenorm.md). ``matmul_cluster``
            ignores it; the other ops raise ValueError when called. See "STATS_IN_PRODUCER" in the module docstring.
        LN_SHIFT_SMEM: Lazy Pre-Norm LayerNorm only: each consumer reads its rows' shift ``A[:, 0]`` from the M-tile's
            first A slice in shared memory, at the first K step after its wgmma is issued, instead of loading it from
            global memory before the K loop. The same values, so the same results. Needs CLUSTER_SIZE > 1; excludes
            LN_SHIFT_PREFETCH. Measured slower (docs/results/lazy_prenorm_ln.md, "The shift from shared memory").
            ``matmul_cluster`` ignores it; the other ops raise ValueError when called.

        FILL_IDLE_SMS: ``matmul_rmsnorm`` / ``matmul_layernorm`` with CLUSTER_SIZE 4 or 8: a GPC holds only whole
            clusters, so the persistent grid leaves SMs idle (12 of the H200's 132 at c4 and c8). With the option
            this kernel takes the first rows and triggers ``griddepcontrol.launch_dependents`` at its start, and the
            last rows (``kernels_tlx.lazy_prenorm.fill_rows``: by SM count x FILL_RATE_PCT) go to the kernel of
            ``fill_config()`` -- half the cluster size with two tiles per CTA, which covers the same row -- launched
            as a programmatic dependent grid (``launch_pdl``) on as many clusters as the idle SMs hold. Both write
            row blocks of the same y / mean / rstd. Needs PERSISTENT and TILES_PER_CTA = 1. ``matmul_cluster``
            ignores it; the Lazy Pre-Norm ops raise ValueError (their filler is ``kernels_tlx.lazy_prenorm``'s
            ``TilingConfig.FILL_IDLE_SMS``). See "FILL_IDLE_SMS" in the module docstring.
        FILL_RATE_PCT: with FILL_IDLE_SMS, the filler's throughput per SM in % of this kernel's (1 .. 400): the row
            split. A FILL_RECOMPUTE filler runs the GEMM twice: about 50.
        FILL_RECOMPUTE: with FILL_IDLE_SMS, the filler is the RECOMPUTE_TILES kernel on 2-CTA clusters with
            CLUSTER_SIZE / 2 tiles per CTA (the same columns per cluster: c8 -> c2 x 4 tiles) instead of the
            half-size two-tile cluster (whose 4-CTA clusters do not fit the SMs a c8 grid leaves idle on the H200).
        RECOMPUTE_TILES: ``matmul_rmsnorm`` / ``matmul_layernorm`` only, its own kernel (``_recompute_norm_kernel``):
            each CTA (CLUSTER_SIZE 1 or 2) computes its TILES_PER_CTA (2 or 4) column tiles twice per M-tile, a
            statistics pass that keeps only the per-row partials and, after the one DSMEM exchange, an output pass
            that normalizes and stores them. No parked tile: the shared memory of one tile per CTA, at twice the
            GEMM's work (c2 x 4 tiles covers N = 2048). LayerNorm's statistics are LN_PACKED's (required).
            Excludes every other option. See "RECOMPUTE_TILES" in the module docstring.
        LN_ONEPASS: LayerNorm with LN_PACKED only (RMSNorm unchanged): each CTA tile's (sum, centred sum of squares)
            comes from one pass over the fp32 accumulator, ``M2 = sum x^2 - (sum x)^2 / n`` (clamped at 0), an
            add and an FMA per element instead of the centred form's three operations behind a row reduction;
            the merge over tiles and CTAs stays Chan's. The price is cancellation within a tile: M2 loses about
            ``2^-24 * mean^2 / var`` relative accuracy (TensorRT-LLM's LayerNorm kernels offer the same trade as
            ``USE_DIFF_OF_SQUARES``): rows near ``|mean| = 120 std`` read rstd errors of 1.1-1.4e-3 on the GPU,
            over the self-check's 1e-3 (y stays within tolerance). Passed on to the FILL_IDLE_SMS filler. With an
            affine the two-tile kernel spills more (3.4 KB stored + 3.4 KB loaded at c2, N = 600, against 2.3 +
            2.4 KB centred). An ablation of the centring pass's cost (+3 points at N = 1024, H100), not a default.
            See "LN_ONEPASS" in the module docstring.

    Construction validates the N-independent constraints; ``block_n(N)`` the N-dependent ones (row coverage,
    registers, shared memory; with FILL_IDLE_SMS also the filler's). Both raise ValueError naming the violated
    constraint.
    """

    BLOCK_M: int = 128
    BLOCK_N: int | None = None
    BLOCK_K: int = 64
    CLUSTER_SIZE: int = 4
    NUM_STAGES: int = 3
    NUM_CONSUMERS: int = 2
    PERSISTENT: bool = True
    MULTICAST_A: bool = False
    EPILOGUE_SUBTILE: bool = False
    CONSUMER_REGS: int = 232
    LN_PACKED: bool = False
    STORE_DEFER: bool = False
    PINGPONG: bool = False
    TILES_PER_CTA: int = 1
    EPILOGUE_OVERLAP: bool = False
    STORE_DIRECT: bool = False
    STATS_ELEMENTWISE: bool = False
    STATS_UNPACK_ASM: bool = False
    LN_RANK1_MMA: bool = False
    LN_SHIFT_PREFETCH: bool = False
    LN_SHIFT_SMEM: bool = False
    STATS_IN_PRODUCER: bool = False
    FILL_IDLE_SMS: bool = False
    FILL_RATE_PCT: int = 100
    FILL_RECOMPUTE: bool = False
    RECOMPUTE_TILES: bool = False
    LN_ONEPASS: bool = False

    def __post_init__(self):
        errors = self.field_type_errors(optional=("BLOCK_N",))
        if errors:
            raise ValueError("invalid TilingConfig: " + "; ".join(errors))
        for name in ("BLOCK_M", "BLOCK_K", "NUM_CONSUMERS") + (("BLOCK_N",) if self.BLOCK_N is not None else ()):
            if not _is_pow2(getattr(self, name)):
                errors.append(f"{name}={getattr(self, name)} must be a power of 2")
        if self.CLUSTER_SIZE not in CLUSTER_SIZES:
            errors.append(f"CLUSTER_SIZE={self.CLUSTER_SIZE} is not supported: must be one of {CLUSTER_SIZES} "
                          "(8 is Hopper's portable cluster limit, 16 the non-portable one)")
        if self.NUM_CONSUMERS not in (1, 2):
            errors.append(f"NUM_CONSUMERS={self.NUM_CONSUMERS} must be 1 or 2")
        elif self.BLOCK_M != 64 * self.NUM_CONSUMERS:
            errors.append(f"BLOCK_M // NUM_CONSUMERS = {self.BLOCK_M}//{self.NUM_CONSUMERS} must be 64 "
                          "(one m64 wgmma row slice per consumer warpgroup)")
        if self.BLOCK_N is not None and not MIN_BLOCK_N <= self.BLOCK_N <= MAX_BLOCK_N:
            errors.append(f"BLOCK_N={self.BLOCK_N} must be in [{MIN_BLOCK_N}, {MAX_BLOCK_N}] "
                          "(wgmma N, TMA box and register-accumulator limits)")
        errors += _lp.ws_stage_errors(self.BLOCK_K, self.NUM_STAGES)
        errors += _lp.consumer_register_errors(self.NUM_CONSUMERS, self.CONSUMER_REGS)
        if self.MULTICAST_A:
            if self.CLUSTER_SIZE == 1:
                errors.append("MULTICAST_A=True needs CLUSTER_SIZE >= 2 (there is no peer to share A with)")
            elif self.CLUSTER_SIZE > 8:
                errors.append(f"MULTICAST_A=True needs CLUSTER_SIZE <= 8: each CTA loads 64 / CLUSTER_SIZE rows of "
                              f"every A box, at least 8 (one 128-byte swizzle atom), got CLUSTER_SIZE="
                              f"{self.CLUSTER_SIZE}")
        if self.STORE_DEFER and self.EPILOGUE_SUBTILE:
            errors.append("STORE_DEFER=True with EPILOGUE_SUBTILE=True is not implemented (the deferred store wait "
                          "needs the whole [64, BLOCK_N] staging buffer per consumer)")
        if self.PINGPONG:
            if self.NUM_CONSUMERS != 2:
                errors.append(f"PINGPONG=True needs NUM_CONSUMERS=2 (two warpgroups taking turns), got "
                              f"{self.NUM_CONSUMERS}")
            if self.MULTICAST_A:
                errors.append("PINGPONG=True with MULTICAST_A=True is not implemented")
        if not self.RECOMPUTE_TILES:  # (its tiles are not parked: its own limits, below)
            errors += _lp.tiles_per_cta_errors(self.TILES_PER_CTA, self.CLUSTER_SIZE, PINGPONG=self.PINGPONG,
                                               MULTICAST_A=self.MULTICAST_A, EPILOGUE_SUBTILE=self.EPILOGUE_SUBTILE,
                                               STORE_DEFER=self.STORE_DEFER)
        if self.EPILOGUE_OVERLAP:
            errors += self._conflicts("EPILOGUE_OVERLAP", {
                "PINGPONG": "not implemented (the deferred epilogue rides on the cooperative mainloop)",
                "MULTICAST_A": "not implemented",
                "EPILOGUE_SUBTILE": "not implemented (the parked tiles are stored whole)",
                "STORE_DEFER": "implied (the parked buffers are the staging buffers): leave it False"})
            if not self.LN_PACKED:
                errors.append("EPILOGUE_OVERLAP=True needs LN_PACKED=True (the deferred LayerNorm statistics are the "
                              "packed one-word exchange; RMSNorm is unaffected by LN_PACKED)")
        if self.STORE_DIRECT:
            errors += self._conflicts("STORE_DIRECT", {
                "PINGPONG": "not implemented", "MULTICAST_A": "not implemented (not GPU-checked)",
                "EPILOGUE_SUBTILE": "not implemented (no staging tile to split)",
                "STORE_DEFER": "not applicable (there is no staging buffer to defer)",
                "EPILOGUE_OVERLAP": "not implemented (the deferred epilogue stores its parked tiles by TMA)"})
        errors += _lp.stats_option_errors(self.STATS_ELEMENTWISE, self.STATS_UNPACK_ASM, self.STATS_IN_PRODUCER)
        if self.STATS_IN_PRODUCER:
            errors += self._conflicts("STATS_IN_PRODUCER", {
                "MULTICAST_A": "not implemented", "PINGPONG": "not implemented (Lazy Pre-Norm is cooperative)",
                "EPILOGUE_OVERLAP": "not implemented", "STORE_DIRECT": "not implemented"})
            if self.CLUSTER_SIZE == 1 or self.NUM_CONSUMERS != 2:
                errors.append("STATS_IN_PRODUCER=True needs CLUSTER_SIZE > 1 and NUM_CONSUMERS = 2 (an option of "
                              "Lazy RMSNorm's cluster form; the producer reads both consumers' A slices)")
        errors += _lp.ln_rank1_mma_errors(self.LN_RANK1_MMA, self.STORE_DEFER)
        for flag in ("LN_RANK1_MMA", "LN_SHIFT_PREFETCH", "LN_SHIFT_SMEM"):
            if getattr(self, flag) and self.CLUSTER_SIZE == 1:
                errors.append(f"{flag}=True needs CLUSTER_SIZE > 1 (an option of Lazy LayerNorm's cluster form; "
                              "CLUSTER_SIZE = 1 is not GPU-checked)")
        errors += _lp.ln_shift_errors(self.LN_SHIFT_SMEM, self.LN_SHIFT_PREFETCH)
        if self.FILL_IDLE_SMS and (self.CLUSTER_SIZE not in (4, 8) or not self.PERSISTENT or self.TILES_PER_CTA != 1):
            errors.append("FILL_IDLE_SMS=True needs CLUSTER_SIZE 4 or 8, PERSISTENT=True and TILES_PER_CTA=1 (the "
                          "filler is the half-size cluster with two tiles per CTA, on the SMs the persistent grid "
                          f"leaves idle), got CLUSTER_SIZE={self.CLUSTER_SIZE}, PERSISTENT={self.PERSISTENT}, "
                          f"TILES_PER_CTA={self.TILES_PER_CTA}")
        if self.FILL_RATE_PCT != 100 and not self.FILL_IDLE_SMS:
            errors.append(f"FILL_RATE_PCT={self.FILL_RATE_PCT} applies with FILL_IDLE_SMS=True only")
        if not 1 <= self.FILL_RATE_PCT <= 400:
            errors.append(f"FILL_RATE_PCT={self.FILL_RATE_PCT} must be in 1 .. 400 (a per-SM rate in %)")
        if self.FILL_RECOMPUTE and not self.FILL_IDLE_SMS:
            errors.append("FILL_RECOMPUTE=True applies with FILL_IDLE_SMS=True only")
        if self.RECOMPUTE_TILES:
            if self.TILES_PER_CTA not in (2, 4) or self.CLUSTER_SIZE > 2:
                errors.append(f"RECOMPUTE_TILES=True needs TILES_PER_CTA in (2, 4) and CLUSTER_SIZE in (1, 2) (the "
                              f"sizes built and tested: up to N = 2048 on 2-CTA clusters), got TILES_PER_CTA="
                              f"{self.TILES_PER_CTA}, CLUSTER_SIZE={self.CLUSTER_SIZE}")
            if not self.LN_PACKED:
                errors.append("RECOMPUTE_TILES=True needs LN_PACKED=True (its LayerNorm exchange is the packed word)")
            others = [f for f in ("MULTICAST_A", "EPILOGUE_SUBTILE", "STORE_DEFER", "PINGPONG", "EPILOGUE_OVERLAP",
                                  "STORE_DIRECT", "STATS_ELEMENTWISE", "STATS_UNPACK_ASM", "LN_RANK1_MMA",
                                  "LN_SHIFT_PREFETCH", "LN_SHIFT_SMEM", "STATS_IN_PRODUCER", "FILL_IDLE_SMS")
                      if getattr(self, f)]
            if others:
                errors.append(f"RECOMPUTE_TILES=True excludes {', '.join(others)} (a kernel of its own with none of "
                              "these options)")
        if self.LN_ONEPASS and not self.LN_PACKED:
            errors.append("LN_ONEPASS=True needs LN_PACKED=True (the one-pass partials travel as the packed word)")
        if self.LN_ONEPASS and (self.EPILOGUE_OVERLAP or self.PINGPONG or self.STORE_DIRECT):
            errors.append("LN_ONEPASS=True is built for the cooperative STORE_DEFER / two-tile / recompute epilogues "
                          "only, not with EPILOGUE_OVERLAP, PINGPONG or STORE_DIRECT (not GPU-checked)")
        if not errors and self.BLOCK_N is not None:
            errors += self._n_independent_fit(self.BLOCK_N)
        if errors:
            raise ValueError("invalid TilingConfig: " + "; ".join(errors))

    def _conflicts(self, flag: str, why: dict[str, str]) -> list[str]:
        """"<flag>=True with <field>=True: <reason>" for each boolean field of ``why`` that is set: the options that
        ``flag`` cannot be combined with, each with its reason."""
        return [f"{flag}=True with {k}=True: {v}" for k, v in why.items() if getattr(self, k)]

    # --- derived quantities -----------------------------------------------------------------------------
    def fill_config(self) -> "TilingConfig":
        """FILL_IDLE_SMS: the filler's config -- CLUSTER_SIZE / 2 with TILES_PER_CTA = 2 (the same columns per
        cluster, so the same BLOCK_N), this config's ring, registers and LN_PACKED (c4_defer_lnpack_fill ->
        c2_t2_lnpack); with FILL_RECOMPUTE the RECOMPUTE_TILES kernel on 2-CTA clusters with CLUSTER_SIZE / 2 tiles
        each (c8 -> c2_t4_rc_lnpack). ValueError without FILL_IDLE_SMS."""
        if not self.FILL_IDLE_SMS:
            raise ValueError("fill_config() needs FILL_IDLE_SMS=True (a config with a filler)")
        if self.FILL_RECOMPUTE:  # 2-CTA clusters, C / 2 tiles each, computed twice (c8 -> c2 x 4 tiles)
            return TilingConfig(BLOCK_M=self.BLOCK_M, BLOCK_N=self.BLOCK_N, BLOCK_K=self.BLOCK_K, CLUSTER_SIZE=2,
                                NUM_STAGES=self.NUM_STAGES, NUM_CONSUMERS=self.NUM_CONSUMERS,
                                CONSUMER_REGS=self.CONSUMER_REGS, LN_PACKED=True,
                                TILES_PER_CTA=self.CLUSTER_SIZE // 2, RECOMPUTE_TILES=True,
                                LN_ONEPASS=self.LN_ONEPASS)
        return TilingConfig(BLOCK_M=self.BLOCK_M, BLOCK_N=self.BLOCK_N, BLOCK_K=self.BLOCK_K,
                            CLUSTER_SIZE=self.CLUSTER_SIZE // 2, NUM_STAGES=self.NUM_STAGES,
                            NUM_CONSUMERS=self.NUM_CONSUMERS, CONSUMER_REGS=self.CONSUMER_REGS,
                            LN_PACKED=self.LN_PACKED, TILES_PER_CTA=2, LN_ONEPASS=self.LN_ONEPASS)

    @property
    def rows_per_consumer(self) -> int:
        return self.BLOCK_M // self.NUM_CONSUMERS

    @property
    def num_warps_total(self) -> int:
        return _PRODUCER_WARPS + 4 * self.NUM_CONSUMERS

    def acc_regs_per_thread(self, block_n: int) -> int:
        """fp32 accumulator registers per consumer thread: 64 * block_n / 128."""
        return self.rows_per_consumer * block_n // 128

    @property
    def a_stage_rows(self) -> int:
        """Rows of A per ring stage: the whole M-tile (both consumers' boxes), or one consumer's 64 with PINGPONG."""
        return self.rows_per_consumer if self.PINGPONG else self.BLOCK_M

    def smem_bytes(self, block_n: int, nstat: int = 2, itemsize: int = 2) -> int:
        """Estimated shared memory per CTA: the (A, B) ring (with PINGPONG one 64-row A box per stage), the epilogue
        staging tile (half with EPILOGUE_SUBTILE; with STORE_DEFER the explicit per-consumer buffers, same
        size; with EPILOGUE_OVERLAP one per consumer and tile; with STORE_DIRECT none, 1 KB of scratch), the DSMEM exchange slots (2 buffers x consumers x
        ``nstat`` x CLUSTER_SIZE x 64 fp32; LayerNorm has 2 statistics), mbarriers and 1 KB of slack. Checked
        against ``metadata.shared`` in tests."""
        ring = self.NUM_STAGES * (self.a_stage_rows * self.BLOCK_K + self.BLOCK_K * block_n) * itemsize
        epilogue = self.BLOCK_M * (block_n // (2 if self.EPILOGUE_SUBTILE else 1)) * itemsize
        if self.RECOMPUTE_TILES:
            nstat = 2  # packed 64-bit exchange words for either norm
            epilogue += 1024  # scratch of the whole-tile affine's layout conversion
        if self.STORE_DIRECT:
            # stored from registers (TILES_PER_CTA = 2 keeps the parked buffer); 1 KB for the compiler's small
            # scratch (the affine vectors' layout conversion)
            epilogue = (epilogue if self.TILES_PER_CTA > 1 else 0) + 1024
        if self.EPILOGUE_OVERLAP:
            epilogue *= self.TILES_PER_CTA
        slots = 0
        if self.CLUSTER_SIZE > 1:
            slots = _NUM_DSMEM_BUFFERS * self.NUM_CONSUMERS * nstat * self.CLUSTER_SIZE * self.rows_per_consumer * 4
        bars = 8 * (2 * self.NUM_STAGES + _NUM_DSMEM_BUFFERS * self.NUM_CONSUMERS)
        if self.LN_RANK1_MMA and nstat == 2:  # the [16, block_n] B operand of the rank-1 wgmma and its mbarrier
            epilogue += 16 * block_n * itemsize
            bars += 8
        if self.STATS_IN_PRODUCER and nstat == 1:  # the producer's partials (2 sets x consumers x 64 fp32), 4 barriers
            slots += 2 * self.NUM_CONSUMERS * self.rows_per_consumer * 4
            bars += 32
        return ring + epilogue + slots + bars + 1024

    def _n_independent_fit(self, bn: int) -> list[str]:
        errors = []
        if self.LN_RANK1_MMA and bn < 64:
            errors.append(f"LN_RANK1_MMA=True needs BLOCK_N >= 64 (got {bn}): the wgmma's A operand takes the first "
                          "[64, 64] of the staging buffer")
        if self.acc_regs_per_thread(bn) + 64 > self.CONSUMER_REGS:
            errors.append(f"accumulator registers: 64x{bn} fp32 per warpgroup = {self.acc_regs_per_thread(bn)} "
                          f"regs/thread, needs CONSUMER_REGS >= {self.acc_regs_per_thread(bn) + 64}")
        if self.smem_bytes(bn) > SMEM_LIMIT_BYTES:
            errors.append(f"shared memory: estimated {self.smem_bytes(bn)} B > {SMEM_LIMIT_BYTES} B (227 KB) for "
                          f"NUM_STAGES={self.NUM_STAGES}, tile {self.BLOCK_M}x{bn}x{self.BLOCK_K}, "
                          f"CLUSTER_SIZE={self.CLUSTER_SIZE}, EPILOGUE_SUBTILE={self.EPILOGUE_SUBTILE} "
                          + ("(EPILOGUE_OVERLAP=True with TILES_PER_CTA=2 parks two tiles per consumer: use BLOCK_K=32 "
                             "with NUM_STAGES=3, as c2_t2_ovl_lnpack)"
                             if self.EPILOGUE_OVERLAP and self.TILES_PER_CTA > 1 else
                             "(fewer stages)" if self.STORE_DIRECT else
                             f"(LN_RANK1_MMA=True adds {16 * bn * 2} B: drop it or use NUM_STAGES=2)"
                             if self.LN_RANK1_MMA else
                             "(fewer stages or EPILOGUE_SUBTILE=True)"))
        return errors

    def block_n(self, N: int) -> int:
        """Columns per CTA tile for rows of N elements; ValueError (naming the limit) if this config cannot serve
        N: the cluster must cover the row (``CLUSTER_SIZE * TILES_PER_CTA * BLOCK_N >= N``; at most 8 * 256 = 2048
        columns with portable clusters and one tile per CTA, 4096 with 16 CTAs or two tiles) and every rank must
        own a column."""
        C, T = self.CLUSTER_SIZE, self.TILES_PER_CTA
        if self.BLOCK_N is not None:
            bn = self.BLOCK_N
        else:
            bn = max(MIN_BLOCK_N, triton.next_power_of_2(triton.cdiv(N, C * T)))
        if bn > MAX_BLOCK_N or C * T * bn < N:
            bn_c = min(bn, MAX_BLOCK_N)
            span = f"CLUSTER_SIZE * BLOCK_N = {C} * {bn_c}" if T == 1 else \
                f"CLUSTER_SIZE * TILES_PER_CTA * BLOCK_N = {C} * {T} * {bn_c}"
            raise ValueError(
                f"N={N} is too wide for this config: the cluster covers {span} = {C * T * bn_c} columns (BLOCK_N <= "
                f"{MAX_BLOCK_N}; the limit is N <= {8 * MAX_BLOCK_N} with portable clusters of 8 and N <= "
                f"{16 * MAX_BLOCK_N} with 16 or with TILES_PER_CTA=2){_wider_hint(C, T, N)}")
        if triton.cdiv(N, T * bn) != C:
            used = triton.cdiv(N, T * bn)
            per = "BLOCK_N" if T == 1 else "TILES_PER_CTA * BLOCK_N"
            fit = max(c for c in CLUSTER_SIZES if c <= used)  # the largest valid cluster size the row fills
            fix = f"use CLUSTER_SIZE={fit} or a smaller BLOCK_N"
            raise ValueError(
                f"N={N} with CLUSTER_SIZE={C}, BLOCK_N={bn}{'' if T == 1 else f', TILES_PER_CTA={T}'}: only "
                f"cdiv(N, {per}) = {used} ranks own columns, ranks {used}..{C - 1} would idle: {fix}")
        errors = self._n_independent_fit(bn)
        if errors:
            raise ValueError(f"invalid TilingConfig for N={N}: " + "; ".join(errors))
        if self.FILL_IDLE_SMS:
            try:
                self.fill_config().block_n(N)
            except ValueError as e:
                raise ValueError(f"FILL_IDLE_SMS=True: the filler (fill_config()) cannot serve N={N}: {e}") from None
        return bn

    def supports(self, N: int) -> bool:
        """True if ``block_n(N)`` succeeds."""
        try:
            self.block_n(N)
            return True
        except ValueError:
            return False


DEFAULT_CONFIG = TilingConfig()

# Proposed H200 tiling list (configs/tiling/multi_cta_h200.yaml mirrors it). With BLOCK_N = None each config
# serves every N with cdiv(N, next_pow2(cdiv(N, C))) == C: c2 -> N in (256, 512], c4 -> (512, 1024] (BN 256) and
# (256, 512] (BN 128), c8 -> (1024, 2048] / (512, 1024] / (256, 512], c16 -> (2048, 4096] / ... .
SHIPPED_CONFIGS: dict[str, TilingConfig] = {
    "c1": TilingConfig(CLUSTER_SIZE=1),  # no cluster: N <= 256 (the naive full-N fusion)
    "c2": TilingConfig(CLUSTER_SIZE=2),
    "c4": DEFAULT_CONFIG,
    "c8": TilingConfig(CLUSTER_SIZE=8),
    "c8_mcast": TilingConfig(CLUSTER_SIZE=8, MULTICAST_A=True),
    "c16_subtile": TilingConfig(CLUSTER_SIZE=16, EPILOGUE_SUBTILE=True),  # N = 4096: the non-portable limit
    # LN_PACKED: the leaner LayerNorm epilogue (packed one-word exchange, unmasked full-row statistics, FMA
    # output); RMSNorm runs the same kernel as the config without it. c4: N = 1024, c8: N = 2048.
    "c4_lnpack": TilingConfig(CLUSTER_SIZE=4, LN_PACKED=True),
    "c8_lnpack": TilingConfig(CLUSTER_SIZE=8, LN_PACKED=True),
    # STORE_DEFER: the output store drains during the next tile's mainloop (its wait moved to the next epilogue);
    # PINGPONG (+ STORE_DEFER): each consumer warpgroup owns its own 64-row tiles, one's epilogue + exchange runs
    # under the other's wgmma. The RMSNorm kernels of the *_lnpack configs are those without LN_PACKED.
    "c4_defer_lnpack": TilingConfig(CLUSTER_SIZE=4, LN_PACKED=True, STORE_DEFER=True),
    "c8_defer_lnpack": TilingConfig(CLUSTER_SIZE=8, LN_PACKED=True, STORE_DEFER=True),
    "c4_pp_lnpack": TilingConfig(CLUSTER_SIZE=4, LN_PACKED=True, STORE_DEFER=True, PINGPONG=True),
    "c8_pp_lnpack": TilingConfig(CLUSTER_SIZE=8, LN_PACKED=True, STORE_DEFER=True, PINGPONG=True),
    # the ping-pong schedule at the other cluster sizes (self-check coverage; c16: its smaller ring leaves room
    # for the whole staging tile, so no EPILOGUE_SUBTILE)
    "c1_pp": TilingConfig(CLUSTER_SIZE=1, STORE_DEFER=True, PINGPONG=True),
    "c2_pp": TilingConfig(CLUSTER_SIZE=2, STORE_DEFER=True, PINGPONG=True),
    "c16_pp": TilingConfig(CLUSTER_SIZE=16, STORE_DEFER=True, PINGPONG=True),
    # TILES_PER_CTA=2: two 256-wide column tiles per CTA, the first parked in shared memory, so a cluster half
    # the size covers the row: c2 at N = 1024, c4 at 2048, c8 at 4096 (portable); c1 (no cluster, N <= 512) for
    # the self-check. RMSNorm runs the same kernels without LN_PACKED.
    "c1_t2": TilingConfig(CLUSTER_SIZE=1, TILES_PER_CTA=2),
    "c2_t2_lnpack": TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=2, LN_PACKED=True),
    "c4_t2_lnpack": TilingConfig(CLUSTER_SIZE=4, TILES_PER_CTA=2, LN_PACKED=True),
    "c8_t2_lnpack": TilingConfig(CLUSTER_SIZE=8, TILES_PER_CTA=2, LN_PACKED=True),
    # EPILOGUE_OVERLAP: the M-tile's normalization, exchange wait and stores run under the next M-tile's first
    # mainloop. One tile per CTA: the STORE_DEFER shared memory (c4: N = 1024, c8: 2048); two tiles: two parked
    # buffers per consumer (128 KB) leave room for a 3-stage ring of BLOCK_K = 32 only (c2: N = 1024); c1 (no
    # cluster) for the self-check. RMSNorm runs the same kernels without LN_PACKED. Measured slower than the
    # kernels without it (docs/results/multi_cta.md, "EPILOGUE_OVERLAP"): kept opt-in, as the record of that result.
    # control: the two-tile kernel on the same BLOCK_K = 32 ring, without the overlap
    "c2_t2_bk32_lnpack": TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=2, BLOCK_K=32, LN_PACKED=True),
    "c1_ovl": TilingConfig(CLUSTER_SIZE=1, LN_PACKED=True, EPILOGUE_OVERLAP=True),
    "c4_ovl_lnpack": TilingConfig(CLUSTER_SIZE=4, LN_PACKED=True, EPILOGUE_OVERLAP=True),
    "c8_ovl_lnpack": TilingConfig(CLUSTER_SIZE=8, LN_PACKED=True, EPILOGUE_OVERLAP=True),
    "c2_t2_ovl_lnpack": TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=2, BLOCK_K=32, LN_PACKED=True,
                                     EPILOGUE_OVERLAP=True),
    # STORE_DIRECT: the output leaves from registers by st.global, no staging tile and no TMA store. One tile per
    # CTA frees the 64 KB staging buffer: room for a 4-stage ring (_s4); two tiles keep the parked buffer (its
    # chunks are stored from the registers they are normalized in). c1: the self-check only. Measured slower than
    # the staged kernels (docs/results/multi_cta.md, "STORE_DIRECT"): kept opt-in, as the record of that result.
    "c1_direct": TilingConfig(CLUSTER_SIZE=1, STORE_DIRECT=True),
    "c4_direct_lnpack": TilingConfig(CLUSTER_SIZE=4, LN_PACKED=True, STORE_DIRECT=True),
    "c4_direct_s4_lnpack": TilingConfig(CLUSTER_SIZE=4, NUM_STAGES=4, LN_PACKED=True, STORE_DIRECT=True),
    "c8_direct_s4_lnpack": TilingConfig(CLUSTER_SIZE=8, NUM_STAGES=4, LN_PACKED=True, STORE_DIRECT=True),
    "c2_t2_direct_lnpack": TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=2, LN_PACKED=True, STORE_DIRECT=True),
    # FILL_IDLE_SMS: the c4 / c8 STORE_DEFER kernels on the first rows, the half-size two-tile cluster kernel
    # (fill_config(): c2_t2_lnpack / c4_t2_lnpack) on the last rows, on the SMs the persistent grid leaves idle,
    # as a programmatic dependent grid; rows split by SM count (100) or at 90 / 80 % of the cluster SM's rate
    "c4_defer_lnpack_fill": TilingConfig(CLUSTER_SIZE=4, LN_PACKED=True, STORE_DEFER=True, FILL_IDLE_SMS=True),
    "c4_defer_lnpack_fill90": TilingConfig(CLUSTER_SIZE=4, LN_PACKED=True, STORE_DEFER=True, FILL_IDLE_SMS=True,
                                           FILL_RATE_PCT=90),
    "c4_defer_lnpack_fill80": TilingConfig(CLUSTER_SIZE=4, LN_PACKED=True, STORE_DEFER=True, FILL_IDLE_SMS=True,
                                           FILL_RATE_PCT=80),
    "c8_defer_lnpack_fill": TilingConfig(CLUSTER_SIZE=8, LN_PACKED=True, STORE_DEFER=True, FILL_IDLE_SMS=True),
    # RECOMPUTE_TILES: each CTA's column tiles computed twice (statistics pass, then output pass), no parked tile:
    # c2 x 4 tiles covers N = 2048 on 2-CTA clusters (c1 / c2 x 2: the self-check's smaller N); and c8 with such a
    # filler (FILL_RECOMPUTE) at 50 / 40 % of a cluster SM's rate (it runs the GEMM twice; rate 50 best at K >= 1024,
    # 60 at K = 512 on an H100, docs/results/multi_cta.md)
    "c1_t2_rc": TilingConfig(CLUSTER_SIZE=1, TILES_PER_CTA=2, LN_PACKED=True, RECOMPUTE_TILES=True),
    "c2_t2_rc_lnpack": TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=2, LN_PACKED=True, RECOMPUTE_TILES=True),
    "c2_t4_rc_lnpack": TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=4, LN_PACKED=True, RECOMPUTE_TILES=True),
    "c8_defer_lnpack_fill_rc50": TilingConfig(CLUSTER_SIZE=8, LN_PACKED=True, STORE_DEFER=True, FILL_IDLE_SMS=True,
                                              FILL_RECOMPUTE=True, FILL_RATE_PCT=50),
    "c8_defer_lnpack_fill_rc40": TilingConfig(CLUSTER_SIZE=8, LN_PACKED=True, STORE_DEFER=True, FILL_IDLE_SMS=True,
                                              FILL_RECOMPUTE=True, FILL_RATE_PCT=40),
    # LN_ONEPASS ("1p"): the LayerNorm partials of each tile from one pass (sum, sum of squares); RMSNorm runs the
    # kernels of the same configs without it. The one-tile, two-tile and recompute kernels and both fillers.
    "c4_defer_lnpack1p": TilingConfig(CLUSTER_SIZE=4, LN_PACKED=True, STORE_DEFER=True, LN_ONEPASS=True),
    "c2_t2_lnpack1p": TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=2, LN_PACKED=True, LN_ONEPASS=True),
    "c2_t4_rc_lnpack1p": TilingConfig(CLUSTER_SIZE=2, TILES_PER_CTA=4, LN_PACKED=True, RECOMPUTE_TILES=True,
                                      LN_ONEPASS=True),
    "c4_defer_lnpack1p_fill": TilingConfig(CLUSTER_SIZE=4, LN_PACKED=True, STORE_DEFER=True, FILL_IDLE_SMS=True,
                                           LN_ONEPASS=True),
    "c8_defer_lnpack1p_fill_rc50": TilingConfig(CLUSTER_SIZE=8, LN_PACKED=True, STORE_DEFER=True, FILL_IDLE_SMS=True,
                                                FILL_RECOMPUTE=True, FILL_RATE_PCT=50, LN_ONEPASS=True),
    # MULTICAST_A on the c4 STORE_DEFER grid with its filler (the filler, a two-tile c2 kernel, loads A itself):
    # each CTA TMA-loads 16 of a box's 64 rows and multicasts them, 25 % less L2 -> shared-memory traffic per stage
    "c4_defer_lnpack_mcast_fill": TilingConfig(CLUSTER_SIZE=4, LN_PACKED=True, STORE_DEFER=True, MULTICAST_A=True,
                                               FILL_IDLE_SMS=True),
}


# ------------------------------------------------------------------------------------------------------------
# Kernel
# ------------------------------------------------------------------------------------------------------------
@triton.jit
def _split_cols(y, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """[ROWS, WIDTH] -> its column halves [ROWS, WIDTH / 2] (lo, hi)."""
    return tl.split(tl.permute(tl.reshape(y, (ROWS, 2, WIDTH // 2)), (0, 2, 1)))


@triton.jit
def _join_cols(lo, hi, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """Inverse of ``_split_cols``."""
    return tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (ROWS, WIDTH))


@triton.jit
def _affine(y, w_ptr, bias_ptr, off, N, live, WIDTH: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """``y * weight[off:off+WIDTH] + bias[...]`` (fp32; columns past N read 0 and are never stored). ``live`` is
    a per-tile scalar that is true whenever the result is stored: in the mask it keeps the compiler from hoisting
    these loop-invariant loads out of the persistent tile loop (their registers would then be live through every
    K loop: ptxas spills)."""
    cols = off + tl.arange(0, WIDTH)
    ok = (cols < N) & live
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        y = y + tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)[None, :]
    return y


@triton.jit
def _affine_half(y, w_ptr, bias_ptr, off, N, live, ROWS: tl.constexpr, WIDTH: tl.constexpr, HAS_W: tl.constexpr,
                 HAS_B: tl.constexpr):
    """``_affine`` of a [ROWS, WIDTH] column half; with both weight and bias, one column quarter at a time, so
    that about 32 registers of affine vectors are live either way (measured: no ptxas spills at BLOCK_N=256)."""
    if HAS_W and HAS_B:
        q0, q1 = _split_cols(y, ROWS, WIDTH)
        q0 = _affine(q0, w_ptr, bias_ptr, off, N, live, WIDTH // 2, HAS_W, HAS_B)
        q1 = _affine(q1, w_ptr, bias_ptr, off + WIDTH // 2, N, live, WIDTH // 2, HAS_W, HAS_B)
        y = _join_cols(q0, q1, ROWS, WIDTH)
    else:
        y = _affine(y, w_ptr, bias_ptr, off, N, live, WIDTH, HAS_W, HAS_B)
    return y


# "lazy_layer": the shifted sums of one A slice (Lazy Pre-Norm LayerNorm's, K tail masked unless EVEN_K)
_ln_tile_stats = _lp._ln_tile_stats


@triton.jit
def _ln_shift(a_ptr, off_cm, M, K, BM_C: tl.constexpr):
    """"lazy_layer": the per-row shift ``A[row, 0]`` of the consumer's A box at row ``off_cm`` (input dtype), [BM_C].
    The box starts at the producer's clamped row ``min(off_cm, M - 1)``; rows past M read 0, as TMA zero-fills."""
    srows = tl.minimum(off_cm, M - 1) + tl.arange(0, BM_C)
    return tl.load(a_ptr + srows.to(tl.int64) * K, mask=srows < M, other=0.0)


# STATS_UNPACK_ASM: bf16 -> fp32 as two integer ops per packed pair (defined with ``_col0``, its other user)
_widen_bf16 = _lp._widen_bf16


@triton.jit
def _lazy_sumsq_step(ss, a_tile, SS_2D: tl.constexpr, UNPACK_ASM: tl.constexpr):
    """"lazy_rms": ``ss`` plus the squares of one shared-memory A slice: elementwise into the [rows, BLOCK_K] tile
    (``SS_2D``: STATS_ELEMENTWISE) or as row sums into the [rows] vector; ``UNPACK_ASM``: widened by
    ``_widen_bf16``."""
    if UNPACK_ASM:
        x = _widen_bf16(tlx.local_load(a_tile))
    else:
        x = tlx.local_load(a_tile).to(tl.float32)
    if SS_2D:
        ss += x * x
    else:
        ss += tl.sum(x * x, axis=1)
    return ss


@triton.jit
def _producer_with_sumsq(a_desc, b_desc, a_bufs, b_bufs, full_bars, empty_bars, ss_bufs, ss_full, ss_empty, M,
                         cluster_id, num_clusters, num_pid_m, k_tiles, rank, off_n, C: tl.constexpr,
                         TILES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         BM_C: tl.constexpr, NUM_STAGES: tl.constexpr, STAGE_BYTES: tl.constexpr,
                         UNPACK_ASM: tl.constexpr):
    """STATS_IN_PRODUCER ("lazy_rms", two consumers): the producer warpgroup's loop, TMA loads *and* this CTA's
    share of the per-row sum a^2 (the consumers then run the plain GEMM loop).

    One flat loop over this CTA's ring steps ``j`` (M-tiles ``cluster_id, cluster_id + num_clusters, ...`` times
    ``k_tiles * TILES`` steps: the consumers' sequence) plus ``LAG = NUM_STAGES - 1`` drain iterations. Iteration
    ``j`` issues the loads of step ``j`` as the plain producer does, then handles step ``js = j - LAG``: if it is one
    of this CTA's statistic steps (``ki % (C * TILES) == rank * TILES + tile``, as the consumers' own), wait for its
    slot, add the row sums of a^2 of both consumers' A slices; in any case release the slot (``empty`` counts
    NUM_CONSUMERS + 1). Deadlock-free as ``kernels_tlx.lazy_prenorm``'s in-loop producer: slot reuse at step ``j``
    needs the release of step ``j - NUM_STAGES``, done at iteration ``j - 1``. After an M-tile's last step its
    partials go to set ``t % 2`` of ``ss_bufs`` (after ``ss_empty``: the consumers have read set ``t - 2``) and
    ``ss_full[t % 2]`` is arrived on."""
    LAG: tl.constexpr = NUM_STAGES - 1
    KT = k_tiles * TILES
    total = tl.cdiv(num_pid_m - cluster_id, num_clusters) * KT
    ss0 = tl.zeros([BM_C], dtype=tl.float32)
    ss1 = tl.zeros([BM_C], dtype=tl.float32)
    for j in range(0, total + LAG):
        if j < total:  # the loads of step j (the plain producer's)
            tj = j // KT
            kt = j - tj * KT
            off_m = (cluster_id + tj * num_clusters) * BLOCK_M
            ki = kt % k_tiles
            s = j % NUM_STAGES
            tlx.barrier_wait(empty_bars[s], ((j // NUM_STAGES) & 1) ^ 1)  # first use of a slot passes at once
            tlx.barrier_expect_bytes(full_bars[s], STAGE_BYTES)
            for c in tl.static_range(2):
                a_row = tl.minimum(off_m + c * BM_C, M - 1)  # clamped, as the plain producer
                tlx.async_descriptor_load(a_desc, a_bufs[c * NUM_STAGES + s], [a_row, ki * BLOCK_K], full_bars[s])
            tlx.async_descriptor_load(b_desc, b_bufs[s], [ki * BLOCK_K, off_n + (kt // k_tiles) * BLOCK_N],
                                      full_bars[s])
        js = j - LAG
        if js >= 0:  # the statistic of step js (TMA zero-fills the K tail: adds 0)
            ts = js // KT
            kts = js - ts * KT
            ss_s = js % NUM_STAGES
            if (kts % k_tiles) % (C * TILES) == rank * TILES + kts // k_tiles:
                tlx.barrier_wait(full_bars[ss_s], (js // NUM_STAGES) & 1)
                ss0 = _lazy_sumsq_step(ss0, a_bufs[ss_s], False, UNPACK_ASM)
                ss1 = _lazy_sumsq_step(ss1, a_bufs[NUM_STAGES + ss_s], False, UNPACK_ASM)
            tlx.barrier_arrive(empty_bars[ss_s])
            if kts == KT - 1:  # the M-tile's partials are complete: hand them to the consumers
                tlx.barrier_wait(ss_empty[ts % 2], ((ts // 2) & 1) ^ 1)  # the first two tiles pass at once
                tlx.local_store(ss_bufs[ts % 2], ss0)
                tlx.local_store(ss_bufs[2 + ts % 2], ss1)
                tlx.barrier_arrive(ss_full[ts % 2])
                ss0 = tl.zeros([BM_C], dtype=tl.float32)
                ss1 = tl.zeros([BM_C], dtype=tl.float32)


@triton.jit
def _ln_tile_terms(a_tile, shift, off_k, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                   UNPACK_ASM: tl.constexpr = False):
    """STATS_ELEMENTWISE, "lazy_layer": ``y = a - shift`` of one shared-memory A slice in fp32, the K padding (TMA
    zero fill) masked to 0 unless ``EVEN_K`` (``_ln_tile_stats`` before its row sums); ``UNPACK_ASM``: widened by
    ``_widen_bf16``."""
    if UNPACK_ASM:
        y = _widen_bf16(tlx.local_load(a_tile)) - shift[:, None]
    else:
        y = tlx.local_load(a_tile).to(tl.float32) - shift[:, None]
    if not EVEN_K:
        y = tl.where(((off_k + tl.arange(0, BLOCK_K)) < K)[None, :], y, 0.0)
    return y


@triton.jit
def _lazy_ln_cols(acc, rstd, rm, colsum_ptr, betab_ptr, off, N, live, WIDTH: tl.constexpr):
    """"lazy_layer" epilogue of one [rows, WIDTH] column chunk at column ``off``: ``acc * rstd - rm * colsum +
    beta_b`` in fp32 (``rm = rstd * mean``; the fp32 colsum / beta_b of columns past N read 0 and are never
    stored). ``live`` as in ``_affine`` (keeps the vector loads inside the persistent tile loop)."""
    cols = off + tl.arange(0, WIDTH)
    ok = (cols < N) & live
    cs = tl.load(colsum_ptr + cols, mask=ok, other=0.0)
    bb = tl.load(betab_ptr + cols, mask=ok, other=0.0)
    return acc * rstd[:, None] - rm[:, None] * cs[None, :] + bb[None, :]


@triton.jit
def _lazy_ln_half(acc, rstd, rm, colsum_ptr, betab_ptr, off, N, live, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """``_lazy_ln_cols`` of a [ROWS, WIDTH] column half, one column quarter at a time (two fp32 vectors per
    column, as ``_affine_half`` with weight and bias)."""
    q0, q1 = _split_cols(acc, ROWS, WIDTH)
    q0 = _lazy_ln_cols(q0, rstd, rm, colsum_ptr, betab_ptr, off, N, live, WIDTH // 2)
    q1 = _lazy_ln_cols(q1, rstd, rm, colsum_ptr, betab_ptr, off + WIDTH // 2, N, live, WIDTH // 2)
    return _join_cols(q0, q1, ROWS, WIDTH)


@triton.jit
def _pack_f32x2(lo, hi):
    """Two fp32 [R] -> one int64 [R] (``lo`` in the low word): the LN_PACKED exchange word."""
    lo_u = lo.to(tl.uint32, bitcast=True).to(tl.uint64)
    hi_u = hi.to(tl.uint32, bitcast=True).to(tl.uint64)
    return (lo_u | (hi_u << 32)).to(tl.int64, bitcast=True)


@triton.jit
def _unpack_f32x2(v):
    """Inverse of ``_pack_f32x2``: int64 [R] -> (lo, hi) fp32 [R]."""
    u = v.to(tl.uint64, bitcast=True)
    return u.to(tl.uint32).to(tl.float32, bitcast=True), (u >> 32).to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _ln_partials_full(acc, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """LN_PACKED partials of a [ROWS, WIDTH] fp32 tile whose columns are all valid (the row fills the cluster):
    ``(sum, sum of (x - sum / WIDTH)^2)`` per row, unmasked (no per-column compare and select), ``1 / WIDTH``
    exact (WIDTH a power of 2). (Splitting the sums into column halves for more independent chains makes the
    compiler move the whole epilogue to another layout, with shared-memory conversions: not done.)"""
    p0 = tl.sum(acc, axis=1)
    d = acc - (p0 * (1.0 / WIDTH))[:, None]
    p1 = tl.sum(d * d, axis=1)
    return p0, p1


@triton.jit
def _ln_partials_onepass(acc, n, WIDTH: tl.constexpr, EVEN: tl.constexpr):
    """LN_ONEPASS partials of a [ROWS, WIDTH] fp32 tile with ``n`` valid columns (0 allowed: then (0, 0)):
    ``(sum, max(sum x^2 - sum^2 / n, 0))`` from one pass over the accumulator (an add and an FMA per element, no
    mask: the accumulator is zero past N, TMA zero-fills B there), against three operations of the centred
    two-pass form, whose second pass waits for the first's row reduction. The centred sum of squares loses about
    ``2^-24 * mean^2 / var`` relative accuracy per tile (``TilingConfig.LN_ONEPASS``); the merge over tiles and
    CTAs stays Chan's."""
    s1 = tl.sum(acc, axis=1)
    s2 = tl.sum(acc * acc, axis=1)
    if EVEN:
        m2 = s2 - s1 * s1 * (1.0 / WIDTH)
    else:
        m2 = s2 - s1 * s1 / tl.maximum(n, 1).to(tl.float32)
    return s1, tl.maximum(m2, 0.0)


@triton.jit
def _ln_partials(acc, off, N, n, ROWS: tl.constexpr, WIDTH: tl.constexpr, EVEN: tl.constexpr,
                 ONEPASS: tl.constexpr = False):
    """LayerNorm partials of one [ROWS, WIDTH] fp32 tile at column ``off`` with ``n`` valid columns (0 allowed:
    then (0, 0)): ``(sum, sum over valid columns of (x - sum / n)^2)``; EVEN (every column valid, n == WIDTH, a
    power of 2): unmasked, ``1 / WIDTH`` exact; ONEPASS: ``_ln_partials_onepass``. TILES_PER_CTA == 2 and
    RECOMPUTE_TILES (the one-tile kernel keeps its inline forms, unchanged builds)."""
    if ONEPASS:
        return _ln_partials_onepass(acc, n, WIDTH, EVEN)
    if EVEN:
        return _ln_partials_full(acc, ROWS, WIDTH)
    p0 = tl.sum(acc, axis=1)
    ok = (off + tl.arange(0, WIDTH)) < N
    d = tl.where(ok[None, :], acc - (p0 / tl.maximum(n, 1))[:, None], 0.0)
    return p0, tl.sum(d * d, axis=1)


@triton.jit
def _chan_merge(s0, m0, n0, s1, m1, n1, WIDTH: tl.constexpr, EVEN: tl.constexpr):
    """Chan's merge of two column tiles' (sum, centred sum of squares) with n0 >= 1 and n1 >= 0 valid columns:
    ``(s0 + s1, m0 + m1 + n0 (s0/n0 - mean)^2 + n1 (s1/n1 - mean)^2)``, mean = (s0 + s1) / (n0 + n1) (a tile
    with n1 = 0 adds exactly 0: its sums are 0 and its weight is 0). EVEN: n0 = n1 = WIDTH, divisions exact."""
    if EVEN:
        a0 = s0 * (1.0 / WIDTH)
        a1 = s1 * (1.0 / WIDTH)
        mean = (s0 + s1) * (0.5 / WIDTH)
        d0 = a0 - mean
        d1 = a1 - mean
        return s0 + s1, m0 + m1 + WIDTH * (d0 * d0 + d1 * d1)
    f0 = n0.to(tl.float32)
    f1 = n1.to(tl.float32)
    mean = (s0 + s1) / (f0 + f1)
    d0 = s0 / f0 - mean
    d1 = s1 / tl.maximum(f1, 1.0) - mean
    return s0 + s1, m0 + m1 + f0 * d0 * d0 + f1 * d1 * d1


@triton.jit
def _packed_combine(slots, base, N, eps, C: tl.constexpr, W: tl.constexpr, BM_C: tl.constexpr, EVEN_N: tl.constexpr):
    """LN_PACKED: the rank-order Chan merge of the C packed (sum, M2) words in ``slots[base + r]`` (rank r owns
    ``min(N - r W, W)`` columns; EVEN_N: every rank W, a power of 2, so the divisions are exact). Returns
    ``(mean, rstd)`` fp32 [BM_C]; every CTA adds the same values in the same order (bit-identical statistics)."""
    total = tl.zeros([BM_C], dtype=tl.float32)
    for r in tl.static_range(C):
        q0, q1 = _unpack_f32x2(tlx.local_load(slots[base + r]))
        total += q0
    if EVEN_N:
        mean = total * (1.0 / (C * W))  # N == C * W (powers of 2: exact)
    else:
        mean = total / N
    m2 = tl.zeros([BM_C], dtype=tl.float32)
    for r in tl.static_range(C):
        q0, q1 = _unpack_f32x2(tlx.local_load(slots[base + r]))
        if EVEN_N:
            dm = q0 * (1.0 / W) - mean
            m2 += q1 + W * dm * dm
        else:
            n_r = tl.minimum(N - r * W, W).to(tl.float32)
            dm = q0 / n_r - mean
            m2 += q1 + n_r * dm * dm
    return mean, tl.math.rsqrt(m2 / N + eps)


@triton.jit
def _exchange_send(slots, bar, p0, p1, base, rank, C: tl.constexpr, RECV_BYTES: tl.constexpr, PACKED: tl.constexpr):
    """Arm this M-tile's exchange barrier and push this CTA's per-row partials (RMSNorm: sum x^2; PACKED: the
    (sum, M2) word) into its own slot and the same slot of every peer, without waiting: EPILOGUE_OVERLAP defers
    the wait (``_ovl_stats``), RECOMPUTE_TILES waits at once. Same slots, bytes and WAR argument as the immediate
    exchange (module docstring)."""
    tlx.barrier_expect_bytes(bar, RECV_BYTES)
    if PACKED:
        own = _pack_f32x2(p0, p1)
    else:
        own = p0
    tlx.local_store(slots[base + rank], own)
    for p in tl.static_range(C):
        if p != rank:
            tlx.async_remote_shmem_store(dst=slots[base + rank], src=own, remote_cta_rank=p, barrier=bar)


@triton.jit
def _ovl_stats(slots, recv_bars, mean, rstd, t, cid: tl.constexpr, row0, mean_ptr, rstd_ptr, rank, M, N, eps,
               C: tl.constexpr, NUM_CONSUMERS: tl.constexpr, W: tl.constexpr, BM_C: tl.constexpr,
               RMS: tl.constexpr, EVEN_N: tl.constexpr, EXCHANGE: tl.constexpr):
    """EPILOGUE_OVERLAP, first deferred step for M-tile ``t`` (rows ``row0 ...``): wait for the peers' partials
    and combine all C in rank order (RMSNorm: rstd; LayerNorm: Chan's merge of the packed words), as the
    immediate exchange does; without a cluster ``mean`` / ``rstd`` were computed at the park. Rank 0 writes
    ``mean`` / ``rstd`` (rows < M). Returns ``(mean, rstd)`` fp32 [BM_C] (RMSNorm: mean unused)."""
    if EXCHANGE:
        buf = t % 2
        base = (buf * NUM_CONSUMERS + cid) * C
        tlx.barrier_wait(recv_bars[buf * NUM_CONSUMERS + cid], (t // 2) & 1)
        if RMS:
            total = tl.zeros([BM_C], dtype=tl.float32)
            for r in tl.static_range(C):
                total += tlx.local_load(slots[base + r])
            rstd = tl.math.rsqrt(total / N + eps)
            mean = rstd
        else:
            mean, rstd = _packed_combine(slots, base, N, eps, C, W, BM_C, EVEN_N)
    rows = row0 + tl.arange(0, BM_C)
    stat_ok = (rows < M) & (rank == 0)
    tl.store(rstd_ptr + rows, rstd, mask=stat_ok)
    if not RMS:
        tl.store(mean_ptr + rows, mean, mask=stat_ok)
    return mean, rstd


@triton.jit
def _ovl_chunk(buf, c_desc, w_ptr, bias_ptr, mean, rstd, row0, col0, M, N, q: tl.constexpr, NCH: tl.constexpr,
               BM_C: tl.constexpr, CHUNK: tl.constexpr, RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """EPILOGUE_OVERLAP, one deferred step: normalize column chunk ``q`` (of ``NCH``) of a parked tile in place
    (output dtype in, fp32 math, output dtype out), affine; after its last chunk, TMA-store the tile at
    ``[row0, col0]`` (rows past M clipped; a tile wholly past N or M is not stored)."""
    part = tlx.local_slice(buf, [0, q * CHUNK], [BM_C, CHUNK])
    x = tlx.local_load(part).to(tl.float32)
    if RMS:
        x = x * rstd[:, None]
    else:
        x = x * rstd[:, None] - (mean * rstd)[:, None]
    if HAS_W or HAS_B:
        x = _affine(x, w_ptr, bias_ptr, col0 + q * CHUNK, N, row0 < M, CHUNK, HAS_W, HAS_B)
    tlx.local_store(part, x.to(tlx.dtype_of(c_desc)))
    if q == NCH - 1:
        tlx.fence("async_shared")
        if (row0 < M) & (col0 < N):
            tlx.async_descriptor_store(c_desc, buf, [row0, col0])


@triton.jit
def _store_direct(c_ptr, y, row0, col0, M, N, ROWS: tl.constexpr, WIDTH: tl.constexpr, ACC_LAYOUT: tl.constexpr):
    # STORE_DIRECT: the tile y, rows [row0, row0 + ROWS) x columns [col0, col0 + WIDTH) of the row-major Y [M, N],
    # straight to global memory.
    # ACC_LAYOUT=False: a tile loaded from shared memory (a blocked layout): coalesced vector stores (tl.store).
    # ACC_LAYOUT=True: a tile in the wgmma accumulator layout: each thread stores its two adjacent columns as one
    # 32-bit st.global, in that layout (a tl.store would be given a coalesced layout, i.e. a convert_layout through
    # shared memory). Relies on the layout's pairs (2 consecutive columns per thread, the packed elements) and on N
    # even (TMA: N % 8 == 0), so a pair is wholly in or out of bounds; a masked-off pair's address is 0 (no store)
    rows = row0 + tl.arange(0, ROWS)
    cols = col0 + tl.arange(0, WIDTH)
    ptrs = c_ptr + rows[:, None].to(tl.int64) * N + cols[None, :]
    in_bounds = (rows < M)[:, None] & (cols < N)[None, :]
    if ACC_LAYOUT:
        addr = tl.where(in_bounds, ptrs.to(tl.int64, bitcast=True), 0)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.u64 p, $2, 0; @p st.global.b32 [$2], $4; mov.b32 $0, 0; mov.b32 $1, 0; }",
            "=r,=r,l,l,r", [addr, y.to(c_ptr.dtype.element_ty)], dtype=tl.int32, is_pure=False, pack=2)
    else:
        tl.store(ptrs, y.to(c_ptr.dtype.element_ty), mask=in_bounds)


@triton.jit
def _multi_cta_norm_kernel(
    a_desc,  # TMA descriptor of A [M, K], block [64 (/ C with MULTICAST_A), BLOCK_K]
    b_desc,  # TMA descriptor of B [K, N], block [BLOCK_K, BLOCK_N]
    c_desc,  # TMA descriptor of Y [M, N], block [64, BLOCK_N (// 2 with EPILOGUE_SUBTILE)]
    w_ptr,  # weight [N] (unused unless HAS_W); "lazy_layer": colsum, fp32 [N]
    bias_ptr,  # bias [N] (unused unless HAS_B); "lazy_layer": beta_b, fp32 [N]
    mean_ptr,  # fp32 [M] (LayerNorm, "lazy_layer")
    rstd_ptr,  # fp32 [M]
    M,
    N,
    K,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    NUM_CONSUMERS: tl.constexpr,
    CONSUMER_REGS: tl.constexpr,
    CLUSTER_SIZE: tl.constexpr,
    MULTICAST_A: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    NORM: tl.constexpr,  # "rms" | "layer" | "none" (no norm: a cluster-schedule GEMM) | "lazy_rms" | "lazy_layer"
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    LN_PACKED: tl.constexpr = False,  # TilingConfig.LN_PACKED (LayerNorm only)
    EVEN_N: tl.constexpr = False,  # N == CLUSTER_SIZE * BLOCK_N: every rank owns BLOCK_N valid columns
    STORE_DEFER: tl.constexpr = False,  # TilingConfig.STORE_DEFER
    PINGPONG: tl.constexpr = False,  # TilingConfig.PINGPONG
    a_ptr=None,  # "lazy_layer": A [M, K] itself, for the per-row shift A[:, 0]
    EVEN_K: tl.constexpr = False,  # "lazy_layer": K % BLOCK_K == 0 (no K-tail mask in the shifted sums)
    TILES: tl.constexpr = 1,  # TilingConfig.TILES_PER_CTA: BLOCK_N tiles per CTA, computed one after the other
    OVERLAP: tl.constexpr = False,  # TilingConfig.EPILOGUE_OVERLAP ("rms" / "layer" only)
    # probe only (tools/multi_cta_overlap_probe.py; never set by the library), one-tile OVERLAP kernels: 1 = only the
    # exchange wait inside the next mainloop, the chunks after it; 2 = the whole deferred epilogue after it
    PROBE_OVL: tl.constexpr = 0,
    DIRECT: tl.constexpr = False,  # TilingConfig.STORE_DIRECT
    c_ptr=None,  # DIRECT: Y [M, N] itself (row-major), for the stores from registers
    SS_2D: tl.constexpr = False,  # TilingConfig.STATS_ELEMENTWISE ("lazy_rms", "lazy_layer")
    UNPACK_ASM: tl.constexpr = False,  # TilingConfig.STATS_UNPACK_ASM (with SS_2D, bf16)
    LN_MMA: tl.constexpr = False,  # TilingConfig.LN_RANK1_MMA ("lazy_layer")
    SHIFT_PF: tl.constexpr = False,  # TilingConfig.LN_SHIFT_PREFETCH ("lazy_layer")
    SHIFT_SMEM: tl.constexpr = False,  # TilingConfig.LN_SHIFT_SMEM ("lazy_layer")
    SS_PROD: tl.constexpr = False,  # TilingConfig.STATS_IN_PRODUCER ("lazy_rms")
    PDL_TRIGGER: tl.constexpr = False,  # a programmatic dependent grid may start once all CTAs ran it (idle-SM filler)
    PDL_WAIT_END: tl.constexpr = False,  # FILL_IDLE_SMS filler: exit only after the primary (cluster) grid completes
    ONEPASS: tl.constexpr = False,  # TilingConfig.LN_ONEPASS (LayerNorm with LN_PACKED)
):
    if PDL_TRIGGER:  # every CTA at its start: once all are resident, the dependent grid may take the idle SMs
        gdc_launch_dependents()
    C: tl.constexpr = CLUSTER_SIZE
    W: tl.constexpr = BLOCK_N * TILES  # columns per CTA: rank r owns [r * W, (r + 1) * W)
    BM_C: tl.constexpr = BLOCK_M // NUM_CONSUMERS  # rows per consumer warpgroup (64)
    A_ROWS: tl.constexpr = BM_C // C if MULTICAST_A else BM_C  # rows of one A TMA box
    DT: tl.constexpr = tlx.dtype_of(a_desc)
    A_STAGE_ROWS: tl.constexpr = BM_C if PINGPONG else BLOCK_M  # PINGPONG: a stage feeds one consumer
    STAGE_BYTES: tl.constexpr = (A_STAGE_ROWS * BLOCK_K + BLOCK_K * BLOCK_N) * tlx.size_of(DT)
    NSTAT: tl.constexpr = 2 if (NORM == "layer" or NORM == "lazy_layer") else 1
    # "lazy_rms": y = rstd(A) * (A @ B_folded), the statistic of the *input* rows: CTA `rank` sums a^2 over its
    # 1/C share of the K steps (ki % C == rank; TILES == 2: ki % 2C == 2 rank + j in its tile j) of the A tile every
    # CTA of the cluster loads anyway, and the RMSNorm exchange below completes it (divisor K instead of N)
    LAZY: tl.constexpr = NORM == "lazy_rms"
    RMS_LIKE: tl.constexpr = NORM == "rms" or LAZY
    # "lazy_layer": y = rstd * (A @ B_folded) - (rstd * mean) * colsum + beta_b (Lazy Pre-Norm LayerNorm). CTA
    # `rank` accumulates the shifted sums S1 = sum (a - c), S2 = sum (a - c)^2 over its K steps ki % C == rank, c =
    # A[row, 0] (loaded by every CTA: the same shift, so the CTAs' partial sums simply add); the NSTAT == 2
    # exchange carries (S1, S2), summed in rank order; mean = c + S1/K, var = max(S2/K - (S1/K)^2, 0)
    LAZY_LN: tl.constexpr = NORM == "lazy_layer"
    NB: tl.constexpr = 2  # exchange buffers (_NUM_DSMEM_BUFFERS)
    EXCHANGE: tl.constexpr = C > 1 and NORM != "none"
    PACKED: tl.constexpr = LN_PACKED and NORM == "layer"  # one int64 (sum, M2) word per row and peer
    RECV_BYTES: tl.constexpr = NSTAT * BM_C * 4 * (C - 1)  # bytes the C - 1 peers push per exchange
    EMPTY_ARRIVALS: tl.constexpr = NUM_CONSUMERS * C if MULTICAST_A else (1 if PINGPONG else NUM_CONSUMERS + SS_PROD)

    # Ring: consumer c's A box of slot s is a_bufs[c * NUM_STAGES + s]; B of slot s is b_bufs[s]. PINGPONG: slot s
    # holds one A box, a_bufs[s], for the consumer whose turn it is.
    a_bufs = tlx.local_alloc((BM_C, BLOCK_K), DT, NUM_STAGES * (1 if PINGPONG else NUM_CONSUMERS))
    b_bufs = tlx.local_alloc((BLOCK_K, BLOCK_N), DT, NUM_STAGES)
    full_bars = tlx.alloc_barriers(num_barriers=NUM_STAGES, arrive_count=1)
    empty_bars = tlx.alloc_barriers(num_barriers=NUM_STAGES, arrive_count=EMPTY_ARRIVALS)
    if EXCHANGE:
        if PACKED:
            # slot (b * NUM_CONSUMERS + cid) * C + r receives rank r's packed (sum, M2) word (same bytes)
            slots = tlx.local_alloc((BM_C, ), tl.int64, NB * NUM_CONSUMERS * C)
        else:
            # slot ((b * NUM_CONSUMERS + cid) * NSTAT + stat) * C + r receives rank r's partial
            slots = tlx.local_alloc((BM_C, ), tl.float32, NB * NUM_CONSUMERS * NSTAT * C)
        recv_bars = tlx.alloc_barriers(num_barriers=NB * NUM_CONSUMERS, arrive_count=1)
    if OVERLAP:
        # the parked tiles, un-normalized: tile j of consumer cid in out_bufs[j * NUM_CONSUMERS + cid]
        out_bufs = tlx.local_alloc((BM_C, BLOCK_N), tlx.dtype_of(c_desc), NUM_CONSUMERS * TILES)
    elif STORE_DEFER or TILES > 1:
        # output staging; TILES == 2: also the parked first tile (module docstring, "TILES_PER_CTA")
        out_bufs = tlx.local_alloc((BM_C, BLOCK_N), tlx.dtype_of(c_desc), NUM_CONSUMERS)
    if SS_PROD:
        # STATS_IN_PRODUCER: the producer's per-row partial sum a^2 of M-tile t, consumer c's rows, in
        # ss_bufs[2 * c + t % 2]; ss_full[t % 2] (1 arrival: the producer) / ss_empty[t % 2] (NUM_CONSUMERS)
        tl.static_assert(LAZY and NUM_CONSUMERS == 2 and not MULTICAST_A and not PINGPONG and not OVERLAP,
                         "STATS_IN_PRODUCER: Lazy RMSNorm, two consumers, no MULTICAST_A / PINGPONG / OVERLAP")
        ss_bufs = tlx.local_alloc((BM_C, ), tl.float32, 2 * NUM_CONSUMERS)
        ss_full = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
        ss_empty = tlx.alloc_barriers(num_barriers=2, arrive_count=NUM_CONSUMERS)
    if LAZY_LN and LN_MMA:
        # the rank-1 wgmma's B operand (this rank's split colsum / beta_b: the same for every M-tile), written once
        # by consumer 0, which then arrives on bext_bar
        bext_buf = tlx.local_alloc((16, BLOCK_N), DT, 1)
        bext_bar = tlx.alloc_barriers(num_barriers=1, arrive_count=1)
        # its A operand in the first [64, 64] of the consumer's own staging buffer (STORE_DEFER, required; 128-byte
        # rows, as the staging tile's swizzle needs; the wgmma reads its first 16 columns), free between the previous
        # store's wait and this tile's local_store (a register operand the compiler stages itself: 4 KB more, which c4
        # has not got); consumer cid's is aext_bufs[cid * AEXT_PER_BUF]. The output dtype is the input's (_prepare)
        tl.static_assert(STORE_DEFER and BLOCK_N >= 64, "LN_RANK1_MMA needs STORE_DEFER and BLOCK_N >= 64")
        AEXT_PER_BUF: tl.constexpr = BLOCK_N // 64
        aext_bufs = tlx.local_alloc((BM_C, 64), DT, NUM_CONSUMERS * AEXT_PER_BUF, reuse=out_bufs)
    if C > 1:
        # make the mbarrier inits visible cluster-wide; the rendezvous itself is the first statement of every task
        tlx.fence_mbarrier_init_cluster()

    with tlx.async_tasks():
        # ---------------------------------------------------------------- producer: TMA loads
        with tlx.async_task("default"):
            if C > 1:
                # entry rendezvous: every barrier of every CTA is initialized before any remote access. Issued in
                # every task rather than before async_tasks(): a pre-region cluster barrier is mirrored into the
                # worker warps only when the compiler inserts no cluster sync of its own (it does for multicast
                # TMA and remote arrives, and then leaves the explicit one to the default warps alone: deadlock)
                tlx.cluster_barrier()
                rank = tlx.cluster_cta_rank()
            else:
                rank = 0
            cluster_id = tl.program_id(0) // C
            num_clusters = tl.num_programs(0) // C
            num_pid_m = tl.cdiv(M, BLOCK_M)
            k_tiles = tl.cdiv(K, BLOCK_K)
            off_n = rank * W
            it = 0
            for pid_m in range(cluster_id, num_pid_m, num_clusters):
                off_m = pid_m * BLOCK_M
                if PINGPONG:
                    # consumer 0's K steps, then consumer 1's: one 64-row A box + the B tile per stage
                    for c in tl.static_range(NUM_CONSUMERS):
                        a_row = tl.minimum(off_m + c * BM_C, M - 1)  # clamp, as below
                        for ki in range(0, k_tiles):
                            s = it % NUM_STAGES
                            phase = (it // NUM_STAGES) & 1
                            tlx.barrier_wait(empty_bars[s], phase ^ 1)
                            tlx.barrier_expect_bytes(full_bars[s], STAGE_BYTES)
                            tlx.async_descriptor_load(a_desc, a_bufs[s], [a_row, ki * BLOCK_K], full_bars[s])
                            tlx.async_descriptor_load(b_desc, b_bufs[s], [ki * BLOCK_K, off_n], full_bars[s])
                            it += 1
                elif not SS_PROD:
                    for kt in range(0, k_tiles * TILES):  # TILES == 2: this CTA's first column tile, then its second
                        if TILES > 1:
                            ki = kt % k_tiles
                            off_nb = off_n + (kt // k_tiles) * BLOCK_N
                        else:
                            ki = kt
                            off_nb = off_n
                        s = it % NUM_STAGES
                        phase = (it // NUM_STAGES) & 1
                        tlx.barrier_wait(empty_bars[s], phase ^ 1)  # first use of a slot passes at once
                        tlx.barrier_expect_bytes(full_bars[s], STAGE_BYTES)
                        off_k = ki * BLOCK_K
                        for c in tl.static_range(NUM_CONSUMERS):
                            if MULTICAST_A:
                                # this CTA's 1/C share of consumer c's A box, multicast into every CTA of the cluster
                                for r in tl.static_range(C):
                                    if r == rank:
                                        a_row = tl.minimum(off_m + c * BM_C + r * A_ROWS, M - 1)
                                        dst = tlx.local_slice(a_bufs[c * NUM_STAGES + s], [r * A_ROWS, 0],
                                                              [A_ROWS, BLOCK_K])
                                        # multicast_targets must be a literal list: one per cluster size
                                        if C == 2:
                                            tlx.async_descriptor_load(a_desc, dst, [a_row, off_k], full_bars[s],
                                                                      multicast_targets=[0, 1])
                                        elif C == 4:
                                            tlx.async_descriptor_load(a_desc, dst, [a_row, off_k], full_bars[s],
                                                                      multicast_targets=[0, 1, 2, 3])
                                        else:
                                            tlx.async_descriptor_load(a_desc, dst, [a_row, off_k], full_bars[s],
                                                                      multicast_targets=[0, 1, 2, 3, 4, 5, 6, 7])
                            else:
                                # clamp: no A box lies wholly below row M (its consumer computes on real rows and
                                # skips its store)
                                a_row = tl.minimum(off_m + c * BM_C, M - 1)
                                tlx.async_descriptor_load(a_desc, a_bufs[c * NUM_STAGES + s], [a_row, off_k],
                                                          full_bars[s])
                        tlx.async_descriptor_load(b_desc, b_bufs[s], [off_k, off_nb], full_bars[s])
                        it += 1
            if SS_PROD:
                _producer_with_sumsq(a_desc, b_desc, a_bufs, b_bufs, full_bars, empty_bars, ss_bufs, ss_full,
                                     ss_empty, M, cluster_id, num_clusters, num_pid_m, k_tiles, rank, off_n, C, TILES,
                                     BLOCK_M, BLOCK_N, BLOCK_K, BM_C, NUM_STAGES, STAGE_BYTES, UNPACK_ASM)
            if C > 1:
                tlx.cluster_barrier()  # exit rendezvous (module docstring)
            if PDL_WAIT_END:
                # the filler of FILL_IDLE_SMS (a programmatic dependent grid): its CTAs exit only once the primary
                # grid has completed and flushed, so that whatever the stream runs next sees both row blocks
                gdc_wait()

        # ---------------------------------------------------------------- consumers: wgmma + norm epilogue
        with tlx.async_task(num_warps=4, registers=CONSUMER_REGS, replicate=NUM_CONSUMERS):
            cid: tl.constexpr = tlx.async_task_replica_id()
            if C > 1:
                tlx.cluster_barrier()  # entry rendezvous (see the producer)
                rank = tlx.cluster_cta_rank()
            else:
                rank = 0
            cluster_id = tl.program_id(0) // C
            num_clusters = tl.num_programs(0) // C
            num_pid_m = tl.cdiv(M, BLOCK_M)
            k_tiles = tl.cdiv(K, BLOCK_K)
            off_n = rank * W
            off_nt = off_n + (TILES - 1) * BLOCK_N  # the register tile's columns (TILES == 2: the second tile)
            cols = off_nt + tl.arange(0, BLOCK_N)
            col_ok = cols < N
            n_local = tl.minimum(N - off_n, BLOCK_N)  # columns of this rank's first tile (>= 1: TilingConfig.block_n)
            PARK_CHUNK: tl.constexpr = 64 if BLOCK_N > 64 else BLOCK_N  # parked-tile columns normalized at a time
            if PINGPONG:
                it = cid * k_tiles  # ring steps: consumer 0's k_tiles, then consumer 1's, per M-tile
                if cid == 1:
                    tlx.named_barrier_arrive(_PP_BAR0, 256)  # consumer 0 issues its mainloop first
            else:
                it = 0
            t = 0  # tiles done by this consumer: selects the exchange buffer and its phase
            if LAZY_LN and LN_MMA:
                if cid == 0:  # the rank-1 wgmma's B operand, once (fp32 colsum / beta_b in the w / bias slots)
                    vcols = off_nt + tl.arange(0, BLOCK_N)
                    cs_v = tl.load(w_ptr + vcols, mask=vcols < N, other=0.0)
                    bb_v = tl.load(bias_ptr + vcols, mask=vcols < N, other=0.0)
                    tlx.local_store(bext_buf[0], _lp._ln_b_ext(cs_v, bb_v, DT))
                    tlx.fence("async_shared")  # generic-proxy stores -> the wgmma's async-proxy reads
                    tlx.barrier_arrive(bext_bar[0])
                tlx.barrier_wait(bext_bar[0], 0)
            if LAZY_LN and SHIFT_PF:  # the first M-tile's shift (the loop loads each next one: _ln_shift)
                shift_nx = _ln_shift(a_ptr, cluster_id * BLOCK_M + cid * BM_C, M, K, BM_C)
            if OVERLAP:
                # the previous M-tile's deferred epilogue: its rows, statistics (carried: computed at its park
                # without a cluster, by its first deferred step with one), TILES * NCH chunk steps
                NCH: tl.constexpr = BLOCK_N // PARK_CHUNK
                prev_cm = 0
                mean_c = tl.zeros([BM_C], dtype=tl.float32)
                rstd_c = tl.zeros([BM_C], dtype=tl.float32)
                if not EXCHANGE:  # (placeholders: unused without the exchange)
                    slots = out_bufs
                    recv_bars = full_bars
            for pid_m in range(cluster_id, num_pid_m, num_clusters):
                off_cm = pid_m * BLOCK_M + cid * BM_C
                if LAZY and not SS_PROD:  # (STATS_IN_PRODUCER: the producer's partials, read in the epilogue)
                    if SS_2D:  # a^2 elementwise, reduced across threads once per M-tile
                        ss = tl.zeros([BM_C, BLOCK_K], dtype=tl.float32)
                    else:
                        ss = tl.zeros([BM_C], dtype=tl.float32)
                if TILES > 1:
                    # the first column tile (plain mainloop: TILES == 2 excludes Lazy LayerNorm, PINGPONG and
                    # multicast), its fp32 partial statistics, then parked in out_bufs[cid] as the output dtype.
                    # "lazy_rms": the K steps ki % (C * TILES) == rank * TILES + j are this CTA's share of sum a^2
                    # in its tile j, so the cluster's 2 C tile passes over A sum every K step once. A loop of its
                    # own: folding the park into the main loop's last K step (an `if` holding async_dot_wait(0))
                    # fails to compile in fbtriton 3.7.4 ("operand does not dominate this use")
                    acc = tl.zeros([BM_C, BLOCK_N], dtype=tl.float32)
                    s_prev = 0
                    for ki in range(0, k_tiles):
                        s = it % NUM_STAGES
                        tlx.barrier_wait(full_bars[s], (it // NUM_STAGES) & 1)
                        acc = tlx.async_dot(a_bufs[cid * NUM_STAGES + s], b_bufs[s], acc)
                        if LAZY and not SS_PROD:
                            if ki % (C * TILES) == rank * TILES:
                                ss = _lazy_sumsq_step(ss, a_bufs[cid * NUM_STAGES + s], SS_2D, UNPACK_ASM)
                        acc = tlx.async_dot_wait(1, acc)
                        if ki > 0:
                            tlx.barrier_arrive(empty_bars[s_prev])
                        s_prev = s
                        it += 1
                        # EPILOGUE_OVERLAP: the previous M-tile's epilogue, one step per K step, under this wgmma;
                        # after the release (a release held back by it would delay the ring's refill: with 3 stages
                        # the producer runs only one slot ahead)
                        if OVERLAP:
                            if t > 0:
                                if ki == 0:
                                    mean_c, rstd_c = _ovl_stats(slots, recv_bars, mean_c, rstd_c, t - 1, cid, prev_cm,
                                                                mean_ptr, rstd_ptr, rank, M, N, eps, C, NUM_CONSUMERS,
                                                                W, BM_C, RMS_LIKE, EVEN_N, EXCHANGE)
                                for c in tl.static_range(TILES * NCH):
                                    if ki == c + 1:
                                        _ovl_chunk(out_bufs[(c // NCH) * NUM_CONSUMERS + cid], c_desc, w_ptr, bias_ptr,
                                                   mean_c, rstd_c, prev_cm, off_n + (c // NCH) * BLOCK_N, M, N, c % NCH,
                                                   NCH, BM_C, PARK_CHUNK, RMS_LIKE, HAS_W, HAS_B)
                    acc = tlx.async_dot_wait(0, acc)
                    tlx.barrier_arrive(empty_bars[s_prev])
                    if OVERLAP:  # the deferred steps a short K loop had no room for
                        if t > 0:
                            for c in tl.static_range(TILES * NCH):
                                if c + 1 >= k_tiles:
                                    _ovl_chunk(out_bufs[(c // NCH) * NUM_CONSUMERS + cid], c_desc, w_ptr, bias_ptr,
                                               mean_c, rstd_c, prev_cm, off_n + (c // NCH) * BLOCK_N, M, N, c % NCH,
                                               NCH, BM_C, PARK_CHUNK, RMS_LIKE, HAS_W, HAS_B)
                    # the previous M-tile's last store has finished reading out_bufs[cid] (it drained during the
                    # mainloop above); waited for before the statistics, as STORE_DEFER does
                    tlx.async_descriptor_store_wait(0)
                    if NORM == "rms":
                        f0 = tl.sum(acc * acc, axis=1)
                    elif NORM == "layer":
                        f0, f1 = _ln_partials(acc, off_n, N, n_local, BM_C, BLOCK_N, EVEN_N, ONEPASS)
                    if NORM == "none" and DIRECT:  # no statistic to wait for: store the first tile now
                        if off_cm < M:
                            _store_direct(c_ptr, acc, off_cm, off_n, M, N, BM_C, BLOCK_N, True)
                    else:
                        tlx.local_store(out_bufs[cid], acc.to(tlx.dtype_of(c_desc)))
                        if NORM == "none":  # no statistic to wait for: store the first tile now
                            tlx.fence("async_shared")
                            if off_cm < M:
                                tlx.async_descriptor_store(c_desc, out_bufs[cid], [off_cm, off_n])
                    # the second tile's accumulator starts at 0 in the first's registers (a select on a condition
                    # that is false at run time, K < 0: with a zero constant ptxas spills the zeros)
                    acc = tl.where(K < 0, acc, 0.0)
                else:
                    acc = tl.zeros([BM_C, BLOCK_N], dtype=tl.float32)
                if LAZY_LN:
                    # per-row shift = the first element of each row of this consumer's A box (the box starts at
                    # the producer's clamped row; rows past M read 0, matching TMA's zero fill)
                    if SHIFT_PF:
                        shift = shift_nx.to(tl.float32)
                    elif SHIFT_SMEM:  # read from the first A slice at ki == 0, in the K loop below
                        shift = tl.zeros([BM_C], dtype=tl.float32)
                    else:
                        shift = _ln_shift(a_ptr, off_cm, M, K, BM_C).to(tl.float32)
                    if SS_2D:  # the shifted terms elementwise, reduced across threads once per M-tile
                        s1 = tl.zeros([BM_C, BLOCK_K], dtype=tl.float32)
                        s2 = tl.zeros([BM_C, BLOCK_K], dtype=tl.float32)
                    else:
                        s1 = tl.zeros([BM_C], dtype=tl.float32)
                        s2 = tl.zeros([BM_C], dtype=tl.float32)
                s_prev = 0
                if PINGPONG:  # my turn on the tensor cores: the other warpgroup has issued its whole mainloop
                    if cid == 0:
                        tlx.named_barrier_wait(_PP_BAR0, 256)
                    else:
                        tlx.named_barrier_wait(_PP_BAR1, 256)
                for ki in range(0, k_tiles):
                    s = it % NUM_STAGES
                    phase = (it // NUM_STAGES) & 1
                    tlx.barrier_wait(full_bars[s], phase)
                    if PINGPONG:
                        acc = tlx.async_dot(a_bufs[s], b_bufs[s], acc)
                    else:
                        acc = tlx.async_dot(a_bufs[cid * NUM_STAGES + s], b_bufs[s], acc)
                    if LAZY and not SS_PROD:
                        # while the wgmma is in flight; TMA zero-fills the K tail (adds 0). TILES == 2: the second
                        # tile's share (see the first tile's loop)
                        if ki % (C * TILES) == rank * TILES + (TILES - 1):
                            ss = _lazy_sumsq_step(ss, a_bufs[cid * NUM_STAGES + s], SS_2D, UNPACK_ASM)
                    if LAZY_LN:
                        if SHIFT_SMEM:
                            if ki == 0:  # column 0 of the first slice: _ln_shift's values (the same clamped box,
                                # TMA's zero fill past M)
                                shift = _lp._col0(a_bufs[cid * NUM_STAGES + s], UNPACK_ASM)
                        if ki % C == rank:  # (the K tail, zero-filled by TMA, would add -shift: masked)
                            if SS_2D:
                                y = _ln_tile_terms(a_bufs[cid * NUM_STAGES + s], shift, ki * BLOCK_K, K, BLOCK_K, EVEN_K,
                                                   UNPACK_ASM)
                                s1 += y
                                s2 += y * y
                            else:
                                q1, q2 = _ln_tile_stats(a_bufs[cid * NUM_STAGES + s], shift, ki * BLOCK_K, K, BLOCK_K,
                                                        EVEN_K)
                                s1 += q1
                                s2 += q2
                    acc = tlx.async_dot_wait(1, acc)  # the previous wgmma has retired: release its slot
                    if ki > 0:
                        if MULTICAST_A:  # the slot is refilled by every CTA's multicast: release it everywhere
                            for r in tl.static_range(C):
                                tlx.barrier_arrive(empty_bars[s_prev], 1, remote_cta_rank=r)
                        else:
                            tlx.barrier_arrive(empty_bars[s_prev])
                    s_prev = s
                    it += 1
                    if OVERLAP and TILES == 1:  # the previous M-tile's epilogue (as in the two-tile first loop)
                        if t > 0:
                            if (ki == 0) & (PROBE_OVL < 2):
                                mean_c, rstd_c = _ovl_stats(slots, recv_bars, mean_c, rstd_c, t - 1, cid, prev_cm,
                                                            mean_ptr, rstd_ptr, rank, M, N, eps, C, NUM_CONSUMERS, W,
                                                            BM_C, RMS_LIKE, EVEN_N, EXCHANGE)
                            for c in tl.static_range(NCH):
                                if (ki == c + 1) & (PROBE_OVL == 0):
                                    _ovl_chunk(out_bufs[cid], c_desc, w_ptr, bias_ptr, mean_c, rstd_c, prev_cm, off_n, M,
                                               N, c, NCH, BM_C, PARK_CHUNK, RMS_LIKE, HAS_W, HAS_B)
                if PINGPONG:
                    it += k_tiles  # skip the other consumer's steps of this M-tile
                    if cid == 0:  # all wgmma issued: the other warpgroup may issue its mainloop
                        tlx.named_barrier_arrive(_PP_BAR1, 256)
                    else:
                        tlx.named_barrier_arrive(_PP_BAR0, 256)
                acc = tlx.async_dot_wait(0, acc)
                if MULTICAST_A:
                    for r in tl.static_range(C):
                        tlx.barrier_arrive(empty_bars[s_prev], 1, remote_cta_rank=r)
                else:
                    tlx.barrier_arrive(empty_bars[s_prev])  # k_tiles >= 1 always (K >= 8)
                if LAZY_LN and SHIFT_PF:  # the next M-tile's shift, in flight during this epilogue
                    shift_nx = _ln_shift(a_ptr, off_cm + num_clusters * BLOCK_M, M, K, BM_C)
                if OVERLAP:
                    if TILES == 1:
                        if t > 0:  # the deferred steps a short K loop had no room for
                            if PROBE_OVL == 2:
                                mean_c, rstd_c = _ovl_stats(slots, recv_bars, mean_c, rstd_c, t - 1, cid, prev_cm,
                                                            mean_ptr, rstd_ptr, rank, M, N, eps, C, NUM_CONSUMERS, W,
                                                            BM_C, RMS_LIKE, EVEN_N, EXCHANGE)
                            for c in tl.static_range(NCH):
                                if (c + 1 >= k_tiles) | (PROBE_OVL > 0):
                                    _ovl_chunk(out_bufs[cid], c_desc, w_ptr, bias_ptr, mean_c, rstd_c, prev_cm, off_n, M,
                                               N, c, NCH, BM_C, PARK_CHUNK, RMS_LIKE, HAS_W, HAS_B)
                        tlx.async_descriptor_store_wait(0)  # the previous M-tile's store has read out_bufs[cid]
                    # this M-tile's partials from the fp32 accumulator, sent now; the wait, the normalization and
                    # the stores run during the next M-tile's first mainloop (or after the walk: the last M-tile)
                    if RMS_LIKE:
                        p0 = tl.sum(acc * acc, axis=1)
                        if TILES > 1:
                            p0 += f0
                        p1 = p0
                    elif TILES > 1:
                        n1 = tl.minimum(tl.maximum(N - off_nt, 0), BLOCK_N)
                        r0, r1 = _ln_partials(acc, off_nt, N, n1, BM_C, BLOCK_N, EVEN_N, ONEPASS)
                        p0, p1 = _chan_merge(f0, f1, n_local, r0, r1, n1, BLOCK_N, EVEN_N)
                    else:
                        p0, p1 = _ln_partials(acc, off_nt, N, n_local, BM_C, BLOCK_N, EVEN_N, ONEPASS)
                    if EXCHANGE:
                        buf = t % NB
                        _exchange_send(slots, recv_bars[buf * NUM_CONSUMERS + cid], p0, p1,
                                       (buf * NUM_CONSUMERS + cid) * C, rank, C, RECV_BYTES, PACKED)
                    elif RMS_LIKE:
                        rstd_c = tl.math.rsqrt(p0 / N + eps)
                    else:
                        mean_c = p0 / N
                        rstd_c = tl.math.rsqrt(p1 / N + eps)
                    tlx.local_store(out_bufs[(TILES - 1) * NUM_CONSUMERS + cid], acc.to(tlx.dtype_of(c_desc)))
                    prev_cm = off_cm
                    t += 1
                else:
                    if STORE_DEFER:
                        # the previous tile's store (this consumer's only pending bulk group) has finished reading
                        # out_bufs[cid]: waited for only now, after this tile's mainloop, during which it drained
                        # (here, not just before the local_store: a barrier between the normalization and the store
                        # makes ptxas keep more values live across it and spill)
                        tlx.async_descriptor_store_wait(0)

                    if NORM == "none":
                        y = acc
                    else:
                        # 1. per-row partials of this CTA's columns (TMA zero-filled acc past N: adds nothing)
                        if NORM == "rms":
                            p0 = tl.sum(acc * acc, axis=1)
                            if TILES > 1:
                                p0 += f0
                        elif LAZY:
                            if SS_PROD:  # the producer's partial of these rows (module docstring, STATS_IN_PRODUCER)
                                tlx.barrier_wait(ss_full[t % 2], (t // 2) & 1)
                                p0 = tlx.local_load(ss_bufs[2 * cid + t % 2])
                                tlx.barrier_arrive(ss_empty[t % 2])
                            elif SS_2D:
                                p0 = tl.sum(ss, axis=1)
                            else:
                                p0 = ss
                        elif LAZY_LN:
                            if SS_2D:
                                p0 = tl.sum(s1, axis=1)
                                p1 = tl.sum(s2, axis=1)
                            else:
                                p0 = s1
                                p1 = s2
                        elif TILES > 1:  # Chan's merge of this CTA's two tiles (the second may lie past N: n1 = 0)
                            n1 = tl.minimum(tl.maximum(N - off_nt, 0), BLOCK_N)
                            r0, r1 = _ln_partials(acc, off_nt, N, n1, BM_C, BLOCK_N, EVEN_N, ONEPASS)
                            p0, p1 = _chan_merge(f0, f1, n_local, r0, r1, n1, BLOCK_N, EVEN_N)
                        elif ONEPASS:
                            p0, p1 = _ln_partials_onepass(acc, n_local, BLOCK_N, EVEN_N)
                        elif LN_PACKED and EVEN_N:
                            p0, p1 = _ln_partials_full(acc, BM_C, BLOCK_N)
                        else:
                            p0 = tl.sum(acc, axis=1)
                            d = tl.where(col_ok[None, :], acc - (p0 / n_local)[:, None], 0.0)
                            p1 = tl.sum(d * d, axis=1)
                        if EXCHANGE and PACKED:
                            # 2'. LN_PACKED: one 64-bit DSMEM store per peer and row (and the own word into the own slot:
                            # reading it back keeps the combine in the load layout, so that the mean / rstd stores need no
                            # shared-memory layout conversion, which the combine from registers gets)
                            buf = t % NB
                            base = (buf * NUM_CONSUMERS + cid) * C
                            bar = recv_bars[buf * NUM_CONSUMERS + cid]
                            tlx.barrier_expect_bytes(bar, RECV_BYTES)
                            own = _pack_f32x2(p0, p1)
                            tlx.local_store(slots[base + rank], own)
                            for p in tl.static_range(C):
                                if p != rank:
                                    tlx.async_remote_shmem_store(dst=slots[base + rank], src=own, remote_cta_rank=p,
                                                                 barrier=bar)
                            tlx.barrier_wait(bar, (t // NB) & 1)
                            # 3'. the same rank-order Chan merge
                            mean, rstd = _packed_combine(slots, base, N, eps, C, W, BM_C, EVEN_N)
                        elif EXCHANGE:
                            # 2. DSMEM all-to-all of the partials (module docstring)
                            buf = t % NB
                            base = (buf * NUM_CONSUMERS + cid) * NSTAT * C
                            bar = recv_bars[buf * NUM_CONSUMERS + cid]
                            tlx.barrier_expect_bytes(bar, RECV_BYTES)
                            tlx.local_store(slots[base + rank], p0)
                            if NSTAT == 2:
                                tlx.local_store(slots[base + C + rank], p1)
                            for p in tl.static_range(C):
                                if p != rank:
                                    tlx.async_remote_shmem_store(dst=slots[base + rank], src=p0, remote_cta_rank=p,
                                                                 barrier=bar)
                                    if NSTAT == 2:
                                        tlx.async_remote_shmem_store(dst=slots[base + C + rank], src=p1,
                                                                     remote_cta_rank=p, barrier=bar)
                            tlx.barrier_wait(bar, (t // NB) & 1)
                            # 3. rank-order combine: identical fp32 sums in every CTA, every run
                            if RMS_LIKE:
                                total = tl.zeros([BM_C], dtype=tl.float32)
                                for r in tl.static_range(C):
                                    total += tlx.local_load(slots[base + r])
                                rstd = tl.math.rsqrt(total / (K if LAZY else N) + eps)
                            elif LAZY_LN:  # the shifted partial sums of all ranks add (same shift)
                                t1 = tl.zeros([BM_C], dtype=tl.float32)
                                t2 = tl.zeros([BM_C], dtype=tl.float32)
                                for r in tl.static_range(C):
                                    t1 += tlx.local_load(slots[base + r])
                                    t2 += tlx.local_load(slots[base + C + r])
                                d = t1 / K
                                mean = shift + d
                                rstd = tl.math.rsqrt(tl.maximum(t2 / K - d * d, 0.0) + eps)
                            else:
                                total = tl.zeros([BM_C], dtype=tl.float32)
                                for r in tl.static_range(C):
                                    total += tlx.local_load(slots[base + r])
                                mean = total / N
                                m2 = tl.zeros([BM_C], dtype=tl.float32)
                                for r in tl.static_range(C):  # Chan's merge of (n_r, mean_r, M2_r)
                                    n_r = tl.minimum(N - r * W, W).to(tl.float32)
                                    dm = tlx.local_load(slots[base + r]) / n_r - mean
                                    m2 += tlx.local_load(slots[base + C + r]) + n_r * dm * dm
                                rstd = tl.math.rsqrt(m2 / N + eps)
                        else:
                            if RMS_LIKE:
                                rstd = tl.math.rsqrt(p0 / (K if LAZY else N) + eps)
                            elif LAZY_LN:
                                d = p0 / K
                                mean = shift + d
                                rstd = tl.math.rsqrt(tl.maximum(p1 / K - d * d, 0.0) + eps)
                            else:
                                mean = p0 / N  # n_local == N: p1 is the centred sum of squares of the whole row
                                rstd = tl.math.rsqrt(p1 / N + eps)
                        # 4. normalize the fp32 accumulator, affine, statistics (rank 0)
                        if RMS_LIKE:
                            y = acc * rstd[:, None]
                        elif LAZY_LN and LN_MMA:
                            # acc += A_ext @ B_ext = -mean ⊗ colsum + (1/rstd) ⊗ beta_b (one m64 k16 wgmma, A staged
                            # in out_bufs[cid], which the previous store has read: waited for above), then the
                            # RMSNorm-like scaling. A_ext (columns as _lp._ln_a_ext) is built in the wgmma A-fragment
                            # layout, whose rows are the accumulator's: built in a blocked layout, it pulled the
                            # combine and rsqrt above into that layout, 8 rows per thread (24a63c9). (Inline pins: a
                            # pinned value cannot be passed to a jit helper.)
                            aext = tlx.local_slice(aext_bufs[cid * AEXT_PER_BUF], [0, 0], [BM_C, 16])
                            d1, d2, _ = _lp._split3(d, DT)
                            r1, r2, _ = _lp._split3(1.0 / rstd, DT)
                            j = tlx.require_layout(tl.broadcast_to(tl.arange(0, 16)[None, :], (BM_C, 16)),
                                                   _A_EXT_LAYOUT)
                            ax = tl.where(j < 3, tlx.require_layout(tl.broadcast_to((-shift).to(DT)[:, None],
                                                                                    (BM_C, 16)), _A_EXT_LAYOUT),
                                          0.0).to(DT)
                            ax = tl.where((j == 3) | (j == 4), tlx.require_layout(
                                tl.broadcast_to((-d1)[:, None], (BM_C, 16)), _A_EXT_LAYOUT), ax)
                            ax = tl.where(j == 5, tlx.require_layout(tl.broadcast_to((-d2)[:, None], (BM_C, 16)),
                                                                     _A_EXT_LAYOUT), ax)
                            ax = tl.where((j == 6) | (j == 7), tlx.require_layout(
                                tl.broadcast_to(r1[:, None], (BM_C, 16)), _A_EXT_LAYOUT), ax)
                            ax = tl.where(j == 8, tlx.require_layout(tl.broadcast_to(r2[:, None], (BM_C, 16)),
                                                                     _A_EXT_LAYOUT), ax)
                            tlx.local_store(aext, ax)
                            tlx.fence("async_shared")
                            acc = tlx.async_dot(aext, bext_buf[0], acc)
                            acc = tlx.async_dot_wait(0, acc)
                            y = acc * rstd[:, None]
                        elif LAZY_LN:
                            y = acc  # normalized with the colsum / beta_b correction per column chunk below
                        elif LN_PACKED:
                            y = acc * rstd[:, None] - (mean * rstd)[:, None]  # one FMA per element
                        else:
                            y = (acc - mean[:, None]) * rstd[:, None]
                        rows = off_cm + tl.arange(0, BM_C)
                        if C > 1:
                            stat_ok = (rows < M) & (rank == 0)
                        else:
                            stat_ok = rows < M
                        tl.store(rstd_ptr + rows, rstd, mask=stat_ok)
                        if NORM == "layer" or LAZY_LN:
                            tl.store(mean_ptr + rows, mean, mask=stat_ok)
                        t += 1
                        if TILES > 1:
                            # the parked first tile: normalized in place, PARK_CHUNK columns at a time (the register
                            # tile stays live), then TMA-stored while the register tile is normalized
                            live = off_cm < M
                            for c in tl.static_range(BLOCK_N // PARK_CHUNK):
                                part = tlx.local_slice(out_bufs[cid], [0, c * PARK_CHUNK], [BM_C, PARK_CHUNK])
                                x = tlx.local_load(part).to(tl.float32)
                                if RMS_LIKE:
                                    x = x * rstd[:, None]
                                else:
                                    x = x * rstd[:, None] - (mean * rstd)[:, None]
                                if HAS_W or HAS_B:
                                    x = _affine(x, w_ptr, bias_ptr, off_n + c * PARK_CHUNK, N, live, PARK_CHUNK, HAS_W,
                                                HAS_B)
                                if DIRECT:
                                    if live:
                                        _store_direct(c_ptr, x, off_cm, off_n + c * PARK_CHUNK, M, N, BM_C, PARK_CHUNK,
                                                      False)
                                else:
                                    tlx.local_store(part, x.to(tlx.dtype_of(c_desc)))
                            if not DIRECT:
                                tlx.fence("async_shared")
                                if live:
                                    tlx.async_descriptor_store(c_desc, out_bufs[cid], [off_cm, off_n])
                    AFFINE: tl.constexpr = HAS_W or HAS_B
                    if DIRECT and AFFINE:
                        # the whole tile at once: _join_cols would reorder the accumulator layout's elements, whose
                        # adjacent-column pairs _store_direct(ACC_LAYOUT=True) relies on
                        y = _affine(y, w_ptr, bias_ptr, off_nt, N, off_cm < M, BLOCK_N, HAS_W, HAS_B)
                    elif EPILOGUE_SUBTILE or AFFINE or (LAZY_LN and not LN_MMA):
                        # column halves (register-level splits of the accumulator layout), the affine per half/quarter
                        y_lo, y_hi = _split_cols(y, BM_C, BLOCK_N)
                        if LAZY_LN and not LN_MMA:  # y = acc * rstd - (rstd * mean) * colsum + beta_b, fp32, one column quarter at a time
                            live = off_cm < M
                            rm = rstd * mean
                            y_lo = _lazy_ln_half(y_lo, rstd, rm, w_ptr, bias_ptr, off_nt, N, live, BM_C, BLOCK_N // 2)
                            y_hi = _lazy_ln_half(y_hi, rstd, rm, w_ptr, bias_ptr, off_nt + BLOCK_N // 2, N, live, BM_C,
                                                 BLOCK_N // 2)
                        elif AFFINE:
                            live = off_cm < M  # per tile: see _affine
                            y_lo = _affine_half(y_lo, w_ptr, bias_ptr, off_nt, N, live, BM_C, BLOCK_N // 2, HAS_W, HAS_B)
                            y_hi = _affine_half(y_hi, w_ptr, bias_ptr, off_nt + BLOCK_N // 2, N, live, BM_C, BLOCK_N // 2,
                                                HAS_W, HAS_B)
                        if not EPILOGUE_SUBTILE:
                            y = _join_cols(y_lo, y_hi, BM_C, BLOCK_N)
                    if DIRECT:
                        if off_cm < M:
                            _store_direct(c_ptr, y, off_cm, off_nt, M, N, BM_C, BLOCK_N, True)
                    elif TILES > 1:
                        # the first tile's store has finished reading out_bufs[cid]; this one drains under the next
                        # M-tile's first mainloop (the wait before the next park). A last rank's second tile may lie
                        # wholly past N: no store
                        tlx.async_descriptor_store_wait(0)
                        if (off_cm < M) & (off_nt < N):
                            tlx.local_store(out_bufs[cid], y.to(tlx.dtype_of(c_desc)))
                            tlx.fence("async_shared")
                            tlx.async_descriptor_store(c_desc, out_bufs[cid], [off_cm, off_nt])
                    elif STORE_DEFER:
                        if off_cm < M:
                            tlx.local_store(out_bufs[cid], y.to(tlx.dtype_of(c_desc)))
                            tlx.fence("async_shared")  # generic-proxy smem writes -> visible to the TMA (async proxy)
                            tlx.async_descriptor_store(c_desc, out_bufs[cid], [off_cm, off_nt])
                    elif off_cm < M:  # rows past M are clipped by TMA; wholly out-of-bounds slices skip the store
                        if EPILOGUE_SUBTILE:
                            c_desc.store([off_cm, off_nt], y_lo.to(tlx.dtype_of(c_desc)))
                            c_desc.store([off_cm, off_nt + BLOCK_N // 2], y_hi.to(tlx.dtype_of(c_desc)))
                        else:
                            c_desc.store([off_cm, off_nt], y.to(tlx.dtype_of(c_desc)))
            if PINGPONG:
                if cid == 0:  # consume consumer 1's last arrival (no named-barrier arrival is left pending)
                    tlx.named_barrier_wait(_PP_BAR0, 256)
            if OVERLAP:
                if t > 0:  # the last M-tile's deferred epilogue, with no mainloop left to hide it
                    mean_c, rstd_c = _ovl_stats(slots, recv_bars, mean_c, rstd_c, t - 1, cid, prev_cm, mean_ptr,
                                                rstd_ptr, rank, M, N, eps, C, NUM_CONSUMERS, W, BM_C, RMS_LIKE, EVEN_N,
                                                EXCHANGE)
                    for c in tl.static_range(TILES * NCH):
                        _ovl_chunk(out_bufs[(c // NCH) * NUM_CONSUMERS + cid], c_desc, w_ptr, bias_ptr, mean_c,
                                   rstd_c, prev_cm, off_n + (c // NCH) * BLOCK_N, M, N, c % NCH, NCH, BM_C,
                                   PARK_CHUNK, RMS_LIKE, HAS_W, HAS_B)
            if STORE_DEFER or TILES > 1 or OVERLAP:
                tlx.async_descriptor_store_wait(0)  # the staging buffer must outlive the last store's read
            if C > 1:
                tlx.cluster_barrier()  # exit rendezvous: no peer stores into / arrives on this CTA afterwards


@triton.jit
def _recompute_mainloop(acc, a_bufs, b_bufs, full_bars, empty_bars, it, cid: tl.constexpr, k_tiles, K,
                 NUM_STAGES: tl.constexpr):
    """RECOMPUTE_TILES: consumer ``cid``'s K loop (``k_tiles`` steps) over ring steps ``it, it + 1, ...`` (``it``:
    the ring-step counter, in step with the producer's) into ``acc``, its fp32 [64, BLOCK_N] wgmma accumulator,
    restarted at 0 in its registers (a select on the run-time-false ``K < 0``, as the two-tile kernel does: with a
    zero constant per tile ptxas spills); ``async_dot_wait(1)`` pipelining, each slot released one step late, the
    last after the drain. Returns ``(acc, it)`` with ``it`` advanced by ``k_tiles``."""
    acc = tl.where(K < 0, acc, 0.0)
    s_prev = 0
    for ki in range(0, k_tiles):
        s = it % NUM_STAGES
        tlx.barrier_wait(full_bars[s], (it // NUM_STAGES) & 1)
        acc = tlx.async_dot(a_bufs[cid * NUM_STAGES + s], b_bufs[s], acc)
        acc = tlx.async_dot_wait(1, acc)
        if ki > 0:
            tlx.barrier_arrive(empty_bars[s_prev])
        s_prev = s
        it += 1
    acc = tlx.async_dot_wait(0, acc)
    tlx.barrier_arrive(empty_bars[s_prev])  # k_tiles >= 1 always (K >= 8)
    return acc, it


@triton.jit
def _recompute_norm_kernel(
    a_desc,  # TMA descriptor of A [M, K], block [64, BLOCK_K]
    b_desc,  # TMA descriptor of B [K, N], block [BLOCK_K, BLOCK_N]
    c_desc,  # TMA descriptor of Y [M, N], block [64, BLOCK_N]
    w_ptr,  # weight [N] (unused unless HAS_W)
    bias_ptr,  # bias [N] (unused unless HAS_B)
    mean_ptr,  # fp32 [M] (LayerNorm)
    rstd_ptr,  # fp32 [M]
    M,
    N,
    K,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    NUM_CONSUMERS: tl.constexpr,
    CONSUMER_REGS: tl.constexpr,
    CLUSTER_SIZE: tl.constexpr,
    TILES: tl.constexpr,  # TilingConfig.TILES_PER_CTA: BLOCK_N tiles per CTA, each computed twice
    NORM: tl.constexpr,  # "rms" | "layer"
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    EVEN_N: tl.constexpr,  # N == CLUSTER_SIZE * TILES * BLOCK_N: every tile's columns valid
    PDL_TRIGGER: tl.constexpr = False,  # as in _multi_cta_norm_kernel
    PDL_WAIT_END: tl.constexpr = False,  # as in _multi_cta_norm_kernel (the FILL_IDLE_SMS filler)
    ONEPASS: tl.constexpr = False,  # TilingConfig.LN_ONEPASS (LayerNorm)
):
    """RECOMPUTE_TILES (module docstring): CTA ``rank`` of a cluster owns ``TILES`` column tiles; per M-tile a
    statistics pass computes each tile and keeps only its per-row (sum, centred sum of squares) / sum of squares,
    merged over the tiles by Chan's formula; one packed DSMEM exchange per M-tile (the LN_PACKED word and
    double-buffer protocol of ``_multi_cta_norm_kernel``); then an output pass computes each tile again, normalizes
    it and TMA-stores it through one staging buffer per consumer (the wait for a store before the buffer's next
    use). No tile is parked, so any TILES fits the shared memory of one tile per CTA; the GEMM runs twice."""
    if PDL_TRIGGER:
        gdc_launch_dependents()
    C: tl.constexpr = CLUSTER_SIZE
    W: tl.constexpr = BLOCK_N * TILES  # columns per CTA: rank r owns [r * W, (r + 1) * W)
    BM_C: tl.constexpr = BLOCK_M // NUM_CONSUMERS
    DT: tl.constexpr = tlx.dtype_of(a_desc)
    STAGE_BYTES: tl.constexpr = (BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N) * tlx.size_of(DT)
    EXCHANGE: tl.constexpr = C > 1
    RECV_BYTES: tl.constexpr = BM_C * 8 * (C - 1)  # one int64 word per row from each peer
    a_bufs = tlx.local_alloc((BM_C, BLOCK_K), DT, NUM_STAGES * NUM_CONSUMERS)
    b_bufs = tlx.local_alloc((BLOCK_K, BLOCK_N), DT, NUM_STAGES)
    full_bars = tlx.alloc_barriers(num_barriers=NUM_STAGES, arrive_count=1)
    empty_bars = tlx.alloc_barriers(num_barriers=NUM_STAGES, arrive_count=NUM_CONSUMERS)
    if EXCHANGE:
        # slot (b * NUM_CONSUMERS + cid) * C + r receives rank r's packed word; buffer b = t % 2 (module docstring)
        slots = tlx.local_alloc((BM_C, ), tl.int64, 2 * NUM_CONSUMERS * C)
        recv_bars = tlx.alloc_barriers(num_barriers=2 * NUM_CONSUMERS, arrive_count=1)
    out_bufs = tlx.local_alloc((BM_C, BLOCK_N), tlx.dtype_of(c_desc), NUM_CONSUMERS)
    if C > 1:
        # make the mbarrier inits visible cluster-wide (peers complete transactions on recv_bars); the rendezvous is
        # the first statement of every task, as in _multi_cta_norm_kernel
        tlx.fence_mbarrier_init_cluster()

    with tlx.async_tasks():
        # ---------------------------------------------------------------- producer: TMA loads, both passes
        with tlx.async_task("default"):
            if C > 1:
                tlx.cluster_barrier()  # entry rendezvous (as _multi_cta_norm_kernel)
                rank = tlx.cluster_cta_rank()
            else:
                rank = 0
            cluster_id = tl.program_id(0) // C
            num_clusters = tl.num_programs(0) // C
            num_pid_m = tl.cdiv(M, BLOCK_M)
            k_tiles = tl.cdiv(K, BLOCK_K)
            off_n = rank * W
            it = 0
            for pid_m in range(cluster_id, num_pid_m, num_clusters):
                off_m = pid_m * BLOCK_M
                for kt in range(0, 2 * TILES * k_tiles):  # the statistics pass's tiles, then the output pass's
                    ki = kt % k_tiles
                    off_nb = off_n + ((kt // k_tiles) % TILES) * BLOCK_N
                    s = it % NUM_STAGES
                    tlx.barrier_wait(empty_bars[s], ((it // NUM_STAGES) & 1) ^ 1)
                    tlx.barrier_expect_bytes(full_bars[s], STAGE_BYTES)
                    for c in tl.static_range(NUM_CONSUMERS):
                        a_row = tl.minimum(off_m + c * BM_C, M - 1)  # clamped, as _multi_cta_norm_kernel
                        tlx.async_descriptor_load(a_desc, a_bufs[c * NUM_STAGES + s], [a_row, ki * BLOCK_K],
                                                  full_bars[s])
                    tlx.async_descriptor_load(b_desc, b_bufs[s], [ki * BLOCK_K, off_nb], full_bars[s])
                    it += 1
            if C > 1:
                tlx.cluster_barrier()  # exit rendezvous
            if PDL_WAIT_END:
                gdc_wait()  # (as _multi_cta_norm_kernel)

        # ---------------------------------------------------------------- consumers
        with tlx.async_task(num_warps=4, registers=CONSUMER_REGS, replicate=NUM_CONSUMERS):
            cid: tl.constexpr = tlx.async_task_replica_id()
            if C > 1:
                tlx.cluster_barrier()
                rank = tlx.cluster_cta_rank()
            else:
                rank = 0
            cluster_id = tl.program_id(0) // C
            num_clusters = tl.num_programs(0) // C
            num_pid_m = tl.cdiv(M, BLOCK_M)
            k_tiles = tl.cdiv(K, BLOCK_K)
            off_n = rank * W
            it = 0
            t = 0
            acc = tl.zeros([BM_C, BLOCK_N], dtype=tl.float32)
            for pid_m in range(cluster_id, num_pid_m, num_clusters):
                off_cm = pid_m * BLOCK_M + cid * BM_C
                # statistics pass: this CTA's per-row partials over its TILES tiles (a tile wholly past N adds 0);
                # the first tile, then the others in a loop (not unrolled: ptxas spilled the unrolled K loops)
                acc, it = _recompute_mainloop(acc, a_bufs, b_bufs, full_bars, empty_bars, it, cid, k_tiles, K,
                                              NUM_STAGES)
                if NORM == "rms":
                    p0 = tl.sum(acc * acc, axis=1)
                    p1 = p0
                else:
                    n_acc = tl.minimum(N - off_n, BLOCK_N)  # >= 1 (TilingConfig.block_n)
                    p0, p1 = _ln_partials(acc, off_n, N, n_acc, BM_C, BLOCK_N, EVEN_N, ONEPASS)
                for j in range(1, TILES):
                    acc, it = _recompute_mainloop(acc, a_bufs, b_bufs, full_bars, empty_bars, it, cid, k_tiles, K,
                                                  NUM_STAGES)
                    if NORM == "rms":
                        p0 += tl.sum(acc * acc, axis=1)
                        p1 = p0
                    else:
                        n_j = tl.minimum(tl.maximum(N - (off_n + j * BLOCK_N), 0), BLOCK_N)
                        q0, q1 = _ln_partials(acc, off_n + j * BLOCK_N, N, n_j, BM_C, BLOCK_N, EVEN_N,
                                                ONEPASS)
                        p0, p1 = _chan_merge(p0, p1, n_acc, q0, q1, n_j, BLOCK_N, False)
                        n_acc += n_j
                if EXCHANGE:
                    buf = t % 2
                    base = (buf * NUM_CONSUMERS + cid) * C
                    bar = recv_bars[buf * NUM_CONSUMERS + cid]
                    _exchange_send(slots, bar, p0, p1, base, rank, C, RECV_BYTES, True)
                    tlx.barrier_wait(bar, (t // 2) & 1)
                    if NORM == "rms":  # rank-order sum (bit-identical on every CTA)
                        total = tl.zeros([BM_C], dtype=tl.float32)
                        for r in tl.static_range(C):
                            q0, q1 = _unpack_f32x2(tlx.local_load(slots[base + r]))
                            total += q0
                        rstd = tl.math.rsqrt(total / N + eps)
                        mean = rstd
                    else:
                        mean, rstd = _packed_combine(slots, base, N, eps, C, W, BM_C, EVEN_N)
                else:
                    if NORM == "rms":
                        rstd = tl.math.rsqrt(p0 / N + eps)
                        mean = rstd
                    else:
                        mean = p0 / N
                        rstd = tl.math.rsqrt(p1 / N + eps)
                rows = off_cm + tl.arange(0, BM_C)
                stat_ok = (rows < M) & (rank == 0)
                tl.store(rstd_ptr + rows, rstd, mask=stat_ok)
                if NORM == "layer":
                    tl.store(mean_ptr + rows, mean, mask=stat_ok)
                t += 1
                # output pass: each tile again, normalized (one FMA per element) and stored
                live = off_cm < M
                for j in range(0, TILES):
                    acc, it = _recompute_mainloop(acc, a_bufs, b_bufs, full_bars, empty_bars, it, cid, k_tiles, K,
                                                  NUM_STAGES)
                    off_j = off_n + j * BLOCK_N
                    if NORM == "rms":
                        y = acc * rstd[:, None]
                    else:
                        y = acc * rstd[:, None] - (mean * rstd)[:, None]
                    if HAS_W or HAS_B:
                        y = _affine(y, w_ptr, bias_ptr, off_j, N, live, BLOCK_N, HAS_W, HAS_B)
                    tlx.async_descriptor_store_wait(0)  # the previous store has read out_bufs[cid]
                    if live & (off_j < N):  # (a last rank's tile may lie wholly past N)
                        tlx.local_store(out_bufs[cid], y.to(tlx.dtype_of(c_desc)))
                        tlx.fence("async_shared")
                        tlx.async_descriptor_store(c_desc, out_bufs[cid], [off_cm, off_j])
            tlx.async_descriptor_store_wait(0)  # the staging buffer must outlive the last store's read
            if C > 1:
                tlx.cluster_barrier()  # exit rendezvous


# ------------------------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------------------------
_NUM_SMS_CACHE: dict = {}
_MAX_CLUSTERS_CACHE: dict = {}
# Shared memory passed to the occupancy query: at least this much, so that the query (run with 128 threads by
# the driver utility) counts one CTA per SM, as the real 384-thread CTA with ~168 registers per thread gets.
_ONE_CTA_PER_SM_SMEM = 120 * 1024


def _num_sms(device: torch.device) -> int:
    key = (device.type, device.index)
    if key not in _NUM_SMS_CACHE:
        _NUM_SMS_CACHE[key] = torch.cuda.get_device_properties(device).multi_processor_count
    return _NUM_SMS_CACHE[key]


def _validate(a, b, weight, bias, eps, norm: str, *, need_cuda: bool) -> tuple[int, int, int]:
    """Shared input checks of the public functions; returns (M, N, K). Raises TypeError/ValueError."""
    if norm != "none":
        eps = check_eps(eps)
    # the technique's contract: dtypes, shapes, 16-byte aligned a and b (TMA), affine vectors of a's dtype
    M, N, K = _spec.check_inputs(a, b, weight, bias, eps if norm != "none" else None)
    if a.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"the TLX kernel supports bf16 and fp16 inputs, got {a.dtype} "
                        "(fp32 would need tf32 wgmma with K-major B)")
    if need_cuda and a.device.type != "cuda":
        raise ValueError(f"inputs must be CUDA tensors, got device {a.device}")
    return M, N, K


def _prepare(a, b, weight, bias, eps, norm: str, cfg: TilingConfig, *, need_cuda: bool, ln_vectors=None, out=None,
             stats_out=None):
    """Validate, allocate the outputs and build the descriptors and launch arguments (grid not final: the
    persistent cluster count needs the compiled kernel, ``_grid``). ``ln_vectors``: ``(colsum, beta_b)`` of the
    "lazy_layer" norm (validated by the caller; None allocates empty ones: compile-only and occupancy queries).
    ``out``: an ``[M, N]`` row-major tensor of a's dtype to write y into (a row block of a larger output: the
    idle-SM fillers, ``_run_filled`` and ``kernels_tlx.lazy_prenorm``'s), else a new one; ``stats_out``: likewise
    ``(mean, rstd)``, contiguous fp32 ``[M]`` (mean None for RMSNorm)."""
    if norm in ("lazy_rms", "lazy_layer") and cfg.EPILOGUE_OVERLAP:  # (first: it also implies LN_PACKED)
        raise ValueError(f"Lazy Pre-Norm ({norm}): EPILOGUE_OVERLAP=True is not supported (the deferred epilogue "
                         "takes the output's statistics): use a config without it")
    if norm in ("lazy_rms", "lazy_layer") and cfg.STORE_DIRECT:
        raise ValueError(f"Lazy Pre-Norm ({norm}): STORE_DIRECT=True is not supported (not GPU-checked for the Lazy "
                         "forms): use a config without it")
    if norm in ("lazy_rms", "lazy_layer") and cfg.PINGPONG:
        raise ValueError(f"Lazy Pre-Norm ({norm}): PINGPONG=True is not supported (the cooperative ring only)")
    if norm not in ("lazy_rms", "lazy_layer", "none") and cfg.STATS_ELEMENTWISE:  # (matmul_cluster: GEMM without it)
        op = next(op for op, n in _NORM_OF_OP.items() if n == norm)
        raise ValueError(f"STATS_ELEMENTWISE=True applies to Lazy Pre-Norm only (lazy_rmsnorm_matmul, "
                         f"lazy_layernorm_matmul), got {op}: use a config without it")
    if cfg.STATS_IN_PRODUCER and norm not in ("lazy_rms", "none"):  # (matmul_cluster: the GEMM without it)
        op = next(op for op, n in _NORM_OF_OP.items() if n == norm)
        raise ValueError(f"STATS_IN_PRODUCER=True applies to lazy_rmsnorm_matmul only (Lazy Pre-Norm RMSNorm), got "
                         f"{op}: use a config without it")
    for flag in ("LN_RANK1_MMA", "LN_SHIFT_PREFETCH", "LN_SHIFT_SMEM"):
        if getattr(cfg, flag) and norm not in ("lazy_layer", "none"):  # (matmul_cluster: the GEMM without it)
            op = next(op for op, n in _NORM_OF_OP.items() if n == norm)
            raise ValueError(f"{flag}=True applies to lazy_layernorm_matmul only (Lazy Pre-Norm LayerNorm), got "
                             f"{op}: use a config without it")
    if cfg.RECOMPUTE_TILES and norm not in ("rms", "layer"):
        op = next((op for op, n in _NORM_OF_OP.items() if n == norm), "matmul_cluster")
        raise ValueError(f"RECOMPUTE_TILES=True applies to matmul_rmsnorm / matmul_layernorm only, got {op}: use a "
                         "config without it")
    if norm in ("lazy_rms", "lazy_layer") and cfg.FILL_IDLE_SMS:
        raise ValueError(f"Lazy Pre-Norm ({norm}): multi_cta's FILL_IDLE_SMS=True is not supported here (its filler is "
                         "the post-GEMM norm's): use kernels_tlx.lazy_prenorm's TilingConfig.FILL_IDLE_SMS")
    if norm == "lazy_layer" and cfg.LN_PACKED:
        raise ValueError("Lazy Pre-Norm (lazy_layer): LN_PACKED=True is not supported (the two-statistic exchange)")
    if norm == "lazy_layer" and cfg.TILES_PER_CTA > 1:
        raise ValueError(f"Lazy Pre-Norm ({norm}): TILES_PER_CTA={cfg.TILES_PER_CTA} is not supported (the shifted "
                         "sums are taken in the K loop of the one tile per CTA)")
    M, N, K = _validate(a, b, weight, bias, eps, norm, need_cuda=False)
    bn = cfg.block_n(N)  # ValueError naming the limit if the cluster cannot cover N (before the device check)
    if need_cuda and a.device.type != "cuda":
        raise ValueError(f"inputs must be CUDA tensors, got device {a.device}")
    C = cfg.CLUSTER_SIZE
    bm_c = cfg.rows_per_consumer
    if out is not None and (out.shape != (M, N) or out.dtype != a.dtype or out.stride() != (N, 1)
                            or out.device != a.device):
        raise ValueError(f"out must be a row-major [{M}, {N}] {a.dtype} tensor on {a.device}, got "
                         f"{tuple(out.shape)} {out.dtype} with strides {out.stride()} on {out.device}")
    y = out if out is not None else torch.empty((M, N), dtype=a.dtype, device=a.device)
    has_mean = norm in ("layer", "lazy_layer")
    if stats_out is not None:
        for name, t, want in zip(("mean", "rstd"), stats_out, (has_mean, norm != "none")):
            if want and (t is None or t.shape != (M, ) or t.dtype != torch.float32 or not t.is_contiguous()
                         or t.device != a.device):
                raise ValueError(f"stats_out {name} must be a contiguous fp32 [{M}] tensor on {a.device}, got "
                                 f"{None if t is None else (tuple(t.shape), t.dtype, t.device)}")
    rstd = (stats_out[1] if stats_out is not None else torch.empty(M, dtype=torch.float32, device=a.device)) \
        if norm != "none" else y
    mean = (stats_out[0] if stats_out is not None else torch.empty(M, dtype=torch.float32, device=a.device)) \
        if has_mean else rstd
    a_desc = TensorDescriptor.from_tensor(a, [bm_c // C if cfg.MULTICAST_A else bm_c, cfg.BLOCK_K])
    b_desc = TensorDescriptor.from_tensor(b, [cfg.BLOCK_K, bn])
    c_desc = TensorDescriptor.from_tensor(y, [bm_c, bn // 2 if cfg.EPILOGUE_SUBTILE else bn])
    args = (a_desc, b_desc, c_desc, weight if weight is not None else a, bias if bias is not None else a, mean, rstd,
            M, N, K, float(eps) if eps is not None else 1e-6)
    kwargs = dict(
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=bn, BLOCK_K=cfg.BLOCK_K, NUM_STAGES=cfg.NUM_STAGES,
        NUM_CONSUMERS=cfg.NUM_CONSUMERS, CONSUMER_REGS=cfg.CONSUMER_REGS, CLUSTER_SIZE=C,
        MULTICAST_A=cfg.MULTICAST_A, EPILOGUE_SUBTILE=cfg.EPILOGUE_SUBTILE, NORM=norm,
        HAS_W=weight is not None and norm != "none", HAS_B=bias is not None and norm == "layer",
        num_warps=_PRODUCER_WARPS,  # the default (producer) task; consumers add 4 warps each
        num_stages=1,  # no compiler pipelining: the ring is explicit
    )
    T = cfg.TILES_PER_CTA
    if cfg.LN_ONEPASS and norm == "layer":  # (needs LN_PACKED; both kernels take it; absent otherwise: unchanged builds)
        kwargs["ONEPASS"] = True
    if cfg.RECOMPUTE_TILES:  # _recompute_norm_kernel's constexprs (_kernel(cfg))
        kwargs = {k: v for k, v in kwargs.items() if k not in ("MULTICAST_A", "EPILOGUE_SUBTILE")}
        kwargs.update(TILES=T, EVEN_N=N == C * T * bn)
        if C > 1:
            kwargs["ctas_per_cga"] = (C, 1, 1)
        return (M, N, K), bn, (y, mean if has_mean else None, rstd), args, kwargs
    # (the other kernels keep their default constexprs: unchanged builds)
    if cfg.LN_PACKED and norm == "layer":
        kwargs["LN_PACKED"] = True
    if norm == "layer" and (cfg.LN_PACKED or T > 1):
        kwargs["EVEN_N"] = N == C * T * bn  # the row fills the cluster: unmasked statistics
    if T > 1:
        kwargs["TILES"] = T
    if cfg.EPILOGUE_OVERLAP:
        if norm in ("rms", "layer"):
            kwargs["OVERLAP"] = True
        elif T == 1:  # matmul_cluster: the same schedule's GEMM, its store deferred as the fused kernel's
            kwargs["STORE_DEFER"] = True
    if cfg.STORE_DEFER:
        kwargs["STORE_DEFER"] = True
    if cfg.PINGPONG:
        kwargs["PINGPONG"] = True
    if cfg.STORE_DIRECT:
        kwargs.update(DIRECT=True, c_ptr=y)
    if cfg.STATS_ELEMENTWISE and norm in ("lazy_rms", "lazy_layer"):
        kwargs["SS_2D"] = True
    if cfg.STATS_IN_PRODUCER and norm == "lazy_rms":
        kwargs["SS_PROD"] = True
    if cfg.STATS_UNPACK_ASM and a.dtype == torch.bfloat16 and ("SS_2D" in kwargs or "SS_PROD" in kwargs):
        kwargs["UNPACK_ASM"] = True  # (the widening of whichever statistic the kernel takes)
    if norm == "lazy_layer":  # colsum / beta_b in the (unused: HAS_W = HAS_B = False) weight / bias slots
        if ln_vectors is None:
            ln_vectors = tuple(torch.empty(N, dtype=torch.float32, device=a.device) for _ in range(2))
        args = args[:3] + tuple(ln_vectors) + args[5:]
        kwargs.update(HAS_W=False, HAS_B=False, a_ptr=a, EVEN_K=K % cfg.BLOCK_K == 0)
        if cfg.LN_RANK1_MMA:
            kwargs["LN_MMA"] = True
        if cfg.LN_SHIFT_PREFETCH:
            kwargs["SHIFT_PF"] = True
        if cfg.LN_SHIFT_SMEM:
            kwargs["SHIFT_SMEM"] = True
    if C > 1:
        kwargs["ctas_per_cga"] = (C, 1, 1)
    outs = (y, mean if has_mean else None, rstd if norm != "none" else None)
    return (M, N, K), bn, outs, args, kwargs


def _occupancy_ctypes(function: int, threads: int, shared: int, C: int) -> int | None:
    """``cuOccupancyMaxActiveClusters`` through ctypes with the kernel's real block size (its PTX pins it:
    ``.reqntid``) and dynamic shared memory, after setting ``CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED``
    (needed before any 16-CTA launch). Struct layouts from cuda.h (CUDA 12/13: ``CUlaunchConfig``,
    ``CUlaunchAttribute`` = id + 4 pad bytes + a 64-byte union). None on any failure."""
    import ctypes as ct

    class _Dim(ct.Structure):
        _fields_ = [("x", ct.c_uint), ("y", ct.c_uint), ("z", ct.c_uint)]

    class _Value(ct.Union):
        _fields_ = [("pad", ct.c_char * 64), ("clusterDim", _Dim), ("align", ct.c_uint64)]

    class _Attr(ct.Structure):
        _fields_ = [("id", ct.c_int), ("pad", ct.c_char * 4), ("value", _Value)]

    class _Config(ct.Structure):
        _fields_ = [("gridDimX", ct.c_uint), ("gridDimY", ct.c_uint), ("gridDimZ", ct.c_uint),
                    ("blockDimX", ct.c_uint), ("blockDimY", ct.c_uint), ("blockDimZ", ct.c_uint),
                    ("sharedMemBytes", ct.c_uint), ("hStream", ct.c_void_p), ("attrs", ct.POINTER(_Attr)),
                    ("numAttrs", ct.c_uint)]

    try:
        lib = ct.CDLL("libcuda.so.1")
        if C > 8 and lib.cuFuncSetAttribute(ct.c_void_p(function), ct.c_int(14), ct.c_int(1)) != 0:
            return None  # 14 = CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        attr = _Attr()
        attr.id = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim = _Dim(C, 1, 1)
        cfg = _Config(C, 1, 1, threads, 1, 1, shared, None, ct.pointer(attr), 1)
        n = ct.c_int(0)
        if lib.cuOccupancyMaxActiveClusters(ct.byref(n), ct.c_void_p(function), ct.byref(cfg)) != 0:
            return None
        return n.value
    except (OSError, AttributeError, TypeError, ValueError):
        return None


def _max_active_clusters(compiled, C: int, device: torch.device) -> int | None:
    """Co-resident clusters of ``compiled`` on ``device`` (the persistent grid, in clusters; a GPC only holds
    whole clusters, so this is not ``#SMs / C``), or None if unknown. First ``_occupancy_ctypes`` (real block
    size); else the Triton driver utility (it queries 128-thread blocks, so its shared memory is raised to
    force the one CTA per SM that the real kernel gets; it also sets the non-portable attribute)."""
    key = (device.index, id(compiled))
    if key not in _MAX_CLUSTERS_CACHE:
        n = None
        try:
            compiled._init_handles()
            shared = int(compiled.metadata.shared)
            n = _occupancy_ctypes(compiled.function, 32 * int(compiled.metadata.num_warps), shared, C)
            if not n:
                util = triton.runtime.driver.active.utils.cuOccupancyMaxActiveClusters
                n = int(util(compiled.function, max(shared, _ONE_CTA_PER_SM_SMEM), C))
        except Exception:  # noqa: BLE001  (no driver utility, a driver error): caller falls back
            n = None
        _MAX_CLUSTERS_CACHE[key] = n if n and n > 0 else None
    return _MAX_CLUSTERS_CACHE[key]


def _grid(cfg: TilingConfig, M: int, num_clusters_avail: int | None) -> tuple[int]:
    """1-D grid of CTAs: ``num_clusters * CLUSTER_SIZE``. Persistent: the co-resident clusters (never more than
    the M-tiles); without an occupancy figure, one cluster per M-tile (as non-persistent: always safe)."""
    num_pid_m = triton.cdiv(M, cfg.BLOCK_M)
    clusters = num_pid_m
    if cfg.PERSISTENT and num_clusters_avail:
        clusters = min(num_pid_m, num_clusters_avail)
    return (clusters * cfg.CLUSTER_SIZE, )


def _kernel(cfg: TilingConfig):
    """The JIT kernel of ``cfg``: ``_recompute_norm_kernel`` with RECOMPUTE_TILES, else ``_multi_cta_norm_kernel``."""
    return _recompute_norm_kernel if cfg.RECOMPUTE_TILES else _multi_cta_norm_kernel


def cluster_occupancy(config=None, N: int = 1024, op: str = "matmul_rmsnorm", device="cuda") -> int | None:
    """Co-resident clusters of ``config``'s kernel for rows of N (GPU only; compiles the kernel): the persistent
    grid in clusters. None if unknown."""
    cfg = TilingConfig.from_dict(config)
    a = torch.empty(cfg.BLOCK_M, 64, dtype=torch.bfloat16, device=device)
    b = torch.empty(64, N, dtype=torch.bfloat16, device=device)
    _, _, _, args, kwargs = _prepare(a, b, None, None, 1e-6, _NORM_OF_OP.get(op, "none"), cfg, need_cuda=True)
    ck = _kernel(cfg).warmup(*args, grid=(cfg.CLUSTER_SIZE, ), **kwargs)
    return _max_active_clusters(ck, cfg.CLUSTER_SIZE, torch.device(device))


def _run(a, b, weight, bias, eps, norm: str, config, ln_vectors=None):
    cfg = TilingConfig.from_dict(config)
    if cfg.FILL_IDLE_SMS and norm in ("rms", "layer"):
        return _run_filled(a, b, weight, bias, eps, norm, cfg)
    if cfg.FILL_IDLE_SMS and norm == "none":  # matmul_cluster: this schedule's GEMM, without the filler
        cfg = TilingConfig.from_dict({**cfg.to_dict(), "FILL_IDLE_SMS": False, "FILL_RATE_PCT": 100,
                                      "FILL_RECOMPUTE": False})
    (M, N, K), bn, outs, args, kwargs = _prepare(a, b, weight, bias, eps, norm, cfg, need_cuda=True,
                                                 ln_vectors=ln_vectors)
    avail = None
    if cfg.PERSISTENT or cfg.CLUSTER_SIZE > 8:
        # compile (cached) to query the occupancy; for 16-CTA clusters this also sets the non-portable attribute
        ck = _kernel(cfg).warmup(*args, grid=(cfg.CLUSTER_SIZE, ), **kwargs)
        avail = _max_active_clusters(ck, cfg.CLUSTER_SIZE, a.device)
        if cfg.CLUSTER_SIZE > 8 and avail is None:
            raise RuntimeError(f"CLUSTER_SIZE={cfg.CLUSTER_SIZE}: no co-resident {cfg.CLUSTER_SIZE}-CTA cluster "
                               "(cuOccupancyMaxActiveClusters returned 0 or failed): non-portable cluster sizes "
                               "need a GPC with that many free SMs")
    grid = _grid(cfg, M, avail)
    with torch.cuda.device(a.device):
        _kernel(cfg)[grid](*args, **kwargs)
    return outs


def _pdl_primary_clusters(args, kwargs, C: int, device: torch.device) -> int:
    """FILL_IDLE_SMS (both fillers: ``_run_filled`` here and in ``kernels_tlx.lazy_prenorm``): set ``PDL_TRIGGER``
    in the cluster kernel's launch ``kwargs`` and return that build's co-resident clusters of C. Without an
    occupancy figure (``cuOccupancyMaxActiveClusters`` failed) the idle SMs are not known: 0, with a RuntimeWarning
    (the cluster kernel then runs alone on all rows, one cluster per M-tile)."""
    import warnings

    kwargs["PDL_TRIGGER"] = True
    ck = _multi_cta_norm_kernel.warmup(*args, grid=(C, ), **kwargs)
    avail = _max_active_clusters(ck, C, device) or 0
    if not avail:
        warnings.warn("FILL_IDLE_SMS: the co-resident cluster count is unknown (occupancy query failed), so no "
                      "filler runs: the cluster kernel takes all rows", RuntimeWarning, stacklevel=4)
    return avail


def fill_split(cfg: TilingConfig, M: int, clusters_avail: int | None, num_sms: int) -> tuple[int, int]:
    """FILL_IDLE_SMS: ``(m_fill, fill_clusters)`` for M rows: the persistent cluster grid holds ``busy =
    clusters_avail * CLUSTER_SIZE`` SMs (also when M has fewer M-tiles: small M runs the cluster kernel alone, as
    GPU-checked), the filler ``fill_clusters = (num_sms - busy) // fill_config().CLUSTER_SIZE`` clusters, and gets
    the last ``m_fill = fill_rows(M, busy, used, FILL_RATE_PCT, BLOCK_M)`` rows (``used``: the SMs of those
    clusters). ``(0, 0)`` without an occupancy figure, idle SMs or BLOCK_M rows for the filler."""
    if not clusters_avail:
        return 0, 0
    fcfg = cfg.fill_config()
    busy = clusters_avail * cfg.CLUSTER_SIZE
    fill_clusters = max(num_sms - busy, 0) // fcfg.CLUSTER_SIZE
    used = fill_clusters * fcfg.CLUSTER_SIZE
    m_fill = _lp.fill_rows(M, busy, used, cfg.FILL_RATE_PCT, cfg.BLOCK_M)
    return (m_fill, fill_clusters) if m_fill > 0 else (0, 0)


def _run_filled(a, b, weight, bias, eps, norm: str, cfg: TilingConfig):
    """FILL_IDLE_SMS (``TilingConfig``): this cluster kernel on the first rows, with ``griddepcontrol.
    launch_dependents`` at its start (``PDL_TRIGGER``), and the ``cfg.fill_config()`` kernel (half the cluster with
    two tiles per CTA; FILL_RECOMPUTE: 2-CTA clusters of the RECOMPUTE_TILES kernel) on the last rows
    (``fill_split``) as its programmatic dependent grid (``launch_pdl``: it starts once every CTA of this grid is
    resident, so its clusters take the SMs this grid leaves, and it needs none of its output), one cluster per
    ``fill_config().CLUSTER_SIZE`` idle SMs; both write row blocks of the same y / mean / rstd. The filler's
    producer ends with ``griddepcontrol.wait`` (``PDL_WAIT_END``): it completes only after this grid. Without idle
    SMs or with fewer than BLOCK_M filler rows, this kernel takes all rows; so it does, with a RuntimeWarning, when
    the occupancy query fails. Returns ``(y, mean or None, rstd)`` as the public op; same validation and errors as
    without the option."""
    (M, N, K), _, outs, args, kwargs = _prepare(a, b, weight, bias, eps, norm, cfg, need_cuda=True)
    avail = _pdl_primary_clusters(args, kwargs, cfg.CLUSTER_SIZE, a.device)
    fcfg = cfg.fill_config()
    m_fill, fill_clusters = fill_split(cfg, M, avail, _num_sms(a.device))
    m_c = M - m_fill
    y, mean, rstd = outs
    if m_fill > 0:
        def rows(lo, hi):
            return dict(out=y[lo:hi], stats_out=(None if mean is None else mean[lo:hi], rstd[lo:hi]))

        *_, args, kwargs = _prepare(a[:m_c], b, weight, bias, eps, norm, cfg, need_cuda=True, **rows(0, m_c))
        kwargs["PDL_TRIGGER"] = True
        *_, f_args, f_kwargs = _prepare(a[m_c:], b, weight, bias, eps, norm, fcfg, need_cuda=True, **rows(m_c, M))
        f_grid = _grid(fcfg, m_fill, fill_clusters)
    with torch.cuda.device(a.device):
        _multi_cta_norm_kernel[_grid(cfg, m_c, avail or None)](*args, **kwargs)
        if m_fill > 0:
            _kernel(fcfg)[f_grid](*f_args, launch_pdl=True, PDL_WAIT_END=True, **f_kwargs)
    return outs


def matmul_rmsnorm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None, *, eps: float = 1e-6,
                   config=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``y = rmsnorm(a @ b) (* weight)`` in one kernel: the row statistics span a thread-block cluster (DSMEM).

    Args:
        a: ``[M, K]`` bf16 or fp16, row-major contiguous, CUDA, 16-byte aligned (K multiple of 8).
        b: ``[K, N]`` same dtype and device, row-major contiguous (N multiple of 8; N <= CLUSTER_SIZE *
            TILES_PER_CTA * BLOCK_N).
        weight: ``[N]`` of a's dtype, or None.
        eps: added to the mean square inside the rsqrt (finite, > 0).
        config: ``TilingConfig``, a dict of overrides, or None for ``DEFAULT_CONFIG`` (CLUSTER_SIZE=4).

    Returns:
        ``(y [M, N] a.dtype, rstd [M] fp32)``.

    Raises:
        NotImplementedError: an input requires grad with grad mode on (forward only).
        TypeError: non-tensors, mixed dtypes, dtypes other than bf16/fp16, a weight of another dtype than a.
        ValueError: wrong ranks, mismatched K, non-contiguous or misaligned inputs (TMA: 16-byte base and
            rows), non-CUDA tensors, eps not a finite number > 0 (None too), a config that cannot serve N
            (``TilingConfig.block_n``: N larger than the cluster can cover); ``normfuse.tiling.ConfigError`` for
            an invalid config (e.g. an unsupported CLUSTER_SIZE). y may exceed 2^31 elements (TMA coordinates).
        RuntimeWarning (a warning, not raised): FILL_IDLE_SMS without an occupancy figure (no filler runs).

    Sources: PyTorch blog "Towards Free Normalization" (multi-CTA norm fusion),
    https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/ ;
    TLX, https://github.com/facebookexperimental/triton
    """
    check_forward_only("multi_cta.matmul_rmsnorm", a=a, b=b, weight=weight)
    y, _, rstd = _run(a, b, weight, None, eps, "rms", config)
    return y, rstd


def matmul_layernorm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, *, eps: float = 1e-5,
                     config=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``y = layernorm(a @ b) (* weight + bias)`` (biased variance) in one kernel; the per-CTA (sum, centred sum
    of squares) are exchanged once through DSMEM and merged in rank order with Chan's formula (module docstring).

    Args and errors as ``matmul_rmsnorm``; ``bias``: ``[N]`` of a's dtype, or None.

    Returns:
        ``(y [M, N] a.dtype, mean [M] fp32, rstd [M] fp32)``.
    """
    check_forward_only("multi_cta.matmul_layernorm", a=a, b=b, weight=weight, bias=bias)
    return _run(a, b, weight, bias, eps, "layer", config)


def matmul_cluster(a: torch.Tensor, b: torch.Tensor, *, config=None) -> torch.Tensor:
    """``a @ b`` with the fused kernel's cluster schedule and no norm (diagnostic: fused minus this is the cost
    of the norm epilogue and exchange; this minus ``matmul`` the cost of the cluster schedule). Args as
    ``matmul_rmsnorm``; returns ``y [M, N]``."""
    y, _, _ = _run(a, b, None, None, None, "none", config)
    return y


def lazy_rmsnorm_matmul(a: torch.Tensor, b_folded: torch.Tensor, *, eps: float = 1e-6,
                        config=None) -> torch.Tensor:
    """Lazy Pre-Norm on the cluster schedule: ``y = rmsnorm(a) @ b_folded = rstd(a) * (a @ b_folded)``, with the
    per-row sum of squares of ``a`` split K-wise across the thread-block cluster that covers the output row.

    Every CTA of a C-CTA cluster computes one ``[BLOCK_M, N / C]`` slice of the same M-tile, so it streams the same
    A tile; CTA ``rank`` adds up ``a^2`` only over the K steps ``ki % C == rank`` (from the A slice in shared
    memory, while its wgmma runs), and the RMSNorm DSMEM all-to-all of ``matmul_rmsnorm`` completes the sum in rank
    order (deterministic). The statistic is thus computed exactly once per row -- no ``N / BLOCK_N``-fold
    redundancy as in ``kernels_tlx.lazy_prenorm`` -- while the CTAs walk M-tiles with the whole (L2-resident) B.
    With ``TILES_PER_CTA=2`` each CTA computes two ``N / 2C`` slices one after the other and sums ``a^2`` in its
    slice j over the K steps ``ki % 2C == 2 rank + j`` (module docstring, "TILES_PER_CTA").

    Args:
        a: ``[M, K]`` bf16 or fp16, row-major contiguous, CUDA, 16-byte aligned (K multiple of 8).
        b_folded: ``[K, N]`` same dtype, ``diag(gamma) @ B`` (N multiple of 8; N <= CLUSTER_SIZE * TILES_PER_CTA
            * BLOCK_N).
        eps: added to the mean square (finite, > 0).
        config: this module's ``TilingConfig`` (or dict / None for ``DEFAULT_CONFIG``); PINGPONG is not supported.

    Returns:
        ``y [M, N]`` of a's dtype.

    Raises:
        ValueError: as ``matmul_rmsnorm`` (incl. a config whose cluster cannot cover N), and PINGPONG=True;
        TypeError: bad dtypes; NotImplementedError: inputs requiring grad with grad mode on.

    Sources: Lazy Pre-Norm and multi-CTA norm fusion, PyTorch blog "Towards Free Normalization",
    https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
    (the K-wise split of the statistic across the cluster is our Hopper variant).
    """
    check_forward_only("multi_cta.lazy_rmsnorm_matmul", a=a, b_folded=b_folded)
    y, _, _ = _run(a, b_folded, None, None, eps, "lazy_rms", config)
    return y


def lazy_layernorm_matmul(a: torch.Tensor, b_folded: torch.Tensor, colsum: torch.Tensor, beta_b: torch.Tensor, *,
                          eps: float = 1e-5, config=None) -> torch.Tensor:
    """Lazy Pre-Norm for LayerNorm on the cluster schedule: ``y = rstd ⊙ (a @ b_folded) - (rstd * mean) ⊗ colsum +
    beta_b`` (= ``(LN(a) * gamma + beta) @ b`` with ``b_folded = diag(gamma) @ b``, ``colsum = b_folded.float()
    .sum(0)``, ``beta_b = beta @ b``: ``normfuse.techniques.lazy_prenorm``), with the per-row statistics of ``a``
    split K-wise across the thread-block cluster that covers the output row.

    As ``lazy_rmsnorm_matmul``: CTA ``rank`` of the C-CTA cluster accumulates, over its K steps ``ki % C ==
    rank`` (from the A slice in shared memory, while its wgmma runs; K tail masked), the fp32 shifted sums ``S1 =
    sum (a - c)`` and ``S2 = sum (a - c)^2`` with the per-row shift ``c = a[row, 0]`` (loaded from global memory by
    every CTA: the same shift, so the partial sums add). The two-statistic DSMEM all-to-all of
    ``matmul_layernorm`` sums them in rank order (deterministic); ``mean = c + S1/K``, ``rstd = rsqrt(max(S2/K -
    (S1/K)^2, 0) + eps)``. The epilogue is fp32 per column quarter: ``acc * rstd - (rstd * mean) * colsum[col] +
    beta_b[col]`` (no extra MMA). Numerics as ``kernels_tlx.lazy_prenorm.lazy_layernorm_matmul`` (rows with
    |mean| up to ~100 standard deviations, the limit of the rank-1 form).

    Args:
        a: ``[M, K]`` bf16 or fp16, row-major contiguous, CUDA, 16-byte aligned (K multiple of 8).
        b_folded: ``[K, N]`` same dtype and device, row-major contiguous (N multiple of 8; N <= CLUSTER_SIZE *
            BLOCK_N and the cluster covering N exactly: ``TilingConfig.block_n``).
        colsum, beta_b: fp32 ``[N]``, contiguous, on a's device.
        eps: added to the variance (finite, > 0). Default 1e-5 (``torch.nn.LayerNorm``'s).
        config: this module's ``TilingConfig`` (or dict / None for ``DEFAULT_CONFIG``); PINGPONG and LN_PACKED are
            not supported.

    Returns:
        ``y [M, N]`` of a's dtype.

    Raises:
        ValueError: as ``matmul_rmsnorm`` (incl. a config whose cluster cannot cover N), PINGPONG=True or
            LN_PACKED=True, a wrong shape, layout or device of ``colsum`` / ``beta_b``;
        TypeError: bad dtypes (incl. non-fp32 ``colsum`` / ``beta_b``); NotImplementedError: inputs requiring grad
            with grad mode on.

    Sources: Lazy Pre-Norm and multi-CTA norm fusion, PyTorch blog "Towards Free Normalization",
    https://pytorch.org/blog/towards-free-normalization-fusing-normalization-into-gemm-and-attention-kernels/
    (RMSNorm form; the LayerNorm extension and the K-wise split across the cluster are ours); shifted one-pass
    variance: Chan, Golub & LeVeque, "Algorithms for computing the sample variance" (1983).
    """
    check_forward_only("multi_cta.lazy_layernorm_matmul", a=a, b_folded=b_folded, colsum=colsum, beta_b=beta_b)
    _validate_lazy_ln(a, b_folded, colsum, beta_b, eps)
    y, _, _ = _run(a, b_folded, None, None, eps, "lazy_layer", config, ln_vectors=(colsum, beta_b))
    return y


def _validate_lazy_ln(a, b_folded, colsum, beta_b, eps) -> None:
    """The LayerNorm op's contract before ``_prepare``'s checks: inputs, eps, then the fp32 ``[N]`` vectors
    (``normfuse.techniques.lazy_prenorm``, as ``kernels_tlx.lazy_prenorm._validate_ln``)."""
    _, N, _ = _lp._spec.check_inputs(a, b_folded, check_eps(eps))
    _lp._spec.check_layernorm_vectors(colsum, beta_b, N, a.device)


def _ptx_extras(ptx: str) -> dict:
    """PTX facts of the protocol: DSMEM stores, cluster barriers, multicast TMA, remote arrives, setmaxnreg."""
    return {
        "st_async": len(re.findall(r"st\.async\.shared::cluster\.mbarrier::complete_tx", ptx)),
        "st_async_b64": len(re.findall(r"st\.async\.shared::cluster\.mbarrier::complete_tx::bytes\.b64", ptx)),
        # fp32 arithmetic instructions (the epilogue's cost; the mainloop is wgmma) and column-mask selects
        "f32_arith": len(re.findall(r"^\s+(?:add|sub|mul|fma\.rn|selp|neg)\.f32", ptx, flags=re.M)),
        "selp_f32": len(re.findall(r"^\s+selp\.f32", ptx, flags=re.M)),
        "barrier_cluster_arrive": ptx.count("barrier.cluster.arrive"),
        "barrier_cluster_wait": ptx.count("barrier.cluster.wait"),
        "fence_mbarrier_init": ptx.count("fence.mbarrier_init"),
        "tma_multicast": len(re.findall(r"cp\.async\.bulk\.tensor[^\n]*multicast::cluster", ptx)),
        "remote_arrive": len(re.findall(r"mbarrier\.arrive[^\n]*shared::cluster", ptx)),
        "cluster_ctarank": ptx.count("%cluster_ctarank"),
        "mbarrier_expect_tx": ptx.count("expect_tx"),
        "mbarrier_try_wait": ptx.count("mbarrier.try_wait"),
        "setmaxnreg": sorted({int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
        "wgmma_wait_1": len(re.findall(r"wgmma\.wait_group\.sync\.aligned 1;", ptx)),
        "tma_store": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta", ptx)),
        "reqnctapercluster": (re.search(r"\.reqnctapercluster\s+([\d, ]+)", ptx) or [None, None])[1],
    }


def _ttgir_cluster_sync(ttgir: str) -> dict:
    """Cluster barriers per region of the TTGIR: ``pre`` (before ``ttg.warp_specialize``: must be 0, see the
    entry rendezvous in the kernel) and ``regions``: [arrive, wait] for the default region and each partition
    (every region must hold the same counts, or the warps of a CTA would disagree on the barrier phases)."""
    i = ttgir.find("ttg.warp_specialize")
    if i < 0:
        return {"pre": ttgir.count("ttng.cluster_arrive"), "regions": []}
    regions = re.split(r"\bpartition\d+\(", ttgir[i:])
    return {"pre": ttgir[:i].count("ttng.cluster_arrive"),
            "regions": [[r.count("ttng.cluster_arrive"), r.count("ttng.cluster_wait")] for r in regions]}


def compile_sm90(op: str, a: torch.Tensor, b: torch.Tensor, *, eps: float = 1e-6, config=None,
                 affine: bool = False, ptxas: bool = False, colsum: torch.Tensor | None = None,
                 beta_b: torch.Tensor | None = None) -> dict:
    """Compile ``op`` for sm_90a without a GPU and summarize the result (never launches).

    The caller must already have run ``normfuse.compile_only.install(90)`` in this process. ``a [M, K]``, ``b
    [K, N]``: CPU (or CUDA) bf16/fp16 tensors (never read; shapes, dtype and alignment matter). ``op``:
    ``"matmul_rmsnorm"``, ``"matmul_layernorm"``, ``"matmul_cluster"`` (``matmul_cluster``: no norm) or
    ``"matmul"`` (the Lazy Pre-Norm module's GEMM, with its own
    ``TilingConfig``: delegated to ``kernels_tlx.lazy_prenorm.compile_sm90``). ``affine``: also pass a weight
    (and a bias for LayerNorm). ``ptxas``: add ``ptxas -v`` registers/spills (slower). ``"lazy_rmsnorm_matmul"``
    / ``"lazy_layernorm_matmul"``: the Lazy Pre-Norm cluster form (``b`` = b_folded; the LayerNorm op's fp32
    ``colsum`` / ``beta_b``: None allocates empty ones; ``affine`` is ignored for it).

    Returns ``normfuse.compile_only.summarize(compiled)`` (ptx_markers incl. ``mapa`` / ``wgmma`` / ``tma_load``,
    shared_bytes, num_warps, smem_ok, cluster_dims) plus ``ptx_extra`` (``_ptx_extras``), ``grid`` (the
    non-persistent grid; the persistent one needs the GPU's occupancy), ``block_n``, ``config``,
    ``smem_estimate`` and, with ``ptxas``, ``ptxas``. Raises like the ops (minus the CUDA check).
    """
    from normfuse.compile_only import summarize

    if op not in OPS + ("matmul_cluster", ):
        raise ValueError(f"unknown op {op!r}; choices: {', '.join(OPS + ('matmul_cluster', ))}")
    if op == "matmul":
        return _lp.compile_sm90("matmul", a, b, config=config)
    norm = "none" if op == "matmul_cluster" else _NORM_OF_OP[op]
    cfg = TilingConfig.from_dict(config)
    N = b.shape[1] if isinstance(b, torch.Tensor) and b.dim() == 2 else 8
    w = torch.empty(N, dtype=a.dtype, device=a.device) if affine and isinstance(a, torch.Tensor) else None
    bias = torch.empty(N, dtype=a.dtype, device=a.device) if affine and norm == "layer" and w is not None else None
    ln_vectors = None
    if norm == "lazy_layer":
        w = bias = None
        colsum = torch.empty(N, dtype=torch.float32, device=a.device) if colsum is None else colsum
        beta_b = torch.empty(N, dtype=torch.float32, device=a.device) if beta_b is None else beta_b
        _validate_lazy_ln(a, b, colsum, beta_b, eps)
        ln_vectors = (colsum, beta_b)
    (M, N, K), bn, _, args, kwargs = _prepare(a, b, w, bias, eps, norm, cfg, need_cuda=False, ln_vectors=ln_vectors)
    grid = _grid(cfg, M, None)
    compiled = _kernel(cfg).warmup(*args, grid=grid, **kwargs)
    ptx = compiled.asm["ptx"]
    out = summarize(compiled)
    out["ptx_extra"] = _ptx_extras(ptx)
    out["ptx_sha256"] = hashlib.sha256(ptx.encode()).hexdigest()  # identical kernels compare equal
    out["ttgir_cluster_sync"] = _ttgir_cluster_sync(compiled.asm["ttgir"])
    out["expect_tx_bytes"] = sorted({int(v) for v in re.findall(r"mbarrier\.arrive\.expect_tx[^\n]*, (\d+);", ptx)})
    if ptxas:
        out["ptxas"] = ptxas_info(ptx)
    out["grid"] = list(grid)
    out["block_n"] = bn
    out["config"] = cfg.to_dict()
    out["smem_estimate"] = cfg.smem_bytes(bn, 2 if norm in ("layer", "lazy_layer") else 1, a.element_size())
    return out


# ------------------------------------------------------------------------------------------------------------
# GPU self-check: python -m kernels_tlx.multi_cta [--quick] [--config NAME ...]
# ------------------------------------------------------------------------------------------------------------
# (M, N, K): each config runs the shapes it supports (TilingConfig.supports(N)). Odd M (1, 257, 129, 17793: a
# last M-tile of 1 row, consumer 1 wholly out of bounds), K tails and K < BLOCK_K, a last rank owning 8 columns
# (N = 264, 392, 456) or a partial slice (1000, 2000, 4000), persistent walks of several tiles per cluster.
_CHECK_SHAPES = [
    (1, 200, 1000),  # c1 (N <= 256), M = 1
    (257, 264, 1000),  # c2: rank 1 owns 8 columns
    (1000, 392, 72),  # c4 with BLOCK_N = 128: rank 3 owns 8 columns; 1 full + 1 partial K step
    (129, 456, 8),  # c8 with BLOCK_N = 64: rank 7 owns 8 columns; one mostly zero-filled K step
    (1000, 1000, 1000),  # c4 (BLOCK_N 256) / c8 (128) / c16 (64)
    (17793, 1000, 520),  # 140 M-tiles: every persistent cluster walks several, the last holds 1 row
    (4096, 2000, 1024),  # c8 (BLOCK_N 256: rank 7 owns 208) / c16 (128)
    (300, 4000, 264),  # c16 (BLOCK_N 256): the non-portable 16-CTA cluster
    # rows that fill the cluster (N == C * BLOCK_N: the unmasked LN_PACKED statistics, as at the benchmark N)
    (129, 512, 1000),  # c2 (BLOCK_N 256) / c4 (128) / c8 (64) / c16 (32)
    (1000, 1024, 520),  # c4 (256) / c8 (128) / c16 (64); 8 M-tiles
    (257, 2048, 72),  # c8 (256) / c16 (128); a last M-tile of 1 row
    # TILES_PER_CTA=2 (c2_t2: BLOCK_N 256): rank 1's second tile lies wholly past N = 600 (no valid column), its
    # first holds 88; c4_t2 at N = 1800: rank 3's second tile holds 8 columns
    (257, 600, 520),
    (1000, 1800, 264),
    # EPILOGUE_OVERLAP: walks of several M-tiles, so that the deferred epilogue runs inside the next mainloop
    # (K = 520) and, with K = 72 (2-3 K steps), mostly after it
    (17793, 200, 520),
    (40000, 200, 72),
    (40000, 1000, 72),
    (40000, 2000, 72),
    # FILL_IDLE_SMS: rows split between the cluster kernel and the filler (M >= 1408 at c4 / c8 on 132 SMs), at the
    # benchmark N with a K tail and M odd (the cluster kernel's last M-tile holds 1 row)
    (17793, 1024, 264),
    (17793, 2048, 264),
    (262144, 1024, 1024),  # blog shape (skipped by --quick)
]
_BENCH_SHAPES = [(262144, N, K) for K in (512, 1024, 2048) for N in (512, 1024, 2048, 4096)]
_MEAN_SHIFT = 30.0  # LayerNorm inputs: row means ~30x the row spread (E[x^2] - mean^2 would lose ~10 bits)
_EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}
_DEVICE = "cuda"


def _self_check(argv=None) -> int:
    """Every shipped config x both variants x affine on/off against the fp32 reference (``multi_cta.check``: y
    within the flash-attention tolerance, mean/rstd to 1e-3) at the ``_CHECK_SHAPES`` it supports, LayerNorm on
    mean-shifted inputs; bitwise determinism (a second launch must reproduce y and the statistics exactly); then
    (unless --quick / --no-bench) timings at M = 262144: cuBLAS, the torch.compile norm, this DSL's GEMM, the
    fused kernel and the same kernel without the norm (``matmul_cluster``), with % of the norm hidden.

    A hung launch (barrier deadlock) aborts the process after ``--hang-timeout`` seconds with a traceback, so the
    last ``[run ]`` line names the culprit. Outputs are NaN-poisoned through the caching allocator first."""
    import argparse
    import faulthandler
    import sys
    import time

    p = argparse.ArgumentParser(description="GPU correctness + speed check of the TLX multi-CTA norm-fusion kernels")
    p.add_argument("--config", action="append", choices=sorted(SHIPPED_CONFIGS),
                   help="config(s) to check, repeatable (default: all shipped)")
    p.add_argument("--quick", action="store_true", help="skip the M=262144 check and all timing")
    p.add_argument("--no-bench", action="store_true", help="correctness only")
    p.add_argument("--no-affine", action="store_true", help="skip the affine (weight/bias) checks")
    p.add_argument("--hang-timeout", type=float, default=120.0,
                   help="seconds before a hung launch aborts the process with a traceback")
    args = p.parse_args(argv)
    names = args.config or list(SHIPPED_CONFIGS)
    shapes = [s for s in _CHECK_SHAPES if not (args.quick and s[0] >= 262144)]
    print(f"triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"{_num_sms(torch.device(_DEVICE))} SMs", flush=True)

    def guarded(fn):
        faulthandler.dump_traceback_later(args.hang_timeout, exit=True, file=sys.__stderr__)
        try:
            out = fn()
            torch.cuda.synchronize()
            return out
        finally:
            faulthandler.cancel_dump_traceback_later()

    def call(variant, inp, eps, cfg):
        if variant == "rmsnorm":
            return matmul_rmsnorm(inp["a"], inp["b"], inp["weight"], eps=eps, config=cfg)
        return matmul_layernorm(inp["a"], inp["b"], inp["weight"], inp["bias"], eps=eps, config=cfg)

    failures = []
    for name in names:
        cfg = SHIPPED_CONFIGS[name]
        occ = None
        for (M, N, K) in shapes:
            if not cfg.supports(N):
                continue
            if occ is None:
                occ = guarded(lambda: cluster_occupancy(cfg, N))
                print(f"[info] {name}: {occ} co-resident clusters of {cfg.CLUSTER_SIZE} "
                      f"(persistent={cfg.PERSISTENT})", flush=True)
            if cfg.FILL_IDLE_SMS:  # the split the runs below make (the filler's rows are the last m_fill)
                m_fill, n_fill = fill_split(cfg, M, occ, _num_sms(torch.device(_DEVICE)))
                print(f"[info] {name} M={M} N={N}: rows {M - m_fill} + filler {m_fill} on {n_fill} clusters of "
                      f"{cfg.fill_config().CLUSTER_SIZE}", flush=True)
            for variant in _spec.VARIANTS:
                for affine in ((False,) if args.no_affine else (False, True)):
                    eps = _EPS[variant]
                    inp = _spec.make_inputs(M, N, K, dtype="bf16", device=_DEVICE, seed=M + N + K + affine,
                                            affine=affine, mean_shift=_MEAN_SHIFT if variant == "layernorm" else 0.0)
                    torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=_DEVICE)  # poison the allocator
                    print(f"[run ] {name:12s} {variant:9s} M={M:6d} N={N:5d} K={K:5d} affine={affine:d} ...", end=" ",
                          flush=True)
                    t0 = time.perf_counter()
                    out = guarded(lambda: call(variant, inp, eps, cfg))
                    res = _spec.check("fused", out, inp, eps, variant)
                    again = guarded(lambda: call(variant, inp, eps, cfg))
                    same = all(torch.equal(x, y) for x, y in zip(out, again))
                    ok = res["ok"] and same
                    if not ok:
                        failures.append(f"{name} {variant} {M}x{N}x{K} affine={affine}"
                                        + ("" if same else " (not deterministic)"))
                    stats = " ".join(f"{k}={v:.1e}" for k, v in res.items() if k.endswith("_rel_err") and k != "rel_err")
                    print(f"{'ok  ' if ok else 'FAIL'} max_abs={res['max_abs_err']:.3e} tol={res['tol']:.3e} {stats} "
                          f"bitwise-repeat={'yes' if same else 'NO'} ({time.perf_counter() - t0:.1f}s)", flush=True)
                    del out, again, inp
        torch.cuda.empty_cache()

    if not (args.quick or args.no_bench):
        from triton.testing import do_bench

        gemm_cfg = _lp.TilingConfig()  # the Lazy Pre-Norm module's default persistent 128x256x64 GEMM
        for (M, N, K) in _BENCH_SHAPES:
            inp = _spec.make_inputs(M, N, K, dtype="bf16", device=_DEVICE, seed=0)
            a, b = inp["a"], inp["b"]
            c = a @ b
            print(f"--- timing M={M} N={N} K={K} bf16 (do_bench median, L2 flushed) ---", flush=True)

            def bench(label, fn):
                guarded(fn)
                ms = guarded(lambda: do_bench(fn, return_mode="median"))
                print(f"{label:40s} {ms * 1e3:9.1f} us", flush=True)
                return ms

            t_cublas = bench("cublas a@b", lambda: a @ b)
            t_gemm = bench("tlx matmul (lazy_prenorm default)", lambda: matmul(a, b, config=gemm_cfg))
            for variant in _spec.VARIANTS:
                eps = _EPS[variant]
                torch._dynamo.reset()
                norm = torch.compile(lambda x, v=variant, e=eps: _spec._torch_norm(v, x, None, None, e),
                                     dynamic=False)
                t_norm = bench(f"torch.compile {variant} of C", lambda: norm(c))
                for name in names:
                    cfg = SHIPPED_CONFIGS[name]
                    if not cfg.supports(N):
                        continue
                    t_f = bench(f"tlx fused {variant} [{name}]", lambda: call(variant, inp, eps, cfg))
                    if cfg.RECOMPUTE_TILES:  # (no GEMM of its own: matmul_cluster refuses it)
                        print(f"{'':40s} hidden_dsl {100 * (t_gemm + t_norm - t_f) / t_norm:6.1f}%", flush=True)
                        continue
                    t_cg = bench(f"tlx cluster gemm (no norm) [{name}]", lambda: matmul_cluster(a, b, config=cfg))
                    best_gemm = min(t_gemm, t_cublas)
                    t_same = min(t_gemm, t_cg)  # vs the better of the DSL GEMM and this schedule's own GEMM
                    print(f"{'':40s} hidden_dsl {100 * (t_gemm + t_norm - t_f) / t_norm:6.1f}%  "
                          f"vs min(tlx GEMM, same-schedule GEMM) {100 * (t_same + t_norm - t_f) / t_norm:6.1f}%  "
                          f"vs best GEMM {100 * (best_gemm + t_norm - t_f) / t_norm:6.1f}%  "
                          f"norm epilogue cost {100 * (t_f - t_cg) / t_norm:6.1f}% of the norm, "
                          f"cluster schedule {100 * (t_cg - t_gemm) / t_gemm:+.1f}% of the GEMM", flush=True)
            del inp, a, b, c
            torch.cuda.empty_cache()

    print("ALL OK" if not failures else f"{len(failures)} FAILURE(S): " + "; ".join(failures), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(_self_check())
