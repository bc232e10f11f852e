"""CPU check of ``tools/cluster_fill_probe.py`` (TLX venv): its probe kernel builds for sm_90a as a cluster kernel
with the shared memory that keeps one CTA per SM, reads ``%smid`` and ``%globaltimer``, and triggers
``griddepcontrol.launch_dependents`` only as the primary grid. The probe itself needs the GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from normfuse.testing import run_python_json  # noqa: E402

_SCRIPT = r"""
import json, torch
from normfuse import compile_only
compile_only.install(90)
from tools import cluster_fill_probe as p
rec = torch.empty(12, dtype=torch.int64)
out = {}
for C, trig in ((4, True), (2, False)):
    ck = p._probe_kernel.warmup(rec, 1000, TRIGGER=trig, NBUF=p.NBUF, grid=(C,), num_warps=4, ctas_per_cga=(C, 1, 1))
    ptx = ck.asm["ptx"]
    out[str(C)] = dict(shared=ck.metadata.shared, smid=ptx.count("%smid"), timer=ptx.count("%globaltimer"),
                       trig=ptx.count("griddepcontrol.launch_dependents"), cluster=".reqnctapercluster" in ptx)
print(json.dumps(out))
"""


def test_probe_kernel_builds():
    r = run_python_json(_SCRIPT, timeout=300)
    for C, trig in (("4", 1), ("2", 0)):
        v = r[C]
        assert 228 * 1024 / 2 < v["shared"] <= 227 * 1024, v  # one CTA per SM
        assert v["smid"] >= 1 and v["timer"] >= 2 and v["cluster"] and v["trig"] == trig, v
