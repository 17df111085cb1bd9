"""GPTQ (Frantar et al., 2022) for every quarl weight format, through the format hooks.

GPTQ quantizes a linear layer's weight ``W`` [N, K] one input column at a time
and spreads each column's rounding error over the columns not yet quantized,
weighted by the inverse Hessian of the layer's reconstruction loss
``||W X - W_hat X||^2``, whose Hessian is ``H = 2 X X^T`` [K, K] (X: the
layer's calibration inputs, one column per token).

The algorithm below is the GPTQ repository's (``gptq.py: fasterquant``):

  * dead inputs (``diag(H) == 0``: a channel that is always zero) get
    ``H[i, i] = 1`` and their weight column is zeroed -- it can never matter;
  * dampening ``H += percdamp * mean(diag(H)) * I`` (percdamp 0.01) keeps the
    Cholesky factorisation stable;
  * ``Hinv`` is the *upper* Cholesky factor of ``H^-1``; a column's error is
    ``(w - q) / Hinv[i, i]`` and the update of the remaining columns is that
    error times row ``i`` of ``Hinv``;
  * columns go in blocks of ``block_size`` (128): inside a block updates are
    applied column by column to a small copy, and the rest of the matrix is
    updated once per block (the "lazy batch" trick: same arithmetic, far less
    memory traffic);
  * optional act-order: columns in order of decreasing ``diag(H)``, so the
    columns that matter most are quantized while the most freedom is left.

Scales. A format decides its own numbers only through three hooks of
:class:`quarl.quant.base.Format`: ``tensor_state`` (e.g. NVFP4's global
scale; fixed once per layer, and shared by the fused q/k/v or gate/up shards
when the caller passes a shared state), ``block_scales`` (the scales of one
group of ``cfg.block_size`` columns, computed from the *current, already
error-updated* weights when GPTQ reaches the group's first column) and
``qdq_with_scales`` (round one column with those scales frozen). So the same
code serves NVFP4, MXFP4, NF4 (with or without double quantization), INT-k
group-wise and FP8 (per-tensor: one "group" of K columns; 128x128 blockwise:
``block_scales`` already returns per-row-tile scales, which we pass through).

Act-order with groups. Quantizing in a permuted order while scales belong to
contiguous groups of the *original* order is what the GPTQ repository calls
``static_groups``: every group's scales are computed up front from the
(dead-column-cleaned) original weights, then each column uses the scales of
the group it belongs to. No ``g_idx`` is needed, so the checkpoint layout is
unchanged (compressed-tensors calls this ``actorder: static``). The trade-off:
static scales cannot follow the error updates, which act-order usually more
than pays for. We therefore force static groups whenever act-order is on.

The column loop itself lives in :mod:`quarl.calibrate.gptq_columns`: the eager reference, the
same ops replayed as CUDA graphs, and one Triton kernel per lazy block -- bit-identical, chosen
by ``column_loop`` (docs/calibrate.md).

The result is ``Q`` (the dequantized weight, exactly on the format's grid)
plus the per-group scales; :mod:`quarl.quant.pack` turns those into a
:class:`~quarl.quant.base.QTensor` with the format's exact bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from quarl.calibrate.gptq_columns import (
    COLUMN_LOOPS,
    GRAPH_FORMATS,
    reference_loop,
    static_loop,
    triton_applies,
    triton_loop,
)
from quarl.quant.base import FormatConfig, QTensor, QuantError, check_weight, get_format


def group_size(cfg: FormatConfig, k: int) -> int:
    """Columns that share one set of scales: the format's block, or all of K for FP8 per-tensor."""
    if cfg.name == "fp8" and getattr(cfg, "granularity", "") == "tensor":
        return k
    return int(cfg.block_size)


HESSIAN_MATMULS = ("fp32", "native")


class HessianAccumulator:
    """Running ``H = 2/n * sum_t x_t x_t^T`` over calibration tokens (float32 [K, K]).

    Kept as a mean so that adding more data never changes the scale of H (and
    so that ``percdamp`` means the same thing for any sample count). The
    normalisation cancels in GPTQ and in the relative reconstruction error.

    ``matmul``: "fp32" (the reference: inputs upcast to fp32, scaled by sqrt(2/n), one fp32 GEMM
    per batch on the CUDA cores) or "native": 16-bit (bf16/fp16) CUDA inputs go into the GEMM as
    they are, on the tensor cores, with fp32 accumulation and output, and the 2/n scaling is the
    GEMM's alpha. A product of two bf16 (or fp16) numbers is exact in fp32, so "native" differs
    from "fp32" only in the order and rounding of the fp32 sums (and in where 2/n is applied) --
    not in what is summed; fp32 inputs, and CPUs, always take the fp32 path. On an H100 the 7B
    down_proj Hessian is ~10x faster this way (see benchmarks/RESULTS.md for its effect on GPTQ).
    """

    def __init__(self, in_features: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 matmul: str = "fp32"):
        if matmul not in HESSIAN_MATMULS:
            raise QuantError(f"gptq: hessian matmul must be one of {', '.join(HESSIAN_MATMULS)}, got {matmul!r}")
        self.H = torch.zeros(in_features, in_features, device=device, dtype=dtype)
        self.n = 0
        self.matmul = matmul

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1])  # [T, K]
        t = x.shape[0]
        if t == 0:
            return
        if (self.matmul == "native" and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
                and self.H.dtype == torch.float32 and _native_addmm(self.H, x, self.n, t)):
            self.n += t
            return
        x = x.to(self.H.dtype)
        self.H.mul_(self.n / (self.n + t))
        self.n += t
        x = x * math.sqrt(2.0 / self.n)
        self.H.addmm_(x.t(), x)  # [K, T] @ [T, K]


_NATIVE_OK: bool | None = None  # whether this torch has the 16-bit-in, fp32-out GEMM (learned once)


def _native_addmm(H: torch.Tensor, x: torch.Tensor, n: int, t: int) -> bool:
    """``H <- n/(n+t) H + 2/(n+t) x^T x`` with a 16-bit x, fp32 accumulate/output; False if unsupported."""
    global _NATIVE_OK
    if _NATIVE_OK is False:
        return False
    beta, alpha = n / (n + t), 2.0 / (n + t)
    try:
        prod = torch.mm(x.t(), x, out_dtype=torch.float32)  # [K, K] fp32, exact products
    except (RuntimeError, TypeError, NotImplementedError) as e:
        _NATIVE_OK = False
        import logging

        logging.getLogger(__name__).warning("gptq: no 16-bit GEMM with fp32 output here (%s); Hessians in fp32", e)
        return False
    _NATIVE_OK = True
    H.mul_(beta).add_(prod, alpha=alpha)
    return True


@dataclass
class GPTQResult:
    q: torch.Tensor  # [N, K] dequantized weight on the format's grid (float32)
    scales: list[Any]  # per group, in K order: what block_scales returned
    state: dict  # the tensor state used (fixed before the first group)
    loss: float  # GPTQ's own objective: sum of (w - q)^2 / Hinv_ii^2 / 2
    qtensor: QTensor | None = None


def _to(x: Any, device: torch.device) -> Any:
    """A scale (a tensor, or a tuple of tensors / None) moved to ``device``."""
    if isinstance(x, tuple):
        return tuple(_to(y, device) for y in x)
    return x.to(device) if torch.is_tensor(x) else x


def relative_error(w: torch.Tensor, w_hat: torch.Tensor, H: torch.Tensor) -> float:
    """``||W X - W_hat X||^2 / ||W X||^2`` from the (undamped) Hessian, without X."""
    d = (w - w_hat).to(H.dtype)
    num = ((d @ H) * d).sum()
    den = ((w.to(H.dtype) @ H) * w.to(H.dtype)).sum()
    return float(num / den) if den > 0 else float(num > 0)


def weight_error(w: torch.Tensor, w_hat: torch.Tensor) -> float:
    """``||W - W_hat||^2 / ||W||^2``: the error when no activations were seen (data-free RTN)."""
    den = float(w.square().sum())
    return float((w - w_hat).square().sum()) / den if den > 0 else float(bool((w - w_hat).any()))


def gptq_quantize(
    w: torch.Tensor,
    H: torch.Tensor,
    cfg: FormatConfig,
    *,
    state: dict | None = None,
    block_size: int = 128,
    percdamp: float = 0.01,
    act_order: bool = False,
    pack: bool = True,
    device: str | torch.device | None = None,
    column_loop: str = "auto",
) -> GPTQResult:
    """GPTQ-quantize ``w`` [N, K] given its Hessian ``H`` [K, K]; returns Q, scales and the QTensor.

    ``state``: per-tensor format state to use (e.g. shared by fused shards);
    defaults to ``tensor_state(w)``. Neither ``w`` nor ``H`` is modified.
    ``device``: where the solve runs (default: ``w``'s device); the results come back on ``w``'s
    device. On a GPU the column loop is one Triton kernel per 128 columns (act-order) or CUDA
    graphs, ~10x faster than the eager loop on a 7B layer (benchmarks/RESULTS.md).
    ``column_loop`` (all bit-identical; see :mod:`quarl.calibrate.gptq_columns`): "reference"
    (eager, one format call per column); "graph" (the same ops on fixed buffers, captured as
    CUDA graphs on a GPU, eager elsewhere; formats in ``GRAPH_FORMATS``); "triton" (one kernel
    per lazy block, ``quarl_kernels.gptq_block``: static groups, i.e. act-order, and
    ``TRITON_FORMATS`` only; elsewhere it falls back to "graph"); "auto": triton, else graph, on
    CUDA; reference on other devices.
    """
    home = w.device
    if device is not None and torch.device(device) != home:
        st = None if state is None else {k: _to(v, torch.device(device)) for k, v in state.items()}
        r = gptq_quantize(w.to(device), H.to(device), cfg, state=st, block_size=block_size, percdamp=percdamp,
                          act_order=act_order, pack=pack, column_loop=column_loop)
        return GPTQResult(q=r.q.to(home), scales=[_to(s, home) for s in r.scales],
                          state={k: _to(v, home) for k, v in r.state.items()}, loss=r.loss,
                          qtensor=r.qtensor.to(home) if r.qtensor is not None else None)
    fmt = get_format(cfg.name)
    if w.dim() != 2 or H.shape != (w.shape[1], w.shape[1]):
        raise QuantError(f"gptq: weight {tuple(w.shape)} and Hessian {tuple(H.shape)} do not match ([N, K] and [K, K])")
    if column_loop not in COLUMN_LOOPS:
        raise QuantError(f"gptq: column_loop must be one of {', '.join(COLUMN_LOOPS)}, got {column_loop!r}")
    if block_size <= 0 or percdamp < 0:
        raise QuantError(f"gptq: block_size must be > 0 and percdamp >= 0, got {block_size}, {percdamp}")
    k = w.shape[1]
    g = group_size(cfg, k)
    check_weight(w, g, f"gptq/{cfg.name}")
    dev = w.device
    W = w.detach().to(torch.float32).clone()  # [N, K], updated in place
    H = H.detach().to(device=dev, dtype=torch.float32).clone()  # [K, K]
    if not torch.isfinite(H).all():
        raise QuantError(
            "gptq: the Hessian has NaN/Inf entries; the calibration activations overflowed "
            "(calibrate in float32, or check the model for NaNs)"
        )

    if state is None:
        state = fmt.tensor_state(W, cfg)
    else:
        state = dict(state)  # a private copy: some states carry a cursor (NF4 double quant)
    if "next_group" in state:
        state["next_group"] = 0

    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0

    static = act_order  # act-order needs scales fixed per original group (see module docstring)
    groups: list[Any] = []
    if static:
        groups = [fmt.block_scales(W[:, j : j + g], cfg, state) for j in range(0, k, g)]
    perm = invperm = None
    if act_order:
        perm = torch.argsort(torch.diag(H), descending=True)
        W, H = W[:, perm], H[perm][:, perm]
        invperm = torch.argsort(perm)
    # column -> original column, on the host once: indexing a CUDA tensor per column would
    # sync the GPU ~40k times per 7B block (measured: it dominated GPTQ's wall time)
    orig_col = perm.tolist() if perm is not None else range(k)

    damp = percdamp * torch.mean(torch.diag(H))
    H.diagonal().add_(damp)
    try:
        L = torch.linalg.cholesky(H)
        Hinv = torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True)  # [K, K] upper
    except torch.linalg.LinAlgError as e:
        raise QuantError(
            f"gptq: the damped Hessian is not positive definite ({e}); raise percdamp "
            f"(now {percdamp}) or use more calibration data"
        ) from None

    sg = groups if static else None
    loop = column_loop
    if loop == "auto":  # on a GPU the Triton kernel where it applies, else CUDA graphs (both checked on an H200)
        loop = ("triton" if triton_applies(cfg, static, dev) else "graph") if dev.type == "cuda" else "reference"
    if loop == "triton" and not triton_applies(cfg, static, dev):
        loop = "graph"  # no static groups, another format, or no Triton here
    if loop == "graph" and cfg.name not in GRAPH_FORMATS:
        loop = "reference"
    if loop == "triton":
        Q, losses, scales_in_order = triton_loop(fmt, cfg, state, W, Hinv, block_size=block_size, g=g, groups=sg,
                                                 orig_col=orig_col)
    elif loop == "graph":  # the same ops on fixed buffers, replayed as CUDA graphs (eagerly off CUDA)
        Q, losses, scales_in_order = static_loop(fmt, cfg, state, W, Hinv, block_size=block_size, g=g, groups=sg,
                                                 orig_col=orig_col, graph=dev.type == "cuda")
    else:
        Q, losses, scales_in_order = reference_loop(fmt, cfg, state, W, Hinv, block_size=block_size, g=g,
                                                    groups=sg, orig_col=orig_col)

    if invperm is not None:
        Q = Q[:, invperm]
    res = GPTQResult(q=Q, scales=groups if static else scales_in_order, state=state, loss=float(losses.sum()))
    if pack:
        from quarl.quant.pack import pack_qtensor

        res.qtensor = pack_qtensor(cfg, Q, res.scales, state)
    return res
