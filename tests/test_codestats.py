"""normfuse.codestats' PTX-text helpers: ptxas + cuobjdump on PTX text, the spill line, the innermost marked loops
of SASS."""

import pytest

from normfuse import codestats

PTX = """.version 8.0
.target sm_90a
.address_size 64
.visible .entry empty_kernel()
{
    ret;
}
"""

# cuobjdump's layout: /*address*/ instruction ; two loops hold HGMMA, the outer one contains the inner one; a third
# loop has none
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0030*/                   FADD R2, R2, R3 ;
        /*0040*/               @P0 BRA 0x20 ;
        /*0050*/                   FMUL R4, R4, R5 ;
        /*0060*/               @P1 BRA 0x10 ;
        /*0070*/                   IADD3 R6, R6, 0x1, RZ ;
        /*0080*/               @P2 BRA 0x70 ;
        /*0090*/                   EXIT ;
"""


def test_sass_inner_loops_keeps_the_innermost_marked_loop():
    ins, loops = codestats.sass_inner_loops(SASS)
    assert len(ins) == 10 and ins[1][0] == 0x10 and ins[1][1].startswith("HGMMA")
    assert loops == [(0x20, 0x40)]  # not the outer (0x10, 0x60), not the unmarked (0x70, 0x80)
    assert codestats.sass_inner_loops(SASS, marker="IADD3")[1] == [(0x70, 0x80)]


def test_spill_store_bytes():
    log = "ptxas info    : Used 168 registers, 12 bytes spill stores, 12 bytes spill loads"
    assert codestats.spill_store_bytes(log) == 12
    with pytest.raises(RuntimeError, match="no spill line"):
        codestats.spill_store_bytes("ptxas info    : Used 168 registers")


def test_ptx_to_sass_compiles_ptx_text():
    log, sass = codestats.ptx_to_sass(PTX)
    assert codestats.spill_store_bytes(log) == 0 and "empty_kernel" in log
    assert "EXIT" in sass
    with pytest.raises(RuntimeError, match="ptxas failed"):
        codestats.ptx_to_sass(PTX.replace("ret;", "not_an_instruction;"))
