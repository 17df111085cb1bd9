"""A frozen quantized base's BF16 weights held through the trainer's log-prob pass and updates, when memory allows.

Why. At training sizes the GPU kernels multiply a 4-bit base through a transient BF16 copy of each weight and cuBLAS
(``quarl_kernels.dense``); the copy is made per call. A LoRA trainer's base never changes, yet one GRPO step makes
every copy again for each micro-batch of its log-prob pass and of each of its ``mu`` updates (Qwen2.5-7B, 64 answers
in micro-batches of 8, mu 2: about 40 decodes of each projection), and each call pays the kernel path's host work
(dispatch, a Python autograd function) -- the update is partly host-bound. Holding the copies for the phase
(``QuantLinear._held``, made by the kernels' own decode, ``dispatch.dense_weight``) decodes once per step and
turns each call the dense path would take into that same matmul, under autograd's own matmul: the BF16+LoRA step's
GEMMs and host path, bit for bit the per-call path's values (a call the fused kernels take -- few rows -- stays
theirs, ``dispatch.HeldWeight.serves``: a run computes the same held or not, and a resumed run is identical). The
price is memory: up to the base in BF16 for the phase (12.15 GiB at Qwen2.5-7B), given back before the next rollout
plans its KV cache. Measured (benchmarks/RESULTS.md "Issue 17, session 25"): the 7B NVFP4+LoRA update 1.2-1.8x
faster at micro-batch 4, level at micro-batch 8.

How much. ``optim.dequant_cache`` (one knob, checked when the config is built):

* ``false``: every call decodes (the smallest footprint: QeRL's 32B-on-one-GPU case).
* ``true``: the whole base is held (its BF16 size on top of the working set; may not fit -- the user's call).
* ``auto`` (default): on CUDA only, and not in the first phase: that one measures the phase's working set (peak
  minus what was allocated at its start, less what was held) and the tokens of its micro-batch. Each later phase
  holds up to the free memory (device free plus the caching allocator's reserved, unused bytes) less 1.25x the working
  set scaled to its own micro-batch's tokens (RL answers grow over a run; activations grow with them) and a margin
  (1 GiB or 5 % of the device, the larger), at most the base's BF16 size. What does not fit is decoded per call, as
  with ``false``.

Nothing here changes what is computed: only whether a weight's BF16 copy is made again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from quarl.quant import dispatch
from quarl.train.metrics import peak_memory_gb

SETTINGS = ("auto", "true", "false")
GIB = 2**30
WORKING_SET_FACTOR = 1.25  # headroom over the measured working set (micro-batches differ in length)


def check_setting(value, key: str = "optim.dequant_cache") -> str:
    """The knob's normalized value; the config calls it when built, so ``compile`` rejects what a pod would."""
    v = str(value).lower()
    if v not in SETTINGS:
        raise ValueError(f"{key} must be auto|true|false, got {value!r}: auto holds the frozen base's BF16 weights "
                         f"through the log-prob pass and updates when memory allows, true always, false never")
    return v


def holdable(model: nn.Module) -> list[nn.Module]:
    """``model``'s frozen quantized projections whose format has a GPU kernel (weight-only: no FP8 flow, no activation
    quantizer), in model order: what the kernels' dense path decodes per call."""
    from quarl.quant.linear import QuantLinear

    return [m for m in model.modules()
            if isinstance(m, QuantLinear) and m.mode == "frozen" and m.config is not None and not m.fp8_flow
            and m._act_fn is None and dispatch.has_kernel(m.format_name)]


def base_bf16_bytes(model: nn.Module) -> int:
    """Bytes of the BF16 copies the kernels' dense path makes for ``model``'s frozen quantized projections."""
    return sum(2 * m.out_features * m.in_features for m in holdable(model))


def auto_budget(need: int, avail: int, working_set: int | None, total: int) -> int:
    """Bytes ``auto`` holds: 0 before a working set is known, else what the free memory leaves after 1.25x the
    working set and the margin, clamped to [0, need]."""
    if working_set is None or need <= 0:
        return 0
    margin = max(GIB, int(0.05 * total))
    return int(max(0, min(need, avail - WORKING_SET_FACTOR * working_set - margin)))


class DequantCache:
    """``optim.dequant_cache`` for one trainer: :meth:`phase` wraps its log-prob pass and updates."""

    def __init__(self, model: nn.Module, setting: str, device: torch.device):
        self.model, self.setting, self.device = model, check_setting(setting), torch.device(device)
        on = self.setting != "false" and self.device.type == "cuda"
        self.need = base_bf16_bytes(model) if on else 0  # 0: nothing to hold (CPU, BF16 base, FP8 flow, off)
        self.working_set: int | None = None
        self.working_tokens = 0  # the micro-batch tokens the working set was measured at
        self.peak_before = 0  # the step's peak allocation before the phase (the phase resets the counter)
        self.last: dict[str, float] = {}

    def new_step(self) -> None:
        """A trainer's step begins (right after it resets the device's peak counter)."""
        self.peak_before = 0

    def step_peak_gb(self) -> float:
        """The step's peak memory, GiB: the phase resets the device's counter, so the larger of the two spans."""
        return max(peak_memory_gb(self.device), self.peak_before / GIB)

    # the device's memory counters (one place, so that a CPU test can stand in for them)
    def _avail_total(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(self.device)
        return free + torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device), total

    def _allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def _take_peak(self) -> int:
        """The peak allocation since the last call (or the step's start), and a fresh count from here."""
        peak = torch.cuda.max_memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return peak

    @contextlib.contextmanager
    def phase(self, tokens: int = 0) -> Iterator[None]:
        """Hold the base for the block. ``tokens``: the phase's largest micro-batch (rows x padded length), which
        the measured working set is scaled by (0: unscaled)."""
        if self.need == 0:
            yield
            return
        if self.setting == "true":
            budget = self.need
        else:
            avail, total = self._avail_total()
            ws = self.working_set
            if ws is not None and tokens and self.working_tokens:
                ws = int(ws * max(1.0, tokens / self.working_tokens))  # never below what was measured
            budget = auto_budget(self.need, avail, ws, total)
        start, self.peak_before = self._allocated(), self._take_peak()
        held, layers = 0, []
        try:
            # in model order, each layer that still fits: with part of the budget, the rest decode per call
            for m in holdable(self.model) if budget else ():
                nbytes = 2 * m.out_features * m.in_features  # [N, K] bf16
                if held + nbytes > budget:
                    continue
                w = dispatch.dense_weight(m)
                if w is not None:
                    m._held = dispatch.HeldWeight(w)
                    layers.append(m)
                    held += nbytes
            yield
        except torch.OutOfMemoryError as e:
            if not held:
                raise
            raise torch.OutOfMemoryError(
                f"{e}\n\nThe device ran out of memory while {held / GIB:.2f} GiB of the frozen base were held in BF16 "
                f"(optim.dequant_cache={self.setting}). Set optim.dequant_cache=false to decode per call instead "
                f"(the smallest footprint), or lower optim.micro_batch_size; the checkpoint resumes either way.") from e
        finally:
            for m in layers:
                m._held = None
            peak = self._take_peak()
        self.working_set, self.working_tokens = max(0, peak - start - held), tokens
        self.last = {"dequant_cache/budget_gb": budget / GIB, "dequant_cache/held_gb": held / GIB,
                     "dequant_cache/base_gb": self.need / GIB, "dequant_cache/working_set_gb": self.working_set / GIB}


__all__ = ["SETTINGS", "DequantCache", "auto_budget", "base_bf16_bytes", "check_setting", "holdable"]
