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
of ``y`` per element). Unsplit launches run it in place over ``y``. A group launch's
passes run as one kernel: ``group_pass.py``.
"""

from __future__ import annotations

import typing

import torch
import triton
import triton.language as tl

from quarl_kernels import pdl
from quarl_kernels.act import silu_mul_values
from quarl_kernels.env import env_flag, env_int, interpreting
from quarl_kernels.rounding import round_to

__all__ = [
    "DecodeOperands",
    "Epilogue",
    "decode_operands",
    "each_in_group",
    "env_flag",
    "env_int",
    "epilogue_kernel",
    "finish",
    "finish_splits",
    "interpreting",
    "num_sms",
    "splitk_reduce_kernel",
]


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (split-K sizing)."""
    if device.type != "cuda":  # TRITON_INTERPRET=1 runs on CPU tensors: pretend an H100
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


@triton.jit
def splitk_reduce_kernel(ws_ptr, y_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    """y[i] = sum_s ws[s, i] in split order (deterministic). ws [S, M*N] fp32. PDL: ``pdl.enter`` first."""
    pdl.enter(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: M * N may pass 2**31
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
                    A_PARTS: tl.constexpr = False, SA: tl.constexpr = 1, HAS_GATE: tl.constexpr = False,
                    PDL: tl.constexpr = 0):
    """y[m, n] = sum_s ws[s, m, n] (split order) + bias[n] + scaling * sum_r a[m, r] b[n, r].

    ``ws`` is the fp32 partials [S, M, N] (strides s_ws, m_ws), or ``y`` itself when S == 1
    (each element is read and written by the same program: in place is safe). R = 0: no LoRA;
    RP = R padded to a power of two (>= 16 for tl.dot), the pad masked to zero. DOT: the LoRA
    term as a tl.dot of 16-row tiles (M >= 2); else (one decode row) a broadcast multiply of
    ``a [1, RP]`` with the ``b [BN, RP]`` tile and a sum over r in registers (BN * RP <= 8192).
    A_PARTS: ``a`` is SA fp32 partials (split stride s_a), summed in split order and rounded once to
    y's dtype before the product (``quarl_kernels.lora_a``). PDL: ``pdl.enter`` first (reads the launch's partials)."""
    pdl.enter(PDL)
    # int64 rows: a prefill's rows * N passes 2**31 at 113k tokens on the 7B gate / up (an illegal address in session
    # 15's batch-128 profile before the engine chunked its prefill)
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)  # [BM]
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
            splitk_reduce_kernel[(triton.cdiv(mn, 1024),)](out, y, mn, SPLIT_K=split, BLOCK=1024, num_warps=4,
                                                            **pdl.kwargs(y.device))
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
        num_warps=4, **pdl.kwargs(y.device),
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

