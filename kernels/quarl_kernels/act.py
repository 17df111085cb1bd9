"""``silu(gate) * up`` for the Llama / Qwen MLP in one Triton kernel.

HF's MLP runs ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``: with
``hidden_act = "silu"`` the middle is two kernels over the ``[M, I]``
intermediate (I = 18944 for Qwen2.5-7B), each reading and writing it in the
model dtype. One kernel reads gate and up once and writes the product.

Numerics follow PyTorch's CUDA kernels: ``F.silu`` computes ``x / (1 + exp(-x))``
in fp32 (``expf``, IEEE division) and rounds to the input dtype; the product of
two rounded values is computed in fp32 and rounded again. The kernel uses
libdevice's ``expf`` (what ``expf`` in PyTorch's kernel is) and ``div_rn`` --
not Triton's default ``exp`` (``ex2.approx``) and ``/`` (``div.full``), which are
faster but would move more results to the neighbouring bf16 value. Identical
results are expected; the GPU test still allows one bf16 ulp, since bit-equality
of two compilers' ``expf`` is not a documented guarantee. Under the CPU
interpreter (no libdevice) NumPy's ``exp`` stands in.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from quarl_kernels import pdl
from quarl_kernels.rounding import round_to

BLOCK = 2048  # elements per program


@triton.jit
def silu_mul_values(g, u, dt: tl.constexpr, INTERPRET: tl.constexpr):
    """``silu(g) * u`` for fp32 values of ``dt`` numbers, rounded to ``dt`` as PyTorch's two kernels round (also the
    weight-only GEMMs' last pass for the up projection: ``launch.Epilogue.gate``)."""
    if INTERPRET:
        e = tl.exp(-g)
    else:
        e = libdevice.exp(-g)
    act = round_to(tl.math.div_rn(g, 1.0 + e), dt, INTERPRET).to(tl.float32)  # F.silu in the input dtype
    return round_to(act * u, dt, INTERPRET)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, o_ptr, n, BLOCK: tl.constexpr, INTERPRET: tl.constexpr,
                     PDL: tl.constexpr = 0):
    pdl.enter(PDL)
    dt: tl.constexpr = o_ptr.dtype.element_ty
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(o_ptr + offs, silu_mul_values(g, u, dt, INTERPRET), mask=mask)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Launch the kernel on same-shape, same-dtype ``gate`` and ``up`` (copied if not contiguous)."""
    g, u = gate.contiguous(), up.contiguous()
    out = torch.empty_like(g)
    n = g.numel()
    if n:
        _silu_mul_kernel[(triton.cdiv(n, BLOCK),)](
            g, u, out, n, BLOCK=BLOCK, INTERPRET=os.environ.get("TRITON_INTERPRET", "0") == "1",
            num_warps=4, enable_fp_fusion=False, **pdl.kwargs(g.device),
        )
    return out
