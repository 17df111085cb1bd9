"""Fused FP8 quantizers of the Jet-RL training linear: one pass per operand, codes and scales
written directly in the layouts the blockwise FP8 GEMMs (``torch.nn.functional.scaled_mm``) take.

The FP8 linear (``quarl.quant.fp8_linear``) needs, per layer and step::

    X  [M, K]  -> Xq  [Mp, Kp]   1x128 along K      (forward A operand)
               -> XTq [Kp, Mt]   1x128 along tokens  (WGrad B operand: X^T, i.e. 128x1 of X)
    dY [M, N]  -> dYq [Mp, Np]   1x128 along N      (DGrad A operand)
               -> dYTq[Np, Mt]   1x128 along tokens  (WGrad A operand)
    W  [N, K]  -> Wq  [Np, Kp]   128x128 tiles      (forward B operand)
               -> WTq [Kp, Np]   the same tiles, transposed (DGrad B operand)

with Mp = M rounded up to 4 (cuBLAS), Mt = M rounded up to 128 (a token group), Np / Kp
rounded up to 128 (a short last block is zero-padded: zeros change no amax, so it gets the
scale of its own values). The PyTorch path does each of these as ~6 kernels (pad, abs,
amax, divide, clamp, cast, plus a transpose copy): ~80 % of the FP8 layer's time on an
H100 (benchmarks/RESULTS.md, "Jet-RL"). Here each operand is one kernel that reads the
high-precision tensor from HBM once: :func:`quantize_act` loads a ``[BLOCK_M, 128]`` tile, reduces
it along K for the row groups and (``t_rows``) along the tokens for the column groups, and
stores both code tiles (the second transposed, in a second pass over the tile: L2 hits) and both
scale vectors; :func:`quantize_tiles` does a 128x128 weight tile (amax pass, codes pass) and
optionally its transpose (a third pass). Padding is done by the masks (no padded copy of the
input); any input strides are accepted.

A transposed code tile is always stored from codes computed in its own loop, never as the
``tl.trans`` of codes the same loop also stores row-major: for that pattern ptxas (CUDA 12.8, the
one Triton 3.6 bundles for sm_90) emits SASS that reads a quarter of the transposed bytes from
registers *before* the loop iteration writes them (stale codes of the previous chunk). It hit the
fp32-input weight kernel on the H100 (W^T rows k = 1 mod 4 wrong; docs/kernels.md, "The W^T
bug"); ``tests/kernels/test_fp8_quant_interpreter.py`` checks every variant's SASS for it on CPU.

Scale layouts. A scale of a 1x128 operand is stored *outer-major* (storage
``[groups, rows]``, returned as the ``[rows, groups]`` view with strides ``(1, rows)``):
M-major for ``scaled_mm``'s A operand, which is what ``fp8_linear.blockwise_gemm`` passes
(no copy there). Tile scales are ``[Np/128, Kp/128]`` row-major, as the weight format's.

Numerics: bit for bit the reference ``quarl.quant.formats.fp8.quantize_act_1x128`` /
``quarl.quant.fp8_linear.quantize_weight_padded`` run eagerly on the same device (tested on
CPU through ``TRITON_INTERPRET=1`` and on CUDA): ``scale = amax / 448`` (float32 eps for an
all-zero group), ``q = clamp(x / scale, +-448)`` cast round-to-nearest-even to E4M3. Two
details make that exact rather than "close":

* ``amax / 448.0`` with a Python-float divisor is a true division on CPU but ``amax *
  fp32(1/448)`` on CUDA (ATen's ``div_true_kernel_cuda`` multiplies by the reciprocal of a
  CPU scalar); ``SCALE_RECIP`` follows the device, as ``quarl_kernels.norm`` does;
* ``x / scale`` is a correctly rounded division (``div_rn``) as PyTorch's eager CUDA and
  CPU kernels compute it. Triton's and ``torch.compile``'s plain ``/`` is the approximate
  ``div.full.f32``, which is why the compiled quantizers differ from eager on near-ties
  (2 of 14.7M activation bytes on the H100); these kernels do not.

The FP8 cast is RNE with saturation on the GPU (``cvt.rn.satfinite.e4m3x2.f32``); under the
interpreter :func:`quarl_kernels.rounding.round_to_fp8` rounds in software first.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from quarl_kernels.launch import interpreting as _interpreting
from quarl_kernels.rounding import FP8_MAX, FP32_EPS, INV_FP8_MAX, round_to_fp8

GROUP = 128  # 1x128 activation groups, 128x128 weight tiles (DeepSeek-V3 / Jet-RL)
# Rows per chunk and warps per program. A program walks its tile in [SUB, 128] chunks: a whole
# 128x128 tile in registers needs 255 registers per thread and spills (ptxas for sm_90), while a
# [32, 128] chunk at 8 warps needs 39 (rows only), 63 (weight tile + transpose) and 112 (both
# activation groupings) with unit-stride inputs, no spills: several programs per SM to keep
# enough loads in flight for HBM bandwidth. Not tuned on a GPU yet (benchmarks/fp8_linear.py times
# a few settings).
SUB = 32
WARPS = 8


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class Launch(NamedTuple):
    """One kernel launch as :func:`quantize_act` / :func:`quantize_tiles` make it: the tests compile
    exactly these arguments for sm_90 on a CPU (``tests/kernels/sm90_sass.py``)."""

    kernel: object  # the @triton.jit function
    grid: tuple
    args: tuple  # positional runtime arguments (tensors, ints)
    constexprs: dict
    num_warps: int


def _launch(la: Launch) -> None:
    la.kernel[la.grid](*la.args, **la.constexprs, num_warps=la.num_warps, enable_fp_fusion=False)


@triton.jit
def _scale(amax, SCALE_RECIP: tl.constexpr):
    """amax (fp32) -> scale = amax / 448 as the reference computes it on this device; eps if 0."""
    if SCALE_RECIP:  # CUDA PyTorch: amax / 448.0 == amax * fp32(1/448)
        s = amax * INV_FP8_MAX
    else:
        s = tl.math.div_rn(amax, FP8_MAX)
    return tl.where(s == 0.0, FP32_EPS, s)


@triton.jit
def _codes(x, s, INTERPRET: tl.constexpr):
    """fp32 x / s (correctly rounded), clamped to +-448, cast RNE to E4M3."""
    q = tl.math.div_rn(x, s)
    q = tl.clamp(q, -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    return round_to_fp8(q, INTERPRET)


@triton.jit
def _act_kernel(
    x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr,
    M, K, stride_xm, stride_xk,
    RQ, CQ, RT,  # rows of q (Mp), columns of q and rows of qt (Kp), columns of qt (Mt)
    stride_qm, stride_sm, stride_sg, stride_qtk, stride_stk, stride_stg,
    ROWS: tl.constexpr, COLS: tl.constexpr, SCALE_RECIP: tl.constexpr,
    BLOCK_M: tl.constexpr, SUB: tl.constexpr, INTERPRET: tl.constexpr,
):
    # one program: rows [pid_m*BLOCK_M, +BLOCK_M) x columns [pid_k*128, +128) of x, in chunks of SUB
    # rows (a whole 128x128 tile in registers spills); with COLS, BLOCK_M == 128 (one token group)
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = (pid_k * 128 + tl.arange(0, 128)).to(tl.int64)  # [128]
    c_in = cols < K
    c_ok = cols < CQ
    colmax = tl.zeros([128], dtype=tl.float32)
    for i in tl.range(0, BLOCK_M // SUB):
        rows = (pid_m * BLOCK_M + i * SUB + tl.arange(0, SUB)).to(tl.int64)  # [SUB]
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xk,
                    mask=(rows < M)[:, None] & c_in[None, :], other=0.0).to(tl.float32)  # [SUB, 128]; 0 = padding
        if ROWS:  # 1x128 groups along K: one scale per row
            s = _scale(tl.max(tl.abs(x), axis=1), SCALE_RECIP)  # [SUB]
            q = _codes(x, s[:, None], INTERPRET)
            r_ok = rows < RQ
            tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], q, mask=r_ok[:, None] & c_ok[None, :])
            tl.store(s_ptr + rows * stride_sm + pid_k * stride_sg, s, mask=r_ok)
        if COLS:
            colmax = tl.maximum(colmax, tl.max(tl.abs(x), axis=0))
    if COLS:  # 1x128 groups along the tokens (128x1 of x): one scale per column of the tile
        sc = _scale(colmax, SCALE_RECIP)  # [128]
        for i in tl.range(0, BLOCK_M // SUB):  # second pass over the tile: an L2 hit, not HBM
            rows = (pid_m * BLOCK_M + i * SUB + tl.arange(0, SUB)).to(tl.int64)
            x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xk,
                        mask=(rows < M)[:, None] & c_in[None, :], other=0.0).to(tl.float32)
            qc = tl.trans(_codes(x, sc[None, :], INTERPRET))  # [128 (K), SUB (tokens)]
            tl.store(qt_ptr + cols[:, None] * stride_qtk + rows[None, :], qc,
                     mask=c_ok[:, None] & (rows < RT)[None, :])
        tl.store(st_ptr + cols * stride_stk + pid_m * stride_stg, sc, mask=c_ok)


@triton.jit
def _tile_kernel(
    w_ptr, q_ptr, qt_ptr, s_ptr,
    N, K, stride_wn, stride_wk, stride_qn, stride_qtk, stride_sn, stride_sk,
    TRANS: tl.constexpr, SCALE_RECIP: tl.constexpr, SUB: tl.constexpr, INTERPRET: tl.constexpr,
):
    # one program: the 128x128 tile (pid_n, pid_k) of the padded [Np, Kp] weight, in passes of
    # SUB-row chunks (amax, codes, and with TRANS the transposed codes)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = (pid_k * 128 + tl.arange(0, 128)).to(tl.int64)
    amax = tl.zeros([SUB, 128], dtype=tl.float32)
    for i in tl.range(0, 128 // SUB):
        rows = (pid_n * 128 + i * SUB + tl.arange(0, SUB)).to(tl.int64)
        w = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :] * stride_wk,
                    mask=(rows < N)[:, None] & (cols < K)[None, :], other=0.0)
        amax = tl.maximum(amax, tl.abs(w.to(tl.float32)))
    s = _scale(tl.max(tl.max(amax, axis=1), axis=0), SCALE_RECIP)  # scalar
    for i in tl.range(0, 128 // SUB):
        rows = (pid_n * 128 + i * SUB + tl.arange(0, SUB)).to(tl.int64)
        w = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :] * stride_wk,
                    mask=(rows < N)[:, None] & (cols < K)[None, :], other=0.0)
        q = _codes(w.to(tl.float32), s, INTERPRET)  # [SUB, 128]
        tl.store(q_ptr + rows[:, None] * stride_qn + cols[None, :], q)
    if TRANS:  # W^T's 128x128 tiles are W's transposed (DGrad's B operand, same bits): a third pass
        # over the tile (L2 hits) with codes of its own. Not the same codes stored twice in one loop:
        # for fp32 input ptxas (CUDA 12.8, Triton 3.6's) miscompiles that loop -- the bytes it stages
        # through shared memory for the transposed store are read from registers before this
        # iteration writes them: W^T's rows k = 1 mod 4 (by the SASS) got stale codes (H100, 2026-11-25;
        # docs/kernels.md "The W^T bug"); tests/kernels/test_fp8_quant_interpreter.py checks the SASS
        for i in tl.range(0, 128 // SUB):
            rows = (pid_n * 128 + i * SUB + tl.arange(0, SUB)).to(tl.int64)
            w = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :] * stride_wk,
                        mask=(rows < N)[:, None] & (cols < K)[None, :], other=0.0)
            qc = tl.trans(_codes(w.to(tl.float32), s, INTERPRET))  # [128 (K), SUB (N)]
            tl.store(qt_ptr + cols[:, None] * stride_qtk + rows[None, :], qc)
    tl.store(s_ptr + pid_n * stride_sn + pid_k * stride_sk, s)


def _outer_major(rows: int, groups: int, device) -> torch.Tensor:
    """A ``[rows, groups]`` fp32 tensor stored as ``[groups, rows]`` (strides ``(1, rows)``)."""
    return torch.empty(groups, rows, device=device, dtype=torch.float32).t()


def quantize_act(x: torch.Tensor, rows: int | None = None, cols: int | None = None, t_rows: int | None = None,
                 *, row_groups: bool = True, sub: int = SUB, warps: int = WARPS):
    """``x`` [M, K] (bf16 / fp16 / fp32, any strides) -> ``(q, s, qt, st)`` in one pass.

    * ``row_groups``: ``q`` [rows, cols] E4M3 row-major (1x128 groups along K) and ``s`` [rows, cols/128]
      fp32 M-major; ``rows`` >= M (default M; extra rows are zero codes), ``cols`` = K rounded up
      to 128 (default; a short last group padded with zeros).
    * ``t_rows`` (a multiple of 128, >= M): also ``qt`` [cols, t_rows] E4M3 row-major = the 1x128
      quantization of x^T along the tokens, and ``st`` [cols, t_rows/128] fp32 stored ``cols``-major.

    Entries not requested are None. Equal to ``quantize_act_1x128`` of the zero-padded ``x`` (and
    of its transpose) on the same device, bit for bit.
    """
    if x.dim() != 2:
        raise ValueError(f"quantize_act: x must be 2-D [M, K], got {tuple(x.shape)}")
    m, k = x.shape
    rows = m if rows is None else rows
    cols = _round_up(k, GROUP) if cols is None else cols
    if cols % GROUP or cols < k or rows < m:
        raise ValueError(f"quantize_act: cols={cols} must be a multiple of {GROUP} >= K={k}, rows={rows} >= M={m}")
    if t_rows is not None and (t_rows % GROUP or t_rows < m):
        raise ValueError(f"quantize_act: t_rows={t_rows} must be a multiple of {GROUP} >= M={m}")
    q, s, qt, st = _act_outputs(x, rows, cols, t_rows, row_groups)
    extent = max(rows if row_groups else 0, t_rows or 0)
    if extent == 0 or m == 0 or (q is None and qt is None):
        if q is not None:  # no tokens: zero codes, eps scales (what the reference gives for padding rows)
            q.view(torch.uint8).zero_()
            s.fill_(torch.finfo(torch.float32).eps)
        if qt is not None:
            qt.view(torch.uint8).zero_()
            st.fill_(torch.finfo(torch.float32).eps)
        return q, s, qt, st
    _launch(_act_launch(x, q, s, qt, st, rows, cols, t_rows, sub, warps))
    return q, s, qt, st


def _act_outputs(x, rows: int, cols: int, t_rows: int | None, row_groups: bool):
    dev = x.device
    q = s = qt = st = None
    if row_groups:
        q = torch.empty(rows, cols, device=dev, dtype=torch.float8_e4m3fn)
        s = _outer_major(rows, cols // GROUP, dev)
    if t_rows is not None:
        qt = torch.empty(cols, t_rows, device=dev, dtype=torch.float8_e4m3fn)
        st = _outer_major(cols, t_rows // GROUP, dev)
    return q, s, qt, st


def _act_launch(x, q, s, qt, st, rows: int, cols: int, t_rows: int | None, sub: int, warps: int) -> Launch:
    # a token group per program when the transpose is wanted; else short row blocks (decode: M <= 64)
    m, k = x.shape
    extent = max(rows if q is not None else 0, t_rows or 0)
    block_m = 128 if t_rows is not None else min(sub, max(16, triton.next_power_of_2(extent)))
    dq, ds = (q, s) if q is not None else (qt, st)  # placeholders for the pointers a pass does not use
    dqt, dst = (qt, st) if qt is not None else (q, s)
    return Launch(
        _act_kernel, (triton.cdiv(extent, block_m), cols // GROUP),
        (x, dq, ds, dqt, dst, m, k, x.stride(0), x.stride(1), rows, cols, t_rows or 0,
         dq.stride(0), ds.stride(0), ds.stride(1), dqt.stride(0), dst.stride(0), dst.stride(1)),
        {"ROWS": q is not None, "COLS": t_rows is not None, "SCALE_RECIP": x.is_cuda, "BLOCK_M": block_m,
         "SUB": min(sub, block_m), "INTERPRET": _interpreting()},
        warps,
    )


def quantize_tiles(w: torch.Tensor, transpose: bool = False, *, sub: int = SUB, warps: int = WARPS):
    """``w`` [N, K] -> ``(q [Np, Kp], s [Np/128, Kp/128], qt [Kp, Np] or None)``: 128x128 tiles,
    zero-padded to multiples of 128; ``qt`` (``transpose``) is ``q.t().contiguous()`` written by the
    same kernel. Equal to ``quantize_weight_padded`` on the same device, bit for bit."""
    if w.dim() != 2:
        raise ValueError(f"quantize_tiles: w must be 2-D [N, K], got {tuple(w.shape)}")
    n, k = w.shape
    if n == 0 or k == 0:
        raise ValueError(f"quantize_tiles: empty weight {tuple(w.shape)}")
    q, qt, s = _tile_outputs(w, transpose)
    _launch(_tile_launch(w, q, qt, s, sub, warps))
    return q, s, qt


def _tile_outputs(w, transpose: bool):
    np_, kp = _round_up(w.shape[0], GROUP), _round_up(w.shape[1], GROUP)
    q = torch.empty(np_, kp, device=w.device, dtype=torch.float8_e4m3fn)
    qt = torch.empty(kp, np_, device=w.device, dtype=torch.float8_e4m3fn) if transpose else None
    s = torch.empty(np_ // GROUP, kp // GROUP, device=w.device, dtype=torch.float32)
    return q, qt, s


def _tile_launch(w, q, qt, s, sub: int, warps: int) -> Launch:
    n, k = w.shape
    dqt = qt if qt is not None else q  # placeholder pointer without the transpose
    return Launch(
        _tile_kernel, (q.shape[0] // GROUP, q.shape[1] // GROUP),
        (w, q, dqt, s, n, k, w.stride(0), w.stride(1), q.stride(0), dqt.stride(0), s.stride(0), s.stride(1)),
        {"TRANS": qt is not None, "SCALE_RECIP": w.is_cuda, "SUB": sub, "INTERPRET": _interpreting()},
        warps,
    )


__all__ = ["GROUP", "quantize_act", "quantize_tiles"]
