"""Compile the FlashNormAttention ``gdpa`` kernels for sm_90a on a CPU-only machine and report, per (DSL, config, H):
registers, spill bytes (ptxas -v), shared memory, the static local-memory instruction counts in the SASS (LDL/STL)
and the code size (``sass_kb``: SASS instructions x 16 B; the head loops unrolled by ``static_range`` make it grow
with H).

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
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def ptxas_report(ck) -> dict:
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as tmp:
        src, cub = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ck.asm["ptx"])
        p = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(src), "-o", str(cub)], capture_output=True, text=True)
        log = p.stdout + p.stderr
        if p.returncode:
            raise RuntimeError(log[-2000:])
        sass = ""
        cuobjdump = Path(ptxas).parent / "cuobjdump"
        if cuobjdump.exists():
            sass = subprocess.run([str(cuobjdump), "-sass", str(cub)], capture_output=True, text=True).stdout
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return dict(regs=int(re.search(r"Used (\d+) registers", log).group(1)),
                spill_st=int(spills.group(1)), spill_ld=int(spills.group(2)),
                stack=int(re.search(r"(\d+) bytes stack frame", log).group(1)),
                STL=len(re.findall(r"\bSTL\b", sass)), LDL=len(re.findall(r"\bLDL\b", sass)),
                hgmma=len(re.findall(r"\bHGMMA\b", sass)), smem=int(ck.metadata.shared),
                sass_kb=round(16 * len(re.findall(r"^\s+/\*[0-9a-f]+\*/", sass, flags=re.M)) / 1024, 1),
                warps=int(ck.metadata.num_warps))


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
    from normfuse import compile_only

    compile_only.install(90)
    from normfuse.techniques import fna as T

    if a.dsl == "helion":
        from normfuse.compile_only import WarmupLauncher
        from kernels_helion import fna as K
    else:
        K = __import__(f"kernels_{a.dsl}.fna", fromlist=["fna"])
    for name, cfg in cfgs.items():
        for H in (int(h) for h in a.heads.split(",")):
            ins = T.compile_inputs(1000, H, 128, "bf16")
            try:
                if a.dsl == "helion":
                    bound, hcfg, args = K._bound("gdpa", *ins, 1e-5, cfg)
                    launcher = WarmupLauncher()
                    with K._live_args(bound, args), K._codegen_env(ins[0]):
                        bound.compile_config(hcfg)(*args, _launcher=launcher)
                    ck = launcher.last
                else:
                    ck = K.compile_sm90_kernel("gdpa", *ins, config=cfg)
                row = ptxas_report(ck)
            except Exception as e:  # noqa: BLE001  (a report line, not a crash)
                row = dict(error=f"{type(e).__name__}: {str(e)[:200]}")
            print(json.dumps(dict(dsl=a.dsl, config=name, H=H, **row)), flush=True)


if __name__ == "__main__":
    main()
