"""``quarl_kernels.group_div``'s algorithm in exact arithmetic on CPU: the quotient it builds from a per-group
reciprocal equals the correctly rounded fp32 division bit for bit (signed zeros included).

The GPU test (``test_fp8_quant_gpu.py``) checks the kernels themselves; Triton's interpreter cannot (it has no
``rcp.approx`` and rounds an ``fma`` twice). Here each step is computed as the hardware does it -- fp32 products
rounded once, FMAs rounded once from the exact value (float64 products are exact for fp32 inputs; the sum is
made exact with TwoSum and rounded to fp32 by hand) -- and ``rcp.approx`` is stood in for by the correctly
rounded reciprocal, on inputs chosen where a wrong quotient would change an E4M3 code: the codes' rounding
boundaries of every exponent and the fp32 values around them, hard divisor significands, scales over the whole
fp32 range, zeros and tiny values. The stand-in matters: moved by one ulp, the Newton step lands two ulps off for
divisors of significand 2 - 2**-23 and quotients go wrong -- the hardware's ``MUFU.RCP`` is not any value within an
ulp but the one ``div.rn.f32``'s own fast path is correct with, which is why ``group_div`` uses it and nothing else;
the GPU test checks it against ``div.rn`` on every divisor significand.
"""

from __future__ import annotations

import numpy as np

F32, F64 = np.float32, np.float64


def _rn32(s: np.ndarray, err: np.ndarray) -> np.ndarray:
    """RN to fp32 of the exact value ``s + err`` (float64 ``s``, ``|err| <= ulp(s) / 2``, TwoSum's pair)."""
    r = s.astype(F32)
    r64 = r.astype(F64)
    toward = np.nextafter(r, np.where(s > r64, F32(np.inf), F32(-np.inf))).astype(F32)
    tie = (s != r64) & (s == (r64 + toward.astype(F64)) / 2)  # s on an fp32 midpoint, float32() rounded it RNE
    up = err > 0
    pick_hi = np.maximum(r, toward)
    pick_lo = np.minimum(r, toward)
    fixed = np.where(up, pick_hi, pick_lo)
    return np.where(tie & (err != 0), fixed, r).astype(F32)


def fma32(a, b, c) -> np.ndarray:
    """fp32 fused multiply-add, rounded once (RNE)."""
    p = a.astype(F64) * b.astype(F64)  # exact: 24 x 24 bits
    c64 = c.astype(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)  # TwoSum: p + c = s + err exactly
    out = _rn32(s, np.nan_to_num(err))
    # exact zeros: IEEE gives +0 for x + (-x) and for (+0) + (-0), -0 for (-0) + (-0)
    zero = (p == 0) & (c64 == 0)
    return np.where(zero, (p + c64).astype(F32), out)


def divisor_parts(s: np.ndarray, ulps: int):
    bits = s.view(np.int32)
    e = (bits >> 23) & 0xFF
    m = (np.maximum(254 - e, 1) << 23).astype(np.int32).view(F32)
    m = np.where(e != 255, m, F32(1))
    sn = (s * m).astype(F32)
    y0 = (F32(1) / sn).astype(F32)
    for _ in range(abs(ulps)):
        y0 = np.nextafter(y0, F32(np.inf) if ulps > 0 else F32(0)).astype(F32)
    y = fma32(y0, fma32(-sn, y0, np.ones_like(sn)), y0)
    return sn, np.where(s == np.inf, F32(0), y).astype(F32), m


def quotient(x, sn, y, m):
    xn = (x * m).astype(F32)
    t = (xn * y).astype(F32)
    r = fma32(-sn, t, xn)
    q = fma32(y, r, t)
    return np.where(t == 0, t, q).astype(F32)


def _e4m3(q: np.ndarray) -> np.ndarray:
    """The quantizers' codes of fp32 quotients: clamp to +-448, cast RNE (PyTorch's), as bytes."""
    import torch

    return torch.from_numpy(q).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def _cases(rng: np.random.Generator):
    """(x, s) pairs with |x| <= 448 s, the kernel's domain."""
    # scales: random over the fp32 range (subnormals included), and hard significands at several exponents
    n_rand = 1000
    s_rand = (rng.uniform(-149, 119, n_rand)).astype(F64)
    s_rand = np.exp2(s_rand).astype(F32)
    sig = np.array([1.0, 1 + 2**-23, 2 - 2**-23, 1.5, 1.75 - 2**-22, 1 / 448 * 256], dtype=F64)
    s_hard = (sig[:, None] * np.exp2(np.array([-140, -100, -64, -20, -8, 0, 7, 30, 90, 118.0]))[None, :]).ravel()
    s = np.concatenate([s_rand, s_hard.astype(F32), np.array([2.0**-149, 2.0**-126, 2.0**-23], dtype=F32)])
    # quotients: every E4M3 rounding boundary (midpoints between codes, subnormals included) and the fp32 values
    # +-4 ulps around it, the codes themselves, random values, and tiny ones
    import torch

    vals = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy().astype(F64)
    mids = (vals[:-1] + vals[1:]) / 2
    v = np.concatenate([vals, mids]).astype(F32)
    around = [v]
    for k in range(1, 5):
        up = v.copy()
        dn = v.copy()
        for _ in range(k):
            up = np.nextafter(up, F32(np.inf)).astype(F32)
            dn = np.nextafter(dn, F32(0)).astype(F32)
        around += [up, dn]
    v = np.concatenate(around + [rng.uniform(-448, 448, 2000).astype(F32), np.exp2(rng.uniform(-40, -9, 500)).astype(F32),
                                 np.array([0.0, 448.0, 2.0**-10, 2.0**-9, 2.0**-11], dtype=F32)])
    v = np.concatenate([v, -v])
    # x = RN(v * s): the quotient x / s is then within an ulp of v, i.e. as close to the boundaries as fp32 allows
    x = (v[None, :].astype(F32) * s[:, None]).astype(F32)
    ss = np.broadcast_to(s[:, None], x.shape).astype(F32)
    ok = np.abs(x.astype(F64)) <= 448.001 * ss.astype(F64)
    return x[ok], ss[ok]


def test_quotient_is_the_correctly_rounded_division():
    rng = np.random.default_rng(0)
    x, s = _cases(rng)
    assert x.size > 1_000_000
    with np.errstate(all="ignore"):
        ref = (x / s).astype(F32)  # IEEE fp32 division: correctly rounded
        got = quotient(x, *divisor_parts(s, 0))
    # the fp32 quotient bit for bit wherever its E4M3 code can be non-zero; below that (subnormal quotients: the
    # residual may underflow) the code -- a signed zero -- bit for bit
    big = np.abs(ref) >= 2.0**-10
    bad = big & (got.view(np.int32) != ref.view(np.int32))
    assert not bad.any(), (x[bad][:5], s[bad][:5], got[bad][:5], ref[bad][:5])
    assert (np.abs(got[~big]) < 2.0**-10).all()
    assert np.array_equal(_e4m3(got), _e4m3(ref))


def test_zeros_infinities_and_nan_follow_pytorch():
    x = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 0.0, -0.0, -2.0**-149], dtype=F32)
    s = np.array([1.0, 1.0, np.inf, np.inf, np.inf, np.inf, 2.0, np.nan, 2.0**-149, 2.0**-149], dtype=F32)
    with np.errstate(all="ignore"):
        ref = (x / s).astype(F32)
        got = quotient(x, *divisor_parts(s, 0))
    same = (got.view(np.int32) == ref.view(np.int32)) | (np.isnan(got) & np.isnan(ref))
    assert same[:-2].all(), (got, ref)
    assert np.array_equal(_e4m3(got), _e4m3(ref))  # the subnormal quotients of the last two: their codes
