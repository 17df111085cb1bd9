"""Launch helpers shared by the weight-only GEMM modules (``wo_gemm``, ``gemv``, ``mma_decode``, ``norm``).

They lived in ``wo_gemm``, which ``gemv`` and ``mma_decode`` then imported back
inside their launchers while ``wo_gemm`` imported them: an import circle between
kernel modules. One small module below all of them removes it.

The last pass of a weight-only GEMM (:func:`finish`). Split over K, every launcher
ends with a kernel that sums the fp32 partials ``[S, M, N]`` into ``y``. A rollout
step's projection then still paid, per call, a bias add and the LoRA branch's
``addmm`` (``y + scaling * a @ B^T``): two to three more small kernels, 7x per
layer (RESULTS "Issue 17: where a 7B decode step's time goes": 616 LoRA kernels and
0.13 ms of bias adds per 7B step at batch 1). :class:`Epilogue` folds both into that
last pass: ``y = sum_s ws[s] + bias + scaling * a @ B^T``, one kernel, fp32 until a
single rounding to ``y``'s dtype (the unfused path rounds the base output, then the
bias sum, then the addmm: results differ from it by those roundings, <= ~1 bf16 ulp
of ``y`` per element). Unsplit launches run it in place over ``y``.
"""

from __future__ import annotations

import os
import typing

import torch
import triton
import triton.language as tl

from quarl_kernels.act import silu_mul_values
from quarl_kernels.rounding import round_to

__all__ = [
    "DecodeOperands",
    "Epilogue",
    "RopeCache",
    "apply_rope",
    "decode_operands",
    "each_in_group",
    "env_flag",
    "epilogue_kernel",
    "finish",
    "finish_group",
    "finish_splits",
    "group_epilogue_kernel",
    "group_pass_launch",
    "interpreting",
    "num_sms",
    "splitk_reduce_kernel",
]


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (split-K sizing)."""
    if device.type != "cuda":  # TRITON_INTERPRET=1 runs on CPU tensors: pretend an H100
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (CPU emulation: no inline PTX, no Gluon)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_ON = ("1", "true", "on", "yes")
_OFF = ("", "0", "false", "off", "no")


def env_flag(name: str, default: bool) -> bool:
    """An on/off switch from the environment: 1 / true / on / yes, or 0 / false / off / no
    (case-insensitive); unset means ``default``. Anything else is an error naming the variable."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in _ON:
        return True
    if v in _OFF:
        return False
    raise ValueError(f"{name}={raw!r} is neither on nor off: set it to 1 (on) or 0 (off)")


@triton.jit
def splitk_reduce_kernel(ws_ptr, y_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """y[i] = sum_s ws[s, i] in split order (deterministic). ws [S, M*N] fp32."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.load(ws_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


class Epilogue(typing.NamedTuple):
    """What the last pass adds to ``x @ W^T``: ``bias [N]`` and ``scaling * a @ b^T`` (a LoRA branch).

    ``a [M, r]`` may be a column slice of a wider tensor (the packed A GEMM of several
    projections, ``quarl.engine.lora``): its row stride is passed, its column stride must be 1.
    ``a`` may also be fp32 split partials ``[S, M, r]`` of ``x @ A^T`` (``quarl_kernels.lora_a``, again a
    column slice): the last pass sums them in split order and rounds once to the output dtype, as
    ``F.linear`` would have returned ``a``. ``b [N, r]`` contiguous. Either part may be absent (None).
    ``lora_a`` (``quarl_kernels.lora_a.LoraA``): those partials are computed by the launch itself, by extra
    programs of the GEMV (``wo_gemm.wo_matmul`` fills them with ``F.linear`` on any other route). ``gate``: the
    MLP's gate projection output; the pass then writes ``silu(gate) * y`` (``act.silu_mul``'s arithmetic on the
    rounded ``y``) -- the up projection's last pass is the activation kernel too."""

    bias: torch.Tensor | None = None  # [N]
    a: torch.Tensor | None = None  # [M, r]
    b: torch.Tensor | None = None  # [N, r]
    scaling: float = 1.0
    lora_a: typing.Any = None  # a lora_a.LoraA the launch fills first (``a`` is then a column slice of its out)
    gate: torch.Tensor | None = None  # [M, N] in y's dtype: write silu(gate) * y instead of y (the MLP's up)

    def check(self, m: int, n: int) -> None:
        """Shapes the kernel assumes; a clear error instead of an out-of-bounds read."""
        if self.bias is not None and (self.bias.shape != (n,) or not self.bias.is_contiguous()):
            raise ValueError(f"Epilogue: bias must be a contiguous [{n}], got {tuple(self.bias.shape)}")
        if (self.a is None) != (self.b is None):
            raise ValueError("Epilogue: a LoRA branch needs both a [M, r] and b [N, r]")
        if self.a is not None:
            r = self.b.shape[-1]
            parts = self.a.dim() == 3
            if self.a.shape[-2:] != (m, r) or self.a.dim() not in (2, 3) or self.a.stride(-1) != 1 or \
                    self.b.shape != (n, r) or not self.b.is_contiguous() or (parts and self.a.dtype != torch.float32):
                raise ValueError(f"Epilogue: need a [{m}, r] or fp32 partials [S, {m}, r] (unit column stride) and a "
                                 f"contiguous b [{n}, r]; got a {tuple(self.a.shape)} {self.a.dtype} strides "
                                 f"{self.a.stride()}, b {tuple(self.b.shape)}")
        if self.gate is not None and (self.gate.shape != (m, n) or self.gate.stride(-1) != 1):
            raise ValueError(f"Epilogue: gate must be [{m}, {n}] with unit column stride, got "
                             f"{tuple(self.gate.shape)} strides {self.gate.stride()}")
        if self.lora_a is not None and (self.a is None or self.a.dim() != 3 or
                                        self.a.untyped_storage().data_ptr() != self.lora_a.out.untyped_storage().data_ptr()):
            raise ValueError("Epilogue: with lora_a, a must be a column slice of lora_a.out (the partials it fills)")


@triton.jit
def _epilogue_acc(ws_ptr, bias_ptr, a_ptr, b_ptr, rows, cols, M, N, scaling, s_ws, m_ws, m_a, s_a,
                  SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
                  DOT: tl.constexpr, INTERPRET: tl.constexpr, A_PARTS: tl.constexpr, SA: tl.constexpr, OUT_T):
    """fp32 ``[BM, BN]`` = sum_s ws[s, rows, cols] (split order) + bias[cols] + scaling * a[rows] @ b[cols]^T (the
    last pass before its rounding: :func:`epilogue_kernel`'s arithmetic, shared with :func:`group_epilogue_kernel`).
    ``OUT_T``: the output dtype, to which LoRA partials are rounded once (F.linear's ``a``)."""
    rm, cm = rows < M, cols < N
    mask = rm[:, None] & cm[None, :]
    off = rows[:, None] * m_ws + cols[None, :]
    acc = tl.load(ws_ptr + off, mask=mask, other=0.0).to(tl.float32)  # [BM, BN]
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(ws_ptr + s * s_ws + off, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
    if R > 0:
        rr = tl.arange(0, RP)
        a_off = rows[:, None] * m_a + rr[None, :]  # [BM, RP]
        a_mask = rm[:, None] & (rr[None, :] < R)
        if A_PARTS:  # x @ A^T as fp32 split partials: their sum in split order, rounded once (F.linear's a)
            af = tl.load(a_ptr + a_off, mask=a_mask, other=0.0)
            for s in tl.static_range(1, SA):  # unrolled: the SA loads issue together
                af += tl.load(a_ptr + s * s_a + a_off, mask=a_mask, other=0.0)
            a = round_to(af, OUT_T, INTERPRET)
        else:
            a = tl.load(a_ptr + a_off, mask=a_mask, other=0.0)
        b = tl.load(b_ptr + cols[:, None] * R + rr[None, :], mask=cm[:, None] & (rr[None, :] < R), other=0.0)
        if DOT:
            if INTERPRET:  # the interpreter's bf16 dot is wrong; bf16 x bf16 products are exact in fp32 anyway
                acc += scaling * tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
            else:
                acc += scaling * tl.dot(a, tl.trans(b))  # [BM, RP] @ [RP, BN] on tensor cores, fp32 accumulate
        else:
            prod = a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :]  # [1, BN, RP]: one vector load of b
            acc += scaling * tl.sum(prod, axis=2)
    return acc


@triton.jit
def epilogue_kernel(ws_ptr, y_ptr, bias_ptr, a_ptr, b_ptr, M, N, scaling, s_ws, m_ws, m_a, s_a, g_ptr, m_g,
                    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, DOT: tl.constexpr, INTERPRET: tl.constexpr,
                    A_PARTS: tl.constexpr = False, SA: tl.constexpr = 1, HAS_GATE: tl.constexpr = False):
    """y[m, n] = sum_s ws[s, m, n] (split order) + bias[n] + scaling * sum_r a[m, r] b[n, r].

    ``ws`` is the fp32 partials [S, M, N] (strides s_ws, m_ws), or ``y`` itself when S == 1
    (each element is read and written by the same program: in place is safe). R = 0: no LoRA;
    RP = R padded to a power of two (>= 16 for tl.dot), the pad masked to zero. DOT: the LoRA
    term as a tl.dot of 16-row tiles (M >= 2); else (one decode row) a broadcast multiply of
    ``a [1, RP]`` with the ``b [BN, RP]`` tile and a sum over r in registers (BN * RP <= 8192).
    A_PARTS: ``a`` is SA fp32 partials (split stride s_a), summed in split order and rounded once to
    y's dtype before the product (``quarl_kernels.lora_a``)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)  # [BM]
    cols = tl.program_id(1) * BN + tl.arange(0, BN)  # [BN]
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    acc = _epilogue_acc(ws_ptr, bias_ptr, a_ptr, b_ptr, rows, cols, M, N, scaling, s_ws, m_ws, m_a, s_a,
                        SPLIT_K, HAS_BIAS, R, RP, DOT, INTERPRET, A_PARTS, SA, y_ptr.dtype.element_ty)
    if HAS_GATE:  # the MLP's activation: silu(gate) * y, on y rounded to its dtype (act.silu_mul's operands)
        u = round_to(acc, y_ptr.dtype.element_ty, INTERPRET).to(tl.float32)
        g = tl.load(g_ptr + rows[:, None] * m_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        out = silu_mul_values(g, u, y_ptr.dtype.element_ty, INTERPRET)
    else:
        out = round_to(acc, y_ptr.dtype.element_ty, INTERPRET)  # = acc.to() on the GPU; RNE in the interpreter too
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], out, mask=mask)


@triton.jit
def _group_pass(ws_ptr, y_ptr, bias_ptr, a_ptr, b_ptr, rows, t, M, N, scaling, s_ws, m_ws, m_a,
                s_a, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
                BN: tl.constexpr, DOT: tl.constexpr, INTERPRET: tl.constexpr, A_PARTS: tl.constexpr,
                SA: tl.constexpr):
    """One projection's column tile ``t`` of :func:`group_epilogue_kernel`: the pass, rounded and stored."""
    cols = t * BN + tl.arange(0, BN)
    acc = _epilogue_acc(ws_ptr, bias_ptr, a_ptr, b_ptr, rows, cols, M, N, scaling, s_ws, m_ws, m_a, s_a,
                        SPLIT_K, HAS_BIAS, R, RP, DOT, INTERPRET, A_PARTS, SA, y_ptr.dtype.element_ty)
    out = round_to(acc, y_ptr.dtype.element_ty, INTERPRET)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], out, mask=(rows < M)[:, None] & (cols < N)[None, :])
    return acc


@triton.jit
def _group_rope_pass(ws_ptr, y_ptr, bias_ptr, a_ptr, b_ptr, rows, t, M, N, scaling, s_ws, m_ws, m_a, s_a,
                     cos_ptr, sin_ptr, scb, scl, ssb, ssl, L, kv_ptr, skb, skh, sks, slot_ptr,
                     SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, DOT: tl.constexpr, INTERPRET: tl.constexpr,
                     A_PARTS: tl.constexpr, SA: tl.constexpr, ROTATE: tl.constexpr, TO_CACHE: tl.constexpr):
    """:func:`_group_pass` of a q/k/v group at a decode step, with ``rope.rope_qk_cache``'s work done here: q's
    columns rotated (into ``y``), k's rotated and v's copied into their caches ``[B, H_kv, S, D]`` at position
    ``slot[l]`` (row ``b * L + l``). A tile is one head (``BN = D``), so ``rotate_half`` is a register permutation
    of the rounded outputs (split the head's halves, join them swapped), and the rotation is ``rope._rope_tile``'s
    arithmetic on them. (Computing the partner columns' pass again instead gave 1-ulp differences on the GPU: the
    two copies of the LoRA sum were contracted differently.)"""
    dt: tl.constexpr = y_ptr.dtype.element_ty
    HALF: tl.constexpr = BN // 2
    cols = t * BN + tl.arange(0, BN)  # [BN]: head t
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    acc = _epilogue_acc(ws_ptr, bias_ptr, a_ptr, b_ptr, rows, cols, M, N, scaling, s_ws, m_ws, m_a, s_a,
                        SPLIT_K, HAS_BIAS, R, RP, DOT, INTERPRET, A_PARTS, SA, dt)
    d = tl.arange(0, BN)  # position in the head
    b_row = (rows // L).to(tl.int64)  # [BM]
    l_row = rows % L
    if ROTATE:
        x = round_to(acc, dt, INTERPRET).to(tl.float32)  # [BM, BN]
        x1, x2 = tl.split(tl.permute(tl.reshape(x, [BM, 2, HALF]), (0, 2, 1)))  # the halves, [BM, HALF] each
        xr = tl.reshape(tl.permute(tl.join(-x2, x1), (0, 2, 1)), [BM, BN])  # rotate_half(x) = cat(-x2, x1)
        c = tl.load(cos_ptr + b_row[:, None] * scb + l_row[:, None] * scl + d[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        sn = tl.load(sin_ptr + b_row[:, None] * ssb + l_row[:, None] * ssl + d[None, :], mask=mask,
                     other=0.0).to(tl.float32)
        ra = round_to(x * c, dt, INTERPRET).to(tl.float32)  # x * cos
        rb = round_to(xr * sn, dt, INTERPRET).to(tl.float32)  # rotate_half(x) * sin
        out = round_to(ra + rb, dt, INTERPRET)
    else:
        out = round_to(acc, dt, INTERPRET)
    if TO_CACHE:
        lo = tl.load(slot_ptr + l_row, mask=rows < M, other=0).to(tl.int64)  # [BM]
        dest = kv_ptr + b_row[:, None] * skb + t.to(tl.int64) * skh + lo[:, None] * sks + d[None, :]
    else:
        dest = y_ptr + rows[:, None] * N + cols[None, :]
    tl.store(dest, out, mask=mask)


@triton.jit
def group_epilogue_kernel(
    M, s_a, ws0, y0, bias0, a0, b0, N0, sc0, s_ws0, m_ws0, m_a0, T0,
    ws1, y1, bias1, a1, b1, N1, sc1, s_ws1, m_ws1, m_a1, T1,
    ws2, y2, bias2, a2, b2, N2, sc2, s_ws2, m_ws2, m_a2,
    cos_ptr, sin_ptr, scb, scl, ssb, ssl, L, kc_ptr, vc_ptr, skb, skh, sks, svb, svh, svs, slot_ptr,
    SPLIT_K: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    DOT: tl.constexpr, INTERPRET: tl.constexpr, A_PARTS: tl.constexpr, SA: tl.constexpr,
    HB0: tl.constexpr, HB1: tl.constexpr, HB2: tl.constexpr, GATE_ACT: tl.constexpr, ROPE: tl.constexpr = False,
):
    """The last passes of a LoRA group's two or three projections (one launch's partials: one split count, one
    rank) as one launch: :func:`epilogue_kernel` for each, program tiles ``[0, T0)`` for projection 0, ``[T0, T0 +
    T1)`` for 1, the rest for 2. ``GATE_ACT`` (gate / up, one N): each program does the same columns of both and
    writes ``gate`` and ``silu(gate) * up`` (``act.silu_mul``'s arithmetic on the rounded values), as the up pass
    with ``HAS_GATE`` would after the gate pass. ``ROPE`` (q / k / v at a decode step; ``BN`` = the head dim):
    :func:`_group_rope_pass` -- q rotated into ``y0``, k rotated into ``kc``, v into ``vc`` (``y1`` / ``y2`` not
    written)."""
    pid = tl.program_id(1)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)  # [BM]
    if GATE_ACT:
        g = _group_pass(ws0, y0, bias0, a0, b0, rows, pid, M, N0, sc0, s_ws0, m_ws0, m_a0, s_a,
                        SPLIT_K, HB0, R, RP, BN, DOT, INTERPRET, A_PARTS, SA)
        cols = pid * BN + tl.arange(0, BN)
        mask = (rows < M)[:, None] & (cols < N1)[None, :]
        u = _epilogue_acc(ws1, bias1, a1, b1, rows, cols, M, N1, sc1, s_ws1, m_ws1, m_a1, s_a,
                          SPLIT_K, HB1, R, RP, DOT, INTERPRET, A_PARTS, SA, y1.dtype.element_ty)
        gr = round_to(g, y1.dtype.element_ty, INTERPRET).to(tl.float32)
        ur = round_to(u, y1.dtype.element_ty, INTERPRET).to(tl.float32)
        tl.store(y1 + rows[:, None] * N1 + cols[None, :], silu_mul_values(gr, ur, y1.dtype.element_ty, INTERPRET),
                 mask=mask)
    elif ROPE:
        if pid < T0:
            _group_rope_pass(ws0, y0, bias0, a0, b0, rows, pid, M, N0, sc0, s_ws0, m_ws0, m_a0, s_a,
                             cos_ptr, sin_ptr, scb, scl, ssb, ssl, L, kc_ptr, skb, skh, sks, slot_ptr,
                             SPLIT_K, HB0, R, RP, BM, BN, DOT, INTERPRET, A_PARTS, SA, True, False)
        elif pid < T0 + T1:
            _group_rope_pass(ws1, y1, bias1, a1, b1, rows, pid - T0, M, N1, sc1, s_ws1, m_ws1, m_a1, s_a,
                             cos_ptr, sin_ptr, scb, scl, ssb, ssl, L, kc_ptr, skb, skh, sks, slot_ptr,
                             SPLIT_K, HB1, R, RP, BM, BN, DOT, INTERPRET, A_PARTS, SA, True, True)
        else:
            _group_rope_pass(ws2, y2, bias2, a2, b2, rows, pid - T0 - T1, M, N2, sc2, s_ws2, m_ws2, m_a2, s_a,
                             cos_ptr, sin_ptr, scb, scl, ssb, ssl, L, vc_ptr, svb, svh, svs, slot_ptr,
                             SPLIT_K, HB2, R, RP, BM, BN, DOT, INTERPRET, A_PARTS, SA, False, True)
    elif pid < T0:
        _group_pass(ws0, y0, bias0, a0, b0, rows, pid, M, N0, sc0, s_ws0, m_ws0, m_a0, s_a,
                    SPLIT_K, HB0, R, RP, BN, DOT, INTERPRET, A_PARTS, SA)
    elif pid < T0 + T1:
        _group_pass(ws1, y1, bias1, a1, b1, rows, pid - T0, M, N1, sc1, s_ws1, m_ws1, m_a1, s_a,
                    SPLIT_K, HB1, R, RP, BN, DOT, INTERPRET, A_PARTS, SA)
    else:
        _group_pass(ws2, y2, bias2, a2, b2, rows, pid - T0 - T1, M, N2, sc2, s_ws2, m_ws2, m_a2, s_a,
                    SPLIT_K, HB2, R, RP, BN, DOT, INTERPRET, A_PARTS, SA)


def _pow2_floor(v: int) -> int:
    return 1 << (max(int(v), 1).bit_length() - 1)


def _epilogue_tiles(m: int, n: int, r: int) -> tuple[int, int, int, bool]:
    """(BM, BN, RP, dot), sized so that even a narrow projection (k / v: N = 512) gets ~64-128
    programs: this pass is latency-bound, and a handful of programs each summing many splits
    was what made it cost more than the kernels it replaced (H200 profile, RESULTS). One
    decode row: a register broadcast (no tensor-core tile for one row); more: 16-row tl.dot tiles."""
    if m == 1:
        rp = triton.next_power_of_2(max(r, 1))
        return 1, max(16, min(256, _pow2_floor(n // 64), 8192 // rp)), rp, False
    bn = max(16, min(128, _pow2_floor(triton.cdiv(m, 16) * n // 128)))
    return 16, bn, max(16, triton.next_power_of_2(max(r, 1))), r > 0


def finish(out: torch.Tensor, y: torch.Tensor, split: int, epi: Epilogue | None = None) -> torch.Tensor:
    """The last pass of a launch: ``y [M, N]`` from ``out`` (fp32 partials ``[S, M, N]`` when
    ``split > 1``, else ``y`` itself), plus ``epi``. No epilogue and no split: nothing to do."""
    m, n = y.shape
    if epi is None or (epi.bias is None and epi.a is None and epi.gate is None):
        if split > 1:
            mn = y.numel()
            splitk_reduce_kernel[(triton.cdiv(mn, 1024),)](out, y, mn, SPLIT_K=split, BLOCK=1024, num_warps=4)
        return y
    epi.check(m, n)
    if m == 0:
        return y
    r = 0 if epi.a is None else epi.b.shape[-1]
    parts = r > 0 and epi.a.dim() == 3  # fp32 split partials [S, M, r] of x @ A^T
    bm, bn, rp, dot = _epilogue_tiles(m, n, r)
    s_ws, m_ws = (out.stride(0), out.stride(1)) if split > 1 else (0, y.stride(0))
    dummy = y
    epilogue_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        out if split > 1 else y, y, epi.bias if epi.bias is not None else dummy,
        epi.a if r else dummy, epi.b if r else dummy, m, n, float(epi.scaling), s_ws, m_ws,
        epi.a.stride(-2) if r else 0, epi.a.stride(0) if parts else 0,
        epi.gate if epi.gate is not None else dummy, epi.gate.stride(0) if epi.gate is not None else 0,
        SPLIT_K=split, HAS_BIAS=epi.bias is not None, R=r, RP=rp, BM=bm, BN=bn, DOT=dot,
        INTERPRET=interpreting(), A_PARTS=parts, SA=epi.a.shape[0] if parts else 1, HAS_GATE=epi.gate is not None,
        num_warps=4,
    )
    return y


def each_in_group(epis: list, gate_act: bool, run_one) -> list[torch.Tensor]:
    """``[run_one(j, epis[j])]`` in order for a LoRA group's projections; with ``gate_act`` the second one's epilogue
    carries the first one's output as its ``gate`` (the MLP's up projection writes ``silu(gate) * up``)."""
    ys = []
    for j, e in enumerate(epis):
        if gate_act and j == 1:
            e = (e if e is not None else Epilogue())._replace(gate=ys[0])
        ys.append(run_one(j, e))
    return ys


GROUP_PASS_ENV = "QUARL_GROUP_PASS"  # 0: a group's last passes as one launch each (the before of the group pass)


class RopeCache(typing.NamedTuple):
    """A decode step's RoPE and K/V cache write for a q/k/v group (``rope.rope_qk_cache``'s arguments): rows of the
    group's ``x`` are tokens ``b * L + l``; ``cos, sin [B, L, D]`` (unit stride along D); ``k_cache, v_cache [B,
    H_kv, S, D]`` (unit stride along D) get k rotated and v at position ``slot[l]`` along S."""

    cos: torch.Tensor
    sin: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot: torch.Tensor


def apply_rope(ys: list, rope: RopeCache) -> list[torch.Tensor]:
    """``[q, k, v]`` (``[B * L, H * D]`` each) -> ``[q_rot]`` (same layout) with k and v written into the caches:
    ``rope.rope_qk_cache`` after the passes, where the group pass could not do it."""
    from quarl_kernels import rope as rope_mod

    b, l, d = rope.cos.shape
    q, k, v = (y.view(b, l, -1, d).transpose(1, 2) for y in ys)  # [B, H, L, D] views
    q_rot = rope_mod.rope_qk_cache(q, k, v, rope.cos, rope.sin, rope.k_cache, rope.v_cache, rope.slot)
    return [q_rot.transpose(1, 2).reshape(ys[0].shape)]


def _group_pass_ok(pairs: list, split: int, epis: list, gate_act: bool, rope: RopeCache | None = None) -> bool:
    """True when :func:`finish_group` can run the group's passes as one launch: every projection has a LoRA branch
    of one rank with its ``a`` in one form (all split partials with one count, or all plain), and gate / up share
    N; with ``rope``, three projections of whole heads and caches of the outputs' dtype."""
    if not env_flag(GROUP_PASS_ENV, True) or not 2 <= len(pairs) <= 3:
        return False
    if any(e is None or e.a is None or e.gate is not None for e in epis):
        return False
    r, dim, sa = epis[0].b.shape[-1], epis[0].a.dim(), epis[0].a.shape[0]
    if any(e.b.shape[-1] != r or e.a.dim() != dim or (dim == 3 and e.a.shape[0] != sa) for e in epis):
        return False
    if dim == 3 and any(e.a.stride(0) != epis[0].a.stride(0) for e in epis):
        return False
    if rope is not None:
        b, l, d = rope.cos.shape
        y = pairs[0][1]
        r_pad = triton.next_power_of_2(max(r, 1))
        if (gate_act or len(pairs) != 3 or d < 16 or d & (d - 1) or d * r_pad > 8192 or b * l != y.shape[0]
                or rope.cos.stride(-1) != 1
                or rope.sin.stride(-1) != 1 or rope.sin.shape != rope.cos.shape
                or rope.cos.dtype != y.dtype or rope.sin.dtype != y.dtype
                or any(p[1].shape[1] % d for p in pairs) or pairs[1][1].shape != pairs[2][1].shape
                or any(c.dtype != y.dtype or c.stride(-1) != 1 or c.shape[1] * d != pairs[1][1].shape[1]
                       or c.shape[0] != b for c in (rope.k_cache, rope.v_cache))):
            return False
    return not gate_act or (len(pairs) == 2 and pairs[0][1].shape == pairs[1][1].shape)


class PassLaunch(typing.NamedTuple):
    """One launch of :func:`group_epilogue_kernel`, as :func:`group_pass_launch` builds it (also what a build test
    compiles for sm_90 on a CPU)."""

    kernel: typing.Any
    grid: tuple
    args: tuple
    constexprs: dict
    num_warps: int


def group_pass_launch(pairs: list, split: int, epis: list, gate_act: bool, rope: RopeCache | None = None
                      ) -> PassLaunch:
    """The :func:`group_epilogue_kernel` launch for :func:`finish_group`'s arguments (which it assumes
    :func:`_group_pass_ok` accepted)."""
    m = pairs[0][1].shape[0]
    r = epis[0].b.shape[-1]
    parts = epis[0].a.dim() == 3
    ns = [y.shape[1] for _, y in pairs]
    bm, bn, rp, dot = _epilogue_tiles(m, min(ns), r)
    if rope is not None:  # one head per tile: rotate_half inside the tile
        bn = rope.cos.shape[-1]
    tiles = [triton.cdiv(n, bn) for n in ns]
    sets = []
    for j in range(3):  # a missing third projection: placeholders no program reads (T0 + T1 covers the grid)
        out, y = pairs[min(j, len(pairs) - 1)]
        e = epis[min(j, len(pairs) - 1)]
        real = j < len(pairs)
        s_ws, m_ws = (out.stride(0), out.stride(1)) if split > 1 else (0, y.stride(0))  # unsplit: in place over y
        sets += [out if split > 1 else y, y, e.bias if e.bias is not None else y, e.a, e.b, ns[j] if real else 0,
                 float(e.scaling), s_ws, m_ws, e.a.stride(-2)]
        if j < 2:
            sets.append(tiles[j] if real else 0)
    if rope is not None:
        kc, vc = rope.k_cache, rope.v_cache
        rargs = (rope.cos, rope.sin, rope.cos.stride(0), rope.cos.stride(1), rope.sin.stride(0), rope.sin.stride(1),
                 rope.cos.shape[1], kc, vc, kc.stride(0), kc.stride(1), kc.stride(2),
                 vc.stride(0), vc.stride(1), vc.stride(2), rope.slot)
    else:  # placeholders the kernel does not read
        y = pairs[0][1]
        rargs = (y, y, 0, 0, 0, 0, 1, y, y, 0, 0, 0, 0, 0, 0, y)
    hb = [j < len(epis) and epis[j].bias is not None for j in range(3)]
    const = {"SPLIT_K": split, "R": r, "RP": rp, "BM": bm, "BN": bn, "DOT": dot, "INTERPRET": interpreting(),
             "A_PARTS": parts, "SA": epis[0].a.shape[0] if parts else 1, "HB0": hb[0], "HB1": hb[1], "HB2": hb[2],
             "GATE_ACT": gate_act, "ROPE": rope is not None}
    grid = (triton.cdiv(m, bm), tiles[0] if gate_act else sum(tiles))
    return PassLaunch(group_epilogue_kernel, grid, (m, epis[0].a.stride(0) if parts else 0, *sets, *rargs), const,
                      4)


def finish_group(pairs: list, split: int, epis: list, gate_act: bool = False, rope: RopeCache | None = None
                 ) -> list[torch.Tensor]:
    """The last passes of a group launch (``pairs[j] = (out_j, y_j)``: fp32 partials ``[S, M, N_j]`` and output
    ``[M, N_j]``; ``epis[j]`` as :func:`finish` takes it) -> ``[y_j]``. One kernel for all of them where
    :func:`_group_pass_ok` allows (:func:`group_epilogue_kernel`: one launch instead of two or three per LoRA
    group), else one :func:`finish` each; ``gate_act`` as in :func:`each_in_group`. ``QUARL_GROUP_PASS=0``: one
    each. ``rope`` (a q/k/v group at a decode step): ``[q_rot]`` comes back and k / v go into the caches, in the
    same pass where it can (else :func:`apply_rope` after the passes)."""
    if not _group_pass_ok(pairs, split, epis, gate_act, rope):
        ys = each_in_group(epis, gate_act, lambda j, e: finish(*pairs[j], split, e))
        return ys if rope is None else apply_rope(ys, rope)
    m = pairs[0][1].shape[0]
    for (_, y), e in zip(pairs, epis, strict=True):
        e.check(m, y.shape[1])
    if m > 0:
        la = group_pass_launch(pairs, split, epis, gate_act, rope)
        la.kernel[la.grid](*la.args, **la.constexprs, num_warps=la.num_warps)
    ys = [y for _, y in pairs]
    return ys if rope is None else ys[:1]


class DecodeOperands(typing.NamedTuple):
    """What the register-decode kernels (``mma_decode``, ``wgmma_decode``) take besides the weight words."""

    x2: torch.Tensor  # [M, K] bf16, contiguous
    scale: torch.Tensor  # [N, G]: e4m3 / e8m0 bytes (NVFP4 / MXFP4), fp32 or bf16 (INT4)
    zero: torch.Tensor  # [N, G] int8 zero points (INT4 with zeros), else ``scale`` (unused)
    gscale: torch.Tensor  # NVFP4's global scale, else ``scale`` (unused)
    y: torch.Tensor  # [M, N] output in x's dtype
    out: torch.Tensor  # where the kernel writes: ``y``, or fp32 partials [S, M, N] when split over K
    out_strides: tuple[int, int]  # (split, row) strides of ``out``


def _byte_view(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N, G] bytes of a byte tensor passed either as bytes or as its int32 view [N, G/4]."""
    return t.view(dtype) if t.dtype in (torch.int32, torch.uint8, torch.int8, torch.float8_e4m3fn) else t


def decode_operands(x2: torch.Tensor, pw, split: int, int4: bool) -> DecodeOperands:
    """Operands and output buffers of one decode launch of ``pw`` (a ``wo_gemm.PackedWeight``)."""
    m = x2.shape[0]
    if int4:
        s = pw.scale  # [N, G] fp32 (or bf16)
        z = _byte_view(pw.zero, torch.int8) if pw.zero is not None else s
    else:
        s = _byte_view(pw.scale, torch.uint8)  # [N, G] e4m3 / e8m0 bytes
        z = s
    gs = pw.gscale if pw.gscale is not None else s
    y = torch.empty((m, pw.n), device=x2.device, dtype=x2.dtype)
    out = y if split == 1 else torch.empty((split, m, pw.n), device=x2.device, dtype=torch.float32)
    strides = (0, y.stride(0)) if split == 1 else (out.stride(0), out.stride(1))
    return DecodeOperands(x2.contiguous(), s, z, gs, y, out, strides)


def finish_splits(ops: DecodeOperands, split: int, epi: Epilogue | None = None) -> torch.Tensor:
    """``ops.y``: the fp32 partials summed in split order (deterministic) when the launch was split over K,
    plus ``epi`` (:func:`finish`)."""
    return finish(ops.out, ops.y, split, epi)

