"""Issue 15 ("bad input and edge shapes") for the TLX attention and MXFP8 modules (``kernels_tlx.fna``,
``kernels_tlx.fna_llm``, ``kernels_tlx.mxnorm``). The case table and the GPU checks are those of
``tests/test_bad_inputs_attention.py`` (Triton, Helion), loaded from that file, so the three DSLs are held to one
contract: the same calls rejected with the same exception, the same edge inputs served.

CPU (TLX has no interpreter): the rejections (validation runs before anything is compiled), and what the wrapper
does before compiling for sm_90a: Lkv = 16 padded to the smallest wgmma tile, misaligned K/V copied for TMA,
launches per 65535-slice of the grid's y axis, 32 warps for the widest MXFP8 rows. GPU (marker ``gpu``): the edge
inputs themselves, against the fp32 reference.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "bad_inputs_attention", Path(__file__).resolve().parents[1] / "test_bad_inputs_attention.py")
C = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(C)


@pytest.mark.parametrize("case", C.REJECT, ids=[c[0] for c in C.REJECT])
def test_same_rejection_as_triton_and_helion(case):
    C.assert_rejects("tlx", case)


def test_gdpa_lkv16_padded_and_misaligned_kv_copied():
    """Lkv = 16 (issue 15: q [20, 3, 64], k/v [2, 16, 3, 64] was a CompilationError, "N must be at least 32"):
    K/V are padded with zero rows to LKV_MIN = 32 before the descriptors are built; a 2-byte-misaligned k or v is
    copied (TensorDescriptor asserts on it). Both kernels (single CTA, cluster) then compile for sm_90a."""
    from normfuse import compile_only

    if not torch.cuda.is_available():  # the fake sm_90 driver is process-wide: never where GPU tests may follow
        compile_only.install(90)
    from kernels_tlx import fna as kt

    q, k, v, offsets, max_len = C.gdpa_args(total_q=20, H=3, D=64, B=2, Lkv=16, dtype=torch.bfloat16)
    for cfg in C.GDPA_CONFIGS["tlx"]:
        out, kernel, launches, meta = kt._prepare(q, C.misaligned(k), C.misaligned(v), offsets, max_len, 1e-5, cfg)
        assert meta["LKV"] == kt.LKV_MIN == 32 and len(launches) == 1
        (args, grid), = launches
        assert args[1].block_shape == [32, 64] and tuple(args[1].base.shape) == (2 * 32, 3 * 64)
        padded = args[1].base.view(2, 32, 3, 64)
        assert torch.equal(padded[:, :16], k) and not padded[:, 16:].any()
        assert args[1].base.data_ptr() % 16 == 0 and args[2].base.data_ptr() % 16 == 0
        s = kt.compile_sm90("gdpa", q, k, v, offsets, max_len, config=cfg)
        assert s["ptx_markers"]["wgmma"] > 0 and s["smem_ok"], (cfg, s)


def test_gdpa_launch_per_grid_slice(monkeypatch):
    """More sequences than the grid's y limit: one launch per slice (the limit lowered to 2: 5 sequences, 3
    launches whose grids cover every sequence once, each with its own K/V descriptor rows and offsets)."""
    from kernels_tlx import fna as kt

    monkeypatch.setattr(kt, "MAX_GRID_YZ", 2)
    q, k, v, offsets, max_len = C.gdpa_args(total_q=20, H=2, D=32, B=5, Lkv=32, dtype=torch.bfloat16)
    for cfg in C.GDPA_CONFIGS["tlx"]:
        _, _, launches, _ = kt._prepare(q, k, v, offsets, max_len, 1e-5, cfg)
        assert [g[1] for _, g in launches] == [2, 2, 1]
        assert [a[3].tolist() for a, _ in launches] == [offsets[0:3].tolist(), offsets[2:5].tolist(),
                                                         offsets[4:6].tolist()]
        assert [a[1].base.data_ptr() for a, _ in launches] == [k[b].data_ptr() for b in (0, 2, 4)]


def test_fna_llm_launch_per_grid_slice(monkeypatch):
    """B * Hq above the grid's y limit (lowered to 4: B = 5, Hq = 2 -> 3 launches of 2, 2, 1 batches); each
    launch gets the slice's q, k, v, o and rstd_k; misaligned inputs are copied (device-side TMA descriptors)."""
    import kernels_triton.fna_llm as tri
    from kernels_tlx import fna_llm as kl

    monkeypatch.setattr(tri, "MAX_GRID_YZ", 4)
    q, k, v, qw, kw = C.llm_args(B=5, Hq=2, Hkv=1, S=8, D=64, dtype=torch.bfloat16)
    o, launches, _, pre = kl._prepare(C.misaligned(q), k, C.misaligned(v), qw, kw, None, True, 1e-6, None, True,
                                      need_cuda=False)
    assert [g[1] for _, g in launches] == [4, 4, 2]
    rstd_k = pre[1][1]
    for (args, _), b0 in zip(launches, (0, 2, 4)):
        assert args[0].data_ptr() % 16 == 0 and args[2].data_ptr() % 16 == 0  # aligned copies
        assert args[3].data_ptr() == o[b0].data_ptr() and args[1].data_ptr() == k[b0].data_ptr()
        assert args[7].data_ptr() == rstd_k[b0 * 8:].data_ptr()


def test_mxnorm_default_serves_max_d():
    """The default config serves every D of the contract (up to 65536: 32 warps past 32768) and resolves the
    benchmark D as before."""
    from kernels_tlx.mxnorm import TilingConfig

    assert TilingConfig().resolve(1, 65536, 2)["num_warps"] == 32
    assert TilingConfig().resolve(4, 16384, 2)["num_warps"] == 16 == TilingConfig().resolve(4, 32768, 2)["num_warps"]
    with pytest.raises(ValueError, match="elements of x per thread"):
        TilingConfig(num_warps=16).resolve(1, 65536, 2)  # an explicit num_warps is kept


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(C.GPU_CHECKS))
def test_edge_inputs_gpu(name):
    C.run_gpu_check(name, "tlx")
