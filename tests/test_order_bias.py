"""tools/order_bias.py: the after-switch labelling on small synthetic paired-rounds files (no GPU)."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from normfuse import sweep
from tools import order_bias as ob

SHAPE = {"technique": "norms", "variant": "rmsnorm", "M": 4096, "N": 512, "K": None, "dtype": "bf16"}
PARTS = [("torch", "torch_compile_norm", "-"), ("triton", "norm", "a"), ("triton", "norm", "b"),
         ("helion", "norm", "c"), ("tlx", "norm", "d"), ("tlx", "norm", "e")]


def proc(p):
    return "tlx" if p[0] == "tlx" else "upstream"


def sequence_rows(orders, window=0, replicate=0, effect=-0.01, with_position=False):
    """Rows of one window replayed in ``orders`` (one list of participants per round); a sample right after the
    other process reads ``1 + effect`` of its base time (base: 1.0 + 0.1 * index of the participant)."""
    rows, prev = [], None
    for r, order in enumerate(orders):
        for pos, p in enumerate(order):
            base = 1.0 + 0.1 * PARTS.index(p)
            ms = base * (1 + effect) if prev is not None and proc(prev) != proc(p) else base
            row = {**SHAPE, "replicate": replicate, "window": window, "round": r, "dsl": p[0], "impl": p[1],
                   "config_name": p[2], "ms": ms}
            if with_position:
                row["position"] = pos
            rows.append(row)
            prev = p
    return rows


def rotated(parts, rounds):
    return [sweep.round_order(parts, r, "rotated", None) for r in range(rounds)]


def write(path, rows, gz=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


def by_participant(parts_table, run):
    t = parts_table[parts_table["run"] == run]
    return t.set_index("participant")


def test_rotated_first_participants_after_switch(tmp_path):
    rows = sequence_rows(rotated(PARTS, 30)) + sequence_rows(rotated(PARTS, 30), window=1)
    write(tmp_path / "norms_x" / "run" / "rep0" / "paired_rounds.jsonl.gz", rows, gz=True)
    runs, parts, _ = ob.analyse(tmp_path)
    assert list(runs["run"]) == ["norms_x/run"] and runs.iloc[0]["order"] == "rotated"
    assert runs.iloc[0]["windows"] == 2
    t = by_participant(parts, "norms_x/run")
    # the first listed participant (and the first TLX one) follow the other process's block in every round
    assert t.loc["torch/torch_compile_norm/-", "share_after"] == pytest.approx(1.0)
    assert t.loc["tlx/norm/d", "share_after"] == pytest.approx(1.0)
    assert set(t.index[t["systematic"]]) == {"torch/torch_compile_norm/-", "tlx/norm/d"}
    # the others only at round boundaries (at most one round in len(PARTS))
    assert (t.loc[~t["systematic"], "share_after"] <= 1.0 / len(PARTS) + 1e-9).all()
    # the boundary switches measure the planted -1 % and the systematic participants get it as their estimate
    assert runs.iloc[0]["upstream_effect_pct"] == pytest.approx(-1.0)
    assert runs.iloc[0]["tlx_effect_pct"] == pytest.approx(-1.0)
    assert t.loc["torch/torch_compile_norm/-", "bias_est_pct"] == pytest.approx(-1.0)
    assert t.loc["triton/norm/b", "bias_est_pct"] == pytest.approx(0.0)


def test_shuffled_direct_bias(tmp_path):
    rng = random.Random(1)
    rows = sequence_rows([rng.sample(PARTS, len(PARTS)) for _ in range(200)], with_position=True)
    write(tmp_path / "t" / "run" / "paired_rounds.jsonl", rows)
    runs, parts, _ = ob.analyse(tmp_path)
    assert runs.iloc[0]["order"] == "shuffled"
    t = by_participant(parts, "t/run")
    # 2 of 6 participants in tlx: a tlx sample follows an upstream one ~4/5 of the time, upstream ~2/5
    assert t.loc["tlx/norm/e", "share_after"] == pytest.approx(0.8, abs=0.08)
    assert t.loc["triton/norm/a", "share_after"] == pytest.approx(0.4, abs=0.08)
    assert t.loc["tlx/norm/e", "bias_pct"] == pytest.approx(-1.0, abs=1e-6)  # median of all = the after-switch time


def test_position_is_honoured(tmp_path):
    a, b, d = PARTS[0], PARTS[1], PARTS[4]
    rows = sequence_rows([[a, b, d]] * 20, with_position=True)  # replayed a, b, d: a after d, b after a, d after b
    shuffled = []
    for r in range(20):  # the file holds each round as b, a, d: only position gives the replay order
        rr = [x for x in rows if x["round"] == r]
        shuffled += [rr[1], rr[0], rr[2]]
    write(tmp_path / "t" / "run" / "paired_rounds.jsonl", shuffled)
    t = by_participant(ob.analyse(tmp_path)[1], "t/run")
    assert t.loc["torch/torch_compile_norm/-", "share_after"] == pytest.approx(1.0)
    assert t.loc["triton/norm/a", "share_after"] == pytest.approx(0.0)
    assert t.loc["tlx/norm/d", "share_after"] == pytest.approx(1.0)
    # without position the same file order is the replay order: b after the previous round's d
    for x in shuffled:
        del x["position"]
    write(tmp_path / "t" / "run" / "paired_rounds.jsonl", shuffled)
    t = by_participant(ob.analyse(tmp_path)[1], "t/run")
    assert t.loc["triton/norm/a", "share_after"] == pytest.approx(1.0)
    assert t.loc["torch/torch_compile_norm/-", "share_after"] == pytest.approx(0.0)


def test_one_process_windows_skipped(tmp_path):
    up = [p for p in PARTS if p[0] != "tlx"]
    write(tmp_path / "t" / "only_upstream" / "paired_rounds.jsonl", sequence_rows(rotated(up, 10)))
    mixed = sequence_rows(rotated(up, 10)) + sequence_rows(rotated(PARTS, 12), window=1)
    write(tmp_path / "t" / "mixed" / "paired_rounds.jsonl", mixed)
    runs, parts, _ = ob.analyse(tmp_path)
    assert list(runs["run"]) == ["t/mixed"]
    assert runs.iloc[0]["windows"] == 1
    assert set(parts["run"]) == {"t/mixed"}
    assert (parts["windows"] == 1).all()


def test_markdown_lists_systematic(tmp_path):
    write(tmp_path / "t" / "run" / "paired_rounds.jsonl", sequence_rows(rotated(PARTS, 12)))
    md = ob.markdown(*ob.analyse(tmp_path))
    assert "python -m tools.order_bias --write" in md
    assert "`torch/torch_compile_norm/-` -1.00" in md


def test_systematic_is_judged_per_window(tmp_path):
    """The first TLX entry of the list can differ between windows (another shape, another best config): a
    participant that follows the other process in every round of one window is systematic there even when its
    share over all its windows stays below the threshold."""
    other = [PARTS[0], PARTS[1], PARTS[2], PARTS[3], PARTS[5], PARTS[4]]  # window 1: tlx "e" listed first
    rows = sequence_rows(rotated(PARTS, 30)) + sequence_rows(rotated(other, 30), window=1)
    write(tmp_path / "norms_x" / "run" / "paired_rounds.jsonl", rows)
    _, parts, _ = ob.analyse(tmp_path)
    t = by_participant(parts, "norms_x/run")
    for who in ("tlx/norm/d", "tlx/norm/e"):
        assert t.loc[who, "share_after"] < ob.SYSTEMATIC  # about half over both windows
        assert t.loc[who, "systematic_windows"] == 1 and t.loc[who, "systematic"]
    assert t.loc["torch/torch_compile_norm/-", "systematic_windows"] == 2
    assert not t.loc["triton/norm/a", "systematic"]
