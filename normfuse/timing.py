"""Kernel timing, summarized as p20/p50/p80 in milliseconds. Compilation and warm-up happen before, outside the
samples. Three methods:

* ``do_bench`` — ``triton.testing.do_bench``: CUDA events around each call, 256 MB L2 flush before every call.
  Host-side launch cost is hidden behind the flush only while it is shorter than the flush (~80 us): Python
  wrappers that build TMA descriptors or bind arguments (Helion, TLX) add their host time to kernels shorter
  than that.
* ``cudagraph`` — ``triton.testing.do_bench_cudagraph``: replay of back-to-back calls; no launch gaps, no flush
  (inputs smaller than L2 stay hot).
* ``cudagraph_flush`` — GPU time with a cold L2 and no host cost: two CUDA graphs, ``n x (flush, fn)`` and
  ``n x flush``, replayed alternately (:class:`GraphPair`); each sample is ``(t_both - t_flush) / n`` of one replay
  pair. For the short kernels of the naive-fusion grid and the small-M norms.

The runner's *paired* timing (``timing.paired.rounds > 0``, ``normfuse.sweep``) keeps one :class:`GraphPair` per
implementation of a shape alive and samples them in alternating rounds, so that every derived metric (% hidden,
saving, fraction of SDPA) is computed per round from times taken under the same GPU state.
"""

from __future__ import annotations

import statistics


def bench(fn, *, warmup_ms: float = 25.0, rep_ms: float = 100.0, method: str = "do_bench") -> dict:
    """Time ``fn()`` on the current CUDA device; return {p20_ms, p50_ms, p80_ms, mean_ms, n_samples, timing}.

    ``method='do_bench'`` flushes L2 before each call (cold-cache kernel time); ``'cudagraph'`` replays a graph
    of back-to-back calls (no flush, no launch gaps). ``warmup_ms``/``rep_ms`` are durations, as in Triton.
    Raises ValueError for an unknown method.
    """
    from triton.testing import do_bench, do_bench_cudagraph

    if method == "do_bench":
        times = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
    elif method == "cudagraph":
        times = do_bench_cudagraph(fn, rep=rep_ms, return_mode="all")
    elif method == "cudagraph_flush":
        try:
            times = bench_graph_flush(fn, rep_ms=rep_ms)
        except RuntimeError as e:  # not capturable (host sync in fn): fall back, and say so in the row
            import torch

            torch.cuda.synchronize()
            times = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
            times = sorted(float(t) for t in (times if isinstance(times, (list, tuple)) else [times]))
            return {**summarize(times), "timing": f"do_bench (graph capture failed: {str(e)[:120]})"}
    else:
        raise ValueError(f"unknown timing method {method!r}; choices: do_bench, cudagraph, cudagraph_flush")
    times = sorted(float(t) for t in (times if isinstance(times, (list, tuple)) else [times]))
    return {**summarize(times), "timing": method}


def bench_graph_flush(fn, *, rep_ms: float = 100.0, flush_bytes: int = 256 << 20, graph_ms: float = 3.0) -> list[float]:
    """Per-call GPU times (ms) of ``fn`` with L2 flushed before each call and no host launch cost: a
    :class:`GraphPair` replayed for about ``rep_ms`` (at least 10 samples, at most 1000). ``fn`` must be capturable
    (no host synchronization); RuntimeError otherwise."""
    pair = GraphPair(fn, flush_bytes=flush_bytes, graph_ms=graph_ms)
    try:
        pair.sample()  # warm-up
        out, spent = [], 0.0
        while spent < rep_ms or len(out) < 10:
            out.append(pair.sample())
            spent += pair.last_replay_ms
            if len(out) >= 1000:
                break
        return out
    finally:
        pair.close()


_FLUSH_BUFFERS: dict = {}  # (device, bytes) -> int32 buffer zeroed to evict L2


def flush_buffer(flush_bytes: int = 256 << 20):
    """The int32 CUDA buffer whose ``zero_()`` evicts L2 before a timed call: one per (device, size) and process,
    shared by every sampler here (a worker holding many participants allocates it once)."""
    import torch

    key = (torch.cuda.current_device(), flush_bytes)
    if key not in _FLUSH_BUFFERS:
        _FLUSH_BUFFERS[key] = torch.empty(flush_bytes // 4, dtype=torch.int32, device="cuda")
    return _FLUSH_BUFFERS[key]


class GraphPair:
    """Two CUDA graphs of one zero-argument callable: ``g_both = n x (flush; fn)`` and ``g_flush = n x flush``.

    ``sample()`` replays both and returns ``(t_both - t_flush) / n`` in ms: the GPU time of one call with a cold L2
    and no host launch cost. ``n`` is chosen so that ``g_both`` takes about ``graph_ms`` (3..200 calls, or 1 for
    calls longer than ``graph_ms``). The paired timing of the runner keeps one GraphPair per participant alive and
    takes one sample per participant per round. Outputs that ``fn`` allocates come from the graph's private pool
    and are reused across the ``n`` calls. Raises RuntimeError when ``fn`` cannot be captured."""

    def __init__(self, fn, *, flush_bytes: int = 256 << 20, graph_ms: float = 3.0):
        import torch

        cache = flush_buffer(flush_bytes)
        self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def body():
            cache.zero_()
            fn()

        torch.cuda.synchronize()
        self._start.record()
        for _ in range(3):
            body()
        self._end.record()
        self._end.synchronize()
        t_est = max(self._start.elapsed_time(self._end) / 3, 1e-3)  # eager estimate (host cost included: high)
        self.n = 1 if t_est >= graph_ms else int(min(200, max(3, graph_ms / t_est)))
        graphs = []
        for b in (body, cache.zero_):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(self.n):
                    b()
            graphs.append(g)
        self.g_both, self.g_flush = graphs
        self.last_replay_ms = 0.0

    def _replay(self, g) -> float:
        self._start.record()
        g.replay()
        self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end)

    def sample(self) -> float:
        """One paired sample, ms per call; ``last_replay_ms`` holds the GPU time the two replays took."""
        tb, tf = self._replay(self.g_both), self._replay(self.g_flush)
        self.last_replay_ms = tb + tf
        return (tb - tf) / self.n

    def close(self) -> None:
        self.g_both = self.g_flush = None


class EagerSampler:
    """The fallback of :class:`GraphPair` for callables that cannot be captured (same ``sample()``): L2 flush, then
    CUDA events around one call; host launch cost is included where the GPU waits for it."""

    def __init__(self, fn, *, flush_bytes: int = 256 << 20):
        import torch

        self.fn, self.n = fn, 1
        self.cache = flush_buffer(flush_bytes)
        self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def sample(self) -> float:
        self.cache.zero_()
        self._start.record()
        self.fn()
        self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end)


def bench_graph_interleaved(fns: dict, *, rounds: int = 20, graph_ms: float = 60.0, flush_bytes: int = 256 << 20,
                            max_calls: int = 200) -> dict[str, list[float]]:
    """Paired per-round GPU times (ms per call) of several callables, for comparing variants of one computation.

    The graph-replay method of ``bench_graph_flush``, made paired: every ``fn`` is captured once as ``g_fn = n x
    (flush; fn)`` and a flush-only graph ``g_flush = n x flush`` is captured with the same ``n`` (chosen so that the
    slowest ``g_fn`` takes about ``graph_ms``; 1 <= n <= ``max_calls``); each of ``rounds`` rounds replays all of them
    once, in an order rotated by one position every round (no variant always runs first or right after the flush),
    and records ``(t_fn - t_flush) / n``. Sample ``i`` of every ``fn`` is from round ``i``: differences and ratios
    between variants can be taken per round (paired). Each ``fn`` is called three times on a side stream before
    capture (compilation, autotuning, allocator warm-up, as the CUDA-graph docs prescribe) and must then be
    capturable (no host synchronization); outputs come from its graph's private pool. Returns ``{name: [ms, ...]}``.
    Raises ValueError for an empty ``fns`` or ``rounds < 1``."""
    import torch

    if not fns or rounds < 1:
        raise ValueError("bench_graph_interleaved needs at least one callable and rounds >= 1")
    cache = flush_buffer(flush_bytes)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    est = {}
    with torch.cuda.stream(side):
        for name, fn in fns.items():
            fn(), fn()
            start.record()
            fn()
            end.record()
            end.synchronize()
            est[name] = max(start.elapsed_time(end), 1e-3)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    n = int(min(max_calls, max(1, graph_ms / max(est.values()))))

    def capture(body):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                body()
        return g

    try:
        graphs = {name: capture(lambda fn=fn: (cache.zero_(), fn())) for name, fn in fns.items()}
        graphs[None] = capture(cache.zero_)
    except RuntimeError:  # not capturable (e.g. an autograd step whose AccumulateGrad nodes live on another stream)
        torch.cuda.synchronize()
        return bench_eager_interleaved(fns, rounds=rounds, calls=n, flush=cache)

    def replay(g) -> float:
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    names = list(graphs)
    for name in names:  # one untimed replay each
        replay(graphs[name])
    out = {name: [] for name in fns}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        t = {name: replay(graphs[name]) for name in order}
        for name in fns:
            out[name].append((t[name] - t[None]) / n)
    del graphs
    return Samples(out, method="graph")


class Samples(dict):
    """``{name: [ms per round]}`` of an interleaved benchmark, with ``method`` = 'graph' (CUDA-graph replay) or
    'eager' (``bench_eager_interleaved``: the callables could not be captured)."""

    def __init__(self, data: dict, method: str):
        super().__init__(data)
        self.method = method


def bench_eager_interleaved(fns: dict, *, rounds: int = 20, calls: int = 1, flush=None) -> dict[str, list[float]]:
    """``bench_graph_interleaved`` without graphs, for callables that cannot be captured: each round calls every
    ``fn`` ``calls`` times (after an L2 flush) in rotated order, timed by CUDA events on the current stream, and
    records ms per call. Host launch cost is included where the GPU waits for it (negligible for the ms-scale
    layer steps this is used for). Returns ``{name: [ms, ...]}``."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    names = list(fns)
    out = {name: [] for name in names}
    for r in range(rounds + 1):  # round 0: untimed warm-up
        for name in names[r % len(names):] + names[:r % len(names)]:
            if flush is not None:
                flush.zero_()
            start.record()
            for _ in range(calls):
                fns[name]()
            end.record()
            end.synchronize()
            if r:
                out[name].append(start.elapsed_time(end) / calls)
    return Samples(out, method="eager")


def summarize(times_ms: list[float]) -> dict:
    """p20/p50/p80 (linear interpolation), mean and count of a list of times in ms."""
    if not times_ms:
        raise ValueError("no timing samples")
    if len(times_ms) == 1:
        t = times_ms[0]
        return {"p20_ms": t, "p50_ms": t, "p80_ms": t, "mean_ms": t, "n_samples": 1}
    q = statistics.quantiles(times_ms, n=10, method="inclusive")  # deciles: q[1]=p20, q[4]=p50, q[7]=p80
    return {"p20_ms": q[1], "p50_ms": q[4], "p80_ms": q[7], "mean_ms": statistics.fmean(times_ms),
            "n_samples": len(times_ms)}


def calibrate(device: str = "cuda", copy_bytes: int = 2 << 30, gemm_n: int = 8192) -> dict:
    """Measure the two ceilings once: device-to-device copy bandwidth (bytes read + written, TB/s) and cuBLAS
    bf16 ``gemm_n``³ on random data (TFLOP/s). Medians of do_bench."""
    import torch

    src = torch.empty(copy_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    t_copy = bench(lambda: dst.copy_(src))["p50_ms"]
    src = dst = None  # free 2 x copy_bytes before the GEMM
    a = torch.randn(gemm_n, gemm_n, dtype=torch.bfloat16, device=device)
    b = torch.randn(gemm_n, gemm_n, dtype=torch.bfloat16, device=device)
    t_mm = bench(lambda: a @ b, rep_ms=300)["p50_ms"]
    return {"copy_tbps": 2 * copy_bytes / t_copy / 1e9, "copy_bytes": copy_bytes,
            "cublas_bf16_tflops": 2 * gemm_n**3 / t_mm / 1e9, "cublas_n": gemm_n}
