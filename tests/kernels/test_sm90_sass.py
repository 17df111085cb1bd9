"""The SASS stale-code check (``tests/kernels/sm90_sass.py``) on hand-written loops: no Triton needed.

The buggy loop is the pattern ptxas 12.8 emitted for the fp32 W^T quantizer (addresses renumbered,
registers as in the real SASS): the byte extraction ``R0 = (R5 & 0xffff) >> 8`` reads R5 before
the ``PRMT`` that writes this iteration's codes into it.
"""

from __future__ import annotations

from tests.kernels.sm90_sass import loops, parse, stale_code_stores

HEAD = """
        /*0100*/                   LDG.E.128 R20, desc[UR8][R2.64] ;
        /*0110*/                   FMNMX R30, R30, |R20|, !PT ;
        /*0120*/                   F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C R17, R21, R20, RZ ;
        /*0130*/                   F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C R12, R23, R22, R17 ;
"""
BUGGY = HEAD + """
        /*0140*/                   LOP3.LUT R0, R5, 0xffff, RZ, 0xc0, !PT ;
        /*0150*/                   STG.E.128 desc[UR8][R60.64], R12 ;
        /*0160*/                   PRMT R5, R12, 0x7610, R5 ;
        /*0170*/                   SHF.R.U32.HI R0, RZ, 0x8, R0 ;
        /*0180*/                   STS.U8 [R48+UR4], R5 ;
        /*0190*/                   STS.U8 [R39+UR4+0x80], R0 ;
        /*01a0*/                   STS [R49], R30 ;
        /*01b0*/               @P1 BRA 0x100 ;
        /*01c0*/                   EXIT ;
"""
FIXED = HEAD + """
        /*0140*/                   STG.E.128 desc[UR8][R60.64], R12 ;
        /*0150*/                   PRMT R5, R12, 0x7610, R5 ;
        /*0160*/                   LOP3.LUT R0, R5, 0xffff, RZ, 0xc0, !PT ;
        /*0170*/                   SHF.R.U32.HI R0, RZ, 0x8, R0 ;
        /*0180*/                   STS.U8 [R48+UR4], R5 ;
        /*0190*/                   STS.U8 [R39+UR4+0x80], R0 ;
        /*01a0*/                   STS [R49], R30 ;
        /*01b0*/               @P1 BRA 0x100 ;
        /*01c0*/                   EXIT ;
"""


def test_parse_and_loops():
    ins = parse(BUGGY)
    assert ins[0] == (0x100, "LDG.E.128", ["R20", "desc[UR8][R2.64]"])
    assert ins[-2][1] == "BRA" and loops(ins) == [(0x100, 0x1B0)]


def test_flags_a_byte_read_before_this_iteration_writes_it():
    assert stale_code_stores(BUGGY) == [("0x190", "STS.U8")]  # the odd byte; the loop-carried amax is fine


def test_clean_when_the_read_follows_the_write():
    assert stale_code_stores(FIXED) == []


def test_no_loop_no_finding():
    straight = FIXED.replace("@P1 BRA 0x100", "NOP")
    assert loops(parse(straight)) == [] and stale_code_stores(straight) == []
