"""FlashNormAttention (technique ``fna``, variant gdpa) spec: inputs, reference against an independent per-sequence
loop, the padded baseline's equivalence, tolerance (with negative controls), the saving metric, configs."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from normfuse import metrics, sweep
from normfuse.techniques import fna as T
from normfuse.techniques import get_technique


def _loop_reference(inp, eps):
    """Per sequence, per token, per head in fp64, straight from the blog's pseudocode."""
    q, k, v, o = inp["q"].double(), inp["k"].double(), inp["v"].double(), inp["q_offsets"].long()
    out = torch.empty_like(q)
    H, D = q.shape[1:]
    for b in range(k.shape[0]):
        x = q[o[b]:o[b + 1]].reshape(-1, H * D)
        if not len(x):
            continue
        mu = x.mean(-1, keepdim=True)
        ln = (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)
        lnh = ln.view(-1, H, D)
        g = torch.stack([T.gelu_tanh(lnh[:, h] @ k[b, :, h].T) @ v[b, :, h] for h in range(H)], 1).reshape(-1, H * D)
        r = g + ln
        out[o[b]:o[b + 1]] = (r / torch.sqrt((r * r).mean(-1, keepdim=True) + eps) + x).view(-1, H, D)
    return out


def test_make_inputs_jagged_layout():
    inp = T.make_inputs(50, 3, 32, dtype="fp32", batch=7, kv_len=16, edge_cases=True, seed=3)
    o = inp["q_offsets"].long()
    lengths = o[1:] - o[:-1]
    assert inp["q_offsets"].dtype == torch.int32 and o[0] == 0 and o[-1] == inp["q"].shape[0]
    assert lengths[0] == 1 and lengths[1] == 0 and lengths[-1] == 49 and lengths.max() < 50
    assert inp["q"].shape[1:] == (3, 32) and inp["k"].shape == (7, 16, 3, 32) == inp["v"].shape
    assert (inp["seq_ids"] == torch.repeat_interleave(torch.arange(7), lengths)).all()
    assert (inp["q"] != 0).all()
    T.check_offsets(inp["q_offsets"], inp["q"].shape[0], 50)


def test_reference_matches_loop_and_chunking():
    inp = T.make_inputs(40, 3, 32, dtype="fp32", batch=9, kv_len=32, edge_cases=True, seed=1, mean_shift=3.0)
    ref = T.reference("gdpa", inp, 1e-5)
    loop = _loop_reference(inp, 1e-5)
    assert torch.allclose(ref.double(), loop, atol=1e-4, rtol=1e-4)
    unchunked = T.module(*(inp[n].float() for n in ("q", "k", "v")), inp["seq_ids"], inp["positions"], 40, 1e-5)
    chunked = T.module(*(inp[n].float() for n in ("q", "k", "v")), inp["seq_ids"], inp["positions"], 40, 1e-5,
                       chunk=2)
    assert torch.allclose(unchunked, chunked, atol=1e-5)


def test_check_passes_same_dtype_and_fails_wrong_math():
    inp = T.make_inputs(40, 2, 32, dtype="fp16", batch=5, kv_len=32, edge_cases=True, seed=2)
    eager = T.baseline("torch_eager_gdpa", inp, 1e-5)()
    assert T.check("torch_eager_gdpa", eager, inp, 1e-5)["ok"]
    f = {n: inp[n].float() for n in ("q", "k", "v")}
    T_, H, D = f["q"].shape
    x = f["q"].reshape(T_, H * D)
    ln = torch.nn.functional.layer_norm(x, (H * D,), eps=1e-5)
    g = T._gdpa_padded(ln.view(T_, H, D), f["k"], f["v"], inp["seq_ids"], inp["positions"], 40).reshape(T_, -1)
    wrong = {  # negative controls: each drops or changes one piece of the module
        "no residual 1": torch.nn.functional.rms_norm(g, (H * D,), eps=1e-5) + x,
        "no residual 2": torch.nn.functional.rms_norm(g + ln, (H * D,), eps=1e-5),
        "per-head norms": torch.nn.functional.rms_norm((g + ln).view(T_, H, D), (D,), eps=1e-5).reshape(T_, -1) + x,
        "LayerNorm as RMSNorm": None,
    }
    rms_q = torch.nn.functional.rms_norm(x, (H * D,), eps=1e-5)
    g2 = T._gdpa_padded(rms_q.view(T_, H, D), f["k"], f["v"], inp["seq_ids"], inp["positions"], 40).reshape(T_, -1)
    wrong["LayerNorm as RMSNorm"] = torch.nn.functional.rms_norm(g2 + rms_q, (H * D,), eps=1e-5) + x
    for name, out in wrong.items():
        assert not T.check("fused", out.view(T_, H, D).half(), inp, 1e-5)["ok"], name
    assert not T.check("fused", eager.float(), inp, 1e-5)["ok"], "wrong dtype must fail"


def test_bad_inputs_raise():
    inp = T.make_inputs(20, 2, 32, dtype="fp32", batch=3, kv_len=16, seed=0)
    q, k, v, o = inp["q"], inp["k"], inp["v"], inp["q_offsets"]
    T.check_inputs(q, k, v, o, 20)
    with pytest.raises(TypeError):
        T.check_inputs(q.half(), k, v, o, 20)
    with pytest.raises(TypeError):
        T.check_inputs(q, k, v, o.float(), 20)
    with pytest.raises(ValueError, match="B\\+1"):
        T.check_inputs(q, k, v, o[:-1], 20)
    with pytest.raises(ValueError, match="max_len"):
        T.check_inputs(q, k, v, o, 1)
    with pytest.raises(ValueError, match="H ="):
        T.check_inputs(q[:, :1].contiguous(), k[:, :, :1].contiguous(), v[:, :, :1].contiguous(), o, 20)
    with pytest.raises(ValueError, match="eps"):
        T.check_inputs(q, k, v, o, 20, eps=0.0)
    with pytest.raises(ValueError, match="variant"):
        T.reference("qknorm_softmax", inp, 1e-5)
    with pytest.raises(ValueError):
        T.check_shape(1000, 1, 128)


def test_saving_metric_and_cost_model():
    assert get_technique("fna") is T
    rows = []
    for impl, dsl, t in (("torch_compile_gdpa", "torch", 2.0), ("fused", "triton", 1.5), ("fused", "triton", 1.2),
                         ("fused", "tlx", 2.5)):
        rows.append(dict(technique="fna", variant="gdpa", M=1000, N=2, K=128, dtype="bf16", impl=impl, dsl=dsl,
                         p50_ms=t, status="ok", config_name="x"))
    df = metrics.add_saving(metrics.add_hidden(metrics.add_rates(pd.DataFrame(rows))))
    got = sorted(df[df.impl == "fused"]["saving"].round(6).tolist())
    assert got == [-0.25, 0.25, 0.4]
    assert math.isnan(df[df.impl == "torch_compile_gdpa"]["saving"].iloc[0])
    assert T.flops("fused", 1000, 2, 128) == pytest.approx(4 * 768 * 500 * 2 * 128 * 128 + 10 * 768 * 500 * 256)
    assert T.BLOG_SAVING_B200[(3000, 2)] == 35.39 and len(T.BLOG_SAVING_B200) == 12


def test_blog_experiment_points():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from pathlib import Path

    cdir = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(config_dir=str(cdir), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=["experiment=fna_blog"]), resolve=True)
    pts = sweep.expand_points(cfg, "gpu")
    base = [p for p in pts if p["dsl"] == "torch"]
    fused = [p for p in pts if p["impl"] == "fused"]
    assert {(p["M"], p["N"], p["K"]) for p in base} == {(m, h, 128) for m in (1000, 3000, 5000, 10000)
                                                      for h in (2, 3, 4)}
    assert all(p["impl"] == "torch_compile_gdpa" and p["options"] == {"batch": 768, "kv_len": 128} for p in base)
    assert len(fused) == 12 * sum(len(cfg["tiling"][d]) for d in ("triton", "helion", "tlx"))


def test_gpu_summary_shows_saving_next_to_blog():
    from normfuse import report

    rows = []
    for impl, dsl, t in (("torch_compile_gdpa", "torch", 2.0), ("fused", "triton", 1.5), ("fused", "tlx", 1.2)):
        rows.append(dict(technique="fna", variant="gdpa", M=3000, N=2, K=128, dtype="bf16", impl=impl, dsl=dsl,
                         p50_ms=t, status="ok", config_name="x", experiment="fna_blog", mode="gpu", error=None))
    df = metrics.add_saving(metrics.add_hidden(metrics.add_rates(pd.DataFrame(rows))))
    text = report.summary(df, "gpu")
    assert "latency saving" in text and "35.4" in text and "hidden_dsl" not in text
