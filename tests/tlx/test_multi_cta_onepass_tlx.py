"""CPU checks of the Multi-CTA kernel's LN_ONEPASS option (``kernels_tlx.multi_cta``; TLX venv:
``.venv-tlx/bin/python -m pytest tests/tlx/test_multi_cta_onepass_tlx.py``): each tile's LayerNorm partials from one
pass, ``(sum, sum x^2 - sum^2 / n)``, instead of the centred two-pass form.

- Validation, the shipped configs, ``fill_config()`` passing the option to both fillers, the YAML entries, the
  kernel flag reaching only LayerNorm.
- The sm_90a builds: fewer fp32 instructions than the two-pass twin (the centring pass gone), no spills at the
  benchmark N.
- The precision of the docstring, on an fp32 model of the arithmetic (per-tile partials, Chan merge in rank
  order): rstd within 2e-4 at |mean| / std = 30, within a bf16 half-ulp at 100, and the centred form far better at
  1000 (what the option gives up). On the GPU the self-check's rows at mean shift 30 (extreme rows near 120) read
  1.1-1.4e-3, over its 1e-3 bound (results/gpu_tests/20261206_h100_onepass): the model's order of magnitude.

The kernels themselves run on the GPU: ``python -m kernels_tlx.multi_cta --quick --no-bench --config
c4_defer_lnpack1p_fill ...`` (LayerNorm at mean shift 30: fails rstd, as recorded) and ``make test-gpu`` (mean
shift 10 for these entries, ``normfuse.gpu_checks.ONEPASS_MEAN_SHIFTS``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX): run with .venv-tlx/bin/python")

from kernels_tlx import multi_cta as km  # noqa: E402
from normfuse.testing import run_python_json_parallel  # noqa: E402

# onepass config -> its two-pass twin
TWINS = {"c4_defer_lnpack1p": "c4_defer_lnpack", "c2_t2_lnpack1p": "c2_t2_lnpack",
         "c2_t4_rc_lnpack1p": "c2_t4_rc_lnpack", "c4_defer_lnpack1p_fill": "c4_defer_lnpack_fill",
         "c8_defer_lnpack1p_fill_rc50": "c8_defer_lnpack_fill_rc50"}


def test_configs_and_validation():
    for name, twin in TWINS.items():
        cfg = km.SHIPPED_CONFIGS[name]
        assert cfg.LN_ONEPASS and cfg.LN_PACKED, name
        assert km.TilingConfig.from_dict({**cfg.to_dict(), "LN_ONEPASS": False}) == km.SHIPPED_CONFIGS[twin], name
    # both fillers carry the option
    assert km.SHIPPED_CONFIGS["c4_defer_lnpack1p_fill"].fill_config() == km.SHIPPED_CONFIGS["c2_t2_lnpack1p"]
    assert km.SHIPPED_CONFIGS["c8_defer_lnpack1p_fill_rc50"].fill_config() == km.SHIPPED_CONFIGS["c2_t4_rc_lnpack1p"]
    with pytest.raises(ValueError, match="LN_ONEPASS=True needs LN_PACKED=True"):
        km.TilingConfig(CLUSTER_SIZE=4, LN_ONEPASS=True)
    for flag in ("EPILOGUE_OVERLAP", "PINGPONG", "STORE_DIRECT"):
        with pytest.raises(ValueError, match="LN_ONEPASS=True is built for the cooperative"):
            km.TilingConfig(CLUSTER_SIZE=4, LN_PACKED=True, LN_ONEPASS=True, **{flag: True})


def test_flag_reaches_layernorm_only():
    a = torch.empty(256, 64, dtype=torch.bfloat16)
    for name, N in (("c4_defer_lnpack1p", 1024), ("c2_t4_rc_lnpack1p", 2048)):
        b = torch.empty(64, N, dtype=torch.bfloat16)
        cfg = km.SHIPPED_CONFIGS[name]
        kw_ln = km._prepare(a, b, None, None, 1e-5, "layer", cfg, need_cuda=False)[4]
        kw_rms = km._prepare(a, b, None, None, 1e-6, "rms", cfg, need_cuda=False)[4]
        assert kw_ln.get("ONEPASS") is True and "ONEPASS" not in kw_rms, name
        kw_twin = km._prepare(a, b, None, None, 1e-5, "layer", km.SHIPPED_CONFIGS[TWINS[name]], need_cuda=False)[4]
        assert "ONEPASS" not in kw_twin and {k: v for k, v in kw_ln.items() if k != "ONEPASS"} == kw_twin, name


def test_yaml_entries():
    entries = {e["name"]: e for e in yaml.safe_load((REPO / "configs/tiling/multi_cta_h200.yaml").read_text())["tlx"]}
    expect = {"c4-defer-lnpack1p-persistent-s3": "c4_defer_lnpack1p", "c2-t2-lnpack1p-persistent-s3": "c2_t2_lnpack1p",
              "c4-defer-lnpack1p-fill-persistent-s3": "c4_defer_lnpack1p_fill",
              "c8-defer-lnpack1p-fill-rc50-persistent-s3": "c8_defer_lnpack1p_fill_rc50"}
    for entry, name in expect.items():
        e = {k: v for k, v in entries[entry].items() if k not in ("name", "impls")}
        assert km.TilingConfig.from_dict(e) == km.SHIPPED_CONFIGS[name], entry
    for entry in ("c4-defer-lnpack1p-fill110-persistent-s3", "c8-defer-lnpack1p-fill-rc60-persistent-s3"):
        e = {k: v for k, v in entries[entry].items() if k not in ("name", "impls")}
        cfg = km.TilingConfig.from_dict(e)
        assert cfg.LN_ONEPASS and cfg.FILL_IDLE_SMS and cfg.FILL_RATE_PCT in (110, 60), entry


_SCRIPT = r"""
import json, re, sys, torch
from normfuse import compile_only
compile_only.install(90)
from kernels_tlx import multi_cta as km
out = {}
for name, N in json.loads(sys.argv[1]):
    a = torch.empty(4096, 512, dtype=torch.bfloat16)
    b = torch.empty(512, N, dtype=torch.bfloat16)
    cfg = km.SHIPPED_CONFIGS[name]
    r = km.compile_sm90("matmul_layernorm", a, b, config=cfg, ptxas=True)
    # the PTX itself (the same build, cached), for the fp32 instruction count
    (M, N_, K), bn, _, args, kwargs = km._prepare(a, b, None, None, 1e-6, "layer", cfg, need_cuda=False)
    ptx = km._kernel(cfg).warmup(*args, grid=km._grid(cfg, M, None), **kwargs).asm["ptx"]
    out[name] = dict(spills=r["ptxas"]["spill_stores"] + r["ptxas"]["spill_loads"], sha=r["ptx_sha256"],
                     f32=len(re.findall(r"\b(?:add|sub|mul|fma)(?:\.\w+)*\.f32\b", ptx)))
print(json.dumps(out))
"""


def test_fewer_fp32_instructions_no_spills():
    """At the benchmark N the one-pass kernels drop the centring pass: about one fp32 instruction per accumulator
    element (128 per consumer thread and tile: 1172 -> 924 fp32 add / sub / mul / fma in the c4 kernel's PTX), and
    spill nothing."""
    jobs = [(name, 2048 if "rc" in name else 1024) for pair in
            (("c4_defer_lnpack1p", "c4_defer_lnpack"), ("c2_t2_lnpack1p", "c2_t2_lnpack"),
             ("c2_t4_rc_lnpack1p", "c2_t4_rc_lnpack")) for name in pair]
    r = run_python_json_parallel(_SCRIPT, jobs, timeout=600)
    for one, two in (("c4_defer_lnpack1p", "c4_defer_lnpack"), ("c2_t2_lnpack1p", "c2_t2_lnpack"),
                     ("c2_t4_rc_lnpack1p", "c2_t4_rc_lnpack")):
        assert r[one]["spills"] == 0 == r[two]["spills"], (one, r[one], r[two])
        assert r[one]["sha"] != r[two]["sha"], one
        # two consumer regions x the statistics code's copies (one per tile; the recompute kernel's tiles after the
        # first share one loop body) x 128 elements, minus a little (the few extra scalar ops of the formula)
        copies = min(km.SHIPPED_CONFIGS[one].TILES_PER_CTA, 2)
        assert r[two]["f32"] - r[one]["f32"] >= 2 * copies * 128 - 16, (one, r[one]["f32"], r[two]["f32"])


# ------------------------------------------------------------------ fp32 model of the statistics
def _rstd_model(x: torch.Tensor, onepass: bool, W: int = 256, eps: float = 1e-5) -> torch.Tensor:
    """fp32 rstd of rows of ``x`` [R, C * W] as the kernels form it: per-tile partials (one-pass or centred),
    then the rank-order Chan merge of ``_packed_combine``."""
    R, N = x.shape
    t = x.float().view(R, N // W, W)
    s1 = t.sum(-1)
    if onepass:
        m2 = ((t * t).sum(-1) - s1 * s1 * (1.0 / W)).clamp_min(0)
    else:
        d = t - (s1 * (1.0 / W))[..., None]
        m2 = (d * d).sum(-1)
    mean = s1.sum(-1) * (1.0 / N)
    dm = s1 * (1.0 / W) - mean[:, None]
    return torch.rsqrt((m2 + W * dm * dm).sum(-1) / N + eps)


@pytest.mark.parametrize("ratio, bound", [(0.0, 1e-6), (30.0, 2e-4), (100.0, 2 ** -9)])
def test_onepass_precision_model(ratio, bound):
    g = torch.Generator().manual_seed(int(ratio) + 1)
    x = torch.randn(2048, 1024, dtype=torch.float64, generator=g) * 3 + 3 * ratio
    ref = torch.rsqrt(x.var(-1, unbiased=False) + 1e-5)
    err = ((_rstd_model(x, True).double() - ref) / ref).abs().max().item()
    assert err <= bound, (ratio, err)
    assert ((_rstd_model(x, False).double() - ref) / ref).abs().max().item() <= 1e-5


def test_onepass_gives_up_large_shifts():
    """What the option costs: at |mean| / std = 1000 the one-pass rstd is off by percent, the centred one is not."""
    x = torch.randn(2048, 1024, dtype=torch.float64, generator=torch.Generator().manual_seed(7)) * 3 + 3000
    ref = torch.rsqrt(x.var(-1, unbiased=False) + 1e-5)
    assert ((_rstd_model(x, True).double() - ref) / ref).abs().max().item() > 1e-2
    assert ((_rstd_model(x, False).double() - ref) / ref).abs().max().item() < 1e-4
