"""x for the TMA-ring kernel (``wgmma_ring``): permuted once per call into the wgmma A fragment's logical k order.

The ring kernel reads a K step of x as one rectangular TMA box written straight into the swizzled shared layout
wgmma takes as its B operand, so x has to be in the order the decoded weight fragment expects before the launch:
within each 64-wide K step, the value at packed word ``J t + j`` and code ``r0 + 2 r1 + 4 h`` goes to logical
``k = 32 j + 16 r1 + 8 r0 + 2 t + h`` (``J = bkw / 4``; ``wgmma_decode``'s module docstring). One small Triton
launch does it (16-byte-line gathers); the weights of a LoRA group (gate and up) share one result. The result is
padded with zero rows to whole token tiles (``tile_rows``): a TMA box partly past the last row -- the copy engine's
zero fill -- made a launch up to 1.5x slower (session 15).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quarl_kernels import pdl


def permute_x_reference(x2: torch.Tensor, bkw: int) -> torch.Tensor:
    """[M, K] -> [M, K]: each K step of 8 * bkw values in the A fragment's logical k order,
    k = 32 j + 16 r1 + 8 r0 + 2 t + h for the value at word J t + j, code r0 + 2 r1 + 4 h (J = bkw / 4)."""
    m, k = x2.shape
    j = bkw // 4
    x7 = x2.reshape(m, k // (8 * bkw), 4, j, 2, 2, 2)  # [m, step, t, j, h, r1, r0]
    return x7.permute(0, 1, 3, 5, 6, 2, 4).reshape(m, k)  # [m, step, j, r1, r0, t, h]


@triton.jit
def _permute_x_kernel(x_ptr, o_ptr, K, stride_xm, BLOCK: tl.constexpr, J: tl.constexpr, PDL: tl.constexpr = 0):
    """Program (row, block of BLOCK outputs): o[row, k] = x[row, source(k)], gathered inside each 8 J-wide step
    (one or two 128-byte lines), stored contiguously. PDL: ``pdl.enter`` first."""
    pdl.enter(PDL)
    row = tl.program_id(0)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # output (logical) index
    kl = k % (32 * J)
    jj, r1, r0, t, h = kl // 32, (kl // 16) % 2, (kl // 8) % 2, (kl // 2) % 4, kl % 2
    src = (k - kl) + 8 * (J * t + jj) + r0 + 2 * r1 + 4 * h
    ok = k < K
    v = tl.load(x_ptr + row * stride_xm + src, mask=ok)
    tl.store(o_ptr + row * K + k, v, mask=ok)


def permute_x(x2: torch.Tensor, bkw: int, rows: int | None = None) -> torch.Tensor:
    """:func:`permute_x_reference` as one small Triton launch on CUDA (the reference elsewhere); ``rows`` (>= M):
    the result padded with zero rows to that many, so that every token tile's TMA box lies inside the tensor
    (a box partly past the last row -- TMA's zero fill -- measured slower: session 15, phase a)."""
    if not x2.is_cuda:
        xp = permute_x_reference(x2, bkw)
        return (
            xp
            if rows is None or rows == x2.shape[0]
            else torch.cat([xp, xp.new_zeros(rows - x2.shape[0], xp.shape[1])])
        )
    m, k = x2.shape
    rows = m if rows is None else rows
    out = torch.empty((rows, k), device=x2.device, dtype=x2.dtype)
    if rows > m:
        out[m:].zero_()
    _permute_x_kernel[(m, triton.cdiv(k, 1024))](
        x2, out, k, x2.stride(0), BLOCK=1024, J=bkw // 4, num_warps=4, **pdl.kwargs(x2.device)
    )
    return out


def tile_rows(m: int, nt: int) -> int:
    """M rounded up to whole token tiles of ``nt``: the rows of the permuted x a launch reads."""
    return -(-m // nt) * nt
