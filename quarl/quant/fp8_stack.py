"""Full-parameter FP8 projections that read one input -- an attention's q, k and v -- as one GEMM forward and one
DGrad.

Why. In full-parameter Jet-RL every projection is an FP8 linear (:mod:`quarl.quant.fp8_linear`), each with its three
GEMMs. Qwen2.5-7B's k and v projections are 512 wide: their GEMMs (16k tokens x 512 x 3584 forward, and the same
FLOPs in DGrad and WGrad) fill too few 128x128 output tiles to keep 132 SMs busy and ran at ~500-590 TFLOP/s on an
H200 against ~1200 for q's (benchmarks/RESULTS.md, "DeepGEMM beside cuBLAS"): FP8 bought them nothing. And autograd
sums the three DGrads in BF16, two more passes over ``[M, H]``. Stacked, q, k and v are one GEMM of width
``Nq + Nk + Nv`` forward and one DGrad reducing over that width.

    forward   Y   = Q(X) [Wq; Wk; Wv]^T          one GEMM -> q, k, v: column blocks (views) of Y [M, Nq+Nk+Nv]
    backward  dYs = [Q(dq) Q(dk) Q(dv)]          each quantized into its own columns of one stacked operand (its
                                                 dY^T on its own): a 1x128 group never straddles two projections,
                                                 each width being a multiple of 128
              dX  = dYs [Wq; Wk; Wv]             one GEMM, the reduction over all three widths
              dW_i = Q(dY_i)^T X^T               one GEMM per projection: stacked, the weight gradient's output
                                                 tiles fell into one more wave (H200, 7B width: 2.73 against
                                                 2.16 ms for the three apart; RESULTS.md "Session 28")

The weights stay three parameters (the checkpoint's layout, the optimizer's, PEFT's). Their FP8 tiles live in one
stacked buffer (:class:`Stack`: tiles ``[Nq+Nk+Nv, Kp]``, their transpose ``[Kp, Nq+Nk+Nv]``, scales): each master
weight's tiles are a row block of it and its transpose a column block, re-quantized into place by the tile kernel
after every optimizer step, and each weight's own cache (``fp8_linear._master_tiles``: what a single projection,
the rollout engine's decode graphs and ``refresh_master_tiles`` read) points at the same bytes -- no second copy.

Numerics. The forward and the weight gradients are the separate linears' (the same FP8 operands, the same
reductions); the biases' gradients too. DGrad is the FP32 sum of the three products rounded to BF16 once, where the
separate linears round each product and autograd adds them in BF16: closer to exact, not the same bits
(``tests/quant/test_fp8_stack.py``).

Where it runs: :mod:`quarl.train.fused_glue` (``policy.compile_glue``) gives a Llama / Qwen attention's q / k / v a
:class:`StackGroup` when all three are :func:`stackable` (full-parameter FP8 ``QuantLinear`` s, no LoRA, one dtype,
one X^T grouping, widths multiples of 128 -- SmolLM2's 576 / 192 are not, and run as three linears). The attention
calls ``q_proj(x)``, ``k_proj(x)``, ``v_proj(x)`` as transformers writes it: the first call computes all three and
leaves k's and v's outputs for the next two calls with the same, unchanged ``x``. ``QUARL_FP8_STACK=0`` keeps three
linears.
"""

from __future__ import annotations

import copy
import weakref

import torch
from torch import nn
from torch.autograd.graph import increment_version

from quarl.quant.fp8_gemm import add_bias, blockwise_gemm
from quarl.quant.fp8_linear import _OPTIMIZER_STEPS
from quarl.quant.fp8_operands import (
    _fused_module,
    _round_up,
    _scales_t,
    _weight_tiles,
    quant_backend,
    quantize_act_gemm,
    quantize_input,
)
from quarl.switches import switch_on

BLOCK = 128


def enabled() -> bool:
    """``QUARL_FP8_STACK`` unset or ``1``: stack (q / k / v here; gate / up in :mod:`quarl.quant.fp8_swiglu`); ``0``:
    the projections as separate FP8 GEMMs."""
    return switch_on("QUARL_FP8_STACK", "q, k, v (and gate, up) as one FP8 GEMM forward and one DGrad",
                     "separate GEMMs")


# --------------------------------------------------------------------------- the stacked tiles
class Stack:
    """The FP8 tiles of several master weights ``[N_i, K]`` in one buffer: ``q`` [sum N_i, Kp], ``s`` [sum N_i / 128,
    Kp / 128], ``qt`` [Kp, sum N_i] (DGrad's operand); ``offsets[i]`` is weight i's first row. Made once per group;
    :meth:`refresh` re-quantizes a weight whose values changed (its version moved, or an optimizer stepped)."""

    def __init__(self, weights: tuple[torch.Tensor, ...]):
        w0 = weights[0]
        self.widths = tuple(w.shape[0] for w in weights)
        self.offsets = tuple(sum(self.widths[:i]) for i in range(len(weights)))
        n, kp = sum(self.widths), _round_up(w0.shape[1], BLOCK)
        self.q = torch.empty(n, kp, device=w0.device, dtype=torch.float8_e4m3fn)
        self.s = torch.empty(n // BLOCK, kp // BLOCK, device=w0.device, dtype=torch.float32)
        self.qt = torch.empty(kp, n, device=w0.device, dtype=torch.float8_e4m3fn)
        self.made = [None] * len(weights)  # (weight version, optimizer steps) its tiles were made at

    def blocks(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Weight i's tiles, scales and transposed tiles: views of the stacked buffers."""
        a, n = self.offsets[i], self.widths[i]
        return self.q[a:a + n], self.s[a // BLOCK:(a + n) // BLOCK], self.qt[:, a:a + n]

    def refresh(self, weights: tuple[torch.Tensor, ...]) -> None:
        changed = False
        for i, w in enumerate(weights):
            version = (w._version, _OPTIMIZER_STEPS[0])
            if self.made[i] == version:
                continue
            q, s, qt = self.blocks(i)
            hit = getattr(w, "_quarl_fp8", None)
            triton = quant_backend(w) == "triton"
            if triton and hit is not None and hit[0] == version and hit[1].data_ptr() == q.data_ptr():
                # already re-made into these blocks, transposed block included, by fp8_linear._master_tiles (the
                # rollout engine's refresh_master_tiles after an optimizer step): not quantized a second time
                self.made[i] = version
                continue
            if triton:  # straight into the blocks: one kernel, no copy
                _fused_module().quantize_tiles(w.detach(), True, out=(q, s, qt))
            else:  # the PyTorch quantizers, then copied in (CPU: the same bits)
                fq, fs, _ = _weight_tiles(w)
                q.copy_(fq)
                s.copy_(fs)
                qt.copy_(fq.t())
            self.made[i] = version
            # the weight's own cache serves the same bytes to a single projection (rollout, eval)
            w._quarl_fp8 = (version, q, s)
            changed = True
        if changed:
            # the kernel moves no version counter: move it (views share their base's), so that caches keyed on
            # it (DGrad's transposed scales, _scales_t) are re-made and autograd refuses a backward across a change
            increment_version([self.q, self.s, self.qt])
            for i in range(len(weights)):
                q, _, qt = self.blocks(i)
                q._quarl_t = (q._version, qt)  # DGrad of a single projection: this block (fp8_operands._transposed)


def _stack_of(weights: tuple[torch.Tensor, ...]) -> Stack:
    """The :class:`Stack` of ``weights`` (kept on the first one, made on first use or when the group changed)."""
    st = getattr(weights[0], "_quarl_stack", None)
    key = tuple((id(w), tuple(w.shape), w.device) for w in weights)
    if st is None or st[0] != key:
        st = (key, Stack(weights))
        weights[0]._quarl_stack = st
    st[1].refresh(weights)
    return st[1]


# --------------------------------------------------------------------------- dY of several projections
def _stacked_grad_operands(dys: list[torch.Tensor], mp: int, widths: tuple[int, ...], mt: int | None,
                           row_groups: bool):
    """The projections' output gradients ``dys[i]`` [M, N_i] -> the stacked DGrad operand ``(q [Mp, N], s [Mp, N/128])``
    (N = sum N_i; each gradient quantized into its own columns) and each projection's WGrad operand ``[(qt_i [N_i, Mt],
    st_i [N_i, Mt/128])]``, bit for bit each one's own quantization (:func:`quarl.quant.fp8_operands.quantize_act_gemm`).
    WGrad stays one GEMM per projection: stacked, its ``sum N_i`` output rows fell into one more wave of 256x128 tiles
    (H200, Qwen2.5-7B width, 16k tokens: 2.73 ms against 2.16 for q, k and v apart)."""
    n = sum(widths)
    if quant_backend(dys[0]) == "triton":
        fq = _fused_module()
        dev = dys[0].device
        q = torch.empty(mp, n, device=dev, dtype=torch.float8_e4m3fn) if row_groups else None
        s = torch.empty(n // BLOCK, mp, device=dev, dtype=torch.float32).t() if row_groups else None  # M-major
        wgrad = []
        a = 0
        for dy, w in zip(dys, widths, strict=True):
            qt = torch.empty(w, mt, device=dev, dtype=torch.float8_e4m3fn) if mt is not None else None
            st = torch.empty(mt // BLOCK, w, device=dev, dtype=torch.float32).t() if mt is not None else None
            fq.quantize_act(dy, mp, w, mt, row_groups=row_groups, out=(
                q[:, a:a + w] if row_groups else None, s[:, a // BLOCK:(a + w) // BLOCK] if row_groups else None,
                qt, st))
            wgrad.append((qt, st))
            a += w
        return q, s, wgrad
    parts = [quantize_act_gemm(dy, mp, w, mt, row_groups=row_groups) for dy, w in zip(dys, widths, strict=True)]
    q = torch.cat([p[0] for p in parts], 1) if row_groups else None
    s = torch.cat([p[1] for p in parts], 1) if row_groups else None
    return q, s, [(p[2], p[3]) for p in parts]


# --------------------------------------------------------------------------- autograd
class FP8StackFunction(torch.autograd.Function):
    """``(x @ W_i^T + b_i for each i)`` with one FP8 GEMM forward and one DGrad (module docstring). ``x`` [..., K];
    ``stack`` the weights' :class:`Stack` (current); ``k`` the true in features; ``wgrad_tiles``: X^T in 128x128
    tiles in WGrad; ``params``: the master weights [N_i, K] (None: no WGrad, e.g. under no_grad), then the biases
    [N_i] or None."""

    @staticmethod
    def forward(ctx, x, stack, k, wgrad_tiles, *params):
        nw = len(stack.widths)
        weights, biases = params[:nw], params[nw:]
        lead = x.shape[:-1]
        x2 = x.reshape(-1, k)  # [M, K]
        m = x2.shape[0]
        mp = _round_up(m, 4) if x.is_cuda else m  # cuBLAS rows
        mt = _round_up(m, BLOCK)  # WGrad's token groups
        need_w = any(ctx.needs_input_grad[4:4 + nw])
        kp = stack.q.shape[1]
        # xq [Mp, Kp], xs [Mp, Kp/128]; xtq, xts: X^T for WGrad (1x128 along tokens, or 128x128 tiles)
        xq, xs, xtq, xts = quantize_input(x, x2, mp, kp, mt if need_w else None, False, wgrad_tiles)
        y = blockwise_gemm(xq, xs, stack.q, stack.s, True, x.dtype)[:m]  # [M, N], N = sum N_i (multiples of 128)
        if any(b is not None for b in biases):
            y = add_bias(y, torch.cat([b if b is not None else y.new_zeros(w) for b, w in
                                       zip(biases, stack.widths, strict=True)]))
        ctx.save_for_backward(stack.q, stack.s, stack.qt, xtq, xts)
        ctx.dims = (lead, m, mp, mt, k, stack.widths)
        ctx.dtypes = (x.dtype, tuple(w.dtype if w is not None else None for w in weights),
                      tuple(b.dtype if b is not None else None for b in biases))
        ctx.wgrad_tiles = wgrad_tiles
        return tuple(y[:, a:a + n].view(*lead, n) for a, n in zip(stack.offsets, stack.widths, strict=True))

    @staticmethod
    def backward(ctx, *dys):
        _sq, ss, sqt, xtq, xts = ctx.saved_tensors  # the tiles saved too: a backward across their refresh is refused
        lead, m, mp, mt, k, widths = ctx.dims
        x_dtype, w_dtypes, b_dtypes = ctx.dtypes
        nw = len(widths)
        need_x = ctx.needs_input_grad[0]
        need_w = [ctx.needs_input_grad[4 + i] for i in range(nw)]
        need_b = [ctx.needs_input_grad[4 + nw + i] for i in range(nw)]
        dy2 = [d.reshape(-1, n) for d, n in zip(dys, widths, strict=True)]  # [M, N_i]
        # dYs [Mp, N] 1x128 along N (DGrad; N = sum N_i), and each dY_i^T [N_i, Mt] 1x128 along the tokens (WGrad)
        dyq, dys_, dyt = _stacked_grad_operands(dy2, mp, widths, mt if any(need_w) else None, need_x)
        dx = None
        if need_x:  # dX = dYs [Wq; Wk; Wv]: [M, K], one reduction over N
            dx = blockwise_gemm(dyq, dys_, sqt, _scales_t(ss), True, x_dtype)[:m, :k].reshape(*lead, k)
        dws = [None] * nw
        for i, (dytq, dyts) in enumerate(dyt):  # dW_i = dY_i^T X: [N_i, K], in the master weight's dtype
            if need_w[i]:
                dw = blockwise_gemm(dytq, dyts, xtq, xts, ctx.wgrad_tiles, w_dtypes[i])[:, :k]
                dws[i] = dw if dw.is_contiguous() else dw.contiguous()
        dbs = [d.sum(0, dtype=torch.float32).to(b_dtypes[i]) if need_b[i] and b_dtypes[i] is not None else None
               for i, d in enumerate(dy2)]  # fp32 accumulation, as fp8_linear's bias gradient
        return (dx, None, None, None, *dws, *dbs)


def fp8_stack(x: torch.Tensor, weights: tuple[torch.Tensor, ...], biases: tuple[torch.Tensor | None, ...] | None = None,
              wgrad: str = "1x128") -> tuple[torch.Tensor, ...]:
    """``tuple(F.linear(x, w, b) for w, b in zip(weights, biases))`` through one FP8 GEMM forward and one DGrad (module
    docstring); differentiable in ``x``, the master weights [N_i, K] and the biases. Every N_i must be a multiple of
    128."""
    if any(w.shape[0] % BLOCK for w in weights) or len({w.shape[1] for w in weights}) != 1 \
            or len({w.dtype for w in weights}) != 1:
        raise ValueError(f"fp8_stack: weights of one in-features, one dtype and out-features multiples of {BLOCK}; "
                         f"got {[tuple(w.shape) for w in weights]}")
    biases = tuple(biases) if biases is not None else (None,) * len(weights)
    stack = _stack_of(tuple(weights))
    ws = tuple(weights) if torch.is_grad_enabled() else (None,) * len(weights)  # no graph: no X^T for a WGrad
    return FP8StackFunction.apply(x, stack, weights[0].shape[1], wgrad == "tiles", *ws, *biases)


# --------------------------------------------------------------------------- the modules' side
def stackable(projs: tuple[nn.Module, ...]) -> bool:
    """Whether ``projs`` (one input's projections) are full-parameter FP8 ``QuantLinear`` s that :func:`fp8_stack`
    computes: no LoRA, one X^T grouping, one dtype and in-features, out-features multiples of 128 (and
    ``QUARL_FP8_STACK`` is not 0)."""
    from quarl.quant.linear import QuantLinear

    return (all(isinstance(p, QuantLinear) and p.fp8_flow and p.mode == "qat" and p.lora_cfg is None
                and p.out_features % BLOCK == 0 for p in projs)
            and len({p.fp8_wgrad for p in projs}) == 1 and len({p.in_features for p in projs}) == 1
            and len({p.weight.dtype for p in projs}) == 1 and enabled())


class StackGroup:
    """q / k / v of one attention, called one by one as transformers does: the first projection's call computes all
    three (:func:`fp8_stack`) and leaves the others' outputs, each taken by that projection's next call with the same,
    unchanged input (``QuantLinear.forward`` asks :meth:`output` first). A deep copy of the model (the reference
    policy, a rollout replica) gets a group of its own copies."""

    def __init__(self, projs: tuple[nn.Module, ...]):
        self.projs = tuple(projs)
        self.left: dict[int, tuple] = {}  # index -> (weakref to x, x's version, output)

    def __deepcopy__(self, memo):
        new = StackGroup.__new__(StackGroup)
        memo[id(self)] = new
        new.projs = tuple(copy.deepcopy(p, memo) for p in self.projs)
        new.left = {}  # outputs of this model's graph are not the copy's
        return new

    def __getstate__(self):
        return {"projs": self.projs, "left": {}}

    def output(self, proj: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """``proj(x)`` from the stacked GEMM, or None (not stackable now: the caller runs its own forward)."""
        i = next((j for j, p in enumerate(self.projs) if p is proj), None)
        if i is None:
            return None
        left = self.left.pop(i, None)
        if left is not None and left[0]() is x and left[1] == x._version:
            return left[2]
        if i != 0 or not stackable(self.projs) or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            return None  # a graph capture reads tiles by address and must not record their refresh
        outs = fp8_stack(x, tuple(p.weight for p in self.projs), tuple(p.bias for p in self.projs),
                         self.projs[0].fp8_wgrad)
        self.left = {j: (weakref.ref(x), x._version, outs[j]) for j in range(1, len(self.projs))}
        return outs[0]


def attach(projs: tuple[nn.Module, ...]) -> bool:
    """Give ``projs`` (one attention's q, k, v ``QuantLinear`` s) a shared :class:`StackGroup`; False when they are
    not :func:`stackable` (they stay three linears; the group checks again at every call: a switch or a change of
    mode after this falls back to the three)."""
    if not stackable(projs):
        return False
    group = StackGroup(projs)
    for p in projs:
        p._stack = group
    return True


__all__ = ["FP8StackFunction", "Stack", "StackGroup", "attach", "enabled", "fp8_stack", "stackable"]
