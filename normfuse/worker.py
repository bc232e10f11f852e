"""The measuring process: ``python -m normfuse.worker`` reads one JSON request per line on stdin and writes one
JSON reply per line on stdout. One long-lived worker runs per environment (upstream triton + helion, or
fbtriton for TLX); the orchestrator (``normfuse.pool``) never imports triton or helion itself.

A ``measure`` request names one sweep point (technique, dsl, impl, shape, dtype, eps, config, mode, seed). The
worker builds fresh seeded random inputs, runs the implementation once (compile + warm-up, timed as
``compile_s``), poisons the caching allocator with NaN, runs it again (fna_llm's pre-pass scratch NaN-filled
too, ``normfuse.scratch``) and checks that output against the fp32
reference (``normfuse.techniques.<technique>``). Only a correct point is timed. Modes:

* ``gpu``          — check, then time with ``normfuse.timing.bench``;
* ``interpret``    — Triton interpreter on the CPU (``TRITON_INTERPRET=1`` set by the pool), check only;
* ``ref``          — Helion eager reference mode on the CPU (``HELION_INTERPRET=1``), check only;
* ``compile_only`` — compile for sm_90 with a fake driver and report PTX markers (TLX's CPU check).

Paired timing (``prepare`` / ``replay`` / ``release``): the orchestrator prepares every participant of a shape
(checked first, exactly as ``measure``), then asks for one sample of each in alternating rounds.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
import traceback

UNSUPPORTED_ERRORS = ("ValueError", "TypeError", "NotImplementedError", "OutOfResources")
_COMPILE_ONLY_INSTALLED = False
_LAST_TLX_POINT = [""]


def _tlx_replica_stack() -> list | None:
    """fbtriton's thread-local stack of TLX async-task replica ids (None without the TLX front end)."""
    try:
        from triton.language.extra.tlx.compiler.code_generator import _get_region_replica_id_stack
    except ImportError:  # upstream triton
        return None
    return _get_region_replica_id_stack()


def _reset_tlx_frontend(point: str) -> None:
    """Before each TLX point: empty fbtriton's thread-local stack of async-task replica ids if an earlier compile left
    entries in it. The TLX code generator pushes and pops that stack around each async_task body without a
    try/finally (``triton/language/extra/tlx/compiler/code_generator.py``), so a compile that raised inside a task
    body leaves it non-empty (tests/tlx/test_worker_tlx_state_tlx.py). On the GPU, twice, a shipped config that
    passes on its own then failed to compile later in the same process with ``AssertionError:
    region_replica_id_stack is not restored`` (results/gpu_tests/20261201_h200_issue13_s3,
    results/gpu_tests/20261206_h100_fna_llm); on the CPU a stale entry alone did not make a later compile fail, so
    that this reset cures it is our reading, not shown. Each point then compiles with this stack as in a fresh process;
    what was cleared, and after which point, goes to stderr (``_build_checked`` also names the exception of a TLX
    point that leaves the stack dirty)."""
    stack = _tlx_replica_stack()
    if stack:
        print(f"normfuse.worker: fbtriton's TLX replica-id stack held {stack} after {_LAST_TLX_POINT[0] or 'startup'};"
              f" cleared before {point}", file=sys.stderr, flush=True)
        stack.clear()
    _LAST_TLX_POINT[0] = point


def versions() -> dict:
    """Versions of the packages that matter in this environment (absent ones are omitted), and the version and path
    of the ptxas its Triton compiles with (``get_ptxas``: ``TRITON_PTXAS_PATH`` when set, else Triton's own)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    import torch

    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    try:
        import triton

        out["triton"] = triton.__version__  # fbtriton reports e.g. 3.7.4+fb
    except Exception as e:  # noqa: BLE001
        out["triton"] = f"unavailable ({type(e).__name__})"
    for pkg in ("helion", "fbtriton"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    try:  # the ptxas that compiles this environment's kernels (TRITON_PTXAS_PATH or Triton's bundled one)
        from triton.backends.nvidia.compiler import get_ptxas

        tool = get_ptxas(90)
        out["ptxas"] = f"{tool.version} ({tool.path})"
    except Exception as e:  # noqa: BLE001
        out["ptxas"] = f"unavailable ({type(e).__name__})"
    return out


def _poison_allocator(shape, dtype, device) -> None:
    """Leave a NaN-filled block of the output's size in the caching allocator so that an output element the
    kernel never writes reads back as NaN (and fails the check) instead of as a stale correct value."""
    import torch

    if device != "cuda":
        return
    t = torch.empty(shape, dtype=dtype, device=device)
    t.fill_(float("nan"))
    del t


def _build_checked(req: dict):
    """Build the point's seeded inputs and zero-argument callable, run it once (compile + warm-up, timed as
    ``compile_s``), poison the allocator, run it again with NaN-filled ``normfuse.scratch`` buffers and check it
    against the fp32 reference.
    Returns ``(fn, inputs, row)``; ``row`` has status 'incorrect' (and ``fn`` None) when the check failed."""
    import torch

    from normfuse import registry
    from normfuse.scratch import poisoned_scratch
    from normfuse.techniques import get_technique

    spec = get_technique(req["technique"])
    dsl, impl, mode, variant = req["dsl"], req["impl"], req["mode"], req.get("variant")
    M, N = int(req["M"]), int(req["N"])
    K = int(req["K"]) if req.get("K") is not None else None
    eps, config, dtype = float(req.get("eps", 1e-6)), req.get("config") or {}, req.get("dtype", "bf16")
    options = req.get("options") or {}
    device = "cuda" if mode == "gpu" else "cpu"
    if mode == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("mode=gpu but torch.cuda.is_available() is False")
    if variant is not None and "variant" in inspect.signature(spec.make_inputs).parameters:
        options = {"variant": variant, **options}  # e.g. lazy_prenorm's LayerNorm inputs carry beta, colsum, beta_b
    t_start = time.perf_counter()
    ikey = (req["technique"], M, N, K, dtype, device, int(req.get("seed", 0)), json.dumps(options, sort_keys=True))
    if req.get("share_inputs") and _SHARED_INPUTS.get("key") == ikey:  # the participants of one paired window
        inputs = dict(_SHARED_INPUTS["inputs"])  # same tensors; keys a call adds stay its own
    else:
        inputs = spec.make_inputs(M, N, K, dtype=dtype, device=device, seed=int(req.get("seed", 0)), **options)
        _SHARED_INPUTS.clear()
        if req.get("share_inputs"):
            _SHARED_INPUTS.update(key=ikey, inputs=dict(inputs))
    t_inputs = time.perf_counter() - t_start
    details = {}
    if dsl == registry.BASELINE_DSL:
        fn = spec.baseline(impl, inputs, eps, variant)
        describe = getattr(spec, "baseline_details", None)  # e.g. which SDPA backend PyTorch dispatches to
        if describe is not None:
            details = describe(impl, inputs, variant) or {}
    else:
        if dsl == "tlx":
            _reset_tlx_frontend(f"{req['technique']} {impl} {variant} M={M} N={N} K={K} {options} {config}")
        fn = spec.kernel_call(registry.kernel_function(dsl, req["technique"], impl, variant), impl, inputs, eps,
                              config, variant)

    t0 = time.perf_counter()
    try:
        out = fn()  # first call: compile + warm-up
    except Exception as e:
        if dsl == "tlx" and _tlx_replica_stack():  # the point that leaves fbtriton's front end dirty, and why
            print(f"normfuse.worker: {type(e).__name__} in {_LAST_TLX_POINT[0]} left fbtriton's TLX replica-id stack "
                  f"at {_tlx_replica_stack()}: {str(e)[-300:]}", file=sys.stderr, flush=True)
        raise
    if device == "cuda":
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    first = out if isinstance(out, torch.Tensor) else out[0]
    _poison_allocator(first.shape, first.dtype, device)
    del out, first
    with poisoned_scratch():  # a kernel that reads its scratch (e.g. a pre-pass's k_n) before writing it shows NaN
        out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    check = spec.check(impl, out, inputs, eps, variant)
    del out
    row = {"compile_s": compile_s, "max_abs_err": check["max_abs_err"], "rel_err": check["rel_err"],
           "tol": check["tol"], "inputs_s": t_inputs, "check_s": time.perf_counter() - t0,
           **({"details": details} if details else {})}
    if not check["ok"]:
        return None, inputs, {**row, "status": "incorrect",
                              "error": f"max_abs_err {check['max_abs_err']:.3g} vs tol {check['tol']:.3g} "
                                       f"(rel_err {check['rel_err']:.2e}"
                              + "".join(f", {k} {v:.2e}" for k, v in check.items()
                                        if k.endswith("_rel_err") and k != "rel_err")
                              + "); not timed"}
    return fn, inputs, {**row, "status": "ok"}


def measure(req: dict) -> dict:
    """Check, then (in gpu mode) time one sweep point; returns the result fields of its row."""
    from normfuse import registry
    from normfuse.techniques import get_technique

    inject = req.get("inject")
    if inject == "crash":
        os._exit(3)
    if inject == "hang":
        time.sleep(10**6)
    mode = req["mode"]
    if mode == "compile_only":
        global _COMPILE_ONLY_INSTALLED
        from normfuse import compile_only

        if not _COMPILE_ONLY_INSTALLED:
            compile_only.install(90)
            _COMPILE_ONLY_INSTALLED = True
        spec = get_technique(req["technique"])
        M, N = int(req["M"]), int(req["N"])
        K = int(req["K"]) if req.get("K") is not None else None
        mod = registry.kernel_module(req["dsl"], req["technique"])
        t0 = time.perf_counter()
        summary = mod.compile_sm90(spec.kernel_function_name(req["impl"], req.get("variant")),
                                   *spec.compile_inputs(M, N, K, req.get("dtype", "bf16")),
                                   eps=float(req.get("eps", 1e-6)), config=req.get("config") or {})
        return {"status": "compile_only", "compile_s": time.perf_counter() - t0, "details": summary}

    fn, _inputs, row = _build_checked(req)
    if fn is None or mode != "gpu" or req.get("check_only"):
        return row
    from normfuse import timing

    t = timing.bench(fn, warmup_ms=float(req.get("warmup_ms", 25)), rep_ms=float(req.get("rep_ms", 100)),
                     method=req.get("timing", "do_bench"))
    return {**row, **t, "sm_clock_mhz": _sm_clock()}


# --- paired timing: participants prepared once, then sampled round by round by the orchestrator ----------------
_PREPARED: dict = {}  # handle -> (GraphPair or EagerSampler, inputs, fn)
_SHARED_INPUTS: dict = {}  # the last paired window's inputs (one entry: bounded memory)


def prepare(req: dict) -> dict:
    """Build and check one participant of a paired window (as ``measure`` does), then capture its
    :class:`normfuse.timing.GraphPair` and keep it under ``req['handle']`` for ``replay`` requests. Returns the
    check fields (status 'ok' or 'incorrect') and the graph's calls per sample ``graph_n``."""
    from normfuse import timing

    fn, inputs, row = _build_checked(req)
    if fn is None:
        return row
    t0 = time.perf_counter()
    try:
        pair = timing.GraphPair(fn, graph_ms=float(req.get("graph_ms", 3.0)))
        row["graph_n"], row["timing"] = pair.n, "paired"
    except RuntimeError as e:  # not capturable: eager (flush; fn) timed by events, and said so in the row
        import torch

        torch.cuda.synchronize()
        pair = timing.EagerSampler(fn)
        row["graph_n"], row["timing"] = 1, f"paired-eager (graph capture failed: {str(e)[:120]})"
    row["capture_s"] = time.perf_counter() - t0
    _PREPARED[req["handle"]] = (pair, inputs, fn)
    return row


def replay(req: dict) -> dict:
    """One sample (ms per call) of each prepared handle in ``req['handles']``, in that order."""
    return {"status": "ok", "ms": [_PREPARED[h][0].sample() for h in req["handles"]]}


def release(req: dict) -> dict:
    """Drop prepared participants (all, or ``req['handles']``) and their inputs."""
    for h in req.get("handles") or list(_PREPARED):
        pair = _PREPARED.pop(h, (None,))[0]
        if hasattr(pair, "close"):
            pair.close()
    if not _PREPARED:
        _SHARED_INPUTS.clear()
    return {"status": "ok", "prepared": len(_PREPARED)}


def validate_config(req: dict) -> dict:
    """Check tiling configs without compiling: ``req['configs']`` is a list of {dsl, technique, config}; each is
    built through its kernel module's ``TilingConfig.from_dict``. Returns the error messages (empty when all are
    valid). Used by the runner before a sweep, so a misspelt key stops the run instead of becoming rows."""
    from normfuse import registry

    errors = []
    for item in req["configs"]:
        try:
            # the module of the impl's kernel (multi_cta's 'gemm' is lazy_prenorm.matmul, with its own tilings)
            fn = registry.kernel_function(item["dsl"], item["technique"], item.get("impl", "fused"), item.get("variant"))
            cls = getattr(sys.modules[fn.__module__], "TilingConfig", None)
            if cls is not None:
                cls.from_dict(item.get("config") or {})
        except (ValueError, TypeError) as e:
            errors.append(f"{item['dsl']} {item['technique']} config {item.get('name')!r}: {e}")
    return {"status": "ok", "errors": errors}


_UUID = None


def device_uuid() -> str | None:
    """NVML-style UUID ('GPU-...') of the CUDA device this worker uses (device 0 of its visible devices)."""
    global _UUID
    if _UUID is None:
        try:
            import torch

            if torch.cuda.is_available():
                u = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
                _UUID = u if u.startswith("GPU-") else f"GPU-{u}"
        except Exception:  # noqa: BLE001
            _UUID = None
    return _UUID


def device_props() -> dict:
    """SM count, compute capability and L2 size (MB) of this worker's CUDA device ({} without CUDA)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {"sm_count": p.multi_processor_count, "compute_capability": f"{p.major}.{p.minor}",
                "l2_cache_mb": getattr(p, "L2_cache_size", 0) / 2**20, "gpu_uuid": device_uuid()}
    except Exception:  # noqa: BLE001
        return {}


def _sm_clock():
    from normfuse import hardware

    return hardware.sm_clock_mhz(uuid=device_uuid())


def handle(req: dict) -> dict:
    op = req.get("op", "measure")
    if op == "hello":
        return {"status": "ok", "pid": os.getpid(), "versions": versions(), "gpu": device_props(),
                "interpret": os.environ.get("TRITON_INTERPRET") == "1",
                "helion_ref": os.environ.get("HELION_INTERPRET") == "1"}
    if op == "calibrate":
        from normfuse import timing

        return {"status": "ok", **timing.calibrate()}
    ops = {"measure": measure, "prepare": prepare, "replay": replay, "release": release,
           "validate_config": validate_config}
    if op in ops:
        return ops[op](req)
    raise ValueError(f"unknown op {op!r}; choices: hello, calibrate, {', '.join(ops)}, exit")


def _exit_with_parent() -> None:
    """The pool starts workers in their own session (so that a hang can be killed as a group); if the
    orchestrator dies without closing them (SIGTERM, SIGKILL), leave too instead of computing on as an orphan."""
    import threading

    parent = os.getppid()

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def main() -> None:
    _exit_with_parent()
    # Keep the protocol channel clean: everything that libraries print goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        if req.get("op") == "exit":
            break
        try:
            reply = handle(req)
        except Exception as e:  # noqa: BLE001  (reported per point; the sweep goes on)
            name = type(e).__name__
            reply = {"status": "unsupported" if name in UNSUPPORTED_ERRORS else "error",
                     "error": f"{name}: {e}"[:2000], "traceback": traceback.format_exc()[-4000:]}
        finally:
            try:
                import torch

                if torch.cuda.is_available() and req.get("op") != "replay":  # replays: no allocator traffic
                    torch.cuda.empty_cache()
            except Exception:
                pass
        proto.write(json.dumps(reply, default=str) + "\n")
        proto.flush()


if __name__ == "__main__":
    main()
