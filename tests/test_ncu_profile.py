"""tools.ncu_profile on the CPU: every target names a real tiling entry, technique, impl and variant; the ncu CSV
parser and the summary table work on a small report of ncu's raw-page format."""

import pandas as pd
import pytest

from normfuse.techniques import get_technique
from tools import ncu_profile as npf


@pytest.mark.parametrize("name", sorted(npf.TARGETS))
def test_targets_resolve(name):
    t = npf.TARGETS[name]
    cfg = npf.load_tiling(t)
    assert "name" not in cfg and "impls" not in cfg and cfg
    spec = get_technique(t.technique)
    assert spec.kernel_function_name(t.impl, t.variant)
    assert npf.technique_eps(t.technique) > 0


def test_load_tiling_unknown_name():
    t = npf.Target("multi_cta", "multi_cta_h200.yaml", "no-such-entry", "fused", "layernorm", 128, 1024, 64)
    with pytest.raises(ValueError, match="no tlx tiling named 'no-such-entry'"):
        npf.load_tiling(t)


RAW = ('"ID","Kernel Name","gpu__time_duration.sum","smsp__inst_executed.sum",'
       '"smsp__pcsamp_warps_issue_stalled_barrier","smsp__pcsamp_warps_issue_stalled_barrier_not_issued",'
       '"smsp__pcsamp_warps_issue_stalled_wait"\n'
       '"","","ns","inst","","",""\n'
       '"0","_multi_cta_norm_kernel","1,234.5","{inst}","{bar}","7","{wait}"\n')


def _metrics(target, inst, bar, wait):
    return npf.parse_raw_csv(RAW.format(inst=inst, bar=bar, wait=wait)).assign(target=target)


def test_parse_raw_csv():
    m = _metrics("a", 100, 30, 70).set_index("metric")
    assert m.at["gpu__time_duration.sum", "value"] == 1234.5
    assert m.at["gpu__time_duration.sum", "unit"] == "ns"
    assert m.at["Kernel Name", "value"] == "_multi_cta_norm_kernel"


def test_parse_raw_csv_without_kernel_row():
    with pytest.raises(ValueError, match="no kernel row"):
        npf.parse_raw_csv('"ID","gpu__time_duration.sum"\n"","ns"\n')


def test_summarize_shares():
    metrics = pd.concat([_metrics("fused", 200, 30, 70), _metrics("gemm", 100, 90, 10)], ignore_index=True)
    md = npf.summarize(metrics.astype({"value": str}))
    assert "| warp instructions | 200 | 100 |" in md
    assert "| warp state: wait (% of samples) | 70.0 | 10.0 |" in md
    assert "| warp state: barrier (% of samples) | 30.0 | 90.0 |" in md
    assert "not_issued" not in md  # the _not_issued twins are not counted as reasons
    assert "| warp-state samples (all reasons, 'selected' = issuing) | 100 | 100 |" in md


def test_parse_raw_csv_skips_warnings():
    m = npf.parse_raw_csv("==WARNING== uncontrolled caches\n" + RAW.format(inst=1, bar=2, wait=3)).set_index("metric")
    assert m.at["smsp__inst_executed.sum", "value"] == 1
    with pytest.raises(ValueError, match="no header row"):
        npf.parse_raw_csv("==WARNING== nothing else\n")


SOURCE = ('"Kernel Name","_multi_cta_norm_kernel",\n'
          '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"Instructions Executed","stall_short_sb","stall_short_sb (Not Issued)"\n'
          '"0x10","      LDS.128 R4, [R2]","5","1","1,000","4","1"\n'
          '"0x20","@!P0  SHFL.BFLY PT, R5, R4, 0x4, 0x1f","9","2","3,000","0","0"\n'
          '"0x30","      SHFL.BFLY PT, R6, R5, 0x2, 0x1f","1","0","3,000","0","0"\n')


def test_parse_source_csv_top_lines():
    top = npf.parse_source_csv(SOURCE, n=2)
    assert list(top["Address"]) == ["0x20", "0x10"]  # most stall samples first
    assert "stall_short_sb" in top.columns and "stall_short_sb (Not Issued)" not in top.columns
    assert npf.parse_source_csv('"Kernel Name","k",\n') is None  # no source counters


def test_opcode_counts():
    ops = npf.opcode_counts(SOURCE).set_index("opcode")
    assert ops.at["SHFL", "inst"] == 6000 and ops.at["SHFL", "samples"] == 10  # predicate and modifiers dropped
    assert ops.at["SHFL", "lines"] == 2 and ops.at["LDS", "lines"] == 1
    assert ops.at["LDS", "inst"] == 1000


def test_from_csv(tmp_path):
    src = tmp_path / "csv"
    src.mkdir()
    (src / "fused.raw.csv").write_text(RAW.format(inst=200, bar=30, wait=70))
    (src / "fused.sass.csv").write_text(SOURCE)
    (src / "gemm.raw.csv").write_text(RAW.format(inst=100, bar=90, wait=10))
    out = tmp_path / "out"
    assert npf.main(["--out", str(out), "--from-csv", str(src)]) == 0
    assert set(pd.read_parquet(out / "metrics.parquet")["target"]) == {"fused", "gemm"}
    assert "| warp instructions | 200 | 100 |" in (out / "summary.md").read_text()
    assert set(pd.read_csv(out / "opcodes.csv")["target"]) == {"fused"}  # gemm has no source export
    assert "| fused | (not in TARGETS)" in (out / "summary.md").read_text()  # the header names each target
    (src / "fused.sass.csv").unlink()
    assert npf.main(["--out", str(out), "--from-csv", str(src)]) == 0
    assert not (out / "opcodes.csv").exists()  # no stale table of the earlier run


@pytest.mark.parametrize("setup, match", [
    (lambda d: None, "not a folder"),  # missing
    (lambda d: d.mkdir(), "no <target>.raw.csv files"),  # empty
    (lambda d: (d.mkdir(), (d / "k.raw.csv").write_text('"ID","x"\n"",""\n')), "k: ncu raw CSV has no kernel row"),
])
def test_from_csv_bad_input(tmp_path, capsys, setup, match):
    src = tmp_path / "csv"
    setup(src)
    with pytest.raises(SystemExit):
        npf.main(["--out", str(tmp_path / "out"), "--from-csv", str(src)])
    assert match in capsys.readouterr().err
