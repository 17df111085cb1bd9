"""Flash-decoding: attention of one new token per row over the engine's static KV cache.

What it computes (the engine's decode step, ``quarl.engine.model.DecoderRunner.decode``)::

    o = softmax(scale * q @ k^T  masked by valid) @ v
    q [B, H_kv, G, D]   the G = H / H_kv query heads of one KV head, folded as G query rows (GQA)
    k, v [B, H_kv, L, D] the cache prefix (a strided view of [B, H_kv, S, D]; L a kv-length bucket)
    valid [B, L] bool    which slots a row may attend (left padding and unwritten slots are False)
    o [B, H_kv, G, D]    in q's dtype

which ``F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])`` computes
today. At batch 1 that is ~2.6 MB of K/V per 7B layer (H_kv 4, D 128, L ~1280) -- ~1 us of
HBM on an H100 -- but SDPA's masked path takes ~32 us: a handful of programs per head,
launch- and latency-bound. The fix is the flash-decoding one: split L across programs so the
whole GPU streams the cache, then combine.

Design:

* **Grid** ``(B * H_kv, splits)``. A program owns one KV head of one row and a contiguous chunk
  of ``tiles_per_split`` tiles of ``BLOCK_N`` slots. It loads its G query rows once, padded to
  ``BLOCK_G = max(16, next_pow2(G))`` rows (``tl.dot`` needs M >= 16; the padded rows are zeros
  and never stored), so K and V are read exactly once per KV head -- GQA costs no extra bytes.
* **Online softmax** in fp32 (m, l, acc) over the chunk, in base 2: scores are ``q @ k^T *
  (scale * log2(e))`` and ``exp2`` replaces ``exp``. Masked slots (``valid`` False, or past L)
  get -inf; the running max starts at a finite ``-1e30`` so an all-masked tile or chunk gives
  ``p = 0`` and no ``inf - inf``. ``p`` is rounded to the cache dtype for the ``p @ v`` dot, as
  in FlashAttention.
* **Splits.** ``splits == 1``: the program normalizes and writes ``o`` itself (one launch).
  Otherwise it writes its partial ``(m, l, acc)`` (the G real rows) to an fp32 workspace and
  ``_combine_kernel`` (grid ``B * H_kv``) merges the splits in split order -- ``M = max m_s``,
  ``w_s = 2^(m_s - M)``, ``o = sum w_s acc_s / sum w_s l_s`` -- deterministic, no atomics. It loads all
  splits' maxima at once and pipelines the ``acc`` loads (its first form's dependent load chains cost
  the 7B batch-1 step 0.06 of its 0.29 ms of attention, 14B 0.11 of 0.55). Merging in the attention launch instead
  (the last program of a (row, head) to arrive, behind an arrival counter) was measured and not kept:
  0.01-0.02 ms a step faster at batch 1, up to 0.06 ms slower at batch 8 (RESULTS, session 13).
* **Split count** (:func:`num_splits`): a function of the shapes and the SM count only (no
  host sync, no data-dependent shape: CUDA-graph safe). When ``B * H_kv`` programs already
  cover the SMs there is no split; otherwise ~2 waves' worth, at most one per tile, rebalanced
  so no split is empty. 7B (H_kv 4) at L 1280, 132 SMs: B 1 -> 10 splits of one 128-slot tile
  (40 programs), B 8 -> 5 splits (160), B 64 -> 1 (256 programs, one launch).
* **Tiles**: ``BLOCK_N = 128`` slots, 4 warps; ``tl.range(..., num_stages=2)`` double-buffers the
  K/V tiles through shared memory (``cp.async``). 128 is the H200 sweep's winner below two
  waves of programs, 64 from there (:func:`block_n_for`; RESULTS "Decode attention"); the first version's 64 (~70 registers, 38 KB of shared memory, no
  spills at D 128 on sm_90) was chosen from the build alone (``tests/kernels/test_decode_attn_interpreter.py``
  compiles the real launches, :func:`launches`, on a CPU). Under ``TRITON_INTERPRET=1`` the dots
  run in fp32 (the interpreter multiplies raw bf16 bits) and casts round with ``rounding.round_to``.
* A row with no valid slot has ``l == 0`` and gets zeros (SDPA would give NaN); the engine
  never produces one (the slot being written is always valid).

Strides are passed, not made contiguous: the cache prefix ``k[:, :, :L]`` and the
``valid[:B, :L]`` view are read in place. D must be 64 or 128 (:data:`HEAD_DIMS`); callers
fall back to SDPA for anything else (``quarl_kernels.fused_ops.decode_attention``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from quarl_kernels import pdl
from quarl_kernels.launch import interpreting, num_sms
from quarl_kernels.rounding import round_to

HEAD_DIMS = (64, 128)  # D: a power of two the dot tiles take whole (== fused_ops.DECODE_ATTN_HEAD_DIMS)
BLOCK_N = 128  # cache slots per tile (the H200 sweep: fastest wherever the grid is under ~2 waves, RESULTS "decode attention")
BLOCK_N_FULL = 64  # ... and from 2 waves of (row, KV head) programs up (14B, batch 64: 80 vs 92 us at L 1280)
NUM_WARPS = 4  # sm_90 build at D 128: ~70 registers a thread, 38 KB of shared memory, no spills
NUM_STAGES = 2  # K/V tiles double-buffered through shared memory (cp.async; tl.range asks for it)
MIN_BLOCK_G = 16  # tl.dot needs M >= 16: G query rows are padded up to this
WAVES = 2  # split until ~WAVES * SMs programs run
LOG2E = 1.4426950408889634
NEG_INIT = tl.constexpr(-1.0e30)  # running max before any valid slot: finite, so 2^(s - m) of a masked s is 0, never NaN


@triton.jit
def _decode_attn_kernel(
    q_ptr, k_ptr, v_ptr, valid_ptr, o_ptr, ws_acc_ptr, ws_ml_ptr,
    H_KV, G, L, tiles_per_split, qk_scale,  # qk_scale = scale * log2(e)
    sq_b, sq_h, sq_g, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sm_b, sm_n, so_b, so_h, so_g,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr, NUM_STAGES: tl.constexpr,
    INTERPRET: tl.constexpr, PDL: tl.constexpr = 0,
):
    pdl.enter(PDL)  # q and this step's K/V slot come from the kernel before
    bh = tl.program_id(0)  # row * H_kv + kv head
    sp = tl.program_id(1)  # split index
    n_splits = tl.num_programs(1)
    b = (bh // H_KV).to(tl.int64)
    h = (bh % H_KV).to(tl.int64)
    g = tl.arange(0, BLOCK_G)  # [BG] query rows (G real, the rest padding)
    d = tl.arange(0, D)  # [D]
    g_ok = g < G

    q = tl.load(q_ptr + b * sq_b + h * sq_h + g[:, None] * sq_g + d[None, :], mask=g_ok[:, None], other=0.0)  # [BG, D]
    if INTERPRET:  # the CPU interpreter multiplies raw bf16 bits in tl.dot; its fp32 dot is right
        q = q.to(tl.float32)
    k_base = k_ptr + b * sk_b + h * sk_h
    v_base = v_ptr + b * sv_b + h * sv_h
    m_base = valid_ptr + b * sm_b

    m_i = tl.full([BLOCK_G], NEG_INIT, tl.float32)  # running max (log2 domain)
    l_i = tl.zeros([BLOCK_G], tl.float32)  # running sum of 2^(s - m_i)
    acc = tl.zeros([BLOCK_G, D], tl.float32)  # running sum of 2^(s - m_i) * v
    start = sp * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, L)
    for n0 in tl.range(start, end, BLOCK_N, num_stages=NUM_STAGES):
        n = n0 + tl.arange(0, BLOCK_N)  # [BN] slots
        n_ok = n < end
        live = tl.load(m_base + n * sm_n, mask=n_ok, other=0) != 0  # [BN] valid & in range
        k = tl.load(k_base + n[:, None] * sk_n + d[None, :], mask=n_ok[:, None], other=0.0)  # [BN, D]
        if INTERPRET:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [BG, BN] fp32, log2 domain
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # [BG] finite: m_i starts at NEG_INIT
        alpha = tl.math.exp2(m_i - m_new)  # [BG] rescale of the old sums
        p = tl.math.exp2(s - m_new[:, None])  # [BG, BN]; masked slots -> 0
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + n[:, None] * sv_n + d[None, :], mask=n_ok[:, None], other=0.0)  # [BN, D]
        pv = round_to(p, v.dtype, INTERPRET)  # [BG, BN] p in the cache dtype, as FlashAttention
        if INTERPRET:
            pv = pv.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pv, v)  # [BG, D] fp32
        m_i = m_new

    pdl.leave(PDL)  # the stores left: the combine kernel may place its programs
    if SPLIT:  # partials of the G real rows: ws_acc [B*H_kv, splits, BG, D], ws_ml [B*H_kv, splits, 2, BG]
        row = bh.to(tl.int64) * n_splits + sp
        tl.store(ws_acc_ptr + row * (BLOCK_G * D) + g[:, None] * D + d[None, :], acc, mask=g_ok[:, None])
        tl.store(ws_ml_ptr + row * (2 * BLOCK_G) + g, m_i)
        tl.store(ws_ml_ptr + row * (2 * BLOCK_G) + BLOCK_G + g, l_i)
    else:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # l == 0: no valid slot -> acc == 0 -> zeros
        tl.store(o_ptr + b * so_b + h * so_h + g[:, None] * so_g + d[None, :],
                 round_to(out, o_ptr.dtype.element_ty, INTERPRET), mask=g_ok[:, None])


@triton.jit
def _combine_kernel(
    ws_acc_ptr, ws_ml_ptr, o_ptr, H_KV, G, n_splits, so_b, so_h, so_g,
    BLOCK_G: tl.constexpr, D: tl.constexpr, INTERPRET: tl.constexpr, SPLITS_P2: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    """o[b, h] from the ``n_splits`` partials of program row ``bh``, in split order (deterministic): all splits'
    maxima in one load, then the ``acc`` loop pipelined (module docstring, "Splits")."""
    pdl.enter(PDL)
    bh = tl.program_id(0)
    b = (bh // H_KV).to(tl.int64)
    h = (bh % H_KV).to(tl.int64)
    g = tl.arange(0, BLOCK_G)  # [BG]
    d = tl.arange(0, D)  # [D]
    g_ok = g < G
    base = bh.to(tl.int64) * n_splits
    s = tl.arange(0, SPLITS_P2)  # [S2]
    m_all = tl.load(ws_ml_ptr + (base + s[:, None]) * (2 * BLOCK_G) + g[None, :], mask=s[:, None] < n_splits,
                    other=NEG_INIT)  # [S2, BG]
    m_max = tl.max(m_all, axis=0)  # [BG] the global max per query row (exact: order-free)
    l_tot = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    for i in tl.range(0, n_splits, num_stages=3):  # rescaled sums, in split order
        m_s = tl.load(ws_ml_ptr + (base + i) * (2 * BLOCK_G) + g)  # [BG]
        l_s = tl.load(ws_ml_ptr + (base + i) * (2 * BLOCK_G) + BLOCK_G + g)  # [BG]
        a_s = tl.load(ws_acc_ptr + (base + i) * (BLOCK_G * D) + g[:, None] * D + d[None, :], mask=g_ok[:, None],
                      other=0.0)  # [BG, D]
        w = tl.math.exp2(m_s - m_max)  # [BG]
        l_tot += w * l_s
        acc += w[:, None] * a_s
    out = acc / tl.where(l_tot > 0.0, l_tot, 1.0)[:, None]  # [BG, D]; no valid slot -> zeros
    tl.store(o_ptr + b * so_b + h * so_h + g[:, None] * so_g + d[None, :], round_to(out, o_ptr.dtype.element_ty,
                                                                                     INTERPRET), mask=g_ok[:, None])


def block_g(g: int) -> int:
    """Query rows per program: G padded to a power of two >= 16 (``tl.dot``'s minimum M)."""
    return max(MIN_BLOCK_G, triton.next_power_of_2(g))


def block_n_for(bh: int, sms: int) -> int:
    """Slots per tile: 128 while ``B * H_kv`` programs are fewer than ``WAVES`` waves (batch 1 / 8, and
    7B at batch 64: fewer, longer programs stream better), 64 from there (14B at batch 64: 512 programs,
    where the smaller tile's occupancy wins by 12-14%). Measured on an H200, ``--sweep``."""
    return BLOCK_N_FULL if bh >= WAVES * sms else BLOCK_N


def num_splits(bh: int, length: int, sms: int, block_n: int = BLOCK_N, waves: int = WAVES) -> int:
    """Programs along L per (row, KV head). ``bh = B * H_kv`` programs per split already: none
    when they cover the SMs; else ~``waves * sms`` programs in all, at most one split per tile,
    rebalanced so every split gets ``cdiv(tiles, splits)`` tiles and none is empty. Shapes only."""
    tiles = max(1, triton.cdiv(length, block_n))
    if bh >= sms:
        return 1
    want = min(tiles, triton.cdiv(waves * sms, bh))
    per = triton.cdiv(tiles, want)  # tiles per split
    return triton.cdiv(tiles, per)


class Launch(NamedTuple):
    """One kernel launch as :func:`launches` makes it (the tests compile exactly these for sm_90 on a CPU)."""

    kernel: object  # the @triton.jit function
    grid: tuple
    args: tuple  # positional runtime arguments (tensors, ints, floats)
    constexprs: dict
    num_warps: int


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> None:
    B, HK, _, D = q.shape
    L = k.shape[2]
    if D not in HEAD_DIMS:
        raise ValueError(f"decode_attention: head dim {D} is not one of {HEAD_DIMS}; use SDPA for it")
    if k.shape != (B, HK, L, D) or v.shape != k.shape or valid.shape != (B, L) or valid.dtype != torch.bool:
        raise ValueError(f"decode_attention expects q [B, H_kv, G, D], k/v [B, H_kv, L, D], valid [B, L] bool; got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, valid {tuple(valid.shape)} "
                         f"{valid.dtype}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("decode_attention needs unit stride along D for q, k and v")


def launches(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, scale: float,
             splits: int | None = None, block_n: int | None = None, num_warps: int | None = None,
             num_stages: int = NUM_STAGES) -> tuple[torch.Tensor, list[Launch]]:
    """``(o, [attention launch, combine launch if split])`` for :func:`decode_attention` (arguments there);
    ``o`` and the fp32 workspace are allocated here (from the graph pool under CUDA-graph capture)."""
    _check(q, k, v, valid)
    B, HK, G, D = q.shape
    L = k.shape[2]
    o = torch.empty((B, HK, G, D), device=q.device, dtype=q.dtype)  # [B, H_kv, G, D]
    if B == 0 or HK == 0 or G == 0:
        return o, []
    bg = block_g(G)
    warps = num_warps or NUM_WARPS
    sms = num_sms(q.device)
    block_n = block_n or block_n_for(B * HK, sms)
    tiles = max(1, triton.cdiv(L, block_n))
    n_split = num_splits(B * HK, L, sms, block_n) if splits is None else max(1, min(int(splits), tiles))
    per = triton.cdiv(tiles, n_split)  # tiles per split
    n_split = triton.cdiv(tiles, per)  # no empty split
    vb = valid.view(torch.uint8)  # [B, L] same strides; Triton reads bytes
    interp = interpreting()
    chained = pdl.mode(q.device)
    if n_split == 1:
        ws_acc = ws_ml = o  # unused
    else:
        ws_acc = torch.empty((B * HK, n_split, bg, D), device=q.device, dtype=torch.float32)
        ws_ml = torch.empty((B * HK, n_split, 2, bg), device=q.device, dtype=torch.float32)
    attn = Launch(
        _decode_attn_kernel, (B * HK, n_split),
        (q, k, v, vb, o, ws_acc, ws_ml, HK, G, L, per, float(scale) * LOG2E,
         q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
         v.stride(0), v.stride(1), v.stride(2), vb.stride(0), vb.stride(1), o.stride(0), o.stride(1), o.stride(2)),
        {"BLOCK_G": bg, "BLOCK_N": block_n, "D": D, "SPLIT": n_split > 1, "NUM_STAGES": num_stages,
         "INTERPRET": interp, "PDL": chained},
        warps,
    )
    if n_split == 1:
        return o, [attn]
    comb = Launch(_combine_kernel, (B * HK,), (ws_acc, ws_ml, o, HK, G, n_split, o.stride(0), o.stride(1), o.stride(2)),
                  {"BLOCK_G": bg, "D": D, "INTERPRET": interp, "SPLITS_P2": triton.next_power_of_2(n_split),
                   "PDL": chained}, 4)
    return o, [attn, comb]


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, scale: float,
                     splits: int | None = None, block_n: int | None = None, num_warps: int | None = None,
                     num_stages: int = NUM_STAGES) -> torch.Tensor:
    """``q [B, H_kv, G, D]``, ``k, v [B, H_kv, L, D]`` (any strides, unit D stride), ``valid [B, L]`` bool
    (any strides) -> ``o [B, H_kv, G, D]`` contiguous, q's dtype. ``splits`` overrides :func:`num_splits`;
    ``block_n`` (slots per tile; default :func:`block_n_for`), ``num_warps`` and ``num_stages`` override the defaults (tests, the
    benchmark's sweep). Callers check applicability (``fused_ops``); this raises ``ValueError`` on
    shapes it cannot run."""
    o, todo = launches(q, k, v, valid, scale, splits, block_n, num_warps, num_stages)
    for la in todo:
        la.kernel[la.grid](*la.args, **la.constexprs, num_warps=la.num_warps, launch_pdl=la.constexprs["PDL"] != pdl.OFF)
    return o


__all__ = ["BLOCK_N", "BLOCK_N_FULL", "HEAD_DIMS", "NUM_STAGES", "NUM_WARPS", "Launch", "block_g", "block_n_for",
           "decode_attention", "launches", "num_splits"]
