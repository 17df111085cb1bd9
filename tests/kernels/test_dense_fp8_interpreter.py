"""The opt-in FP8 variant of the dense path (``quarl_kernels.dense_fp8``) on CPU through ``TRITON_INTERPRET=1``.

* ``expand``: the E4M3 codes and 128x128 tile scales equal a reference built in PyTorch from the packed tensors
  (the exact FP4 value x block scale, a power-of-two tile scale, one round-to-nearest-even to E4M3), in both
  orientations, on shapes whose N and K are not multiples of 128 (padding: zero codes); MXFP4 codes are exact,
  NVFP4 codes off by at most half an E4M3 step on a minority of the weights.
* ``matmul`` / ``matmul_t``: the product of the 1x128-quantized activations and those tiles (the emulated GEMM),
  against the float64 product of the packed weight within the FP8 error -- and not equal to it (this is not the
  weight-only product).
* ``dense.dense_matmul`` / ``dense_matmul_t`` take it only with ``QUARL_KERNELS_DENSE_FP8=1``, FP4 weights and a
  GEMM of at least ``QUARL_KERNELS_DENSE_FP8_MIN_GFLOP`` (default 256), and it keeps nothing for the backward
  (``recent_weights`` holds the BF16 path's weights only).

Skipped unless Triton is importable and NumPy < 2.3 (see test_wo_gemm_interpreter.py).
"""

from __future__ import annotations

import textwrap

import pytest

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

SCRIPT = textwrap.dedent("""
    import os
    import torch
    from quarl.quant import get_format, make_config
    from quarl.quant.formats.fp4 import decode_e2m1, unpack_fp4
    from quarl.quant.formats.mxfp4 import e8m0_to_float
    from quarl_kernels import dense, dense_fp8, recent_weights
    from quarl_kernels.ops import _packed_weight

    def exact_values(spec, t, n, k, b):
        vals = decode_e2m1(unpack_fp4(t["weight_packed"])).reshape(n, k // b, b)
        s = t["weight_scale"]
        s = s.float() if spec == "nvfp4" else e8m0_to_float(s)
        return (vals * s[..., None]).reshape(n, k).double(), s  # exact: <= 5 significant bits each

    def reference(spec, v, s, n, k):
        # the tile exponent from 6 x the tile's largest block scale ``s`` [N, K/B]: its amax for NVFP4 (a block's
        # largest code is 6), an upper bound for MXFP4 (a power-of-two scale leaves a block's largest code at 4 or 6)
        np_, kp = -(-n // 128) * 128, -(-k // 128) * 128
        vp = torch.zeros(np_, kp, dtype=torch.float64)
        vp[:n, :k] = v
        tiles = vp.reshape(np_ // 128, 128, kp // 128, 128)
        sp = torch.zeros(np_, kp, dtype=torch.float64)
        sp[:n, :k] = s.double().repeat_interleave(k // s.shape[1], dim=1)
        amax = 6 * sp.reshape(np_ // 128, 128, kp // 128, 128).amax(dim=(1, 3))  # [Np/128, Kp/128]
        if spec == "nvfp4":
            assert torch.equal(amax, tiles.abs().amax(dim=(1, 3)))
        e = torch.floor(torch.log2(amax.clamp_min(1e-300))) - 8
        e = torch.where(torch.ldexp(amax, -e) > 448, e + 1, e)
        e = torch.where(amax == 0, torch.zeros_like(e), e)
        codes = torch.ldexp(tiles, -e[:, None, :, None]).to(torch.float8_e4m3fn).reshape(np_, kp)
        return codes, e

    torch.manual_seed(0)
    for spec, (n, k) in (("nvfp4", (200, 320)), ("mxfp4", (136, 256)), ("nvfp4", (256, 128))):
        c = make_config(spec)
        t = get_format(c.name).quantize(torch.randn(n, k) * 0.03, c).tensors
        gs = t.get("weight_global_scale")
        pw = _packed_weight(t["weight_packed"], t["weight_scale"], None, gs, c.name, c.block_size, n, k)
        v, bs = exact_values(spec, t, n, k, c.block_size)
        codes, e = reference(spec, v, bs, n, k)
        q, s = dense_fp8.expand(pw)
        qt, st = dense_fp8.expand(pw, transpose=True)
        assert q.dtype == torch.float8_e4m3fn and q.shape == codes.shape and s.shape == e.shape, (q.shape, s.shape)
        assert torch.equal(q.float(), codes.float()), spec  # as values: a zero's sign is no matter
        assert torch.equal(qt.float(), codes.t().float()), spec
        factor = (torch.tensor(65536.0) / gs.float()).double() if spec == "nvfp4" else torch.tensor(65536.0).double()
        s_ref = (torch.ldexp(torch.ones_like(e), e - 16) * factor).float()
        assert torch.equal(s, s_ref) and torch.equal(st, s_ref.t()), spec
        # what the codes represent, against the exact values (in the same power-of-two frame)
        got = torch.ldexp(codes.double().reshape(-1, 128, codes.shape[1] // 128, 128), e[:, None, :, None])
        got = got.reshape(codes.shape)[:n, :k]
        off = got != v
        rel = ((got - v).abs() / v.abs().clamp_min(1e-300))[off]
        if spec == "mxfp4":
            assert not off.any(), off.float().mean()
        else:
            frac = off.float().mean().item()
            assert 0.05 < frac < 0.35, frac  # ~ a fifth: 1.5 / 3 / 6 times a scale with an odd last bit
            assert rel.max().item() <= 2.0 ** -4 + 1e-12, rel.max()
        # the GEMMs: emulated FP8 product vs the float64 product of the packed weight
        w64 = v * (1.0 / gs.double() if spec == "nvfp4" else 1.0)
        for m in (7, 64):
            x = torch.randn(m, k).to(torch.bfloat16)
            dy = torch.randn(m, n).to(torch.bfloat16)
            y = dense_fp8.matmul(x, pw)
            dx = dense_fp8.matmul_t(dy, pw)
            assert y.shape == (m, n) and dx.shape == (m, k) and y.dtype == torch.bfloat16
            for out, ref in ((y, x.double() @ w64.T), (dx, dy.double() @ w64)):
                err = ((out.double() - ref).norm() / ref.norm()).item()
                assert 1e-3 < err < 0.06, (spec, m, err)  # FP8 rounding: not exact, not wrong
        # routing: dense.dense_matmul takes the FP8 tiles only when switched on, and from a GEMM size up
        x = torch.randn(32, k).to(torch.bfloat16)
        os.environ["QUARL_KERNELS_DENSE_FP8"] = "1"
        os.environ["QUARL_KERNELS_DENSE_FP8_MIN_GFLOP"] = "0"
        assert torch.equal(dense.dense_matmul(x, pw), dense_fp8.matmul(x, pw))
        os.environ.pop("QUARL_KERNELS_DENSE_FP8_MIN_GFLOP")  # default 256 GFLOP: far above this GEMM
        assert torch.equal(dense.dense_matmul(x, pw), x @ dense.dequantize(pw).T)
        os.environ["QUARL_KERNELS_DENSE_FP8"] = "0"
        assert torch.equal(dense.dense_matmul(x, pw), x @ dense.dequantize(pw).T)

    # the FP8 path keeps nothing for the backward (the BF16 path's recent_weights would hold its BF16 weights)
    os.environ["QUARL_KERNELS_DENSE_FP8"] = "1"
    os.environ["QUARL_KERNELS_DENSE_FP8_MIN_GFLOP"] = "0"
    recent_weights.release()
    with recent_weights.keeping(True):
        dense.dense_matmul(x, pw)
    assert recent_weights.kept() == 0
    os.environ.pop("QUARL_KERNELS_DENSE_FP8_MIN_GFLOP")
    # INT4 stays on the BF16 dense path; expand names the problem
    c = make_config("int4-g128")
    t = get_format(c.name).quantize(torch.randn(128, 256) * 0.03, c).tensors
    pw4 = _packed_weight(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), None, c.name,
                         c.block_size, 128, 256)
    assert not dense_fp8.supported(pw4) and not dense_fp8.takes(4096, pw4)
    try:
        dense_fp8.expand(pw4)
    except ValueError as e:
        assert "not an FP4 format" in str(e), e
    else:
        raise AssertionError("expand took an INT4 weight")
    # the threshold: 2 M N K >= QUARL_KERNELS_DENSE_FP8_MIN_GFLOP * 1e9 (7B MLP at 6144 rows: 834 GFLOP; q / o: 158)
    big = type(pw)(pw.fmt, pw.group, 18944, 3584, pw.words, pw.scale, None, pw.gscale, pw.bytes32)
    qo = type(pw)(pw.fmt, pw.group, 3584, 3584, pw.words, pw.scale, None, pw.gscale, pw.bytes32)
    assert dense_fp8.min_gflop() == dense_fp8.DEFAULT_MIN_GFLOP == 256
    assert dense_fp8.takes(6144, big) and not dense_fp8.takes(6144, qo) and dense_fp8.takes(16384, qo)
    for name, value, read in (("QUARL_KERNELS_DENSE_FP8_MIN_GFLOP", "-3", dense_fp8.min_gflop),
                              ("QUARL_KERNELS_DENSE_FP8", "maybe", dense_fp8.enabled)):
        os.environ[name] = value
        try:
            read()
        except ValueError as e:
            assert name in str(e), e
        else:
            raise AssertionError(f"{name}={value} was accepted")
        os.environ.pop(name)
    print("OK")
""")


@needs_interpreter
def test_dense_fp8_expand_and_gemms():
    run_interpreted(SCRIPT, timeout=600)


@needs_triton
def test_expand_compiles_for_sm90_without_spills_or_stale_codes():
    """The expansion kernel as a 7B launch would build it (both orientations, NVFP4 and MXFP4), for sm_90 on a CPU:
    the saturating RNE E4M3 cast, no spilled registers, and no FP8 code stored from a register the program has not
    written yet (the fp8_quant W^T bug's check, tests/kernels/sm90_sass.py)."""
    import torch
    from quarl_kernels import dense_fp8, wo_gemm

    from tests.kernels.sm90_sass import compile_launch, cuobjdump, stack_bytes, stale_code_stores

    if cuobjdump() is None:
        pytest.skip("the Triton wheel ships no cuobjdump")
    n, k = 18944, 3584
    for fmt, group, gs in ((0, 16, torch.ones(1)), (1, 32, None)):
        pw = wo_gemm.PackedWeight(fmt, group, n, k, torch.empty(n, k // 8, dtype=torch.int32),
                                  torch.empty(n, k // group // 4, dtype=torch.int32), None, gs, True)
        for transpose in (False, True):
            shape = (k, n) if transpose else (n, k)
            q = torch.empty(shape, dtype=torch.float8_e4m3fn)
            s = torch.empty(shape[0] // 128, shape[1] // 128)
            la = dense_fp8.expand_launch(pw, q, s, transpose)
            kern, sass = compile_launch(la, USE_ASM=True, INTERPRET=False)
            name = f"fmt {fmt} transpose {transpose}"
            assert "cvt.rn.satfinite.e4m3x2.f32" in kern.asm["ptx"], name
            assert stack_bytes(kern) == 0, f"{name}: ptxas spilled registers"
            assert not stale_code_stores(sass), name
