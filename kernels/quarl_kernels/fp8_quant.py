"""Fused FP8 quantizers of the Jet-RL training linear: one pass per operand, codes and scales
written directly in the layouts the blockwise FP8 GEMMs (``torch.nn.functional.scaled_mm``) take.

The FP8 linear (``quarl.quant.fp8_linear``) needs, per layer and step::

    X  [M, K]  -> Xq  [Mp, Kp]   1x128 along K      (forward A operand)
               -> XTq [Kp, Mt]   1x128 along tokens  (WGrad B operand: X^T, i.e. 128x1 of X)
    dY [M, N]  -> dYq [Mp, Np]   1x128 along N      (DGrad A operand)
               -> dYTq[Np, Mt]   1x128 along tokens  (WGrad A operand)
    W  [N, K]  -> Wq  [Np, Kp]   128x128 tiles      (forward B operand)
               -> WTq [Kp, Np]   the same tiles, transposed (DGrad B operand)

with Mp = M rounded up to 4 (cuBLAS), Mt = M rounded up to 128 (a token group), Np / Kp
rounded up to 128 (a short last block is zero-padded: zeros change no amax, so it gets the
scale of its own values). The PyTorch path does each of these as ~6 kernels (pad, abs,
amax, divide, clamp, cast, plus a transpose copy): ~80 % of the FP8 layer's time on an
H100 (benchmarks/RESULTS.md, "Jet-RL"). Here each operand is one kernel that reads the
high-precision tensor from HBM once: :func:`quantize_act` loads a ``[BLOCK_M, 128]`` tile, reduces
it along K for the row groups and (``t_rows``) along the tokens for the column groups, and
stores both code tiles (the second transposed, in a second pass over the tile: L2 hits) and both
scale vectors; :func:`quantize_tiles` does a 128x128 weight tile (amax pass, codes pass) and
optionally its transpose (a third pass). Padding is done by the masks (no padded copy of the
input); any input strides are accepted. Where X^T is wanted on a wide operand, the run-time choice
usually takes a *split* setting instead: the row groups alone, then :func:`_act_t_kernel` for X^T
(two reads of the input, but each kernel streams: 1.25-1.75x the dual kernel on an H200).

A transposed code tile is always stored from codes computed in its own loop, never as the
``tl.trans`` of codes the same loop also stores row-major: for that pattern ptxas (CUDA 12.8, the
one Triton 3.6 bundles for sm_90) emits SASS that reads a quarter of the transposed bytes from
registers *before* the loop iteration writes them (stale codes of the previous chunk). It hit the
fp32-input weight kernel on the H100 (W^T rows k = 1 mod 4 wrong; docs/kernels.md, "The W^T
bug"); ``tests/kernels/test_fp8_quant_interpreter.py`` checks every variant's SASS for it on CPU.

Scale layouts. A scale of a 1x128 operand is stored *outer-major* (storage
``[groups, rows]``, returned as the ``[rows, groups]`` view with strides ``(1, rows)``):
M-major for ``scaled_mm``'s A operand, which is what ``quarl.quant.fp8_gemm.blockwise_gemm`` passes
(no copy there). Tile scales are ``[Np/128, Kp/128]`` row-major, as the weight format's.

Numerics: bit for bit the reference ``quarl.quant.formats.fp8.quantize_act_1x128`` /
``quarl.quant.fp8_operands.quantize_weight_padded`` run eagerly on the same device (tested on
CPU through ``TRITON_INTERPRET=1`` and on CUDA): ``scale = amax / 448`` (float32 eps for an
all-zero group), ``q = clamp(x / scale, +-448)`` cast round-to-nearest-even to E4M3. Two
details make that exact rather than "close":

* ``amax / 448.0`` with a Python-float divisor is a true division on CPU but ``amax *
  fp32(1/448)`` on CUDA (ATen's ``div_true_kernel_cuda`` multiplies by the reciprocal of a
  CPU scalar); ``SCALE_RECIP`` follows the device, as ``quarl_kernels.norm`` does;
* ``x / scale`` is the correctly rounded quotient PyTorch's eager CUDA and CPU kernels
  compute. Triton's and ``torch.compile``'s plain ``/`` is the approximate
  ``div.full.f32``, which is why the compiled quantizers differ from eager on near-ties
  (2 of 14.7M activation bytes on the H100); these kernels do not. On the GPU it is built
  without a division per element (``group_div``: the group's reciprocal once, ``div.rn``'s
  own fast path per element; session 30: 472 instead of 816 SASS instructions in the row
  pass, the 7B operands 1.07-1.20x faster); the interpreter divides (``div_rn``).

The FP8 cast is RNE with saturation on the GPU (``cvt.rn.satfinite.e4m3x2.f32``); under the
interpreter :func:`quarl_kernels.rounding.round_to_fp8` rounds in software first.

On CUDA, where X^T is wanted, the run-time choice also times ``quarl_kernels.fp8_quant_regs`` (Gluon, session 31: the
same bits, X^T transposed by register order instead of through shared memory; :func:`regs_settings`).
"""

from __future__ import annotations

import functools
import os
import random
from typing import NamedTuple

import torch
import triton

from quarl_kernels import pdl
from quarl_kernels.fp8_quant_kernels import (  # noqa: F401  re-exported: callers name them fp8_quant.*
    _act_kernel,
    _act_t_kernel,
    _codes,
    _scale,
    _t_colmax,
    _t_load,
    _t_store,
    _tile_kernel,
)
from quarl_kernels.launch import interpreting as _interpreting

GROUP = 128  # 1x128 activation groups, 128x128 weight tiles (DeepSeek-V3 / Jet-RL)
# Rows per chunk and warps per program. A program walks its tile in [SUB, 128] chunks: a whole
# 128x128 tile in registers needs 255 registers per thread and spills (ptxas for sm_90), while a
# [32, 128] chunk at 8 warps needs 39 (rows only), 63 (weight tile + transpose) and 112 (both
# activation groupings) with unit-stride inputs, no spills: several programs per SM to keep
# enough loads in flight for HBM bandwidth. (SUB, WARPS) is the default; the H100 run of
# 2026-11-25 found other settings up to 1.4x faster per operand (X: 32 rows x 4 warps, dY: 64 x 8),
# so on CUDA the setting is chosen by shape at run time (below).
SUB = 32
WARPS = 8

# Launch-setting choice. Every setting computes the same bits (each element's arithmetic is the same and
# a max-reduction is exact in any order), so a setting is picked by time alone: the first launch of a
# shape class on a GPU times each candidate (compile, warm-up, TUNE_REPS launches between CUDA events),
# keeps the fastest for the process and records the timings in TUNED -- what triton.autotune does, with a
# key of our own (operand kind, groupings, dtype, tokens rounded up to a power of two, columns) so a new
# micro-batch length rarely re-tunes. No timing while a CUDA graph is being captured (a choice made before
# serves, else the default, not remembered), none below TUNE_MIN_ROWS rows (decode: launch-bound), and
# QUARL_FP8_TUNE=0 always takes the default. Each candidate is compiled and its SASS checked on CPU
# (tests/kernels/test_fp8_quant_interpreter.py); the GPU test checks all of them give the same bits.
# Activation candidates: the two best of the four timed on the H100 (X: (32, 4), dY: (64, 8)) and two with 16
# warps per program (ptxas for sm_90: 99-101 registers for both groupings, no spills; one program per SM with
# a whole [64 or 128, 128] chunk of loads in flight, against (32, 8)'s two programs of [32, 128]).
# The entries with a third field True store X^T's codes as 32-bit words of four tokens (``PACK_T``), candidates
# only where X^T is wanted. Under ncu (H200, 2026-11-26) the dual kernel ran 4x longer than the row groups alone,
# bound by L1 / shared-memory traffic, so the byte-wise transpose was suspected; packed words did not fix it
# (0.89-0.95x the byte version's best on 11 of the 12 operands wider than 1024 columns) and won three shape classes:
# the two 512-wide ones by 1-5%, 16384 x 12288 by 12% (RESULTS.md "Jet-RL"); the two settings that won are kept.
# Entries with five fields are *split* settings, candidates only where X^T is wanted: the row groups by the
# dual kernel's row pass alone at (rows per chunk, warps), then X^T by _act_t_kernel at (BLOCK_C, its warps),
# a single-pass kernel of its own -- two reads of x from HBM instead of one, against a dual kernel that ran
# at a quarter of the row pass's speed (L1-bound). On an H200 (2026-11-26) they won every operand 3584 columns
# or wider at 8k / 16k tokens, 1.25-1.75x the best dual setting, and lost on the 512- / 1024-wide k/v ones
# (RESULTS.md "Split quantizer settings"; docs/kernels.md). The winners had X^T tiles of 32-64 columns at 4-8 warps;
# the last two (16 and 32 columns at 2 warps: more, smaller programs) were added after that run, not yet timed.
# Entries with six fields (session 26) are one kernel again, its X^T pass walking the tile by [128 tokens, t_chunk
# columns] chunks -- each transposed row stored as 128 contiguous bytes, as the split kernel's, but the chunk
# re-read from L2 instead of HBM: on an H200 (session 26) they won only the 512- / 1024-wide operands, by 1-3 %; the
# two that did are kept (of four; a [128, 128] chunk at 16 warps was dropped before: the sm_90 SASS check flagged a
# code store from a register not yet written, the W^T bug's pattern). Five-field entries with a third field 2 (session
# 26): a split whose X^T kernel loads its tile through the transposed view and transposes nothing itself (_t_store):
# they won 4 of 12 operands on an H200, by 0.3-7 %; the three that won are kept (of four). Splits whose X^T kernel
# packed four tokens' codes into int32 words before the transpose won one operand of 24, by 1 %: removed, with
# the code (RESULTS.md "Session 26").
# Session 30 (H100): with the division per element gone (group_div), the one-read settings (T_CHUNK, and (128, 16))
# won every 7B operand the splits had won -- those passes had been issue-bound as much as L1-bound. Four more
# one-read entries were added then ((16 | 32 | 64, 4 | 8) rows / warps, 16- or 32-column X^T chunks); a (128, 16)
# one with 64-column chunks spilled (ptxas) and was not.
# Session 31 (H100): six one-read settings with their loops through Triton's software pipeliner (num_stages 3-4,
# cp.async into shared memory) were slower than the best of these on 4 of 5 7B operands (X [T, 18944] 0.850 against
# 0.678 ms) and were removed (RESULTS.md "Session 31").
# A one-read kernel in Gluon with no transpose at all (benchmarks/kernels/fp8_quant_gluon.py, replaced in session 31 by
# quarl_kernels.fp8_quant_regs: a thread held four consecutive tokens of its columns, X^T's 32-bit words) gave the
# same bits on an H200 but ran at half the split settings' speed (one 128x128 tile in flight per SM at its register
# count; RESULTS.md "Session 26"): not a candidate; its persistent form prefetching the next tile (session 27) was
# still ~2x slower on every wide operand.
ACT_SETTINGS = ((SUB, WARPS), (32, 4), (64, 8), (64, 16), (128, 16), (64, 8, True), (32, 4, True),
                (32, 4, False, 32, 4), (64, 8, False, 32, 4), (32, 4, False, 64, 8), (64, 8, False, 64, 8),
                (64, 8, False, 128, 8), (32, 4, False, 16, 2), (32, 4, False, 32, 2),
                (32, 4, False, 0, 0, 32), (64, 8, False, 0, 0, 64),
                (16, 4, False, 0, 0, 32), (32, 8, False, 0, 0, 32), (64, 8, False, 0, 0, 32), (32, 4, False, 0, 0, 16),
                (32, 4, 2, 16, 2), (32, 4, 2, 64, 8), (64, 8, 2, 64, 8))
TILE_SETTINGS = ((SUB, WARPS), (32, 4), (64, 8))
# Session 31: where X^T is wanted on CUDA, ``quarl_kernels.fp8_quant_regs`` (Gluon, X^T by register order) is timed
# beside ACT_SETTINGS as ("regs", tokens a thread, warps) (:func:`regs_settings`): H100, 7B operands, 16k tokens,
# 2-6 % faster than the best Triton setting on 4 of 5 operands.


@functools.cache
def regs_module():
    """``quarl_kernels.fp8_quant_regs`` (Gluon), or None where it does not import; imported once (the quantizers'
    launch path asks on every call)."""
    try:
        from quarl_kernels import fp8_quant_regs
    except Exception:  # noqa: BLE001 - no Gluon here: the Triton kernels serve
        return None
    return fp8_quant_regs


def regs_wanted() -> bool:
    """Whether the Gluon kernels (register-order, and SwiGLU's staged backward) are candidates: they import, and
    ``QUARL_FP8_REGS`` is not ``0`` (the Triton settings alone: an A/B of the choice inside a model)."""
    return os.environ.get("QUARL_FP8_REGS", "1") != "0" and regs_module() is not None


@functools.cache
def staged_module():
    """``quarl_kernels.fp8_swiglu_staged`` (Gluon: the tile staged in shared memory, sessions 33-34), or None where it
    does not import; imported once, on first use (it imports this module)."""
    try:
        from quarl_kernels import fp8_swiglu_staged
    except Exception:  # noqa: BLE001 - no Gluon here: the other kernels serve
        return None
    return fp8_swiglu_staged


def tma_wanted() -> bool:
    """Whether the staged kernels' TMA forms (``("tma", R, warps, NC)``, ``fp8_swiglu_staged.TMA_SETTINGS``; bit-equal
    on an H100, session 35) are candidates: unless ``QUARL_FP8_TMA=0`` (an A/B of the choice inside a model)."""
    return os.environ.get("QUARL_FP8_TMA", "1") != "0"


def staged_settings(x: torch.Tensor, settings: tuple) -> tuple:
    """``fp8_swiglu_staged``'s candidates for BF16 ``x``: ``("staged", *s)`` for each of ``settings``, then the TMA
    forms when :func:`tma_wanted`; () for other dtypes (the tile is staged as BF16) or without the module."""
    stg = staged_module()
    if stg is None or x.dtype != torch.bfloat16:
        return ()
    return (tuple(("staged", *st) for st in settings)
            + (tuple(("tma", *st) for st in stg.TMA_SETTINGS) if tma_wanted() else ()))


def regs_settings(x: torch.Tensor, t_rows: int | None) -> tuple:
    """The Gluon candidates for ``x`` (none on CPU, without X^T, with strided columns or without Gluon):
    ``("regs", tpt, warps)`` and, on BF16 ``x``, ``fp8_swiglu_staged``'s plain-activation form ``("staged", R, warps,
    NC)`` (bit-equal on an H100, session 35) and its TMA form (unless ``QUARL_FP8_TMA=0``: :func:`staged_settings`)."""
    if t_rows is None or not x.is_cuda or x.stride(1) != 1 or not regs_wanted():
        return ()
    regs = tuple(("regs", *st) for st in regs_module().SETTINGS)
    stg = staged_module()
    return regs + (staged_settings(x, stg.ACT_SETTINGS) if stg is not None else ())
TUNE_REPS = 3
TUNE_MIN_ROWS = 1024
TUNED: dict[tuple, dict] = {}  # key -> {"best": (sub, warps), "ms": {setting: ms}}


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class Launch(NamedTuple):
    """One kernel launch as :func:`quantize_act` / :func:`quantize_tiles` make it: the tests compile
    exactly these arguments for sm_90 on a CPU (``tests/kernels/sm90_sass.py``)."""

    kernel: object  # the @triton.jit function
    grid: tuple
    args: tuple  # positional runtime arguments (tensors, ints)
    constexprs: dict
    num_warps: int


def _launch(la: Launch | tuple[Launch, ...]) -> None:
    for one in (la if isinstance(la, tuple) and not isinstance(la, Launch) else (la,)):
        # a PDL constexpr comes with its launch attribute (pdl.kwargs: never one without the other)
        one.kernel[one.grid](*one.args, **one.constexprs, num_warps=one.num_warps, enable_fp_fusion=False,
                             launch_pdl=one.constexprs.get("PDL", pdl.OFF) != pdl.OFF)


def tuning_on(t: torch.Tensor) -> bool:
    """Whether a launch on ``t``'s device may time candidate settings now."""
    return (t.is_cuda and tune_mode() != "0"
            and not torch.cuda.is_current_stream_capturing())


def pick_setting(key: tuple, settings: tuple, make, timer=None) -> tuple[int, int]:
    """The (rows per chunk, warps) for ``key``: the cached choice, else the fastest of ``settings`` by
    ``timer(launch) -> ms`` (default: CUDA events over TUNE_REPS launches after a warm-up one) on the
    launches ``make(sub, warps)`` builds. A candidate that fails to compile or launch is skipped. The
    launches write the caller's outputs (all settings write the same bits)."""
    hit = TUNED.get(key)
    if hit is not None:
        return hit["best"]
    timer = timer or _cuda_ms
    ms = {}
    for st in settings:
        try:
            ms[st] = timer(make(*st))
        except Exception:  # noqa: BLE001, S112 - e.g. out of registers / shared memory here: not a candidate
            continue
    best = min(ms, key=ms.get) if ms else settings[0]
    TUNED[key] = {"best": best, "ms": ms}
    return best


def _setting(key: tuple, settings: tuple, t: torch.Tensor, make) -> tuple[int, int]:
    """The chosen setting for ``key`` (also inside a CUDA-graph capture), else a new choice when timing is
    allowed now, else the default (not remembered: a later eager launch still tunes)."""
    if tune_mode() == "0":
        return settings[0]
    hit = TUNED.get(key)
    if hit is not None:
        return hit["best"]
    return pick_setting(key, settings, make) if tuning_on(t) else settings[0]


def tune_mode() -> str:
    """``QUARL_FP8_TUNE``: ``situ`` (the default: candidates timed back to back, then the fastest few timed again where
    they run -- :class:`_Trial`), ``1`` (back to back alone, the fastest kept), ``0`` (no timing: the default
    setting)."""
    mode = os.environ.get("QUARL_FP8_TUNE", "situ").strip().lower() or "situ"
    if mode not in ("0", "1", "situ"):
        raise ValueError(f"QUARL_FP8_TUNE={mode!r}: use 1 (time the launch settings back to back), situ (then time "
                         "the fastest few again inside the run that uses them) or 0 (the default settings)")
    return mode


SITU_FINALISTS = 4  # the fastest few of the back-to-back timing, timed again in situ
SITU_SAMPLES = 4  # in-situ runs of each finalist (their median decides)
# Only keys whose fastest back-to-back time reaches this (ms) get a trial. Session 33 (H100, 7B step): the 0.03-0.2 ms
# activation quantizers' in-situ times spread 1.2-1.7x between Triton settings that run level back to back -- the call
# site and the host's launch gaps, not the kernel -- while SwiGLU's backward (1.5-2.6 ms, one call site a layer) was
# ranked consistently in three runs
SITU_MIN_MS = 0.5
_TRIALS: dict = {}  # key -> the in-situ trial under way


class _Trial:
    """One key's in-situ choice: the finalists launched in turn where the caller runs them (a training step's
    quantizer calls), each timed by CUDA events around its own launch and read back without a sync once they have
    run; after SITU_SAMPLES each, the median decides and ``TUNED[key]`` keeps it (``situ_ms`` beside the
    back-to-back ``ms``). Why: in the FP8 actor update the quantizers run between FP8 GEMMs that hold the H100 at its
    power limit, its SM clock ~1.35-1.45 GHz against ~1.98 in a loop of one kernel (session 33, nvidia-smi at
    100 ms); a latency-bound candidate slows with the clock, a bandwidth-bound one much less, so the back-to-back
    order can invert (SwiGLU's backward: the register-order kernel 1.72 ms against the two passes' 1.82 back to back,
    2.28 against 1.98 a layer in the step's profile). Every setting writes the same bits: which one ran never shows
    in the result."""

    def __init__(self, key: tuple, finalists: tuple):
        self.key, self.finalists = key, finalists
        self.samples: dict = {f: [] for f in finalists}
        self.pending: list = []
        self.order: list = []  # the finalists' turns: a fresh shuffled round whenever one runs out
        self.rng = random.Random(0)

    def _harvest(self) -> None:
        keep = []
        for st, a, b in self.pending:
            if b.query():
                self.samples[st].append(a.elapsed_time(b))
            else:
                keep.append((st, a, b))
        self.pending = keep

    def run(self, make) -> tuple:
        self._harvest()
        if all(len(v) >= SITU_SAMPLES for v in self.samples.values()):
            ms = {f: sorted(v)[len(v) // 2] for f, v in self.samples.items()}
            best = min(ms, key=ms.get)
            TUNED[self.key].update(best=best, situ_ms=ms)
            del _TRIALS[self.key]
            _launch(make(*best))
            return best
        if not self.order:
            # rounds in shuffled order: one key serves several call sites of a step (X of q / k / v, of o, of the
            # MLP), and a fixed rotation whose period divides theirs would time each finalist at one site only
            self.order = self.rng.sample(self.finalists, len(self.finalists))
        st = self.order.pop()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        _launch(make(*st))
        b.record()
        self.pending.append((st, a, b))
        return st


def run_setting(key: tuple, settings: tuple, t: torch.Tensor, make) -> tuple:
    """Launch ``make(*setting)`` at ``key``'s chosen setting (:func:`_setting`) and return the setting; with
    ``QUARL_FP8_TUNE=situ`` the back-to-back choice is followed by an in-situ trial of its fastest few
    (:class:`_Trial`), which these launches run until it decides."""
    st = _setting(key, settings, t, make)
    trial, hit = _TRIALS.get(key), TUNED.get(key)
    if trial is None and hit is not None and "situ_ms" not in hit and tune_mode() == "situ" and tuning_on(t):
        # once per key: a trial, or none ever (situ_ms {}: a key too short or with one candidate)
        ms = hit["ms"]
        finalists = tuple(sorted(ms, key=ms.get)[:SITU_FINALISTS])
        if len(finalists) > 1 and ms[finalists[0]] >= SITU_MIN_MS:
            trial = _TRIALS[key] = _Trial(key, finalists)
        else:
            hit["situ_ms"] = {}
    if trial is None or not tuning_on(t):
        _launch(make(*st))
        return st
    return trial.run(make)


def _cuda_ms(la: Launch, run=None) -> float:
    """ms of one ``run(la)`` (default :func:`_launch`) by CUDA events over TUNE_REPS runs after a warm-up one."""
    run = run or _launch
    run(la)  # compile (or load from Triton's cache) and warm
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(TUNE_REPS):
        run(la)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / TUNE_REPS


def _outer_major(rows: int, groups: int, device) -> torch.Tensor:
    """A ``[rows, groups]`` fp32 tensor stored as ``[groups, rows]`` (strides ``(1, rows)``)."""
    return torch.empty(groups, rows, device=device, dtype=torch.float32).t()


def parse_setting(setting: tuple) -> tuple[int, int, bool, tuple[int, int] | None, int]:
    """An :data:`ACT_SETTINGS` entry -> (sub, warps, pack, split or None, t_chunk): entries are ``(sub, warps)``,
    ``(sub, warps, pack)``, ``(sub, warps, mode, t_cols, t_warps)`` (split; mode 0 / False: X^T's kernel transposes
    its codes, 2: it loads its tile through the transposed view) or ``(sub, warps, False, 0, 0, t_chunk)`` (one
    kernel, X^T's pass by column chunks). ``pack`` is returned as an int."""
    sub, warps, pack, t_cols, t_warps, t_chunk = (*setting, False, 0, 0, 0)[:6]
    return sub, warps, int(pack), ((t_cols, t_warps) if t_cols else None), t_chunk


def quantize_act(x: torch.Tensor, rows: int | None = None, cols: int | None = None, t_rows: int | None = None,
                 *, row_groups: bool = True, t_tiles: bool = False, sub: int | None = None, warps: int | None = None,
                 pack: bool | int = False, split: tuple[int, int] | None = None, t_chunk: int = 0,
                 out: tuple | None = None):
    """``x`` [M, K] (bf16 / fp16 / fp32, any strides) -> ``(q, s, qt, st)`` in one pass.

    * ``row_groups``: ``q`` [rows, cols] E4M3 row-major (1x128 groups along K) and ``s`` [rows, cols/128]
      fp32 M-major; ``rows`` >= M (default M; extra rows are zero codes), ``cols`` = K rounded up
      to 128 (default; a short last group padded with zeros).
    * ``t_rows`` (a multiple of 128, >= M): also ``qt`` [cols, t_rows] E4M3 row-major = the 1x128
      quantization of x^T along the tokens, and ``st`` [cols, t_rows/128] fp32 stored ``cols``-major;
      with ``t_tiles``, x^T in 128x128 tiles instead (``fp8_wgrad=tiles``): ``st`` [cols/128, t_rows/128]
      row-major, one scale per tile, equal to ``quantize_tiles`` of the zero-padded x, transposed.

    ``out``: ``(q, s, qt, st)`` to write into (None for an entry not requested): views of wider operands -- a column
    block of ``q`` / ``s``, a row block of ``qt`` / ``st`` -- with the layouts above but any row stride (several
    projections' dY quantized into one stacked operand: ``quarl.quant.fp8_stack``).

    Entries not requested are None. Equal to ``quantize_act_1x128`` of the zero-padded ``x`` (and
    of its transpose) on the same device, bit for bit, whatever the launch setting: ``sub`` / ``warps`` /
    ``pack`` (one kernel: X^T stored as 4-token words; a split: 2 for the transposed load) / ``split`` ((BLOCK_C,
    warps): X^T by its own kernel) / ``t_chunk``
    (X^T's pass by column chunks) given, else chosen by shape (:func:`pick_setting`) on CUDA, else (SUB, WARPS).
    """
    if x.dim() != 2:
        raise ValueError(f"quantize_act: x must be 2-D [M, K], got {tuple(x.shape)}")
    m, k = x.shape
    rows = m if rows is None else rows
    cols = _round_up(k, GROUP) if cols is None else cols
    if cols % GROUP or cols < k or rows < m:
        raise ValueError(f"quantize_act: cols={cols} must be a multiple of {GROUP} >= K={k}, rows={rows} >= M={m}")
    if t_rows is not None and (t_rows % GROUP or t_rows < m):
        raise ValueError(f"quantize_act: t_rows={t_rows} must be a multiple of {GROUP} >= M={m}")
    t_tiles = bool(t_tiles) and t_rows is not None
    q, s, qt, st = (_act_outputs(x, rows, cols, t_rows, row_groups, t_tiles) if out is None
                    else _checked_act_out(x, rows, cols, t_rows, row_groups, t_tiles, out))
    extent = max(rows if row_groups else 0, t_rows or 0)
    if extent == 0 or m == 0 or (q is None and qt is None):
        if q is not None:  # no tokens: zero codes, eps scales (what the reference gives for padding rows)
            q.view(torch.uint8).zero_()
            s.fill_(torch.finfo(torch.float32).eps)
        if qt is not None:
            qt.view(torch.uint8).zero_()
            st.fill_(torch.finfo(torch.float32).eps)
        return q, s, qt, st
    if sub is None or warps is None:
        setting = (SUB, WARPS)
        if extent >= TUNE_MIN_ROWS and x.is_cuda:
            key = ("act", q is not None, t_rows is not None, x.dtype, triton.next_power_of_2(extent), cols,
                   x.stride(1) == 1) + (("tiles",) if t_tiles else ())
            cands = ACT_SETTINGS if t_rows is not None else tuple(st for st in ACT_SETTINGS if len(st) == 2)
            run_setting(key, cands + regs_settings(x, t_rows), x,
                        lambda *c: _any_launch(x, q, s, qt, st, rows, cols, t_rows, c, t_tiles))
            return q, s, qt, st
        sub, warps, pack, split, t_chunk = parse_setting(setting)
    _launch(_act_launch(x, q, s, qt, st, rows, cols, t_rows, sub, warps, pack, *(split or (0, 0)), t_chunk=t_chunk,
                        t_tiles=t_tiles))
    return q, s, qt, st


def _any_launch(x, q, s, qt, st, rows: int, cols: int, t_rows: int | None, setting: tuple, t_tiles: bool):
    """The launch of an :data:`ACT_SETTINGS` entry or a Gluon one (:func:`regs_settings`)."""
    if setting[0] == "regs":
        return regs_module().launch_spec(x, q, s, qt, st, rows, cols, t_rows, t_tiles, *setting[1:])
    if setting[0] in ("staged", "tma"):
        return staged_module().fwd_spec(x, None, q, s, qt, st, rows, cols, t_rows, t_tiles, *setting[1:],
                                        tma=setting[0] == "tma")
    return _act_launch(x, q, s, qt, st, rows, cols, t_rows, *_flat(parse_setting(setting)), t_tiles=t_tiles)


def _flat(parsed: tuple) -> tuple:
    """:func:`parse_setting`'s tuple -> :func:`_act_launch`'s positional (sub, warps, pack, t_cols, t_warps, t_chunk)."""
    sub, warps, pack, split, t_chunk = parsed
    return (sub, warps, pack, *(split or (0, 0)), t_chunk)


def _act_outputs(x, rows: int, cols: int, t_rows: int | None, row_groups: bool, t_tiles: bool = False):
    dev = x.device
    q = s = qt = st = None
    if row_groups:
        q = torch.empty(rows, cols, device=dev, dtype=torch.float8_e4m3fn)
        s = _outer_major(rows, cols // GROUP, dev)
    if t_rows is not None:
        qt = torch.empty(cols, t_rows, device=dev, dtype=torch.float8_e4m3fn)
        st = (torch.empty(cols // GROUP, t_rows // GROUP, device=dev, dtype=torch.float32) if t_tiles  # tile scales
              else _outer_major(cols, t_rows // GROUP, dev))
    return q, s, qt, st


def _checked_act_out(x, rows: int, cols: int, t_rows: int | None, row_groups: bool, t_tiles: bool, out: tuple):
    """``out`` = (q, s, qt, st) for :func:`quantize_act`, checked against what it would allocate: the same shapes,
    dtypes and device, unit stride along a code row (and, for the 1x128 scales, along the rows they are stored
    by); any row stride."""
    if len(out) != 4:
        raise ValueError("quantize_act: out must be (q, s, qt, st)")
    q, s, qt, st = out
    want = (row_groups, row_groups, t_rows is not None, t_rows is not None)
    if tuple(t is not None for t in out) != want:
        raise ValueError(f"quantize_act: out gives {tuple(t is not None for t in out)}, the call wants {want}")

    def fits(t, shape, dtype, unit_dim):
        return t.shape == shape and t.dtype == dtype and t.device == x.device and t.stride(unit_dim) == 1

    ok = not row_groups or (fits(q, (rows, cols), torch.float8_e4m3fn, 1)
                            and fits(s, (rows, cols // GROUP), torch.float32, 0))
    if t_rows is not None:
        st_shape = (cols // GROUP, t_rows // GROUP) if t_tiles else (cols, t_rows // GROUP)
        ok = ok and fits(qt, (cols, t_rows), torch.float8_e4m3fn, 1) and fits(st, st_shape, torch.float32,
                                                                                1 if t_tiles else 0)
    if not ok:
        raise ValueError(f"quantize_act: out does not fit x {tuple(x.shape)} as rows={rows}, cols={cols}, "
                         f"t_rows={t_rows}, t_tiles={t_tiles}")
    return q, s, qt, st


def _act_launch(x, q, s, qt, st, rows: int, cols: int, t_rows: int | None, sub: int, warps: int,
                pack: bool = False, t_cols: int = 0, t_warps: int = 0, t_chunk: int = 0,
                t_tiles: bool = False) -> Launch | tuple[Launch, ...]:
    # a token group per program when the transpose is wanted; else short row blocks (decode: M <= 64).
    # t_cols > 0 (a split setting, with X^T wanted): the row groups alone, then X^T by _act_t_kernel.
    # t_chunk > 0: one kernel, X^T's pass by [128, t_chunk] column chunks. t_tiles: X^T in 128x128 tiles
    m, k = x.shape
    if t_cols and qt is not None:  # pack 2: X^T's kernel loads through the transposed view (T_LOAD)
        if pack not in (0, 2):
            raise ValueError(f"a split setting's third field is 0 / False or 2 (transposed load), got {pack!r}")
        t_launch = Launch(
            _act_t_kernel, (t_rows // GROUP, cols // GROUP if t_tiles else triton.cdiv(cols, t_cols)),
            (x, qt, st, m, k, x.stride(0), x.stride(1), cols, t_rows, qt.stride(0), st.stride(0), st.stride(1)),
            {"SCALE_RECIP": x.is_cuda, "BLOCK_C": t_cols, "INTERPRET": _interpreting(), "TILE": t_tiles,
             "T_LOAD": pack == 2},
            t_warps or warps)
        if q is None:
            return (t_launch,)
        return (_act_launch(x, q, s, None, None, rows, cols, None, sub, warps), t_launch)
    extent = max(rows if q is not None else 0, t_rows or 0)
    block_m = 128 if t_rows is not None else min(sub, max(16, triton.next_power_of_2(extent)))
    pack = bool(pack) and qt is not None  # X^T as int32 words of 4 tokens (t_rows is a multiple of 128)
    dq, ds = (q, s) if q is not None else (qt, st)  # placeholders for the pointers a pass does not use
    dqt, dst = (qt.view(torch.int32) if pack else qt, st) if qt is not None else (q, s)
    return Launch(
        _act_kernel, (triton.cdiv(extent, block_m), cols // GROUP),
        (x, dq, ds, dqt, dst, m, k, x.stride(0), x.stride(1), rows, cols, t_rows or 0,
         dq.stride(0), ds.stride(0), ds.stride(1), dqt.stride(0), dst.stride(0), dst.stride(1)),
        {"ROWS": q is not None, "COLS": t_rows is not None, "SCALE_RECIP": x.is_cuda, "BLOCK_M": block_m,
         "SUB": min(sub, block_m), "INTERPRET": _interpreting(), "PACK_T": pack,
         "TILE": t_tiles and qt is not None, "T_CHUNK": t_chunk if qt is not None else 0,
         # the row groups alone (every decode projection's X at rollout): chained to the kernels around it
         "PDL": pdl.mode(x.device) if qt is None else pdl.OFF},
        warps,
    )


def quantize_tiles(w: torch.Tensor, transpose: bool = False, *, sub: int | None = None, warps: int | None = None,
                   out: tuple | None = None):
    """``w`` [N, K] -> ``(q [Np, Kp], s [Np/128, Kp/128], qt [Kp, Np] or None)``: 128x128 tiles,
    zero-padded to multiples of 128; ``qt`` (``transpose``) is ``q.t().contiguous()`` written by the
    same kernel. Equal to ``quantize_weight_padded`` on the same device, bit for bit (any launch setting;
    chosen as :func:`quantize_act`'s). ``out``: ``(q, s, qt)`` to write into instead of new tensors (a master
    weight's tiles re-made in place after an optimizer step: ``quarl.quant.fp8_linear``); the kernel moves no
    version counter, the caller does. The ``out`` tensors may be blocks of wider ones (unit stride along a row, any
    row stride): a weight's tiles as a row block of stacked tiles, its transpose a column block
    (``quarl.quant.fp8_stack``)."""
    if w.dim() != 2:
        raise ValueError(f"quantize_tiles: w must be 2-D [N, K], got {tuple(w.shape)}")
    n, k = w.shape
    if n == 0 or k == 0:
        raise ValueError(f"quantize_tiles: empty weight {tuple(w.shape)}")
    q, qt, s = _tile_outputs(w, transpose) if out is None else _checked_out(w, transpose, out)
    if sub is None or warps is None:
        sub, warps = SUB, WARPS
        if n >= TUNE_MIN_ROWS and w.is_cuda:
            key = ("tiles", transpose, w.dtype, n, k, w.stride(1) == 1)
            sub, warps = _setting(key, TILE_SETTINGS, w, lambda b, wa: _tile_launch(w, q, qt, s, b, wa))
    _launch(_tile_launch(w, q, qt, s, sub, warps))
    return q, s, qt


def _checked_out(w, transpose: bool, out: tuple):
    """``out`` = (q, s, qt) for :func:`quantize_tiles`, checked against what it would allocate -> (q, qt, s)."""
    q, s, qt = out
    np_, kp = _round_up(w.shape[0], GROUP), _round_up(w.shape[1], GROUP)
    ok = (q.shape == (np_, kp) and q.dtype == torch.float8_e4m3fn and q.stride(1) == 1 and q.device == w.device
          and s.shape == (np_ // GROUP, kp // GROUP) and s.dtype == torch.float32 and s.stride(1) == 1
          and (qt is None) == (not transpose)
          and (qt is None or (qt.shape == (kp, np_) and qt.dtype == torch.float8_e4m3fn and qt.stride(1) == 1)))
    if not ok:
        raise ValueError(f"quantize_tiles: out does not fit a {tuple(w.shape)} weight (transpose={transpose})")
    return q, qt, s


def _tile_outputs(w, transpose: bool):
    np_, kp = _round_up(w.shape[0], GROUP), _round_up(w.shape[1], GROUP)
    q = torch.empty(np_, kp, device=w.device, dtype=torch.float8_e4m3fn)
    qt = torch.empty(kp, np_, device=w.device, dtype=torch.float8_e4m3fn) if transpose else None
    s = torch.empty(np_ // GROUP, kp // GROUP, device=w.device, dtype=torch.float32)
    return q, qt, s


def _tile_launch(w, q, qt, s, sub: int, warps: int) -> Launch:
    n, k = w.shape
    dqt = qt if qt is not None else q  # placeholder pointer without the transpose
    return Launch(
        _tile_kernel, (q.shape[0] // GROUP, q.shape[1] // GROUP),
        (w, q, dqt, s, n, k, w.stride(0), w.stride(1), q.stride(0), dqt.stride(0), s.stride(0), s.stride(1)),
        {"TRANS": qt is not None, "SCALE_RECIP": w.is_cuda, "SUB": sub, "INTERPRET": _interpreting()},
        warps,
    )


__all__ = ["ACT_SETTINGS", "GROUP", "TILE_SETTINGS", "TUNED", "parse_setting", "pick_setting", "quantize_act",
           "quantize_tiles", "regs_module", "regs_settings", "regs_wanted", "run_setting", "tune_mode"]
