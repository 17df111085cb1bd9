"""Which config the Gluon ``mma.sync`` decode kernel (``mma_decode.py``) runs at 2..64 rows: the candidates per token
tile, the measured defaults, the rows it is preferred for, the K split a launch gets, and the switch that moves its
first loads ahead of the PDL wait (``QUARL_KERNELS_MMA_W_EARLY``). Pure Python: ``mma_decode.py`` re-exports every
name, so callers go on naming them ``mma_decode.*``.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

from quarl_kernels import pdl
from quarl_kernels.env import env_flag

MIN_M = 1
MAX_M = 64  # token tiles of 8, 16, 32, 64 (1, 2, 4, 8 n8 MMA tiles)


@dataclass(frozen=True)
class MmaDecodeConfig:
    rows: int  # output rows per CTA (R): rows / warps / 16 m16 tiles per warp
    bkw: int  # K step in 32-bit words (8 codes each); thread t reads bkw / 4 contiguous words per row
    warps: int = 4
    prefetch: bool = True  # register double buffer of the next step's words and scales
    waves: int = 4  # split K until cdiv(N, rows) * split >= waves * SMs
    xsmem: bool = False  # stage x through shared memory (once per CTA; barriers per step); bkw 8 only
    # DIAGNOSTIC (session 19; bench_decode_bound.py only): 1 the decode replaced by one conversion a word (wrong
    # results)
    diag: int = 0

    def __post_init__(self) -> None:
        if self.xsmem and self.bkw != 8:
            raise ValueError(f"MmaDecodeConfig: xsmem needs bkw = 8 (its B register pairing), got bkw = {self.bkw}")

    def __str__(self) -> str:
        return (f"mma-R{self.rows}xBK{self.bkw * 8}w{self.warps}{'p' if self.prefetch else ''}W{self.waves}"
                f"{'xs' if self.xsmem else ''}{f'D{self.diag}' if self.diag else ''}")


# Candidates. Per thread and K step: (rows / warps / 8) rows x bkw / 4 words. 0-5 are the
# M <= 16 set (token tile NT = 8 / 16; wo_gemm's measured defaults are 1 and 4), 6-13 (and
# 0 at NT = 32) the M = 17..64 set, where the B fragments (x^T, NT * bkw / 8 registers)
# and the accumulators (rows / warps * NT / 32) crowd the register file: a K step of 8
# words (64 B registers at NT = 64), 32 rows per warp, and 11-13 stage x through shared
# memory (the docstring's "Large M").
MMA_DECODE_CONFIGS = (
    MmaDecodeConfig(128, 16, 4),  # 0: 2 m16 tiles per warp, 16-byte word loads
    MmaDecodeConfig(64, 32, 4),  # 1: 1 m16 tile per warp, 2 x 16-byte loads per row
    MmaDecodeConfig(256, 8, 4),  # 2: 4 m16 tiles per warp (x shared by 64 rows), 8-byte loads
    MmaDecodeConfig(256, 16, 8),  # 3: 8 warps, 2 m16 tiles each
    MmaDecodeConfig(128, 16, 4, prefetch=False),  # 4: occupancy alone hides latency
    MmaDecodeConfig(128, 16, 4, waves=2),  # 5: fewer, longer splits
    MmaDecodeConfig(128, 8, 4),  # 6: M 17..64: 2 m16 tiles per warp, 8-byte loads (NT = 32: 32 B registers)
    MmaDecodeConfig(128, 8, 4, prefetch=False),  # 7: M 17..64: no double buffer (NT = 64: 220-244 registers)
    MmaDecodeConfig(256, 8, 8),  # 8: M 17..64: 8 warps of 6's shape (fewer, larger CTAs)
    MmaDecodeConfig(256, 8, 8, prefetch=False),  # 9: M 33..64: 8 warps of 7's shape
    MmaDecodeConfig(128, 4, 4),  # 10: M 33..64: one k32 block per step (4-byte loads), 168-188 registers
    MmaDecodeConfig(128, 8, 4, prefetch=False, xsmem=True),  # 11: M 17..64: x through shared memory
    MmaDecodeConfig(256, 8, 8, prefetch=False, xsmem=True),  # 12: M 33..64: 8 warps share each x step
    MmaDecodeConfig(256, 8, 8, xsmem=True),  # 13: M 17..32: 12 with the register double buffer
)
# Which configs make sense per token tile: the candidates a tuner / the bench tries at M.
# The M <= 16 configs spill at NT = 64 (128 B registers + 64 accumulators + 64 A).
_CANDIDATES = {8: (0, 1, 2, 3, 4, 5), 16: (0, 1, 2, 3, 4, 5), 32: (0, 6, 7, 8, 11, 13), 64: (6, 7, 8, 9, 10, 11, 12)}
# Defaults per token tile where they do not depend on N (M <= 16: see default_config).
_DEFAULTS = {32: 11, 64: 11}  # H200 bench (docs/kernels.md v10): best geo-mean on the large layers
# Above 16 tokens the kernel beats the Triton tensor-core path only on large weights
# (H200, M = 32/64: 1.10x / 1.37x geo-mean on the 7B MLP layers, 0.79x / 0.85x on the
# 3584x3584 and 512x3584 ones), so ``wo_matmul`` uses it there only.
LARGE_M_MIN_WEIGHTS = 20 << 20


W_EARLY_ENV = "QUARL_KERNELS_MMA_W_EARLY"  # 0: each program's first step of words after its PDL wait, not before


def w_early(device) -> bool:
    """With PDL on, a program loads its first K step's words and scales before its PDL wait, x after (the one-row
    GEMV's ``QUARL_KERNELS_GEMV_W_EARLY`` at 2..16 rows; configs that stage x through shared memory keep the wait
    first). On by default since session 37 (H200, 7B NVFP4+LoRA rollout at batch 8: 3.50 / 3.48 ms a step against
    3.60 / 3.60 without, alternating in one warm call); ``QUARL_KERNELS_MMA_W_EARLY=0`` turns it off."""
    return env_flag(W_EARLY_ENV, True) and pdl.on(device)


def preferred(m: int, n: int, k: int) -> bool:
    """Whether ``wo_matmul`` should take this kernel for an [M, K] x [N, K]^T call by default."""
    return MIN_M <= m <= MAX_M and (m <= 16 or n * k >= LARGE_M_MIN_WEIGHTS)


def token_tile(m: int) -> int:
    """Token tile NT (MMA n extent) for M tokens: 8, 16, 32 or 64."""
    if not MIN_M <= m <= MAX_M:
        raise ValueError(f"mma_decode: M = {m} tokens is outside {MIN_M}..{MAX_M} (use wo_gemm.launch_fwd)")
    return 8 if m <= 8 else 16 if m <= 16 else 32 if m <= 32 else 64


def candidate_configs(m: int) -> tuple[MmaDecodeConfig, ...]:
    """The ``MMA_DECODE_CONFIGS`` entries worth trying at M tokens (all of them run at any
    M; the others spill registers or waste the register file at this token tile)."""
    return tuple(MMA_DECODE_CONFIGS[i] for i in _CANDIDATES[token_tile(m)])


def default_config(m: int, n: int) -> MmaDecodeConfig:
    """Config for M tokens and N output rows without tuning. M <= 16: the H200 winners of
    ``bench_mma_decode.py`` (docs/kernels.md v9): 1 for N <= 1024, 4 above (the H100 sweep of session 12 found 0
    faster alone at M = 8 where N <= K, but the engine's batch-8 step slower with it: 4.635 vs 4.546 ms). M = 17..64:
    11 (x staged through shared memory) at NT = 32 and 64, the measured geo-mean winner on
    the large layers (docs/kernels.md v10); ``preferred`` keeps small layers off this kernel
    above 16 tokens."""
    nt = token_tile(m)
    if nt <= 16:
        return MMA_DECODE_CONFIGS[1 if n <= 1024 else 4]
    return MMA_DECODE_CONFIGS[_DEFAULTS[nt]]


def split_for(cfg, n: int, kw: int, sms: int) -> tuple[int, int]:
    """(split count, K steps per split) of a decode launch of ``cfg`` (any config with ``rows``, ``bkw`` and
    ``waves``: this kernel's and ``wgmma_decode``'s): about ``waves * sms`` CTAs, >= 1 step each."""
    tiles = triton.cdiv(n, cfg.rows)
    steps = triton.cdiv(kw, cfg.bkw)
    split = max(1, min(64, triton.cdiv(cfg.waves * sms, tiles), steps))
    per = triton.cdiv(steps, split)
    return triton.cdiv(steps, per), per


__all__ = [
    "LARGE_M_MIN_WEIGHTS", "MAX_M", "MIN_M", "MMA_DECODE_CONFIGS", "W_EARLY_ENV", "MmaDecodeConfig",
    "candidate_configs", "default_config", "preferred", "split_for", "token_tile", "w_early",
]
