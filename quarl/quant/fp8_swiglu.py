"""Jet-RL's FP8 MLP with SwiGLU's backward fused into the quantizers: ``down(silu(gate(x)) * up(x))`` as one autograd
function.

Why. In full-parameter Jet-RL every projection is an FP8 linear (:mod:`quarl.quant.fp8_linear`). Backward, SwiGLU's
gradients ``dg`` and ``du`` were written in BF16 by the glue only for the gate and up projections' quantizers to read
them back, twice each: at Qwen2.5-32B width and 16k tokens ~0.9 GB apiece. Here the quantizer's passes compute both
from ``dh, g, u`` in registers (``quarl_kernels.fp8_swiglu``): never written, ~2.7 GB a layer less HBM traffic, and
the backward's peak memory lower. Forward, the down projection's input ``h = silu(g) * u`` is quantized straight from
``g`` and ``u`` by one kernel on CUDA (``quarl_kernels.fp8_quant_regs``, session 31: h never written in BF16; H100,
7B width, 16k tokens, 0.84 ms against 1.31 for the glue's ``silu_mul`` + the quantizer; where X^T is made, session 34's
staged form is timed beside it: ``quarl_kernels.fp8_swiglu.swiglu_forward_operand``, the same bits); elsewhere, or with
``QUARL_FP8_SWIGLU_FWD=0``, the glue's ``silu_mul`` writes ``h`` and the quantizer reads it.

    forward    xq = Q(x)                       1x128 (+ X^T for the two WGrads)
               [g u] = xq [Wg; Wu]^T           one FP8 GEMM, BF16 out       [M, 2I]: g, u its column blocks, saved
               hq = Q(silu(g) * u)             one kernel from g, u (or silu_mul, then Q); + h^T for down's WGrad
               y = hq Wd^T                     FP8 GEMM                     [M, H]
    backward   dh = Q(dy) Wd                   DGrad of down                [M, I]
               dWd = Q(dy)^T h^T               WGrad of down
               dgq, duq = Q(SwiGLU'(dh, g, u)) fused: one read of dh, g, u per pass (+ dg^T, du^T); the row
                                               groups the column blocks of one stacked operand [M, 2I]
               dx = [dgq duq] [Wg; Wu]         one DGrad, the reduction over 2I in FP32
               dWg = dgq^T X^T, dWu = duq^T X^T

The GEMMs, their operands' layouts and the weights' tiles are :mod:`quarl.quant.fp8_linear`'s: this is the
computation of the three FP8 linears with the glue's SwiGLU between them, the BF16 round trips left out. Gate and up
run as one GEMM forward and one DGrad (session 32, as :mod:`quarl.quant.fp8_stack` does q / k / v: their tiles one
:class:`~quarl.quant.fp8_stack.Stack`) where :func:`stack_gate_up` allows -- an intermediate width that is a multiple
of 128, ``QUARL_FP8_STACK`` not 0, no CUDA graph being captured: autograd's BF16 sum of the two DGrads (a pass over
``[M, H]``) is gone, and dX is the FP32 sum over 2I rounded once (closer to exact than two rounded products added in
BF16; not their bits). The two WGrads stay apart. Session 32's fused down-DGrad kernel (SwiGLU's backward in its
epilogue) was measured in session 33 and removed: 1.8x slower than DeepGEMM's DGrad + the pass at 7B width (RESULTS.md
"Session 33"). Without the Triton quantizers (CPU) SwiGLU runs in PyTorch (eager autograd's arithmetic; the forward's
``silu_mul``) and its operands come from :mod:`quarl.quant.fp8_linear`'s quantizers: the same numbers as the three
linears, bit for bit (``tests/quant/test_fp8_swiglu.py``), nothing saved. On CUDA the fused kernels keep eager PyTorch's
roundings with fast arithmetic (``exp`` as ``ex2.approx``, an approximate reciprocal): a counted few of ``h``'s,
``dg``'s and ``du``'s codes are one step off eager's (``tests/kernels/test_fp8_swiglu_gpu.py``: at most 1e-3 of them,
scales equal); the no-grad forward computes ``h`` as the training forward does, so the two stay equal.

Where it runs: :mod:`quarl.train.fused_glue` (``policy.compile_glue``) patches a Llama / Qwen MLP's forward; when the
MLP's three projections are full-parameter FP8 ``QuantLinear`` s (``precision.mode=jetrl``, no LoRA, no bias) that
forward calls :func:`mlp_forward` (with the compiled ``silu_mul``) instead of the three linears, with autograd and
without (the trainer's no-grad log-prob pass equals its training forward). ``QUARL_FP8_SWIGLU=0`` keeps the three.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from quarl.quant import fp8_stack
from quarl.quant.fp8_gemm import blockwise_gemm
from quarl.quant.fp8_linear import _master_tiles
from quarl.quant.fp8_operands import (
    _fused_module,
    _round_up,
    _scales_t,
    _transposed,
    quant_backend,
    quantize_act_gemm,
    quantize_input,
)
from quarl.switches import switch_on

BLOCK = 128


def enabled() -> bool:
    """``QUARL_FP8_SWIGLU`` unset or ``1``: fuse; ``0``: the three FP8 linears as they are."""
    return switch_on("QUARL_FP8_SWIGLU", "fuse SwiGLU into the FP8 quantizers", "do not")


@functools.cache
def _kernels():
    from quarl_kernels import fp8_swiglu

    return fp8_swiglu


def forward_fused() -> bool:
    """``QUARL_FP8_SWIGLU_FWD`` unset or ``1``: h = silu(g) * u quantized from g and u by one kernel where it runs."""
    return switch_on("QUARL_FP8_SWIGLU_FWD", "quantize h = silu(g) * u from g and u in one kernel",
                     "write h with the glue's silu_mul, then quantize it")


def swiglu_operand(g: torch.Tensor, u: torch.Tensor, silu_mul, rows: int, cols: int, t_rows: int | None,
                   t_tiles: bool):
    """The down projection's input operand: ``h = silu(g) * u`` [M, I] quantized -- ``quantize_input``'s ``(q, s, qt,
    st)``, X^T when ``t_rows`` (in tiles with ``t_tiles``). On CUDA with the Triton quantizers, Gluon and
    :func:`forward_fused`, from ``g`` and ``u`` by one kernel (h never written; ``silu_mul`` unused); else
    ``silu_mul(g, u)`` then the quantizer."""
    fq = _fused_module() if g.is_cuda and quant_backend(g) == "triton" and forward_fused() else None
    fr = fq.regs_module() if fq is not None else None  # Gluon's kernels, where they import
    if fr is not None:
        g, u = _unit_stride(g, u)
        tiles = t_tiles and t_rows is not None
        out = fq._act_outputs(g, rows, cols, t_rows, True, tiles)
        _kernels().swiglu_forward_operand(g, u, out, rows, cols, t_rows, tiles)
        return out
    h = silu_mul(g, u)
    return quantize_input(h, h, rows, cols, t_rows, False, t_tiles)


def silu_mul_eager(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """SwiGLU's forward as eager PyTorch computes it (``F.silu`` rounded to the input dtype, then the product)."""
    return F.silu(g) * u


def silu_mul_grads(g: torch.Tensor, u: torch.Tensor, dh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dg, du)`` of ``h = F.silu(g) * u`` for the output gradient ``dh``, as eager PyTorch's autograd computes
    them (the mul's backward, then ``silu_backward``)."""
    du = dh * F.silu(g)
    dg = torch.ops.aten.silu_backward(dh * u, g)
    return dg, du


def _stacked_outputs(g, rows: int, cols: int, t_rows: int | None):
    """dg's and du's ``(q, s, qt, st)`` with their row groups the column blocks of one stacked DGrad operand ``(q [rows,
    2 cols], s [rows, 2 cols / 128])``: -> ``(out, both)``."""
    fq = _fused_module()
    q = torch.empty(rows, 2 * cols, device=g.device, dtype=torch.float8_e4m3fn)
    sc = fq._outer_major(rows, 2 * cols // BLOCK, g.device)  # [rows, 2 cols / 128], M-major
    t1, t2 = (fq._act_outputs(g, rows, cols, t_rows, False) for _ in range(2))  # dg^T's, du^T's
    c = cols // BLOCK
    return ((q[:, :cols], sc[:, :c], *t1[2:]), (q[:, cols:], sc[:, c:], *t2[2:])), (q, sc)


def swiglu_grad_operands(dh, g, u, rows: int, cols: int, t_rows: int | None, row_groups: bool, stacked: bool = False):
    """SwiGLU's backward -> ``(dg's (q, s, qt, st), du's, both)``, the gate and up projections' dY operands
    (:func:`quarl.quant.fp8_operands.quantize_act_gemm`'s layouts); on the Triton backend without writing dg, du.
    ``stacked`` (with ``row_groups``): dg's and du's row groups are the column blocks of one DGrad operand ``both`` =
    ``(q [rows, 2 cols], s [rows, 2 cols / 128])`` -- written in place there by the kernels -- else ``both`` is None."""
    both = None
    if quant_backend(dh) == "triton" and _fused_module() is not None:
        dh = dh if dh.stride(-1) == 1 else dh.contiguous()
        g, u = _unit_stride(g, u)
        out = None
        if stacked and row_groups:
            out, both = _stacked_outputs(g, rows, cols, t_rows)
        return (*_kernels().swiglu_grad_operands(dh, g, u, rows, cols, t_rows, row_groups=row_groups, out=out), both)
    dg, du = silu_mul_grads(g, u, dh)
    one = quantize_act_gemm(dg, rows, cols, t_rows, row_groups=row_groups)
    two = quantize_act_gemm(du, rows, cols, t_rows, row_groups=row_groups)
    if stacked and row_groups:
        both = (torch.cat([one[0], two[0]], 1), torch.cat([one[1], two[1]], 1))
    return one, two, both


def _unit_stride(g: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels take g and u of one layout with unit column stride (two GEMM outputs, or the column blocks of one
    stacked output): others (an output sliced to I columns, I not a multiple of 128) are copied."""
    if g.stride() == u.stride() and g.stride(-1) == 1:
        return g, u
    return g.contiguous(), u.contiguous()


class FP8SwiGLUFunction(torch.autograd.Function):
    """``down(silu(gate(x)) * up(x))`` with every GEMM in FP8 and SwiGLU's backward inside the quantizers (module
    docstring). ``x`` [..., H]; ``w_gate`` / ``w_up`` [I, H] and ``w_down`` [H, I] the master weights (None: no
    WGrad, e.g. under no_grad); ``*q`` / ``*s`` their FP8 tiles padded to multiples of 128
    (:func:`fp8_linear._master_tiles`); ``wgrad_tiles``: X^T and h^T in 128x128 tiles for the WGrads
    (``precision.fp8_wgrad=tiles``); ``silu_mul``: the forward's ``(g, u) -> silu(g) * u`` (the glue's compiled one;
    eager PyTorch's by default); ``gu``: the gate's and up's tiles stacked -- ``(q [2Ip, Hp], s, qt [Hp, 2Ip])`` of
    their :class:`quarl.quant.fp8_stack.Stack`, whose row blocks ``gq`` / ``uq`` are -- for one GEMM forward and one
    DGrad (None: two of each)."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, gq, gs, uq, us, dq, ds, inter, out, wgrad_tiles=False,
                silu_mul=silu_mul_eager, gu=None):
        # gq, uq [Ip, Hp], dq [Hp', Ip] (padded to multiples of 128); inter = I, out = H: the true widths
        lead, hdim = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, hdim)  # [M, H]
        m = x2.shape[0]
        mp = _round_up(m, 4) if x.is_cuda else m  # cuBLAS rows
        mt = _round_up(m, BLOCK)  # WGrad's token groups
        need_gu = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        need_d = ctx.needs_input_grad[3]
        # xq [Mp, Hp], xs [Mp, Hp/128]; xtq, xts: X^T for the gate / up WGrads (1x128 along tokens, or tiles)
        xq, xs, xtq, xts = quantize_input(x, x2, mp, gq.shape[1], mt if need_gu else None, False, wgrad_tiles)
        if gu is not None:  # one GEMM: g and u the column blocks of its output [M, 2Ip] (Ip = I here)
            gu_y = blockwise_gemm(xq, xs, gu[0], gu[1], True, x.dtype)[:m]
            g, u = gu_y[:, :inter], gu_y[:, gq.shape[0]:gq.shape[0] + inter]  # [M, I] each, row stride 2Ip
        else:
            g = blockwise_gemm(xq, xs, gq, gs, True, x.dtype)[:m, :inter]  # [M, I]
            u = blockwise_gemm(xq, xs, uq, us, True, x.dtype)[:m, :inter]  # [M, I]
        # h = silu(g) * u quantized (never saved): hq [Mp, Ip] 1x128, htq / hts h^T (down's WGrad)
        hq, hs, htq, hts = swiglu_operand(g, u, silu_mul, mp, dq.shape[1], mt if need_d else None, wgrad_tiles)
        y = blockwise_gemm(hq, hs, dq, ds, True, x.dtype)[:m, :out]  # [M, H]
        gu_s, gu_qt = (gu[1], gu[2]) if gu is not None else (None, None)
        ctx.save_for_backward(g, u, xtq, xts, htq, hts, gq, gs, uq, us, dq, ds, gu_s, gu_qt)
        ctx.dims = (lead, m, mp, mt, hdim, inter, out)
        ctx.w_dtypes = tuple(w.dtype if w is not None else None for w in (w_gate, w_up, w_down))
        ctx.wgrad_tiles = wgrad_tiles
        return y.reshape(*lead, out)

    @staticmethod
    def backward(ctx, dy):
        g, u, xtq, xts, htq, hts, gq, gs, uq, us, dq, ds, gu_s, gu_qt = ctx.saved_tensors
        lead, m, mp, mt, hdim, i_cols, out = ctx.dims
        need_x, need_g, need_u, need_d = ctx.needs_input_grad[:4]
        dt, tiles = g.dtype, ctx.wgrad_tiles
        dx = dwg = dwu = dwd = None
        dy2 = dy.reshape(-1, dy.shape[-1])  # [M, H]
        # dY in 1x128 groups along H (down's DGrad) and along the tokens (down's WGrad): dyq [Mp, Hp], dytq [Hp, Mt]
        dyq, dys, dytq, dyts = quantize_act_gemm(dy2, mp, dq.shape[0], mt if need_d else None)
        if need_d:  # dWd = dY^T h: [H, I]
            dwd = blockwise_gemm(dytq, dyts, htq, hts, tiles, ctx.w_dtypes[2])[:out, :i_cols]
        if need_x or need_g or need_u:
            dh = blockwise_gemm(dyq, dys, _transposed(dq), _scales_t(ds), True, dt)[:m, :i_cols]  # [M, I]
            (dgq, dgs, dgtq, dgts), (duq, dus, dutq, duts), both = swiglu_grad_operands(
                dh, g, u, mp, gq.shape[0], mt if (need_g or need_u) else None, need_x, stacked=gu_s is not None)
            if need_x and both is not None:  # dX = [dg du] [Wg; Wu]: [M, H], one reduction over 2I in FP32
                dx = blockwise_gemm(both[0], both[1], gu_qt, _scales_t(gu_s), True, dt)[:m, :hdim]
                dx = dx.reshape(*lead, hdim)
            elif need_x:  # dX = dg Wg + du Wu: [M, H]
                dx = blockwise_gemm(dgq, dgs, _transposed(gq), _scales_t(gs), True, dt)[:m, :hdim]
                dx = (dx + blockwise_gemm(duq, dus, _transposed(uq), _scales_t(us), True, dt)[:m, :hdim])
                dx = dx.reshape(*lead, hdim)
            if need_g:  # dWg = dg^T X: [I, H]
                dwg = blockwise_gemm(dgtq, dgts, xtq, xts, tiles, ctx.w_dtypes[0])[:i_cols, :hdim]
            if need_u:
                dwu = blockwise_gemm(dutq, duts, xtq, xts, tiles, ctx.w_dtypes[1])[:i_cols, :hdim]
        dws = tuple(w if w is None or w.is_contiguous() else w.contiguous() for w in (dwg, dwu, dwd))
        return (dx, *dws) + (None,) * 11


def fp8_swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
               wgrad: str = "1x128", silu_mul=None) -> torch.Tensor:
    """``F.linear(silu_mul(F.linear(x, w_gate), F.linear(x, w_up)), w_down)`` through FP8 GEMMs with SwiGLU's backward
    fused into the quantizers; differentiable in ``x`` and the three master weights [I, H], [I, H], [H, I].
    ``silu_mul``: the forward's ``silu(g) * u`` (default eager PyTorch's ``F.silu(g) * u``). Gate and up run as one
    GEMM forward and one DGrad where :func:`stack_gate_up` says so."""
    gu = None
    if stack_gate_up(x, w_gate, w_up):
        stack = fp8_stack._stack_of((w_gate, w_up))  # their tiles in one buffer, each weight's cache a row block
        (gq, gs, _), (uq, us, _) = stack.blocks(0), stack.blocks(1)
        gu = (stack.q, stack.s, stack.qt)
    else:
        gq, gs = _master_tiles(w_gate)
        uq, us = _master_tiles(w_up)
    dq, ds = _master_tiles(w_down)
    # no autograd graph (the trainer's old log-probs, eval): no master weights, so no X^T / h^T for absent WGrads
    ws = (w_gate, w_up, w_down) if torch.is_grad_enabled() else (None, None, None)
    return FP8SwiGLUFunction.apply(x, *ws, gq, gs, uq, us, dq, ds, w_gate.shape[0], w_down.shape[0], wgrad == "tiles",
                                   silu_mul or silu_mul_eager, gu)


def stack_gate_up(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> bool:
    """Whether the gate and up projections run as one FP8 GEMM forward and one DGrad (a
    :class:`quarl.quant.fp8_stack.Stack` of their tiles): ``QUARL_FP8_STACK`` not 0, their width a multiple of 128,
    one shape and dtype, and no CUDA graph being captured (a capture reads tiles by address and must not record
    their refresh: the two projections' own tiles then, the same bytes)."""
    return (fp8_stack.enabled() and w_gate.shape == w_up.shape and w_gate.shape[0] % BLOCK == 0
            and w_gate.dtype == w_up.dtype and not (x.is_cuda and torch.cuda.is_current_stream_capturing()))


def fusable(mlp: nn.Module) -> bool:
    """Whether ``mlp``'s ``gate_proj`` / ``up_proj`` / ``down_proj`` are full-parameter FP8 ``QuantLinear`` s with
    one X^T grouping, no LoRA and no bias (and ``QUARL_FP8_SWIGLU`` is not 0): :func:`mlp_forward` computes them."""
    from quarl.quant.linear import QuantLinear

    projs = [getattr(mlp, p, None) for p in ("gate_proj", "up_proj", "down_proj")]
    return (all(isinstance(p, QuantLinear) and p.fp8_flow and p.mode == "qat" and p.lora_cfg is None
                and p.bias is None for p in projs)
            and len({p.fp8_wgrad for p in projs}) == 1 and enabled())


def mlp_forward(mlp: nn.Module, x: torch.Tensor, silu_mul=None) -> torch.Tensor:
    """A :func:`fusable` MLP's forward: ``down_proj(silu_mul(gate_proj(x), up_proj(x)))`` as :func:`fp8_swiglu`."""
    return fp8_swiglu(x, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, mlp.down_proj.fp8_wgrad,
                      silu_mul)


__all__ = ["FP8SwiGLUFunction", "enabled", "forward_fused", "fp8_swiglu", "fusable", "mlp_forward", "silu_mul_eager",
           "silu_mul_grads", "stack_gate_up", "swiglu_grad_operands", "swiglu_operand"]
