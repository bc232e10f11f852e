"""Tests of ``experiments/layer_bench.py`` on a CPU-only machine.

1. The CPU smoke (``--smoke``: tiny layer, fp16, Triton interpreter, eager) end to end in a subprocess: both variants,
   with and without QK-norm, pass the check against the fp64 layer; results.csv, summary.md and meta.json written.
2. The GPU code path (``run_gpu``) driven on the CPU: fp16 in the interpreter, no compilation and a stand-in for
   ``bench_graph_interleaved`` that calls every callable once and returns fixed samples: every row (layer variants,
   the 12 FC GEMMs with their fc_to_gemm dims, the norm pieces, the fused forwards) is produced with status ok, and
   the paired share won and the summary follow from the samples.
3. Units: ``median_ci`` (bootstrap interval contains the median, degenerate samples), ``projections`` of the
   Llama 3 8B layer equal ``normfuse.shapes.MODEL_PRESETS["llama3_8b"]``, ``bench_graph_interleaved`` rejects empty
   input.

The timed run itself needs the H200 (see the module docstring for the command).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from normfuse.testing import run_python_json


def test_smoke_cli(tmp_path):
    r = run_python_json(f"""
        import json
        from experiments import layer_bench
        out = layer_bench.main(["--smoke", "--out", {str(tmp_path)!r}, "--run-id", "t"])
        print(json.dumps(str(out)))
        """, env={"TRITON_INTERPRET": "1"}, timeout=900)
    out = tmp_path / "t"
    assert r == str(out)
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 4 and set(df["name"]) == {"torch_eager", "dropin"} and set(df["qk_norm"]) == {True, False}
    assert (df["status"] == "ok").all() and df["check_ok"].all(), df
    meta = json.loads((out / "meta.json").read_text())
    assert meta["experiment"] == "layer_bench" and meta["layer"]["hidden"] == 64 and "git_sha" in meta
    assert "correctness against fp64 only" in (out / "summary.md").read_text()


_DRY = r"""
import json, sys
from types import SimpleNamespace
import torch
from experiments import layer_bench as LB

def fake(fns, rounds=3, **kw):
    out = {}
    for i, (name, fn) in enumerate(fns.items()):
        fn()
        base = 2.0 if name == "torch_compile" else 1.0 + 0.1 * i
        out[name] = [base + 0.01 * k for k in range(rounds)]
    return out

args = SimpleNamespace(tokens=[32], seq=16, qk_norm=True, dsl="triton", config=None, rounds=5, skip_phases=False,
                       run_id="dry", out=sys.argv[1])
rt = LB.Runtime(device="cpu", dtype=torch.float16, bench=fake, compile=lambda f: f)
out = LB.run_gpu(args, rt=rt, cfg=LB.SMOKE)
print(json.dumps(str(out)))
"""


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    d = tmp_path_factory.mktemp("dry")
    out = run_python_json(_DRY, str(d), env={"TRITON_INTERPRET": "1"}, timeout=900)
    return pd.read_csv(f"{out}/results.csv"), (d / "dry" / "summary.md").read_text()


def test_dry_run_rows(dry):
    df, _ = dry
    assert "error" not in df or df["error"].isna().all(), df.get("error")
    assert (df["status"] == "ok").all()
    kinds = df.groupby("kind")["name"].apply(set).to_dict()
    assert kinds["layer"] == {"torch_compile", "dropin"}
    assert len(df[df.kind == "layer"]) == 4  # with and without QK-norm
    assert kinds["gemm"] == {f"{p}:{ph}" for p in ("qkv", "o", "gate_up", "down") for ph in ("fwd", "dgrad", "wgrad")}
    assert {"rmsnorm_fwd:torch_compile", "rmsnorm_fwd_bwd:torch_compile", "rms_norm_recompute:triton",
            "rms_norm_bwd:triton", "q_norm_fwd_bwd:torch_compile", "k_norm_fwd_bwd:torch_compile"} == kinds["norm"]
    assert kinds["fwd_phase"] == {f"{p}:{w}" for p in ("qkv", "gate_up") for w in ("lazy_fused", "rmsnorm+cublas",
                                                                                   "fold")}
    lay = df[df.kind == "layer"]
    assert lay["check_ok"].all() and (lay["worst_err_over_tol"] <= 1).all()


def test_dry_run_gemm_dims(dry):
    from experiments.layer_bench import SMOKE, projections
    from normfuse.shapes import fc_to_gemm

    df, _ = dry
    for r in df[df.kind == "gemm"].itertuples():
        fin, fout = projections(SMOKE)[r.projection]
        assert {k: getattr(r, k) for k in "MNK"} == fc_to_gemm(32, fin, fout, r.phase)


def test_dry_run_share_won(dry):
    df, summary = dry
    lay = df[(df.kind == "layer") & (df.name == "dropin")]
    # stand-in samples: torch_compile 2.00 + 0.01 k, dropin 1.1 + 0.01 k -> share (2 - 1.1) / 2 = 45 %
    assert lay["share_won"].between(0.44, 0.46).all()
    assert "## Layer" in summary and "share_won_%" in summary


def test_median_ci():
    from experiments.layer_bench import median_ci

    med, lo, hi = median_ci([1.0, 1.2, 0.9, 1.1, 1.05, 0.95, 1.0, 1.3])
    assert lo <= med <= hi and lo >= 0.9 and hi <= 1.3
    assert median_ci([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)


def test_llama_projections_match_the_preset():
    from experiments.layer_bench import LLAMA3_8B, projections
    from normfuse.shapes import MODEL_PRESETS

    assert projections(LLAMA3_8B) == MODEL_PRESETS["llama3_8b"]


def test_bench_interleaved_rejects_empty():
    from normfuse.timing import bench_graph_interleaved

    with pytest.raises(ValueError, match="at least one"):
        bench_graph_interleaved({})


def test_no_gpu_message():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    from experiments.layer_bench import main

    with pytest.raises(SystemExit, match="no CUDA device"):
        main(["--tokens", "8192"])
