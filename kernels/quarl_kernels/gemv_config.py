"""Which one-row / few-row GEMV config a call runs (``gemv.py``'s kernel): the candidates, the measured rules and the
switches that override them, and the K split a launch gets.

Why a module of its own: the kernel (``gemv.py``) is the same on every GPU, its best config is not -- the H200 sweep
(docs/kernels.md v6-v7) chose config 0 at one row, the H100's (session 12) config 7 on long rows, and on the H200 again
(session 36) the isolated ranking and the engine's step disagreed. The rules and the switches that name a config per
run (``QUARL_KERNELS_GEMV_DEFAULTS``, ``QUARL_KERNELS_GEMV_M1``) or change what a program does first
(``QUARL_KERNELS_GEMV_W_EARLY``) live here, where a reader looks for "what runs", with the K split a launch gets
(:func:`_gemv_split`; since session 40 split to whole waves past one, :func:`whole_waves_split`,
``QUARL_KERNELS_GEMV_WHOLE_WAVES`` / ``QUARL_KERNELS_GEMV_SPLIT``); ``gemv.py`` re-exports every name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton

from quarl_kernels.env import env_flag
from quarl_kernels.formats import FMT_INT4


@dataclass(frozen=True)
class GemvConfig:
    bn: int  # output rows per program
    bkw: int  # K step in 32-bit words (8 weights each)
    vec: int  # consecutive words of a row per thread (4 = 16-byte loads)
    warps: int
    prefetch: bool = True  # register double buffer (only without stages)
    waves: int = 4  # split K until cdiv(N, bn) * split >= waves * SMs
    stages: int = 1  # > 1: cp.async pipeline of that depth (tl.range num_stages)
    # DIAGNOSTIC (session 19; benchmarks/kernels/bench_decode_bound.py, never set elsewhere): 1 the decode replaced by
    # a bitcast, 2 also no FFMAs and no x (wrong results by design)
    diag: int = 0

    def __str__(self) -> str:
        pre = f"s{self.stages}" if self.stages > 1 else "p" if self.prefetch else ""
        dg = f"D{self.diag}" if self.diag else ""
        return f"gemv-BN{self.bn}xBK{self.bkw * 8}v{self.vec}w{self.warps}{pre}W{self.waves}{dg}"


# Candidates: the configs that won at least one (format, shape, M) point of the H200
# sweep (docs/kernels.md v6, benchmarks/kernels/runs/v6_gemv_h200.json). Tile [BN, BKW]
# words per K step over 32 * warps threads, VEC consecutive words of a row per thread.
GEMV_CONFIGS = (
    GemvConfig(64, 32, 4, 4, prefetch=False),  # 0: FP4 at M = 1 (96 registers, 5 programs / SM)
    GemvConfig(16, 128, 4, 4, stages=3),  # 1: INT4 at M = 1; a warp reads 512 contiguous bytes of a row
    GemvConfig(64, 32, 4, 4, stages=3),  # 2: M = 2..4, cp.async pipeline 3 deep
    GemvConfig(32, 64, 4, 4, stages=3),  # 3
    GemvConfig(128, 32, 4, 4, stages=3, waves=2),  # 4: 32 words / thread
    GemvConfig(64, 32, 4, 4),  # 5: register prefetch
    GemvConfig(32, 32, 2, 4),  # 6: M > 4: 8 words / thread, 8-byte loads (x: 8 * 2 * M registers)
    # 7: 32 rows, 512-code K steps: at M = 1 on large weights with long rows (K >= 4096: 7B down, every 14B weight)
    # (the H100 sweep of session 12; in the engine's step 14B 6.234 -> 6.055 ms, 7B's down 0.610 -> 0.579 ms, while
    # on K = 3584 rows, 7B's gate/up group, it was slower: RESULTS "Issue 17, session 12")
    GemvConfig(32, 64, 4, 4, prefetch=False),
)
DEFAULTS_ENV = "QUARL_KERNELS_GEMV_DEFAULTS"  # "h200": config 0 at M = 1 everywhere (the H200 sweep's, v7)
LONG_K, LARGE_WEIGHTS = 4096, 20 << 20  # FP4 weights with K >= this and N * K >= that take config 7 at M = 1


def h200_defaults() -> bool:
    """``QUARL_KERNELS_GEMV_DEFAULTS=h200``: config 0 for every FP4 weight at M = 1 (the H200 sweep's choice, v7;
    the before of session 12's config 7 on long rows)."""
    v = os.environ.get(DEFAULTS_ENV, "auto").strip().lower()
    if v not in ("auto", "", "h200"):
        raise ValueError(f"{DEFAULTS_ENV}={v!r}: use auto (the default) or h200 (config 0 at one row everywhere)")
    return v == "h200"


W_EARLY_ENV = "QUARL_KERNELS_GEMV_W_EARLY"  # 1: each program's first weight tile loaded before its PDL wait
L2_FIRST = 2  # QUARL_KERNELS_GEMV_W_EARLY=l2: that tile's lines prefetched to L2 instead (the W_EARLY constexpr's value)


def w_early() -> bool | int:
    """``QUARL_KERNELS_GEMV_W_EARLY=1`` (opt-in; measured slower in session 37: the 7B NVFP4+LoRA step at batch 1 on
    an H200 3.04 / 3.06 ms against 2.87 / 2.86 without -- the first tile held in registers across the wait takes the
    one-row configs from 96 registers to 124-128, 4 programs an SM instead of 5): a GEMV program issues its first weight tile's
    loads before the PDL wait (``_gemv_tiles``), so that those bytes stream while the kernel before finishes. Why it
    may pay where session 16's L2 prefetch of a program's whole slice did not: a read launched with its loads ahead
    of the wait reached 85 % of the copy rate against 78 % plainly (``bench_gemv.py --read-ceiling``), and one tile a
    program is the loads the program issues first anyway -- nothing queues ahead of them. Only with PDL on.
    ``l2`` (-> :data:`L2_FIRST`; session 37; measured in session 38: no gain, 2.90 / 2.91 ms against 2.84-2.88 at 7B
    batch 1 on an H200): the same tile's lines *prefetched to L2* before the
    wait instead (``prefetch.global.L2``): nothing held in registers, the programs an SM as without the switch
    (row-major words: the one-row layout; blocked launches keep the plain order)."""
    raw = os.environ.get(W_EARLY_ENV)
    if raw is not None and raw.strip().lower() == "l2":
        return L2_FIRST
    return env_flag(W_EARLY_ENV, False)


M1_ENV = "QUARL_KERNELS_GEMV_M1"  # "NxK:i,...": GEMV_CONFIGS[i] at one row for an N x K weight (or a group's first)


def m1_overrides() -> dict[tuple[int, int], int]:
    """``QUARL_KERNELS_GEMV_M1``, parsed: {(N, K): index into ``GEMV_CONFIGS``} for FP4 weights at one row, before
    the rules of :func:`default_gemv_config` (a group launch goes by its first weight's shape). The best config of a
    shape differs by GPU (the H200 sweep of session 36 against the H100's of session 12), so this lets a run name it
    per shape without a code change."""
    return _parse_m1(os.environ.get(M1_ENV, ""))


_PARSED: dict[str, dict[tuple[int, int], int]] = {}


def _parse_m1(v: str) -> dict[tuple[int, int], int]:
    return _parse_shapes(M1_ENV, v, "18944x3584:7", lambda i: 0 <= i < len(GEMV_CONFIGS),
                         f"the config an index of GEMV_CONFIGS (0..{len(GEMV_CONFIGS) - 1})")


def _parse_shapes(env: str, v: str, example: str, ok, what: str) -> dict[tuple[int, int], int]:
    """``"NxK:i,..."`` -> {(N, K): i} (cached per value); a malformed entry is an error naming the form and ``what``
    ``i`` must be."""
    hit = _PARSED.get(env + "=" + v)
    if hit is not None:
        return hit
    out = {}
    for item in filter(None, (t.strip() for t in v.split(","))):
        try:
            shape, idx = item.split(":")
            n, k = (int(t) for t in shape.lower().split("x"))
            i = int(idx)
        except ValueError:
            raise ValueError(f"{env}: {item!r} is not NxK:i (e.g. {example}); separate entries with commas") \
                from None
        if not ok(i) or n <= 0 or k <= 0:
            raise ValueError(f"{env}: {item!r}: N and K must be positive and {what}")
        out[(n, k)] = i
    _PARSED[env + "=" + v] = out
    return out


SPLIT_ENV = "QUARL_KERNELS_GEMV_SPLIT"  # "NxK:s,...": a one-row launch of N rows in all (a group's summed) split s ways


def split_overrides() -> dict[tuple[int, int], int]:
    """``QUARL_KERNELS_GEMV_SPLIT``, parsed: {(N, K): K splits} for one-row FP4 launches, N the launch's rows in all
    (a q/k/v or gate/up group's weights summed; K of 5120: 14B's q/k/v group 7168, gate/up 27648), instead of
    :func:`_gemv_split`'s rule (about ``waves`` x SMs programs). The experiment's knob (session 40): that rule puts
    the 14B gate/up group launch at 1.7 waves of the programs an H200 holds (896 programs, 108 registers: 4 an SM),
    the 7B one at 0.92; whether a split to whole waves pays is measured with this, not assumed."""
    return _parse_shapes(SPLIT_ENV, os.environ.get(SPLIT_ENV, ""), "27648x5120:3", lambda s: 1 <= s <= 64,
                         "the split count 1..64")


# Largest M that wo_matmul sends to the GEMV. Measured (H200, v6): the GEMV wins every
# Qwen2.5-7B layer at M = 1..3; at M = 4 the tensor-core decode tile is as fast or
# faster (one FFMA per weight and token caps the CUDA cores), at M >= 8 it is 2-5x faster.
GEMV_MAX_M = 3
GEMV_GROUP_MAX_M = 1  # one launch for a group's weights where the GEMV is the default route (wo_gemm: M = 1)
GEMV_LIMIT_M = 16  # hard limit: the token loop is unrolled, x registers grow as 8 * VEC * M


def effective_tile(cfg: GemvConfig, group: int) -> tuple[int, int, int]:
    """(BN, BKW, VEC) that ``cfg`` runs with for a scale group of ``group`` weights.

    A thread's words must cover whole groups (VEC % WPG == 0) or a tile must lie in
    one group (BKW <= WPG), so that group values broadcast to words in registers:
    small groups raise VEC to WPG (<= 4), large ones (INT4 g128: 16 words) cut the
    K step to one group."""
    wpg = group // 8
    bn, bkw, vec = cfg.bn, cfg.bkw, cfg.vec
    if cfg.stages > 1 or bkw <= wpg or vec % wpg == 0:  # cp.async: tiles reach registers via smem
        return bn, bkw, vec
    if wpg <= 4:
        return bn, bkw, wpg
    return bn, wpg, vec  # the [BN] group vector loads in the row layout only while BN < threads


def default_gemv_config(fmt: int, m: int, n: int, k: int) -> GemvConfig:
    """The measured choice per format and M (H200 sweep, docs/kernels.md v7): at M = 1
    within 0-13% of the best candidate at every measured point, at M = 2..4 within
    0-15% on the large layers (up to 31% on the 3584x3584 and 512x3584 ones). Since session 12, config 7 at M = 1
    on large FP4 weights with long rows (K >= 4096; measured in the engine on an H100), unless
    ``QUARL_KERNELS_GEMV_DEFAULTS=h200``; a shape named in ``QUARL_KERNELS_GEMV_M1`` takes its named config."""
    if m == 1:
        if fmt == FMT_INT4:
            return GEMV_CONFIGS[1]
        named = m1_overrides().get((n, k))
        if named is not None:
            return GEMV_CONFIGS[named]
        return GEMV_CONFIGS[7 if k >= LONG_K and n * k >= LARGE_WEIGHTS and not h200_defaults() else 0]
    return GEMV_CONFIGS[2] if m <= 4 else GEMV_CONFIGS[6]


def gemv_supported(x2: torch.Tensor, pw) -> bool:
    """True when ``wo_gemm.wo_matmul`` should run the GEMV for this call: 1 <= M <=
    ``GEMV_MAX_M``, bf16 activations, and a group of 8 * 2**i weights."""
    wpg = pw.group // 8
    return (1 <= x2.shape[0] <= GEMV_MAX_M and x2.dtype == torch.bfloat16 and pw.group % 8 == 0
            and wpg & (wpg - 1) == 0)


WHOLE_WAVES_ENV = "QUARL_KERNELS_GEMV_WHOLE_WAVES"  # 0: no K split for launches past a wave (before session 40)
SLOTS_PER_SM = 4  # one-row GEMV programs an SM holds at the group launches' 96-108 registers (128 threads: 5 / 4)
MAX_WAVE_SPLIT = 8


def _split_count(k_steps: int, split: int) -> tuple[int, int]:
    """(splits, K steps per split) when ``k_steps`` are cut ``split`` ways (the last split may be shorter, and the
    count lower than asked where the steps do not divide evenly)."""
    per = triton.cdiv(k_steps, max(1, min(64, split, k_steps)))
    return triton.cdiv(k_steps, per), per


def whole_waves_split(tiles: int, extra: int, k_steps: int, sms: int) -> int:
    """K splits for a launch of ``tiles`` weight tiles (+ ``extra`` programs of split 0 only: the LoRA-A ones) that
    already passes a wave of ``SLOTS_PER_SM * sms`` programs unsplit: the fewest ways in 1..``MAX_WAVE_SPLIT`` whose
    programs leave at most 5 % of their waves' program slots idle (else the least idle); 1 up to 1.25 waves.

    Why (session 40, H200, RESULTS): unsplit, the 14B gate/up group launch is 864 tiles + 32 A programs -- 1.7 waves
    of the 528 an H200 holds at its 108 registers, the last 0.7 with SMs idle; split 3 ways (2624 programs, 4.97
    waves) the 14B NVFP4+LoRA decode step at batch 1 was 4.90 ms against 5.15 (2 ways: 4.95), the rollout 2.52x BF16
    against 2.38-2.39x. Launches under a wave are the rule's (``waves``) as before: splitting 14B's q/k/v group to
    fewer programs was slower, and the 7B gate/up group (0.92 of a wave) took the same time split 2 ways."""
    slots = SLOTS_PER_SM * sms
    if tiles + extra <= 1.25 * slots:
        return 1

    def idle(s: int) -> float:  # the share of the launch's waves' program slots left idle, split s ways
        programs = tiles * _split_count(k_steps, s)[0] + extra
        return 1 - programs / (triton.cdiv(programs, slots) * slots)

    ways = range(1, min(MAX_WAVE_SPLIT, k_steps) + 1)
    return next((s for s in ways if idle(s) <= 0.05), min(ways, key=lambda s: (round(idle(s), 3), s)))


def _gemv_split(cfg: GemvConfig, n: int, kw: int, sms: int, split: int | None = None,
                extra: int = 0, whole_waves: bool = False) -> tuple[int, int]:
    """(split count, words per split): about ``waves * sms`` programs, >= 1 K step each -- and, with ``whole_waves``
    (one-row FP4 launches: where it was measured), where that leaves a launch unsplit past a wave,
    :func:`whole_waves_split` (``QUARL_KERNELS_GEMV_WHOLE_WAVES=0``: not); ``extra``: the launch's split-0-only
    programs. ``split``: that many ways instead (at most one a K step; the count returned can be lower where the steps
    do not divide evenly)."""
    tiles = triton.cdiv(n, cfg.bn)
    k_steps = triton.cdiv(kw, cfg.bkw)
    if split is None:
        split = triton.cdiv(cfg.waves * sms, tiles)
        if split == 1 and whole_waves and env_flag(WHOLE_WAVES_ENV, True):
            split = whole_waves_split(tiles, extra, k_steps, sms)
    count, per = _split_count(k_steps, split)
    return count, per * cfg.bkw


__all__ = [
    "DEFAULTS_ENV",
    "GEMV_CONFIGS",
    "GEMV_GROUP_MAX_M",
    "GEMV_LIMIT_M",
    "GEMV_MAX_M",
    "L2_FIRST",
    "LARGE_WEIGHTS",
    "LONG_K",
    "M1_ENV",
    "MAX_WAVE_SPLIT",
    "SLOTS_PER_SM",
    "SPLIT_ENV",
    "WHOLE_WAVES_ENV",
    "W_EARLY_ENV",
    "GemvConfig",
    "default_gemv_config",
    "effective_tile",
    "gemv_supported",
    "h200_defaults",
    "m1_overrides",
    "split_overrides",
    "w_early",
    "whole_waves_split",
]
