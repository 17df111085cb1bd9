"""The blocked in-memory layout of a frozen layer's packed 4-bit words, for the GPU decode kernels.

compressed-tensors stores a 4-bit weight row-major: ``weight_packed`` uint8 ``[N, K/2]`` (NVFP4 / MXFP4) or int32
``[N, K/8]`` (INT4), i.e. 32-bit words ``[N, KW]`` of 8 codes each, ``KW = K / 8``. The decode kernels at 1..16
rows read a K step of a whole tile of rows at once -- the ``mma.sync`` kernel 128 rows x 16 words -- so row-major
words reach them as 128 separate 64-byte pieces, one DRAM page each. Session 19 (RESULTS "Issue 17, session 19")
measured that kernel 1.17-1.22x faster at 4-8 rows, and the 7B / 14B NVFP4+LoRA decode step 6-9 % / 5.5-6 %
faster at batch 4-16, with the words re-laid so that a step reads whole contiguous blocks; [64 rows, 8 words]
blocks (2 KB) served as well as the step's own tile, and they are the TMA ring's box as they are.

The layout: word ``(n, w)`` of the row-major ``[N, KW]`` words sits at

    ((n // 64) * (KW // 8) + w // 8) * 512 + (n % 64) * 8 + w % 8

i.e. the words as ``[N / 64, KW / 8, 64, 8]``: 64-row bands, each a run of [64, 8] blocks along K. Every kernel
that reads packed words addresses it (``BLOCKED`` in ``quarl_kernels``: the GEMV, ``mma_decode``,
``wgmma_decode``, the TMA ring, the dense path's decode, the fused training GEMMs), so a layer holds one copy.

The marker is the tensor's own shape: a blocked ``weight_packed`` keeps its dtype (uint8 / int32) and has four
dimensions (``[N / 64, KW / 8, 64, 32]`` bytes or ``[N / 64, KW / 8, 64, 8]`` words) where a row-major one has
two. Nothing else has to carry a flag: the kernels' ``ops._packed_weight`` and the reference path
(:func:`row_major`) read the layout off the tensor. ``QuantLinear`` hands out row-major tensors wherever its
packed weight leaves the GPU kernels -- ``qtensor()`` (export, dequantize, GPTQ), ``state_dict()`` (every saved
artifact stays byte-identical to compressed-tensors) -- and blocks what ``load_state_dict`` brings in.

Only layers the kernels read are blocked (:func:`blockable`): a frozen NVFP4 / MXFP4 / INT4 (4-bit) weight on a
CUDA device with ``N % 64 == 0`` and ``K % 64 == 0`` (every Qwen2.5 / Llama / SmolLM2 projection). The rollout
engine lays its policy out for the batch it decodes (:func:`wanted`, ``QUARL_KERNELS_BLOCKED=auto|1|0``): blocked
from two rows a step -- every RL rollout (GRPO's groups; compaction stops at 8 rows) -- and row-major for
single-sequence decoding, whose one-row GEMV reads row-major words faster. A change of layout re-captures the
engine's CUDA graphs (the buffers move), so a workload that alternates one-row and batched calls pays that each time.
"""

from __future__ import annotations

import os

import torch

BLOCK_ROWS = 64  # rows of a block
BLOCK_WORDS = 8  # 32-bit words of a block's row (64 codes: 32 bytes)
ENV = "QUARL_KERNELS_BLOCKED"
_FORMATS = ("nvfp4", "mxfp4", "int")


def mode() -> str:
    """``QUARL_KERNELS_BLOCKED``: ``auto`` (the default: blocked while the engine decodes two rows or more), ``1``
    (always blocked) or ``0`` (always row-major) -> "auto" / "on" / "off"."""
    v = os.environ.get(ENV, "auto").strip().lower()
    if v in ("", "auto"):
        return "auto"
    if v in ("1", "on", "true", "yes"):
        return "on"
    if v in ("0", "off", "false", "no"):
        return "off"
    raise ValueError(f"{ENV}={v!r}: expected auto (the default), 1 or 0")


def wanted(rows: int) -> bool:
    """Whether decoding ``rows`` rows a step should read blocked words (:func:`mode`). ``auto`` says yes from two
    rows: the ``mma.sync`` kernel (2..16 rows) is 1.06-1.12x faster on blocked words, but the one-row GEMV's tiles
    read a row's words as 32-byte pieces 2 KB apart and lose 4-10 % (RESULTS "Issue 17, session 21")."""
    m = mode()
    return m == "on" or (m == "auto" and rows >= 2)


def is_blocked(packed: torch.Tensor) -> bool:
    """True for a packed weight in the blocked layout (four dimensions; row-major ones have two)."""
    return packed.dim() == 4


def _words_per_row(packed: torch.Tensor) -> int:
    return packed.shape[-1] * packed.element_size() // 4


def block(packed: torch.Tensor) -> torch.Tensor:
    """Row-major ``[N, KW * 4 / itemsize]`` packed weight -> the blocked layout (a new tensor, same dtype), e.g.
    uint8 ``[N, K/2]`` -> ``[N / 64, KW / 8, 64, 32]``. ``N % 64`` and ``KW % 8`` must be 0."""
    if packed.dim() != 2:
        raise ValueError(f"block: a row-major packed weight has 2 dimensions, got {tuple(packed.shape)}")
    n, kw = packed.shape[0], _words_per_row(packed)
    if n % BLOCK_ROWS or kw % BLOCK_WORDS or packed.shape[1] * packed.element_size() % 4:
        raise ValueError(f"block: [{n} rows, {kw} words] do not split into [{BLOCK_ROWS}, {BLOCK_WORDS}]-word blocks "
                         f"(needs N % 64 == 0 and K % 64 == 0); keep this layer row-major")
    per = packed.shape[1] // (kw // BLOCK_WORDS)  # elements of one block row (32 bytes)
    return packed.view(n // BLOCK_ROWS, BLOCK_ROWS, kw // BLOCK_WORDS, per).transpose(1, 2).contiguous()


def row_major(packed: torch.Tensor) -> torch.Tensor:
    """The row-major packed weight (compressed-tensors' layout): ``packed`` itself when it is row-major already,
    else a new tensor ``[N, KW * 4 / itemsize]`` of the same dtype."""
    if not is_blocked(packed):
        return packed
    nb, kb, rows, per = packed.shape
    return packed.transpose(1, 2).contiguous().view(nb * rows, kb * per)


def blockable(layer) -> bool:
    """True when :func:`block_layer` would block this layer: frozen, a 4-bit format the kernels read, on CUDA,
    row-major now, N and K multiples of 64, and the GPU kernels on (without them -- ``QUARL_KERNELS=reference``, no
    Triton -- every call would copy the words back to row-major for the reference path)."""
    from quarl.quant import dispatch

    cfg = getattr(layer, "config", None)
    packed = getattr(layer, "weight_packed", None)
    if cfg is None or packed is None or getattr(layer, "mode", "frozen") != "frozen" or cfg.name not in _FORMATS:
        return False
    if cfg.name == "int" and getattr(cfg, "bits", 4) != 4:
        return False
    return (packed.is_cuda and not is_blocked(packed) and packed.is_contiguous()
            and layer.out_features % BLOCK_ROWS == 0 and layer.in_features % (8 * BLOCK_WORDS) == 0
            and dispatch.has_kernel(cfg.name))


def block_layer(layer) -> bool:
    """Re-lay ``layer.weight_packed`` blocked (one layer's packed bytes of temporary memory); True if it did."""
    if not blockable(layer):
        return False
    layer.weight_packed = block(layer.weight_packed)  # a registered buffer: replaced in place in _buffers
    return True


def block_model(model: torch.nn.Module) -> int:
    """Block every :func:`blockable` layer of ``model``; returns how many it blocked (0 when all are already)."""
    return sum(block_layer(m) for m in model.modules())


def count_blocked(model: torch.nn.Module) -> int:
    """How many layers of ``model`` hold blocked words."""
    return sum(isinstance(getattr(m, "weight_packed", None), torch.Tensor) and is_blocked(m.weight_packed)
               for m in model.modules())


def unblock_model(model: torch.nn.Module) -> int:
    """Every blocked layer of ``model`` back to row-major in place (one layer's bytes of temporary memory at a time),
    e.g. before handing the model to code that reads ``weight_packed`` itself; returns how many it converted."""
    done = 0
    for m in model.modules():
        packed = getattr(m, "weight_packed", None)
        if isinstance(packed, torch.Tensor) and is_blocked(packed):
            m.weight_packed = row_major(packed)
            done += 1
    return done


__all__ = ["BLOCK_ROWS", "BLOCK_WORDS", "ENV", "block", "block_layer", "block_model", "blockable", "count_blocked",
           "is_blocked", "mode", "row_major", "unblock_model", "wanted"]
