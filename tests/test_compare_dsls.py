"""experiments.compare_dsls (the DSL side-by-side report) and normfuse.codestats: the curated YAML against the
code it cites, the code-size count, the aggregation on a synthetic run with known answers, the report on a subset
of the committed results, and one real sm_90a compile per environment (a small subset, for CI time)."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments import compare_dsls as C

ROOT = Path(__file__).resolve().parents[1]
# a cited function that claims a feature must show it in its source (TMA may be configured outside the kernel:
# the module is searched for it)
FEATURE_MARKERS = {"clusters": r"cluster", "dsmem": r"remote_shmem|remote|mapa",
                   "warp_specialization": r"async_tasks", "explicit_pipelining": r"alloc_barriers|barrier_expect",
                   "tma": r"descriptor|Descriptor|async_load|async_store|bulk"}


def _functions(path: Path) -> dict[str, str]:
    src = path.read_text()
    return {n.name: ast.get_source_segment(src, n) for n in ast.walk(ast.parse(src))
            if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def test_features_yaml_cites_code_that_exists_and_shows_the_feature():
    data = C.load_features()
    assert set(data["studies"]) == set(data["implementations"])
    for sid, impls in data["implementations"].items():
        for dsl, entry in impls.items():
            for kind in ("needed", "could_not", "workarounds"):
                for item in entry.get(kind, []):
                    path, _, func = item["where"].partition(":")
                    f = ROOT / path
                    assert f.is_file(), (sid, dsl, item)
                    assert path.startswith(f"kernels_{dsl}/"), f"{sid}.{dsl} cites another DSL's file: {path}"
                    if not func:
                        assert ast.get_docstring(ast.parse(f.read_text())), (sid, dsl, item)
                        continue
                    funcs = _functions(f)
                    assert func in funcs, f"{sid}.{dsl}: {func} not defined in {path}"
                    if kind == "needed":
                        rx = FEATURE_MARKERS[item["feature"]]
                        where = f.read_text() if item["feature"] == "tma" else funcs[func]
                        assert re.search(rx, where), f"{sid}.{dsl}: {item['feature']} not visible in {item['where']}"


def test_every_study_points_at_a_committed_run_and_kernel_modules():
    for sid, st in C.load_features()["studies"].items():
        d = C.run_dir(st)
        assert (d / "results.parquet").is_file() and (d / "meta.json").is_file(), (sid, d)
        for dsl in C.DSLS:
            assert (ROOT / f"kernels_{dsl}" / f"{st['technique']}.py").is_file()


def test_load_features_rejects_bad_entries(tmp_path):
    import yaml

    data = yaml.safe_load(C.FEATURES_YAML.read_text())
    data["implementations"]["norms"]["tlx"]["needed"][0]["feature"] = "tmem"
    bad = tmp_path / "f.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="unknown feature 'tmem'"):
        C.load_features(bad)
    data = yaml.safe_load(C.FEATURES_YAML.read_text())
    data["studies"]["norms"]["metric"] = "speed"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="metric 'speed'"):
        C.load_features(bad)


def test_kernel_sloc_splits_kernel_and_host(tmp_path):
    src = '''"""Module docstring
over two lines."""
import triton


@triton.jit
def _k(x_ptr, N):
    """kernel docstring"""
    # a comment
    i = 1

    return i


def host(x):
    return _k(x, 1)
'''
    f = tmp_path / "m.py"
    f.write_text(src)
    loc = C.kernel_sloc(f)
    assert loc["kernel"] == 4  # decorator, def, two statements
    assert loc["total"] == 7 and loc["host"] == 3  # + import, def, return
    assert loc["doc"] >= 3


def _synthetic_run(tmp_path, paired: bool):
    """Two shapes x three DSLs of a fused impl with known times; one incorrect row; one known_incorrect config."""
    rows = []
    t = {("triton", 1): 1.0, ("helion", 1): 2.0, ("tlx", 1): 0.5, ("triton", 2): 1.0, ("helion", 2): 1.0, ("tlx", 2): 4.0}
    for (dsl, n), ms in t.items():
        for cfg, extra in (("a", 0.0), ("b", 0.25)):
            rows.append(dict(technique="lazy_prenorm", variant="rmsnorm", dsl=dsl, impl="fused", M=64, N=8 * n, K=16,
                             config_name=cfg, config=json.dumps({"X": cfg}), status="ok", error=None,
                             p50_ms=ms + extra, compile_s=3.0 if cfg == "a" else 1.0, gbps=np.nan,
                             hidden_dsl=0.1 * n + (0.05 if dsl == "tlx" else 0.0) - extra))
    rows.append(dict(technique="lazy_prenorm", variant="rmsnorm", dsl="helion", impl="fused", M=64, N=8, K=16,
                     config_name="bad", config="{}", status="incorrect", error="max_abs_err 1.0 > tol",
                     p50_ms=np.nan, compile_s=np.nan, gbps=np.nan, hidden_dsl=np.nan))
    run = tmp_path / "results" / "exp" / "r1"
    run.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(run / "results.parquet")
    tiling = {"triton": [{"name": "a"}, {"name": "b"}], "helion": [{"name": "a"}, {"name": "b"},
                                                                  {"name": "bad", "known_incorrect": True}],
              "tlx": [{"name": "a"}]}
    (run / "meta.json").write_text(json.dumps({"git_sha": "abc", "config": {"tiling": tiling}}))
    if paired:
        pd.DataFrame([dict(technique="lazy_prenorm", variant="rmsnorm", M=64, N=8, K=16, dtype="bf16", replicate=r,
                           dsl="tlx", config_name="a", metric="hidden_dsl", median=0.15, ci_lo=0.10 + 0.01 * r,
                           ci_hi=0.20 - 0.01 * r) for r in (0, 1)]).to_parquet(run / "paired.parquet")
    return dict(title="synthetic", technique="lazy_prenorm", experiment="exp", run="r1", impl="fused",
                metric="hidden_dsl", compile={"variant": "rmsnorm", "M": 64, "N": 8, "K": 16})


@pytest.mark.parametrize("paired", [False, True])
def test_aggregation_on_a_synthetic_run(tmp_path, monkeypatch, paired):
    monkeypatch.setattr(C, "RESULTS", tmp_path / "results")
    st = _synthetic_run(tmp_path, paired)
    df, meta = C.load_rows(st)
    best = C.best_per_shape(st, df, meta)
    assert len(best) == 6 and set(best["config_name"]) == {"a"}  # config a is faster everywhere
    sp = C.speed_summary(best)
    assert sp["tlx"]["wins"] == 1 and sp["triton"]["wins"] == 1 and sp["helion"]["wins"] == 1  # tie at N=16
    assert sp["tlx"]["rel"] == pytest.approx(np.sqrt(1.0 * 0.25))  # fastest at N=8, 1/4 of the fastest at N=16
    assert sp["helion"]["rel"] == pytest.approx(np.sqrt(0.25 * 1.0))
    comp = C.compile_summary(st, df)
    assert comp["triton"] == dict(first_med=2.0, max=3.0, configs=2)  # per config max: a 3.0, b 1.0
    fails = C.failures(st, df, meta, {d: {"workarounds": []} for d in C.DSLS})
    kinds = {(f["dsl"], f["kind"], f["config"]) for f in fails}
    assert kinds == {("helion", "1 row(s) incorrect", "bad"), ("helion", "known_incorrect config", "bad")}
    ci = C.paired_intervals(st, best)
    if not paired:
        assert ci is None
    else:  # two replicates: median of medians, the widest interval, in %
        assert len(ci) == 1 and ci.iloc[0]["median"] == pytest.approx(15.0)
        assert (ci.iloc[0]["ci_lo"], ci.iloc[0]["ci_hi"]) == (pytest.approx(10.0), pytest.approx(20.0))
    jobs = C.sass_jobs({"studies": {"s": st}}, ["s"], ["tlx", "helion"], None)
    assert [j["config_name"] for j in jobs["helion"]] == ["a", "b", "bad"] and jobs["helion"][0]["config"] == {"X": "a"}
    assert [j["config_name"] for j in jobs["tlx"]] == ["a", "b"] and "triton" not in jobs


def test_merge_sass_replaces_only_recompiled_groups():
    old = pd.DataFrame(dict(study=["s", "s", "s"], dsl=["triton", "triton", "tlx"], config_name=["a", "a", "a"],
                            kernel_index=[0, 1, 0], regs=[10, 20, 30]))
    new = pd.DataFrame(dict(study=["s"], dsl=["triton"], config_name=["a"], kernel_index=[0], regs=[99]))
    m = C.merge_sass(old, new)
    assert sorted(zip(m["dsl"], m["regs"])) == [("tlx", 30), ("triton", 99)]


def test_report_on_committed_results(tmp_path):
    """The report for two committed studies, with the committed SASS table: markdown tables and their HTML."""
    committed = C.DEFAULT_OUT / C.SASS_CSV
    if committed.exists():
        shutil.copy(committed, tmp_path / C.SASS_CSV)
    C.main(["--out", str(tmp_path), "--studies", "norms,fna"])
    md = (tmp_path / "report.md").read_text()
    html = (tmp_path / "report.html").read_text()
    for title in ("Standalone RMSNorm / LayerNorm", "FlashNormAttention, the blog's gdpa module"):
        assert f"## {title}" in md
    assert "<h2>Standalone RMSNorm / LayerNorm" in html and "<h2>FlashNormAttention" in html
    assert "| triton " in md and "| tlx " in md and "% latency saved vs torch.compile" in md
    assert html.count("<table>") >= 5 and "<th " in html and "<td" in html
    assert "kernels_tlx/fna.py:_fna_gdpa_cluster_kernel" in md  # a cited claim reaches the report
    with pytest.raises(SystemExit, match="unknown studies"):
        C.main(["--out", str(tmp_path), "--studies", "nope"])


def _collect(tmp_path, dsl, config) -> pd.DataFrame:
    C.main(["--out", str(tmp_path), "--collect-sass", "--studies", "norms", "--dsls", dsl, "--configs", config])
    return pd.read_csv(tmp_path / C.SASS_CSV)


def test_collect_sass_one_triton_config(tmp_path):
    """A real sm_90a compile through the compile-only path, ptxas -v and cuobjdump (upstream environment)."""
    df = _collect(tmp_path, "triton", "row-auto")
    assert len(df) == 1, df
    r = df.iloc[0]
    assert r["kernel"] == "_rms_norm_kernel" and pd.isna(r["error"]), r.to_dict()
    assert 16 <= r["regs"] <= 255 and r["spill_st"] == 0 and r["sass_kb"] > 0 and r["cluster"] == 1
    assert r["compile_s"] > 0


def test_collect_sass_one_tlx_cluster_config(tmp_path):
    """The same through the fbtriton environment: a TLX cluster kernel reports its cluster size."""
    if not Path(C.env_python("tlx")).exists():
        pytest.skip(f"no TLX environment at {C.env_python('tlx')} (make venvs)")
    df = _collect(tmp_path, "tlx", "cluster2")
    r = df.iloc[0]
    assert pd.isna(r["error"]) and r["cluster"] == 2 and r["regs"] > 0, r.to_dict()


def test_collect_sass_names_the_fix_for_a_missing_interpreter(tmp_path, monkeypatch):
    """A DSL environment that does not exist: a ValueError naming its variable and ``make venvs``, not a raw
    FileNotFoundError from the subprocess."""
    monkeypatch.setenv("NORMFUSE_TLX_PYTHON", str(tmp_path / "no-venv-tlx" / "bin" / "python"))
    with pytest.raises(ValueError, match=r"make venvs.*NORMFUSE_TLX_PYTHON"):
        C.collect_sass({"tlx": [{"study": "s", "config_name": "c"}]})


@pytest.mark.gpu
def test_codestats_matches_the_driver_on_the_gpu():
    """On the H200: the registers and local memory that ``normfuse.codestats`` reads off ptxas for a compiled kernel
    are what the CUDA driver reports for the loaded kernel (``n_regs``; Triton's ``n_spills`` is the driver's local
    bytes per thread / 4, i.e. ptxas's stack frame / 4), for a light kernel and a heavy one (the gdpa head-loop
    kernel: ~245 registers)."""
    import torch

    from kernels_triton import fna as kf
    from kernels_triton import norms as kn
    from normfuse.codestats import ptxas_stats
    from normfuse.techniques import fna as T

    x = torch.empty(4096, 4096, dtype=torch.bfloat16, device="cuda")
    kernels = [kn.compile_sm90_kernel("rms_norm", x, config={})]
    ins = [t.cuda() if isinstance(t, torch.Tensor) else t for t in T.compile_inputs(1000, 4, 128, "bf16")]
    kernels.append(kf.compile_sm90_kernel("gdpa", *ins, config={"BLOCK_M": 64, "num_warps": 8, "head_loop": "range",
                                                                 "ln_stats": "onepass"}))
    for ck in kernels:
        ck._init_handles()
        s = ptxas_stats(ck)
        assert (s["regs"], s["stack"] // 4) == (ck.n_regs, ck.n_spills), (s, ck.n_regs, ck.n_spills)
        assert s["sass_kb"] > 0
