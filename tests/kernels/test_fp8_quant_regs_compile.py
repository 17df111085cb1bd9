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


@pytest.mark.parametrize("rows", [True, False], ids=["with-row-groups", "x-t-alone"])
def test_staged_swiglu_backward_builds_for_sm90(rows):
    """``quarl_kernels.fp8_swiglu_staged`` (session 33): at every setting no spills, at most 128 registers (two 8-warp
    programs a multiprocessor -- the point of staging dg / du in shared memory; the register-order kernel takes 255),
    64 KB of shared memory (dg's and du's BF16 tile; the amax reduction reuses it), the SwiGLU backward's codes by
    the group's reciprocal cast with saturation, and X^T as 16-byte runs of a column's tokens."""
    from quarl_kernels import fp8_swiglu_staged as stg

    from tests.kernels.sm90_sass import registers, stack_bytes

    for st in stg.SETTINGS:
        r, nc = st[0], (st[2] if len(st) > 2 else 128)
        k = stg.compile_sm90(r, rows, nc)
        ptx = k.asm["ptx"]
        assert stack_bytes(k) in (0, None), f"{st}: ptxas spilled"
        assert registers(k) is None or registers(k) <= 128, (st, registers(k))
        if st == (16, 8, 64):  # X^T by 64-column chunks: three 8-warp programs a multiprocessor (65536 registers)
            assert registers(k) is None or 3 * 256 * registers(k) <= 65536, registers(k)
        assert k.metadata.shared <= (64 + 2) * 1024, (st, k.metadata.shared)  # + the chunked amax's scratch
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx and "st.global.v4.b32" in ptx, st
        assert ("st.shared" in ptx) and ("ld.shared" in ptx), st


def test_staged_spec_names_what_it_cannot_launch():
    import torch
    from quarl_kernels import fp8_swiglu_staged as stg

    g = u = dh = torch.zeros(256, 256, dtype=torch.bfloat16)
    outs = tuple(torch.zeros(1) for _ in range(4))
    with pytest.raises(ValueError, match="8 warps"):
        stg.spec(dh, g, u, outs, outs, 256, 256, 256, 16, 4)
    with pytest.raises(ValueError, match="t_rows 200"):
        stg.spec(dh, g, u, outs, outs, 256, 256, 200, 16, 8)
    with pytest.raises(ValueError, match="columns 48"):
        stg.spec(dh, g, u, outs, outs, 256, 256, 256, 16, 8, 48)


@pytest.mark.parametrize("tiles", [True, False], ids=["x-t-tiles", "x-t-1x128"])
def test_staged_swiglu_forward_builds_for_sm90(tiles):
    """The staged kernel's forward form (h = silu(g) * u; session 33, GPU bits in session 34) and its plain-activation
    form (``SWIGLU=False``, session 34, ``ACT_SETTINGS``): no spills, at most 72 / 80 registers (three or more
    8-warp programs a multiprocessor; the register-order forms take 120-128), at most 34 KB of shared memory, the
    correctly rounded quotient by ``group_div`` (no division), 16-byte X^T runs; SiLU's ``ex2`` in the SwiGLU form
    alone."""
    from quarl_kernels import fp8_swiglu_staged as stg

    from tests.kernels.sm90_sass import registers, stack_bytes

    for swiglu, settings, most in ((True, stg.FWD_SETTINGS, 72), (False, stg.ACT_SETTINGS, 80)):
        for r, _, nc in settings:
            for rows in (True, False):
                k = stg.compile_fwd_sm90(r, nc, tiles, rows, swiglu)
                ptx, where = k.asm["ptx"], (swiglu, r, nc, rows)
                assert stack_bytes(k) in (0, None), where
                assert registers(k) is None or registers(k) <= most, (where, registers(k))
                assert k.metadata.shared <= 34 * 1024, (where, k.metadata.shared)
                assert "rcp.approx.ftz.f32" in ptx and "div.rn" not in ptx and "st.global.v4.b32" in ptx, where
                assert ("ex2.approx" in ptx) == swiglu, where


def test_forward_candidates_are_the_staged_forms_only_where_x_t_is_made_on_cuda(monkeypatch):
    """``fp8_swiglu.forward_settings`` (session 34): the register-order SWIGLU form first (the default, and the only one
    without X^T -- rollout -- off CUDA, or with ``QUARL_FP8_REGS=0``), then ``fp8_swiglu_staged.FWD_SETTINGS``, then
    their TMA forms (session 35)."""
    import torch
    from quarl_kernels import fp8_quant_regs as fr
    from quarl_kernels import fp8_swiglu as fs
    from quarl_kernels import fp8_swiglu_staged as stg

    class OnCuda:  # what forward_settings asks of g
        is_cuda = True
        dtype = torch.bfloat16

    regs = tuple(("regs", *st) for st in fr.SWIGLU_SETTINGS)
    monkeypatch.delenv("QUARL_FP8_TMA", raising=False)
    assert fs.forward_settings(OnCuda(), 4096) == (regs + tuple(("staged", *st) for st in stg.FWD_SETTINGS)
                                                   + tuple(("tma", *st) for st in stg.TMA_SETTINGS))
    assert fs.forward_settings(OnCuda(), None) == regs
    assert fs.forward_settings(torch.zeros(1), 4096) == regs
    half = OnCuda()
    half.dtype = torch.float16  # staged as BF16: exact for BF16 values alone
    assert fs.forward_settings(half, 4096) == regs
    monkeypatch.setenv("QUARL_FP8_REGS", "0")
    assert fs.forward_settings(OnCuda(), 4096) == regs


def test_the_staged_forms_and_their_tma_forms_are_candidates_for_bf16(monkeypatch):
    """``fp8_quant.regs_settings``: the register-order settings, then ``fp8_swiglu_staged``'s plain-activation form
    (bit-equal on an H100 in session 35) and its TMA forms for BF16 alone; no TMA forms with ``QUARL_FP8_TMA=0`` -- the
    same rule in SwiGLU's backward and forward candidates."""
    import torch
    from quarl_kernels import fp8_quant as fq
    from quarl_kernels import fp8_quant_regs as fr
    from quarl_kernels import fp8_swiglu as fs
    from quarl_kernels import fp8_swiglu_staged as stg

    class OnCuda:  # what regs_settings asks of x
        is_cuda = True
        dtype = torch.bfloat16

        @staticmethod
        def stride(dim):
            return 1

    regs = tuple(("regs", *st) for st in fr.SETTINGS)
    staged = tuple(("staged", *st) for st in stg.ACT_SETTINGS)
    tma = tuple(("tma", *st) for st in stg.TMA_SETTINGS)
    monkeypatch.setenv("QUARL_FP8_TMA", "0")
    assert fq.regs_settings(OnCuda(), 4096) == regs + staged
    assert not any(st[0] == "tma" for st in fs.regs_settings(OnCuda()) + fs.forward_settings(OnCuda(), 4096))
    monkeypatch.delenv("QUARL_FP8_TMA", raising=False)
    assert fq.regs_settings(OnCuda(), 4096) == regs + staged + tma
    assert fs.regs_settings(OnCuda())[-len(tma):] == tma and fs.forward_settings(OnCuda(), 4096)[-len(tma):] == tma
    assert fq.regs_settings(OnCuda(), None) == ()  # no X^T: none of the Gluon kernels
    half = OnCuda()
    half.dtype = torch.float16  # staged as BF16: exact for BF16 values alone
    assert fq.regs_settings(half, 4096) == regs
    assert not any(st[0] in ("staged", "tma") for st in fs.regs_settings(half) + fs.forward_settings(half, 4096))


@pytest.mark.parametrize("swiglu", [True, False], ids=["h", "plain"])
def test_tma_forward_forms_build_for_sm90(swiglu):
    """The forward kernel's TMA form (session 35; ``tma=True``): one ``UTMALDG`` per input tile (one TMA copy, g and u
    two), no global loads of the inputs (the only ``ld.global`` left would be an input's), the tile read from shared
    memory, no spills, at most 80 registers, the tiles' 32 / 64 KB of shared memory (+ the barrier)."""
    from quarl_kernels import fp8_swiglu_staged as stg

    from tests.kernels.sm90_sass import registers, sass_of, stack_bytes

    for r, _, nc in stg.TMA_SETTINGS:
        k = stg.compile_fwd_sm90(r, nc, True, True, swiglu, tma=True)
        where = (swiglu, r, nc)
        assert stack_bytes(k) in (0, None), where
        assert registers(k) is None or registers(k) <= 80, (where, registers(k))
        assert k.metadata.shared <= (2 if swiglu else 1) * 32 * 1024 + 64, (where, k.metadata.shared)
        assert "ld.global" not in k.asm["ptx"], where
        if registers(k) is not None:  # cuobjdump present: the SASS too
            assert sass_of(k).count("UTMALDG") == (2 if swiglu else 1), where


def test_tma_backward_form_builds_for_sm90():
    """SwiGLU's staged backward with its three tiles (dh, g, u) by TMA (session 35): three ``UTMALDG``, no global loads,
    no spills, at most 128 registers, 96 KB of shared memory (+ the barrier): two 8-warp programs a multiprocessor."""
    from quarl_kernels import fp8_swiglu_staged as stg

    from tests.kernels.sm90_sass import registers, sass_of, stack_bytes

    for r, _, nc in stg.TMA_SETTINGS:
        k = stg.compile_sm90(r, True, nc, tma=True)
        assert stack_bytes(k) in (0, None), (r, nc)
        assert registers(k) is None or registers(k) <= 128, (r, nc, registers(k))
        assert k.metadata.shared <= 96 * 1024 + 64, (r, nc, k.metadata.shared)
        assert "ld.global" not in k.asm["ptx"], (r, nc)
        if registers(k) is not None:
            assert sass_of(k).count("UTMALDG") == 3, (r, nc)


def test_tma_specs_fall_back_to_loads_where_tma_cannot_read():
    """``tma=True`` on tensors TMA cannot read by 128 x 128 boxes (a row stride of 600 bytes: not a multiple of 16) gives
    the load form's launch -- the same bits, no failed launch; aligned ones get descriptors."""
    import torch
    from quarl_kernels import fp8_swiglu_staged as stg

    odd = torch.zeros(256, 300, dtype=torch.bfloat16)[:, :256]  # row stride 300 elements = 600 bytes
    ok = torch.zeros(256, 256, dtype=torch.bfloat16)
    assert not stg.tma_ok(odd) and stg.tma_ok(ok)
    outs = (None, None, torch.zeros(256, 256), torch.zeros(2, 2))
    assert stg.fwd_spec(odd, None, *outs, 256, 256, 256, True, 16, 8, 64, tma=True).constexprs["TMA"] is False
    la = stg.fwd_spec(ok, None, *outs, 256, 256, 256, True, 16, 8, 64, tma=True)
    assert la.constexprs["TMA"] is True and type(la.args[0]).__name__ == "TensorDescriptor"
    two = (torch.zeros(2, 2),) * 4
    assert stg.spec(odd, odd, odd, two, two, 256, 256, 256, 16, 8, 64, tma=True).constexprs["TMA"] is False
    assert stg.spec(ok, ok, ok, two, two, 256, 256, 256, 16, 8, 64, tma=True).constexprs["TMA"] is True
