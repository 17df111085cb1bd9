"""The Triton WGrad GEMM (``quarl_kernels.fp8_wgrad``) on CPU: every launch setting through ``TRITON_INTERPRET=1``
against the FP32 product of the dequantized operands, and every setting compiled for sm_90 (no GPU) without
register spills, on the pipelined path the GPU takes (wgmma, and TMA for the descriptor settings).

Skipped unless Triton is importable (and NumPy < 2.3 for the interpreter), as the other kernel tests.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

SCRIPT = textwrap.dedent("""
    import torch
    from quarl_kernels import fp8_wgrad as fw
    from quarl.quant.formats.fp8 import dequantize_act_1x128, quantize_act_1x128

    def outer(s):
        return s.t().contiguous().t()  # [rows, groups] stored [groups, rows]

    torch.manual_seed(0)
    # M, N not multiples of any tile (masked edges), two and three token blocks, scales of very different size
    for m, n, t in ((200, 72, 384), (128, 256, 256)):
        dy = torch.randn(t, m) * torch.logspace(-3, 3, t)[:, None]
        x = torch.randn(t, n) * torch.logspace(2, -2, n)[None, :]
        aq, sa = quantize_act_1x128(dy.t().contiguous())  # dY^T [M, T], 1x128 along the tokens
        bq, sb = quantize_act_1x128(x.t().contiguous())  # X^T [N, T]
        ref = dequantize_act_1x128(aq, sa).double() @ dequantize_act_1x128(bq, sb).double().t()
        for setting in fw.SETTINGS:
            bm, bn, warps, stages, tma = setting
            for dt in (torch.float32, torch.bfloat16):
                c = fw.wgrad_1d1d(aq, outer(sa), bq, outer(sb), dt, setting=(min(bm, 64), min(bn, 64), 4, 2, tma))
                err = float((c.double() - ref).norm() / ref.norm())
                assert c.dtype == dt and c.shape == (m, n)
                assert err < (1e-6 if dt == torch.float32 else 4e-3), (m, n, t, setting, dt, err)
        print(m, n, t, "ok")
    # bad operands are named
    a = torch.zeros(128, 256, dtype=torch.float8_e4m3fn)
    s = outer(torch.ones(128, 2))
    for bad, msg in (((a.float(), s, a, s), "float8_e4m3fn"), ((a[:, :200], s, a[:, :200], s), "multiple of 128"),
                     ((a, torch.ones(128, 2), a, s), "outer-major")):
        try:
            fw.wgrad_1d1d(*bad, torch.float32, setting=(64, 64, 4, 2, 0))
        except ValueError as e:
            assert msg in str(e), (msg, e)
        else:
            raise AssertionError(msg)
    print("OK")
""")


@needs_interpreter
def test_wgrad_kernel_under_triton_interpreter():
    """Tile sizes are capped at 64 here (the interpreter's time); the kernel's program is the same for any tile."""
    run_interpreted(SCRIPT)


@needs_triton
@pytest.mark.parametrize("shape", [(18944, 3584, 8192), (512, 3584, 8192), (640, 576, 384)])
def test_wgrad_settings_compile_for_sm90_without_spills(shape):
    """Every run-time candidate lowers to wgmma (QGMMA in the SASS) with FP32 FMA scaling and spills nothing; the
    descriptor settings load through TMA."""
    import torch
    from quarl_kernels import fp8_wgrad as fw

    from tests.kernels.sm90_sass import compile_launch, stack_bytes

    m, n, t = shape
    a, b = torch.empty(m, t, dtype=torch.float8_e4m3fn), torch.empty(n, t, dtype=torch.float8_e4m3fn)
    sa, sb = torch.empty(t // 128, m).t(), torch.empty(t // 128, n).t()
    c = torch.empty(m, n, dtype=torch.bfloat16)
    for setting in fw.SETTINGS:
        k, sass = compile_launch(fw._wgrad_launch(a, sa, b, sb, c, *setting), fp_fusion=True)
        assert "QGMMA" in sass and "FFMA" in sass, setting
        assert ("cp.async.bulk.tensor" in k.asm["ptx"]) == bool(setting[4]), setting
        spill = stack_bytes(k)
        assert spill in (None, 0), f"{setting}: {spill} bytes of stack (spills)"
