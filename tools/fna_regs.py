"""Compile the FlashNormAttention ``gdpa`` kernels for sm_90a on a CPU-only machine and report, per (DSL, config, H):
registers, spill bytes (ptxas -v), shared memory, the static local-memory instruction counts in the SASS (LDL/STL)
and the code size (``sass_kb``: SASS instructions x 16 B; the head loops unrolled by ``static_range`` make it grow
with H). The statistics come from ``normfuse.codestats`` (shared with ``experiments.compare_dsls``).

Usage (from the repo root; TLX needs the fbtriton environment)::

    .venv/bin/python tools/fna_regs.py triton [--heads 2,3,4] [--configs '{"name": {...}}']
    .venv/bin/python tools/fna_regs.py helion
    .venv-tlx/bin/python tools/fna_regs.py tlx

Without ``--configs`` it compiles every entry of ``configs/tiling/fna_h200.yaml`` for that DSL. Shape: the blog's
D = 128, Lkv = 128, bf16, max_len 1000 (the compiled code does not depend on max_len or the batch).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from normfuse.codestats import compile_stats, ptxas_stats  # noqa: E402

ptxas_report = ptxas_stats  # the name the fna tests import


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dsl", choices=("triton", "helion", "tlx"))
    ap.add_argument("--heads", default="2,3,4")
    ap.add_argument("--configs", default=None, help="JSON {name: config}; default: the shipped tiling list")
    a = ap.parse_args()
    if a.configs:
        cfgs = json.loads(a.configs)
    else:
        import yaml

        cfgs = {c["name"]: {k: v for k, v in c.items() if k != "name"}
                for c in yaml.safe_load((ROOT / "configs/tiling/fna_h200.yaml").read_text())[a.dsl]}
    for name, cfg in cfgs.items():
        for H in (int(h) for h in a.heads.split(",")):
            try:
                row = compile_stats(a.dsl, "fna", "fused", None, 1000, H, 128, cfg, eps=1e-5)[0]
            except Exception as e:  # noqa: BLE001  (a report line, not a crash)
                row = dict(error=f"{type(e).__name__}: {str(e)[:200]}")
            print(json.dumps(dict(dsl=a.dsl, config=name, H=H, **row)), flush=True)


if __name__ == "__main__":
    main()
