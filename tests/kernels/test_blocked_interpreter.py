"""The Triton kernels reading blocked words (``quarl.quant.packed_layout``) give the row-major kernels' bits.

Under ``TRITON_INTERPRET=1`` on CPU: the one-row GEMV (alone, with a K split, and as a q/k/v group launch), the fused
forward and backward GEMMs (``wo_gemm.launch_fwd`` / ``launch_bwd``: M tails, split-K, pair order), the dense path's
dequantize and the FP8 expansion (both orientations) each run on a weight's words as compressed-tensors lays them out
and on the same words blocked; every output must be bit-equal (the same math at other addresses). The Gluon kernels
(``mma_decode``, ``wgmma_decode``, the TMA ring) do not run in the interpreter: ``test_decode_diag.py`` builds them
for sm_90 and ``test_blocked_gpu.py`` runs everything on a GPU.
"""

from __future__ import annotations

import textwrap

from tests.kernels.interpreter import needs_interpreter, run_interpreted

pytestmark = needs_interpreter

PRELUDE = textwrap.dedent("""
    import dataclasses
    import torch
    from quarl.quant import get_format, make_config, packed_layout
    from quarl_kernels.ops import _packed_weight

    def weights(spec, n, k, seed=0):
        torch.manual_seed(seed)
        c = make_config(spec)
        t = get_format(c.name).quantize(torch.randn(n, k) * 0.05, c).tensors
        args = (t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), t.get("weight_global_scale"),
                c.name, c.block_size, n, k)
        row = _packed_weight(*args)
        blk = _packed_weight(packed_layout.block(args[0]), *args[1:])
        assert blk.blocked and not row.blocked and blk.words.shape == row.words.shape
        assert not torch.equal(blk.words, row.words)  # really another order
        return row, blk
""")


def test_gemv_and_group_read_blocked_words():
    run_interpreted(PRELUDE + textwrap.dedent("""
        from quarl_kernels import gemv
        C = gemv.GemvConfig
        for spec, n, k, cfg in (("nvfp4", 64, 512, C(16, 16, 4, 4, prefetch=False)),  # split-K
                                ("mxfp4", 128, 256, C(32, 8, 4, 4)),  # register prefetch, 8-word steps
                                ("int4-g128", 64, 1024, C(16, 128, 4, 4, stages=3)),  # INT4 zero points
                                ("nvfp4", 192, 1024, C(64, 32, 4, 4, prefetch=False))):
            row, blk = weights(spec, n, k)
            x = torch.randn(1, k).to(torch.bfloat16)
            want = gemv.launch_gemv(x, row, cfg, use_asm=False)
            assert torch.equal(gemv.launch_gemv(x, blk, cfg, use_asm=False), want), (spec, n, k, str(cfg))
        # a q/k/v group in one launch: every weight blocked
        qkv = [weights("nvfp4", n, 256, seed=n) for n in (128, 64, 64)]
        x = torch.randn(1, 256).to(torch.bfloat16)
        cfg = gemv.default_gemv_config(0, 1, 128, 256)
        want = gemv.launch_gemv_group(x, [r for r, _ in qkv], cfg, [None] * 3, use_asm=False)
        got = gemv.launch_gemv_group(x, [b for _, b in qkv], cfg, [None] * 3, use_asm=False)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        try:
            gemv.launch_gemv_group(x, [qkv[0][1], qkv[1][0], qkv[2][1]], cfg, [None] * 3, use_asm=False)
        except ValueError as e:
            assert "blocked" in str(e)
        else:
            raise AssertionError("a launch mixing blocked and row-major words must be refused")
        print("OK")
    """))


def test_fused_gemms_read_blocked_words():
    run_interpreted(PRELUDE + textwrap.dedent("""
        from quarl_kernels import wo_gemm
        C = wo_gemm.Config
        for spec, m, n, k, cfg, fwd, pair in (
                ("nvfp4", 3, 64, 256, C(16, 32, 16, 4, 1, swap=True), True, True),
                ("int4-g128", 70, 128, 512, C(64, 32, 8, 4, 1), True, False),  # M > 64, split-K
                ("mxfp4", 5, 128, 384, C(16, 32, 32, 4, 1), True, False),  # K tail inside a tile
                ("nvfp4", 33, 64, 384, C(64, 32, 8, 4, 1), False, True),
                ("int4-g128", 40, 128, 384, C(64, 32, 32, 4, 1), False, False)):
            row, blk = weights(spec, n, k)
            x = torch.randn(m, k if fwd else n).to(torch.bfloat16)
            run = wo_gemm.launch_fwd if fwd else wo_gemm.launch_bwd
            want = run(x, row, cfg, use_asm=False, pair_order=pair)
            assert torch.equal(run(x, blk, cfg, use_asm=False, pair_order=pair), want), (spec, m, n, k, fwd)
        print("OK")
    """))


def test_dense_and_fp8_expand_read_blocked_words():
    run_interpreted(PRELUDE + textwrap.dedent("""
        from quarl_kernels import dense, dense_fp8
        for spec, n, k in (("nvfp4", 192, 512), ("mxfp4", 64, 384), ("int4-g128", 128, 256)):
            row, blk = weights(spec, n, k)
            assert torch.equal(dense.dequantize(blk, use_asm=False), dense.dequantize(row, use_asm=False)), spec
            if spec != "int4-g128":
                for tr in (False, True):
                    qr, sr = dense_fp8.expand(row, transpose=tr, use_asm=False)
                    qb, sb = dense_fp8.expand(blk, transpose=tr, use_asm=False)
                    assert torch.equal(qb.view(torch.uint8), qr.view(torch.uint8)) and torch.equal(sb, sr), spec
        print("OK")
    """))
