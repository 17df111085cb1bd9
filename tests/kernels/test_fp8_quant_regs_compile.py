"""``quarl_kernels.fp8_quant_regs`` (Gluon: X^T transposed by register order; session 31) builds for sm_90 on a CPU in
every form the library launches: both X^T groupings with and without the row groups, the row groups alone, and the
fused SwiGLU forward (h = silu(g) * u from g and u), at each setting. Checked: no spills, the correctly rounded
quotient without a division per element (``group_div``'s ``rcp.approx`` + FMAs, no ``div``), the saturating RNE E4M3
cast, a row's columns loaded as 8-byte vectors, and X^T stored as 16-byte runs of a column's tokens at 16 tokens a
thread (no shared-memory transpose: the only shared memory is the column amax's reduction across warps). Gluon
kernels do not run in Triton's interpreter; their bits are checked on the GPU (``test_fp8_quant_gpu.py``,
``test_fp8_swiglu_gpu.py``).

Skipped unless Triton with Gluon (>= 3.5) is importable (the CPU CI has no Triton).
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton.experimental.gluon", reason="the kernel is written in Gluon (Triton >= 3.5)")

FORMS = {  # name: compile_sm90 keywords
    "tiles": {"tiles": True}, "1x128": {}, "tiles, X^T alone": {"tiles": True, "rows": False},
    "1x128, X^T alone": {"rows": False}, "rows alone": {"cols": False}, "swiglu tiles": {"tiles": True, "swiglu": True},
    "swiglu 1x128": {"swiglu": True}, "swiglu rows alone": {"swiglu": True, "cols": False},
}


@pytest.mark.parametrize("form", list(FORMS))
def test_builds_for_sm90(form):
    from quarl_kernels import fp8_quant_regs as fr

    from tests.kernels.sm90_sass import stack_bytes

    kw = FORMS[form]
    settings = fr.SWIGLU_SETTINGS if kw.get("swiglu") else fr.SETTINGS
    for tpt, _ in settings:
        k = fr.compile_sm90(tpt=tpt, **kw)
        ptx = k.asm["ptx"]
        assert stack_bytes(k) in (0, None), f"{form} tpt={tpt}: ptxas spilled"
        assert "rcp.approx.ftz.f32" in ptx and "div.rn" not in ptx and "div.full" not in ptx or kw.get("swiglu"), form
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx, form
        assert "ld.global.v2.b32" in ptx, form  # 4 bf16 columns of a row a load
        if tpt == 16 and kw.get("cols", True):
            assert "st.global.v4.b32" in ptx, form  # 16 tokens of a column: one 16-byte store into X^T's row
