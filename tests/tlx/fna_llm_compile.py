"""Shared sm_90a compile helpers of the TLX QK-norm attention tests (test_fna_llm_fa3_tlx, test_fna_llm_persistent_tlx,
test_fna_llm_lazyq_tlx): the kernel's launch plan and PTX for a config, and its SASS read back (spills, the wgmma
loops). Imported after the test module has set up (or not) the compile-only fake driver."""

import re

import torch

from kernels_tlx import fna_llm as K
from normfuse.codestats import ptx_to_sass, sass_inner_loops, spill_store_bytes
from normfuse.techniques import fna_llm as T

SS_WGMMA = re.compile(r"wgmma\.mma_async\S*\s+\{[^}]*\},\s*%rd\d+,\s*%rd\d+")  # A and B both smem descriptors


def inputs(S, B, Hq, D, Hkv=None):
    """Uninitialized bf16 CPU q, k, v, q_weight, k_weight at any head dim (``T.compile_inputs`` is D = 128)."""
    Hkv = Hkv or max(Hq // 4, 1)
    q, k, v = (torch.empty(B, h, S, D, dtype=torch.bfloat16) for h in (Hq, Hkv, Hkv))
    w = torch.empty(D, dtype=torch.bfloat16)
    return q, k, v, w, w


def launch(cfg, norms=False, causal=True, shape=(1000, 2, 32), D=128, Hkv=None):
    """``(launches, constexpr kwargs)`` of ``K._prepare`` for ``cfg`` at ``shape`` = (S, B, Hq), without a GPU
    (``T.compile_inputs``' Hkv = 8 at D = 128, else ``inputs``' Hkv)."""
    q, k, v, qw, kw = T.compile_inputs(*shape, "bf16") if D == 128 else inputs(*shape, D, Hkv)
    _, launches, kwd, _ = K._prepare(q, k, v, qw if norms else None, kw if norms else None, None, causal, 1e-6, cfg,
                                     norms, need_cuda=False)
    return launches, kwd


def ptx(cfg, norms=False, causal=True, **kw):
    """PTX of the attention kernel (fused op with ``norms``) for ``cfg`` (one launch)."""
    launches, kwd = launch(cfg, norms, causal, **kw)
    (args, grid), = launches
    return K._fna_llm_ws_kernel.warmup(*args, grid=grid, **kwd).asm["ptx"]


def spills(ptx_text):
    """Spill-store bytes of the PTX compiled for sm_90a."""
    return spill_store_bytes(ptx_to_sass(ptx_text)[0])


def sass_spills(ptx_text):
    """``(spill-store bytes, local-memory accesses inside a KV loop)``: ptxas -v, then cuobjdump's SASS; a KV loop
    is a backward branch's range that holds wgmma (HGMMA) and no other such loop (the innermost ones)."""
    log, sass = ptx_to_sass(ptx_text)
    ins, inner = sass_inner_loops(sass)
    assert inner, "no wgmma loop found in the SASS"
    local = [a for a, t in ins if re.search(r"\b(?:LDL|STL)\b", t)]
    return spill_store_bytes(log), [hex(a) for a in local if any(s <= a <= e for s, e in inner)]


def sass_loops(ptx_text):
    """Instruction count of each innermost wgmma loop of the SASS, in program order."""
    ins, inner = sass_inner_loops(ptx_to_sass(ptx_text)[1])
    return [sum(s <= a <= e for a, _ in ins) for s, e in inner]
