"""Every experiment composes, and its sweep expands to the points we expect."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from normfuse import sweep

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_composes(experiment):
    cfg = _compose(f"experiment={experiment}")
    assert cfg["experiment_name"] == experiment
    for mode in ("gpu", "cpu"):
        pts = sweep.expand_points(cfg, mode)
        assert pts and all(p["mode"] in ("gpu", "cpu", "interpret", "ref", "compile_only") for p in pts)


def test_blog_sweep_has_27_fused_points_per_tiling():
    cfg = _compose("experiment=lazy_prenorm_blog")
    pts = sweep.expand_points(cfg, "gpu")
    fused = [p for p in pts if p["impl"] == "fused"]
    # every tiling entry that serves the fused op (entries with ``impls: [gemm]`` are GEMMs only)
    n_tilings = sum(1 for d in ("triton", "helion", "tlx") for t in cfg["tiling"][d]
                    if "fused" in (t.get("impls") or ["fused"]))
    assert len(fused) == 9 * n_tilings and {p["dsl"] for p in fused} == {"triton", "helion", "tlx"}
    assert {(p["K"], p["N"]) for p in fused} == {(k, n) for k in (512, 1024, 2048) for n in (512, 1024, 2048)}
    assert all(p["M"] == 262144 and p["dtype"] == "bf16" for p in pts)
    base = [p for p in pts if p["dsl"] == "torch"]
    assert len(base) == 9 * 2


def test_dsl_subset_and_cpu_modes():
    cfg = _compose("experiment=smoke", "dsl=[triton,tlx]")
    pts = sweep.expand_points(cfg, "cpu")
    modes = {p["dsl"]: p["mode"] for p in pts}
    assert modes == {"torch": "cpu", "triton": "interpret", "tlx": "compile_only"}
    assert {p["dtype"] for p in pts if p["dsl"] == "tlx"} == {"bf16"}


def test_model_preset_shapes():
    cfg = _compose("experiment=lazy_prenorm_blog", "shape=llama3_8b")
    pts = sweep.expand_points(cfg, "gpu")
    assert {"M": 8192, "N": 28672, "K": 4096} in [{k: p[k] for k in "MNK"} for p in pts]


def test_bad_names_fail_clearly():
    with pytest.raises(Exception, match="experiment"):
        _compose("experiment=nope")
    cfg = _compose("experiment=smoke")
    cfg["baselines"] = ["cudnn"]
    with pytest.raises(ValueError, match="choices"):
        sweep.expand_points(cfg, "cpu")
    cfg = _compose("experiment=smoke")
    cfg["shape"] = {"points": [{"M": 4, "N": 15, "K": 16}]}
    with pytest.raises(ValueError, match="multiple of 8"):
        sweep.expand_points(cfg, "cpu")
    with pytest.raises(ValueError, match="choices"):
        sweep.resolve_mode("tpu")


@pytest.mark.parametrize("override, message", [
    ("technique.variant=foo", "unknown variant 'foo'"),
    ("technique.eps=-1", "technique.eps must be a finite number > 0"),
    ("dtype=fp8", "dtype='fp8' is not supported"),
    ("cpu_dtype=foo", "cpu_dtype='foo' is not supported"),
    ("timing.method=foo", "timing.method='foo' is not supported"),
])
def test_bad_values_stop_the_sweep_before_it_starts(override, message):
    """A bad value is an error naming it before any point runs, not a column of `unsupported` rows."""
    cfg = _compose("experiment=smoke", override)
    with pytest.raises(ValueError, match=message):
        sweep.expand_points(cfg, "cpu")


@pytest.mark.parametrize("override, message", [("timing.paired.order=random", "timing.paired.order"),
                                               ("timing.paired.settle=no", "timing.paired.settle")])
def test_bad_paired_order_or_settle_stops_before_a_run_folder(tmp_path, override, message):
    """A misspelt round order or a non-bool settle is a ValueError naming the key, raised before the run folder
    exists (no empty results/<experiment>/<run_id>/ left behind)."""
    cfg = _compose("experiment=smoke", override, f"results_dir={tmp_path}", "run_id=t", "mode=cpu")
    with pytest.raises(ValueError, match=message):
        sweep.run(cfg)
    assert not (tmp_path / cfg["experiment_name"]).exists()


def test_paired_code_defaults_match_config_yaml():
    """``sweep.PAIRED_DEFAULTS`` (what a cfg without timing.paired keys gets: the API, tests) and configs/config.yaml
    say the same for every key but the two that the YAML sets on purpose: ``rounds`` (0 = off without a config, 40
    with it) and ``max_window_s`` (60 s vs the experiments' 20 s)."""
    yaml = OmegaConf.to_container(OmegaConf.load(CONFIGS / "config.yaml"))["timing"]["paired"]
    assert set(yaml) == set(sweep.PAIRED_DEFAULTS)
    differ = {k for k in yaml if yaml[k] != sweep.PAIRED_DEFAULTS[k]}
    assert differ == {"rounds", "max_window_s"}, {k: (yaml[k], sweep.PAIRED_DEFAULTS[k]) for k in differ}
