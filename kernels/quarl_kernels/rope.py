"""RoPE on q and k in one Triton kernel, bit for bit HF's ``x * cos + rotate_half(x) * sin``.

PyTorch evaluates the formula as ~10 kernels per tensor (two chunks, a negation,
a cat, two products, a sum, with bf16 rounding after each); the engine applies it
to q and k of every layer. Here one launch rotates both.

Numerics. In bf16/fp16 PyTorch rounds every op: ``a = round(x * cos)``,
``b = round(rotate_half(x) * sin)``, ``out = round(a + b)``. The kernel computes
each product in fp32 (exact: two 8-bit, or 11-bit, significands), rounds it to
the model dtype, adds the two rounded values in fp32 and rounds once more --
the same sequence, so the result is identical (the GPU test asserts equality,
not closeness). ``rotate_half`` only moves and negates values, which is exact.

Layout: ``q [B, H, L, D]`` and ``k [B, H_kv, L, D]`` with any strides but a unit
stride along D (the engine passes the transposed views of the projections'
outputs), ``cos, sin [B, L, D]``. Program ``(b*L + l, j)`` rotates heads
``[j*BLOCK_H, (j+1)*BLOCK_H)`` of the concatenation ``[q heads | k heads]`` at
token ``(b, l)``, so cos/sin are read once per token and head block; a block
holds q heads or k heads, never both. The outputs have the inputs' layouts.

A decode step's K/V write (:func:`rope_qk_cache`). The engine then wrote ``k_rot`` and ``v`` into
its caches with two ``index_copy_`` kernels per layer (57 kernels, 0.14 ms of a 7B NVFP4+LoRA step
at batch 1 on an H100: RESULTS "Issue 17"). With ``CACHE`` the same launch stores rotated k heads
straight at cache position ``slot[l]`` (read on the device: the step runs in a CUDA graph) and has
``cdiv(H_kv, BLOCK_H)`` more programs that copy v's heads there; q's output is as before.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from quarl_kernels import pdl
from quarl_kernels.rounding import round_to

_TILE = 2048  # elements (heads x D) per program


@triton.jit
def _rope_tile(x_ptr, o_ptr, b, l, lo, h0, n_heads, sxb, sxh, sxl, sob, soh, sol, c, s, d, partner, sign, D,
               BLOCK_H: tl.constexpr, INTERPRET: tl.constexpr, ROTATE: tl.constexpr = True):
    """Heads ``[h0, h0 + BLOCK_H)`` of token ``(b, l)``, rotated (or, ``ROTATE=False``, copied) to position ``lo``."""
    dt: tl.constexpr = o_ptr.dtype.element_ty
    heads = h0 + tl.arange(0, BLOCK_H)  # [BH]
    mask = (heads < n_heads)[:, None] & (d < D)[None, :]  # [BH, BD]
    base = x_ptr + b * sxb + l * sxl + heads[:, None].to(tl.int64) * sxh
    if ROTATE:
        x = tl.load(base + d[None, :], mask=mask, other=0.0).to(tl.float32)  # [BH, BD]
        xr = tl.load(base + partner[None, :], mask=mask, other=0.0).to(tl.float32)  # x[(d + D/2) % D]
        a = round_to(x * c[None, :], dt, INTERPRET).to(tl.float32)  # x * cos
        r = round_to((xr * sign[None, :]) * s[None, :], dt, INTERPRET).to(tl.float32)  # rotate_half(x) * sin
        out = round_to(a + r, dt, INTERPRET)
    else:
        out = tl.load(base + d[None, :], mask=mask, other=0.0)
    tl.store(o_ptr + b * sob + lo * sol + heads[:, None].to(tl.int64) * soh + d[None, :], out, mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, c_ptr, s_ptr, qo_ptr, ko_ptr,
    L, H, HK, D,
    sqb, sqh, sql, skb, skh, skl, sqob, sqoh, sqol, skob, skoh, skol, scb, scl, ssb, ssl,
    v_ptr, vo_ptr, slot_ptr, svb, svh, svl, svob, svoh, svol,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, INTERPRET: tl.constexpr, CACHE: tl.constexpr = False,
    PDL: tl.constexpr = 0,
):
    pdl.enter(PDL)
    tok = tl.program_id(0)
    j = tl.program_id(1)
    b = (tok // L).to(tl.int64)
    l = (tok % L).to(tl.int64)
    if CACHE:  # k rotated and v copied into the caches at position slot[l] (a decode step's K/V write)
        lo = tl.load(slot_ptr + l).to(tl.int64)
    else:
        lo = l
    half = D // 2
    d = tl.arange(0, BLOCK_D)  # [BD]
    partner = tl.where(d < half, d + half, d - half)
    sign = tl.where(d < half, -1.0, 1.0)  # rotate_half = cat(-x2, x1)
    c = tl.load(c_ptr + b * scb + l * scl + d, mask=d < D, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + b * ssb + l * ssl + d, mask=d < D, other=0.0).to(tl.float32)
    n_qblocks = tl.cdiv(H, BLOCK_H)
    n_kblocks = tl.cdiv(HK, BLOCK_H)
    if j < n_qblocks:
        _rope_tile(q_ptr, qo_ptr, b, l, l, j * BLOCK_H, H, sqb, sqh, sql, sqob, sqoh, sqol, c, s, d, partner, sign, D,
                   BLOCK_H, INTERPRET)
    elif j < n_qblocks + n_kblocks:
        _rope_tile(k_ptr, ko_ptr, b, l, lo, (j - n_qblocks) * BLOCK_H, HK, skb, skh, skl, skob, skoh, skol, c, s, d,
                   partner, sign, D, BLOCK_H, INTERPRET)
    else:  # CACHE only: v's heads, copied
        _rope_tile(v_ptr, vo_ptr, b, l, lo, (j - n_qblocks - n_kblocks) * BLOCK_H, HK, svb, svh, svl, svob, svoh,
                   svol, c, s, d, partner, sign, D, BLOCK_H, INTERPRET, False)


def tile_config(d: int, heads: int) -> tuple[int, int, int]:
    """``(BLOCK_H, BLOCK_D, num_warps)``: ~``_TILE`` elements per program, fewer heads when few exist."""
    block_d = triton.next_power_of_2(d)
    block_h = max(1, min(triton.next_power_of_2(heads), _TILE // block_d))
    return block_h, block_d, min(8, max(1, block_h * block_d // 512))


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Launch the kernel: ``q [B, H, L, D]``, ``k [B, H_kv, L, D]``, ``cos/sin [B, L, D]`` (unit stride
    along D, D even) -> ``(q_rot, k_rot)`` with the inputs' layouts. Callers check applicability."""
    qo, ko = torch.empty_like(q), torch.empty_like(k)  # same strides as q, k (dense layouts)
    _launch(q, k, cos, sin, qo, ko)
    return qo, ko


def rope_qk_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """A decode step's RoPE and K/V cache write in one launch: returns ``q_rot``; ``k_cache[:, :, slot[l]] =
    rope(k)[:, :, l]`` and ``v_cache[:, :, slot[l]] = v[:, :, l]`` (``index_copy_`` along dim 2), caches ``[B, H_kv,
    S, D]`` with a unit stride along D. Callers check applicability (and that ``slot`` indexes the cache)."""
    qo = torch.empty_like(q)
    _launch(q, k, cos, sin, qo, k_cache, v, v_cache, slot)
    return qo


def _launch(q, k, cos, sin, qo, ko, v=None, vo=None, slot=None) -> None:
    B, H, L, D = q.shape
    HK = k.shape[1]
    if B * L == 0:
        return
    bh, bd, warps = tile_config(D, max(H, HK))
    cache = v is not None
    grid = (B * L, triton.cdiv(H, bh) + triton.cdiv(HK, bh) * (2 if cache else 1))
    vs = (v.stride(0), v.stride(1), v.stride(2), vo.stride(0), vo.stride(1), vo.stride(2)) if cache else (0,) * 6
    _rope_kernel[grid](
        q, k, cos, sin, qo, ko, L, H, HK, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        v if cache else q, vo if cache else qo, slot if cache else cos, *vs,
        BLOCK_H=bh, BLOCK_D=bd, INTERPRET=os.environ.get("TRITON_INTERPRET", "0") == "1", CACHE=cache,
        num_warps=warps, enable_fp_fusion=False, **pdl.kwargs(q.device),
    )
