"""The FP8 decode GEMM (``quarl_kernels.fp8_gemv``) on CPU through ``TRITON_INTERPRET=1``: against the FP8 linear's
emulated blockwise GEMM (``quarl.quant.fp8_linear.blockwise_gemm`` on CPU: dequantize both operands, FP32 matmul)
for decode and wider row counts, N not a multiple of the row block, split and unsplit K, strided activations and
both output dtypes; bad operands are named.

Skipped unless Triton is importable and NumPy < 2.3 (see tests/kernels/interpreter.py).
"""

from __future__ import annotations

import textwrap

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

SCRIPT = textwrap.dedent("""
    import torch
    from quarl_kernels import fp8_gemv as g
    from quarl.quant.fp8_gemm import blockwise_gemm
    from quarl.quant.fp8_operands import _quant_1x128, quantize_weight_padded

    torch.manual_seed(0)
    cases = [(1, 256, 512, g.Fp8GemvConfig()), (5, 300, 256, g.Fp8GemvConfig(bn=32, stages=3)),
             (17, 384, 384, g.Fp8GemvConfig(bn=128)), (64, 256, 128, g.Fp8GemvConfig()),
             (1, 4224, 256, g.Fp8GemvConfig(bn=32, waves=1))]  # the last: 132 row blocks, no split
    for m, n, k, cfg in cases:
        x = torch.randn(m, k) * 2
        w = torch.randn(n, k) * 0.05
        a, sa = _quant_1x128(x)  # [M, K] e4m3, [M, K/128]
        b, sb = quantize_weight_padded(w)  # [Np, Kp] e4m3, [Np/128, Kp/128]
        b = b[:n]  # the true rows (the linear passes the padded tiles; both work)
        split = g.split_for(cfg, m, n, k // 128, 132)[0]
        ref = blockwise_gemm(a, sa, b, sb, True, torch.float32)  # CPU: the emulated path
        got = g.fp8_gemv(a, sa, b, sb, torch.float32, cfg)
        err = ((got - ref).norm() / ref.norm()).item()
        print(m, n, k, cfg, "split", split, "rel", err)
        assert got.shape == (m, n) and err < 1e-6, err
        got16 = g.fp8_gemv(a, sa, b, sb, torch.bfloat16, cfg)
        # one rounding of a value within 1e-6; the interpreter's fp32 -> bf16 cast truncates (the GPU's rounds to
        # nearest): within one bf16 ulp here, half of one on the GPU (test_fp8_gemv_gpu.py)
        ulp = (got16.float() - ref).abs() <= ref.abs() * 2.0 ** -7 + 1e-30
        assert got16.dtype == torch.bfloat16 and bool(ulp.all()), int((~ulp).sum())
    assert g.split_for(g.Fp8GemvConfig(bn=32, waves=1), 1, 4224, 2, 132)[0] == 1
    # a strided activation (rows of a wider buffer) and transposed-layout scales
    x = torch.randn(3, 512)
    a, sa = _quant_1x128(x)
    wide = torch.zeros(3, 640, dtype=a.dtype)
    wide[:, :512] = a
    sa_t = sa.t().contiguous().t()  # [M, K/128] with M-major strides, as the GEMM layouts keep it
    b, sb = quantize_weight_padded(torch.randn(256, 512) * 0.05)
    ref = blockwise_gemm(a, sa, b, sb, True, torch.float32)
    got = g.fp8_gemv(wide[:, :512], sa_t, b, sb, torch.float32)
    assert ((got - ref).norm() / ref.norm()).item() < 1e-6
    for bad, msg in (((a[:, :100], sa, b, sb), "multiple of 128"), ((a, sa[:, :1], b, sb), "scales"),
                     ((a, sa, b.t(), sb), "unit K strides")):
        try:
            g.fp8_gemv(*bad, torch.float32)
        except ValueError as e:
            assert msg in str(e), (msg, str(e))
        else:
            raise AssertionError(f"accepted: {msg}")
    try:
        g.fp8_gemv(a, sa, b, sb, torch.float32, g.Fp8GemvConfig(bn=96))
    except ValueError as e:
        assert "must divide 128" in str(e)
    else:
        raise AssertionError("BN=96 accepted")
    # through the FP8 linear: decode rows take the GEMV when asked (QUARL_FP8_GEMV=1; on CPU only under the
    # interpreter), wider inputs keep the GEMM, and both give the emulated path's numbers
    import os
    from quarl.quant import fp8_linear as fl

    w = torch.randn(300, 576) * 0.05  # SmolLM2's K: padded to 640 inside
    for rows in (1, 3, 65):
        x = torch.randn(rows, 576)
        os.environ["QUARL_FP8_GEMV"] = "0"
        ref = fl.fp8_linear(x, w)
        os.environ["QUARL_FP8_GEMV"] = "1"
        calls = []
        real = fl._gemv_module().fp8_gemv
        fl._gemv_module().fp8_gemv = lambda *a, **k: calls.append(1) or real(*a, **k)
        try:
            got = fl.fp8_linear(x, w)
        finally:
            fl._gemv_module().fp8_gemv = real
        assert bool(calls) == (rows <= 64), rows
        assert ((got - ref).norm() / ref.norm()).item() < 1e-6, rows
    os.environ["QUARL_FP8_GEMV"] = "bogus"
    try:
        fl.gemv_rows()
    except Exception as e:
        assert "QUARL_FP8_GEMV='bogus'" in str(e)
    else:
        raise AssertionError("a bad QUARL_FP8_GEMV was accepted")
    del os.environ["QUARL_FP8_GEMV"]
    print("OK")
""")


@needs_interpreter
def test_fp8_gemv_matches_the_emulated_blockwise_gemm():
    run_interpreted(SCRIPT, timeout=600)


@needs_triton
def test_fp8_gemv_builds_for_sm90_pipelined_without_spills():
    """Built for Hopper on a CPU: tensor-core MMAs (Triton 3.6 feeds the E4M3 tiles to f16 ``mma.sync``, E4M3
    being exact in f16), cp.async loads (the K blocks in flight) and no spilled registers, for the default setting
    and the widest one."""
    import collections

    import torch
    from quarl_kernels import fp8_gemv as g

    from tests.kernels.sm90_sass import compile_launch, stack_bytes

    Launch = collections.namedtuple("Launch", "kernel grid args constexprs num_warps")
    for cfg in (g.default_config(8, 4096, 4096), max(g.GEMV_CONFIGS, key=lambda c: (c.bn, c.stages))):
        m, n, k = 8, 4096, 4096
        a, b = torch.empty(m, k, dtype=torch.float8_e4m3fn), torch.empty(n, k, dtype=torch.float8_e4m3fn)
        sa, sb, out = torch.empty(m, k // 128), torch.empty(n // 128, k // 128), torch.empty(3, m, n)
        la = Launch(g._fp8_gemv_kernel, None, (a, sa, b, sb, out, m, n, k // 128, 11, a.stride(0), sa.stride(0),
                                               sa.stride(1), b.stride(0), sb.stride(0), sb.stride(1), out.stride(0),
                                               out.stride(1)),
                    {"BM": g.BM, "BN": cfg.bn, "BK": g.BK, "STAGES": cfg.stages, "INTERPRET": False}, cfg.warps)
        kernel, sass = compile_launch(la)
        assert "MMA" in sass and "LDGSTS" in sass, cfg
        assert stack_bytes(kernel) in (0, None), ("ptxas spilled registers", cfg)
