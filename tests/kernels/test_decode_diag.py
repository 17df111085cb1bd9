"""The decode kernels' diagnostic builds and their blocked-word builds on a CPU.

Session 19 located where the one-row GEMV and the ``mma.sync`` kernel lose to a plain read of the same bytes with
builds that skip work (``diag`` 1: no decode; 2, GEMV: no decode, no x, no FFMAs -- wrong results by design) and with
the words pre-tiled (RESULTS "Issue 17, session 19"); session 21 made the tiled words the product's layout
(``quarl.quant.packed_layout``: [64, 8]-word blocks, ``BLOCKED`` in every kernel that reads words). What can be
checked without a GPU: the sm_90 builds of the kernels reading blocked words keep their 16-byte word loads (the
addresses stay vectorizable) and spill nothing, the TMA ring still loads by TMA, the default builds carry no
diagnostic code. (Bit-equality with row-major words: ``test_blocked_interpreter.py`` and ``test_blocked_gpu.py``.)
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from tests.kernels.interpreter import needs_triton


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
def test_gemv_builds():
    import torch
    from quarl_kernels import gemv
    from quarl_kernels.wo_gemm import PackedWeight

    from tests.kernels.sm90_sass import compile_launch, loops, parse, stack_bytes

    def loop_fp_ops(sass: str) -> int:  # FP32 arithmetic inside the K loops (the tile's reduction after them aside)
        ins = parse(sass)
        spans = loops(ins)
        return sum(1 for i, op, _ in ins if op.split(".")[0] in ("FFMA", "FMUL", "FADD")
                   and any(a <= i <= b for a, b in spans))

    n, k = 18944, 3584  # 7B gate / up
    pw = PackedWeight(0, 16, n, k, torch.empty(n, k // 8, dtype=torch.int32),
                      torch.empty(n, k // 16, dtype=torch.uint8), None, torch.ones(1))
    x = torch.empty(1, k, dtype=torch.bfloat16)
    cfg = gemv.default_gemv_config(0, 1, n, k)
    assert cfg.diag == 0
    built = {}
    for d, p in ((0, pw), (2, pw), ("blocked", dataclasses.replace(pw, blocked=True))):
        kern, sass = compile_launch(gemv.gemv_launch(x, p, dataclasses.replace(cfg, diag=0 if d == "blocked" else d)))
        assert stack_bytes(kern) in (0, None), d
        built[d] = sass
    words, blocked = _wide_loads(built[0]), _wide_loads(built["blocked"])
    assert words and len(blocked) == len(words)  # the blocked words still load 16 bytes at a time
    fp = [loop_fp_ops(built[d]) for d in (0, 2)]  # built as launched (FP contraction on: FFMAs)
    print("FP32 ops in the K loops, real / diag 2:", fp)
    assert fp[1] < fp[0] // 4, fp  # diag 2: the math gone (one add a word is left, to keep the loads)


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
    kb = compile_mma_decode(FMT_NVFP4, cfg, 8, split=False, blocked=True)
    assert stack_bytes(kb) in (0, None)
    assert len(_wide_loads(sass_of(kb))) == len(wide0)


@needs_triton
def test_ring_builds_reading_blocked_words():
    """The TMA ring reading blocked words (one [64, 8] box per 64-row band): still TMA-fed, no spills, at 64 and
    128 rows a CTA."""
    pytest.importorskip("triton.experimental.gluon")
    from quarl_kernels import wgmma_ring as wr

    from tests.kernels.sm90_sass import bench_module, registers, stack_bytes

    compile_wgmma_ring = bench_module("bench_wgmma_decode").compile_wgmma_ring
    for cfg in (wr.RING_CONFIGS[0], wr.RING_CONFIGS[2]):  # 64 and 128 rows
        k0 = compile_wgmma_ring(0, cfg, 32)
        k1 = compile_wgmma_ring(0, cfg, 32, blocked=True)
        assert stack_bytes(k1) in (0, None), cfg
        ptx = k1.asm["ptx"]
        assert ptx.count("cp.async.bulk.tensor.2d") >= (cfg.rows // 64 + 1), cfg  # x's box and the bands' boxes
        assert registers(k1) is None or registers(k1) <= registers(k0) + 8, cfg


@needs_triton
def test_wgmma_decode_builds_reading_blocks():
    """``wgmma_decode`` reading blocked words keeps its 16-byte word loads and spills nothing."""
    from quarl_kernels import wgmma_decode as wd
    from quarl_kernels.formats import FMT_NVFP4

    bench_module, sass_of, stack_bytes = _gluon_sass_tools()
    compile_wgmma_decode = bench_module("bench_wgmma_decode").compile_wgmma_decode
    for m in (32, 64):
        cfg = wd.default_config(m, 5120, FMT_NVFP4)
        k0 = compile_wgmma_decode(FMT_NVFP4, cfg, wd.token_tile(m))
        k8 = compile_wgmma_decode(FMT_NVFP4, cfg, wd.token_tile(m), blocked=True)
        assert stack_bytes(k8) in (0, None), m
        wide = [_wide_loads(sass_of(k)) for k in (k0, k8)]
        assert wide[0] and len(wide[1]) == len(wide[0]), m


@needs_triton
def test_dense_dequantize_builds_reading_blocked_words():
    """The dense path's decode (``dense._dequant_kernel``, the training forward / backward at M >= 385) keeps its
    16-byte word loads on blocked words."""
    import torch
    from quarl_kernels import dense, fp8_quant
    from quarl_kernels.wo_gemm import PackedWeight

    from tests.kernels.sm90_sass import compile_launch

    n, k = 18944, 3584
    pw = PackedWeight(0, 16, n, k, torch.empty(n, k // 8, dtype=torch.int32),
                      torch.empty(n, k // 16, dtype=torch.uint8).view(torch.int32), None, torch.ones(1), True)
    out = torch.empty(n, k, dtype=torch.bfloat16)
    wide = []
    for blocked in (False, True):
        launch = fp8_quant.Launch(
            dense._dequant_kernel, (1, 1),
            (pw.words, pw.scale, pw.scale, pw.gscale, out, n, k // 8, pw.words.stride(0), pw.scale.stride(0),
             pw.scale.stride(0), out.stride(0)),
            {"FMT": 0, "GROUP": 16, "HAS_ZP": False, "USE_ASM": True, "BYTES32": True, "BN": 32, "BKW": 16,
             "BLOCKED": blocked}, 4)
        wide.append(_wide_loads(compile_launch(launch)[1]))
    assert wide[0] and len(wide[1]) == len(wide[0])
