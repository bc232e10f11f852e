"""fna_llm in TLX (kernels_tlx/fna_llm.py), run with fbtriton:

1. sm_90a compile (fake driver, no GPU) of every shipped config, both ops, causal and not, with / without the output
   norm: wgmma, TMA loads (device-side descriptors), mbarriers and setmaxnreg in the PTX, shared memory within the
   H200's limit, the ping-pong named barriers exactly when PINGPONG is on; the rstd_k pre-pass compiled exactly for
   the fused op with K_NORM = prepass; no register spills beyond a few bytes (both K_NORM modes); K_NORM = prepass
   reads no K tile from shared memory into registers (fewer ld.shared than inloop);
2. bad inputs and configs (a bad K_NORM raises ValueError);
3. GPU (marker ``gpu``): every shipped config through the sweep worker's check and the NaN isolation check.
"""

import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from normfuse import compile_only

# the fake sm_90 driver replaces the real one for the whole pytest process, so it is installed only where there is
# no GPU: installed unconditionally it broke every TLX GPU test collected after this module (they ran against the
# fake driver: "'_CompileOnlyDriver' object has no attribute 'launcher_cls'"); on a GPU host the compile tests
# below target the real H200 (sm_90) instead
if not torch.cuda.is_available():
    compile_only.install(90)

from kernels_tlx import fna_llm as K  # noqa: E402
from normfuse.techniques import fna_llm as T  # noqa: E402



def _tlx_entries(path: Path) -> list[dict]:
    """The flow-mapping entries under ``tlx:`` of a tiling YAML (the TLX venv has no PyYAML): ``- {k: v, ...}``
    with int / bool / name values."""
    out, inside = [], False
    for line in path.read_text().splitlines():
        if re.match(r"^\w", line):
            inside = line.startswith("tlx:")
            continue
        m = re.match(r"^\s+- \{(.*)\}\s*$", line)
        if inside and m:
            d = {}
            for item in m.group(1).split(", "):
                k, v = item.split(": ", 1)
                d[k] = int(v) if v.isdigit() else {"true": True, "false": False}.get(v, v)
            out.append(d)
    return out


CONFIGS = _tlx_entries(Path(__file__).resolve().parents[2] / "configs/tiling/fna_llm_h200.yaml")
assert len(CONFIGS) == 4 and {c["K_NORM"] for c in CONFIGS} == {"prepass", "inloop"}, CONFIGS


def _cfg(c):
    c = dict(c)
    return c.pop("name"), c


@pytest.mark.parametrize("entry", CONFIGS, ids=[c["name"] for c in CONFIGS])
@pytest.mark.parametrize("op", ["qknorm_attention", "attention"])
@pytest.mark.parametrize("causal", [True, False])
def test_shipped_configs_compile_for_sm90a(entry, op, causal):
    _, cfg = _cfg(entry)
    r = K.compile_sm90(op, *T.compile_inputs(1000, 2, 32, "bf16"), config=cfg, causal=causal, o_norm=causal)
    m = r["ptx_markers"]
    assert m["wgmma"] > 0 and m["tma_load"] > 0 and m["mbarrier"] > 0 and m["setmaxnreg"] > 0, m
    assert r["smem_ok"], r
    assert r["num_warps"] == 12  # producer warpgroup + 2 consumer warpgroups
    assert r["tensormap_create"]
    assert (r["pingpong_barriers"] > 0) == cfg.get("PINGPONG", True)
    assert r["grid"] == (8, 64, 1)
    pre = r.get("k_rstd")  # the rstd_k pre-pass: fused op with K_NORM = prepass only (attention ignores K_NORM)
    assert (pre is not None) == (op == "qknorm_attention" and cfg.get("K_NORM", "prepass") == "prepass"), r
    if pre is not None:
        assert pre["smem_ok"] and pre["ptx_markers"]["wgmma"] == 0, pre


def test_registers_and_spills():
    """ptxas -v on the PTX of the default config (both ops, both K_NORM modes): no spills beyond a few words; the
    prepass kernel reads the K tile from shared memory only through wgmma (fewer ld.shared than inloop)."""
    from triton.backends.nvidia.compiler import get_ptxas

    ld_shared = {}
    for norms, k_norm in ((True, "prepass"), (True, "inloop"), (False, "prepass")):
        q, k, v, qw, kw = T.compile_inputs(1000, 2, 32, "bf16")
        _, args, grid, kwd, _ = K._prepare(q, k, v, qw if norms else None, kw if norms else None, None, True, 1e-6,
                                           {"K_NORM": k_norm}, norms, need_cuda=False)
        ptx = K._fna_llm_ws_kernel.warmup(*args, grid=grid, **kwd).asm["ptx"]
        ld_shared[(norms, k_norm)] = len(re.findall(r"\bld\.shared", ptx))
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "k.ptx"
            src.write_text(ptx)
            p = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                               capture_output=True, text=True)
        spills = re.search(r"(\d+) bytes spill stores", p.stdout + p.stderr)
        assert p.returncode == 0 and spills, p.stderr[-2000:]
        assert int(spills.group(1)) <= 64, p.stdout + p.stderr
    assert ld_shared[(True, "prepass")] < ld_shared[(True, "inloop")], ld_shared


def test_bad_inputs_and_configs():
    inp = T.make_inputs(8, 1, 2, dtype="bf16", kv_heads=1, head_dim=64)
    q, k, v, qw, kw = inp["q"], inp["k"], inp["v"], inp["q_weight"], inp["k_weight"]
    with pytest.raises(ValueError, match="CUDA"):
        K.qknorm_attention(q, k, v, qw, kw, causal=True)
    with pytest.raises(TypeError, match="causal"):
        K.attention(q, k, v, causal=None)
    with pytest.raises(TypeError, match="bf16/fp16"):
        K.attention(q.float(), k.float(), v.float(), causal=True)
    q32 = torch.randn(1, 2, 8, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head dim 64 or 128"):
        K.attention(q32, q32, q32, causal=True)
    with pytest.raises(ValueError, match="BLOCK_M"):
        K.TilingConfig(BLOCK_M=64)
    with pytest.raises(ValueError, match="BLOCK_N"):
        K.TilingConfig(BLOCK_N=256)
    with pytest.raises(ValueError, match="NUM_BUFFERS"):
        K.TilingConfig(NUM_BUFFERS=1)
    with pytest.raises(ValueError, match="K_NORM"):
        K.TilingConfig(K_NORM="PREPASS")
    with pytest.raises(ValueError, match="K_NORM"):
        K.compile_sm90("qknorm_attention", *T.compile_inputs(64, 1, 8, "bf16"), config={"K_NORM": 1})
    assert K.TilingConfig().K_NORM == "prepass"
    with pytest.raises(ValueError, match="choices"):
        K.compile_sm90("matmul", *T.compile_inputs(64, 1, 8, "bf16"))


@pytest.mark.gpu
def test_shipped_fna_llm_configs_correct_on_gpu():
    from normfuse.gpu_checks import check_all, check_fna_llm_nan_isolation

    failures = check_all("tlx", "fna_llm") + check_all("tlx", "fna_llm_gqa") + check_fna_llm_nan_isolation("tlx")
    assert not failures, "\n".join(failures)
