"""The decode kernels' diagnostic builds (``GemvConfig.diag``, ``MmaDecodeConfig.diag``) on a CPU.

Session 19 located where the one-row GEMV and the ``mma.sync`` kernel lose to a plain read of the same bytes with
builds that skip work (``diag`` 1: no decode; 2, GEMV: no decode, no x, no FFMAs -- wrong results by design) and with
the words pre-tiled (``diag + 4`` over ``gemv.tile_words``: the same math at other addresses, RESULTS "Issue 17,
session 19"; ``benchmarks/kernels/bench_decode_bound.py``). What can be checked without a GPU: ``tile_words`` puts
each [rows, words] tile in one contiguous block and refuses shapes it cannot tile; under the interpreter the GEMV
reading tiled words gives the same bits as reading them row-major; the sm_90 builds of the tiled kernels keep their
16-byte word loads (the addresses stay vectorizable), the default builds carry no diagnostic code, and nothing spills.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap

import pytest

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted


def _wide_loads(sass: str) -> list[str]:
    """The 16-byte global loads (``LDG...128``) of a SASS listing."""
    return [op for op in re.findall(r"\bLDG[.A-Z0-9_]*", sass) if op.endswith(".128")]


def _gluon_sass_tools():
    """(``bench_module``, ``sass_of``, ``stack_bytes``) for a Gluon kernel's sm_90 build; skips without Gluon or
    ``cuobjdump``."""
    pytest.importorskip("triton.experimental.gluon")
    from tests.kernels.sm90_sass import bench_module, cuobjdump, sass_of, stack_bytes

    if cuobjdump() is None:
        pytest.skip("the Triton wheel ships no cuobjdump")
    return bench_module, sass_of, stack_bytes


@needs_triton
def test_tile_words_layout():
    import torch
    from quarl_kernels import gemv

    w = torch.arange(64 * 96, dtype=torch.int32).view(64, 96)
    t = gemv.tile_words(w, 16, 32)
    assert t.shape == w.shape and t.is_contiguous()
    blocks = t.view(4, 3, 16, 32)  # [N / rows, KW / words, rows, words]
    for i, j in ((0, 0), (1, 2), (3, 1)):
        assert torch.equal(blocks[i, j], w[16 * i:16 * (i + 1), 32 * j:32 * (j + 1)])
    with pytest.raises(ValueError, match="do not split"):
        gemv.tile_words(w, 48, 32)


@needs_interpreter
def test_gemv_reads_tiled_words_to_the_same_bits():
    run_interpreted(textwrap.dedent("""
        import dataclasses
        import torch
        from quarl.quant import get_format, make_config
        from quarl_kernels import gemv
        from quarl_kernels.ops import _packed_weight
        from quarl_kernels.wo_gemm import PackedWeight

        C = gemv.GemvConfig
        for spec, n, k, cfg in (("nvfp4", 64, 512, C(16, 16, 4, 4, prefetch=False)),  # split-K
                                ("mxfp4", 48, 256, C(16, 8, 4, 4)),  # register prefetch
                                ("nvfp4", 32, 1024, C(32, 32, 4, 4, prefetch=False))):
            torch.manual_seed(n + k)
            c = make_config(spec)
            t = get_format(c.name).quantize(torch.randn(n, k) * 0.05, c).tensors
            pw = _packed_weight(t["weight_packed"], t["weight_scale"], None, t.get("weight_global_scale"), c.name,
                                c.block_size, n, k)
            bn, bkw, _ = gemv.effective_tile(cfg, pw.group)
            tiled = PackedWeight(pw.fmt, pw.group, n, k, gemv.tile_words(pw.words, bn, bkw), pw.scale, None,
                                 pw.gscale, pw.bytes32)
            x = torch.randn(1, k).to(torch.bfloat16)
            want = gemv.launch_gemv(x, pw, cfg, use_asm=False)
            got = gemv.launch_gemv(x, tiled, dataclasses.replace(cfg, diag=4), use_asm=False)
            assert torch.equal(got, want), (spec, n, k, str(cfg))
        print("OK")
    """))


@needs_triton
def test_gemv_builds():
    import torch
    from quarl_kernels import gemv
    from quarl_kernels.wo_gemm import PackedWeight

    from tests.kernels.sm90_sass import compile_launch, stack_bytes

    n, k = 18944, 3584  # 7B gate / up
    pw = PackedWeight(0, 16, n, k, torch.empty(n, k // 8, dtype=torch.int32),
                      torch.empty(n, k // 16, dtype=torch.uint8), None, torch.ones(1))
    x = torch.empty(1, k, dtype=torch.bfloat16)
    cfg = gemv.default_gemv_config(0, 1, n, k)
    assert cfg.diag == 0
    built = {}
    for d in (0, 4, 2):
        kern, sass = compile_launch(gemv.gemv_launch(x, pw, dataclasses.replace(cfg, diag=d)))
        assert stack_bytes(kern) in (0, None), d
        built[d] = sass
    words, tiled = _wide_loads(built[0]), _wide_loads(built[4])
    assert words and len(tiled) == len(words)  # the tiled words still load 16 bytes at a time
    fp = [len(re.findall(r"\b(?:FFMA|FMUL|FADD)\b", built[d])) for d in (0, 2)]
    assert fp[1] < fp[0] // 4, fp  # diag 2: the math gone


@needs_triton
def test_mma_decode_builds():
    from quarl_kernels import mma_decode
    from quarl_kernels.formats import FMT_NVFP4

    bench_module, sass_of, stack_bytes = _gluon_sass_tools()
    compile_mma_decode = bench_module("bench_mma_decode").compile_mma_decode
    cfg = mma_decode.default_config(8, 18944)
    assert cfg.diag == 0
    wide0 = _wide_loads(sass_of(compile_mma_decode(FMT_NVFP4, cfg, 8, split=False)))
    assert wide0
    for d in (4, 8):  # the step's own [128, 16] blocks, [64, 8] blocks
        kd = compile_mma_decode(FMT_NVFP4, dataclasses.replace(cfg, diag=d), 8, split=False)
        assert stack_bytes(kd) in (0, None), d
        assert len(_wide_loads(sass_of(kd))) == len(wide0), d


@needs_triton
def test_ring_builds_reading_tiled_words():
    """The TMA ring with ``tiled=True`` (its box one [64, 8] block of ``tile_words``): still TMA-fed, no spills."""
    pytest.importorskip("triton.experimental.gluon")
    from quarl_kernels import wgmma_ring as wr

    from tests.kernels.sm90_sass import bench_module, registers, stack_bytes

    compile_wgmma_ring = bench_module("bench_wgmma_decode").compile_wgmma_ring
    k0 = compile_wgmma_ring(0, wr.RING_CONFIGS[0], 32)
    k1 = compile_wgmma_ring(0, wr.RING_CONFIGS[0], 32, tiled=True)
    assert stack_bytes(k1) in (0, None)
    assert "cp.async.bulk.tensor.2d" in k1.asm["ptx"]
    assert registers(k1) is None or registers(k1) <= registers(k0) + 8


@needs_triton
def test_wgmma_decode_builds_reading_blocks():
    """``wgmma_decode`` with ``diag`` 8 ([64, 8] word blocks) keeps its 16-byte word loads and spills nothing."""
    from quarl_kernels import wgmma_decode as wd
    from quarl_kernels.formats import FMT_NVFP4

    bench_module, sass_of, stack_bytes = _gluon_sass_tools()
    compile_wgmma_decode = bench_module("bench_wgmma_decode").compile_wgmma_decode
    for m in (32, 64):
        cfg = wd.default_config(m, 5120, FMT_NVFP4)
        k0 = compile_wgmma_decode(FMT_NVFP4, cfg, wd.token_tile(m))
        k8 = compile_wgmma_decode(FMT_NVFP4, dataclasses.replace(cfg, diag=8), wd.token_tile(m))
        assert stack_bytes(k8) in (0, None), m
        wide = [_wide_loads(sass_of(k)) for k in (k0, k8)]
        assert wide[0] and len(wide[1]) == len(wide[0]), m
