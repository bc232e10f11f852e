"""The sweep worker's guard against fbtriton's TLX front-end state (``normfuse.worker._reset_tlx_frontend``): a TLX
compile that fails inside an async_task body leaves an entry on the code generator's thread-local replica-id stack
(it is pushed and popped without a try/finally); before each TLX point the worker empties it and says so on stderr.
Subprocess: the compile-only fake driver is process-global."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

REPO = Path(__file__).resolve().parents[2]

SCRIPT = '''
import torch, triton, triton.language as tl
import triton.language.extra.tlx as tlx
from normfuse.compile_only import install
install(90)
from triton.language.extra.tlx.compiler.code_generator import _get_region_replica_id_stack
from normfuse import worker

@triton.jit
def kernel(X, BAD: tl.constexpr):
    bars = tlx.alloc_barriers(num_barriers=1, arrive_count=1)
    with tlx.async_tasks():
        with tlx.async_task("default"):
            tlx.barrier_arrive(bars[0], 1)
        with tlx.async_task(num_warps=4, registers=232, replicate=2):
            tlx.barrier_wait(bars[0], 0)
            offs = tl.arange(0, 128)
            tl.static_assert(not BAD, "fails inside the task body")
            tl.store(X + offs, tl.load(X + offs) * 2)

x = torch.empty(128, dtype=torch.bfloat16)
worker._reset_tlx_frontend("first point")
try:
    kernel.warmup(x, BAD=True, grid=(1,), num_warps=4)
except Exception:
    pass
print("left", list(_get_region_replica_id_stack()))
worker._reset_tlx_frontend("second point")
print("after reset", list(_get_region_replica_id_stack()))
kernel.warmup(x, BAD=False, grid=(1,), num_warps=4)
print("compiled")
'''


def test_failed_task_body_compile_leaves_state_that_the_worker_clears(tmp_path):
    script = tmp_path / "tlx_state.py"  # @jit needs its source in a file
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "left [0]" in r.stdout and "after reset []" in r.stdout and "compiled" in r.stdout, r.stdout
    assert "held [0] after first point; cleared before second point" in r.stderr, r.stderr[-2000:]
