"""How many rollout rows fit the device: the fast engine's batches sized by free memory.

With ``max_batch_size=None`` (the rl stage's ``rollout.batch_size=0``: all rows at once) ``FastGenerator`` asks
:func:`rows_that_fit` before a call, as vLLM sizes its KV blocks by the memory left after the model: the device's
free memory (:func:`free_bytes`: free on the device, held unused by PyTorch's caching allocator, and the current
cache's, which a larger batch replaces), less a prefill pass's activations and :data:`MEMORY_SLACK`, divided by
what one row takes (``DecoderRunner.row_bytes``: its K/V cache, validity mask, fp32 logits, the sampler's sort of
them, the decode step's activations). Rows that do not fit go in batches of the largest power of two that does
(the graphs pad batches to one); a row that cannot fit alone is an ``EngineError`` naming what to lower. Off CUDA
there is no limit.
"""

from __future__ import annotations

import torch

from quarl.engine.model import DecodeState, EngineError

MEMORY_SLACK = 1 << 30  # bytes left free beside a batch's estimate: allocator fragmentation, cuBLAS workspaces


def free_bytes(device: torch.device, state: DecodeState | None) -> int | None:
    """Device memory a new cache may take (module docstring); None off CUDA (no limit)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if state is not None:
        free += state.nbytes() + state.kv_valid.numel() + state.logits.numel() * 4
    return free


def rows_that_fit(runner, n: int, P: int, T: int, S: int, free: int | None, max_num_batched_tokens: int) -> int:
    """Most of ``n`` rows (prompts padded to ``P``, ``T`` new tokens, a cache of ``S`` slots a row) one batch may
    take within ``free`` bytes: ``n`` when they all fit (or ``free`` is None), else the largest power of two."""
    if free is None:
        return n
    chunk = min(n, max(1, max_num_batched_tokens // P)) * P  # tokens of one prefill pass (whole rows)
    budget = free - runner.prefill_bytes(chunk) - MEMORY_SLACK
    fit = budget // runner.row_bytes(S)
    if fit < 1:
        raise EngineError(
            f"one row of {P} prompt + {T} new tokens needs {runner.row_bytes(S) / 2**30:.2f} GiB of cache and "
            f"buffers, and {max(budget, 0) / 2**30:.2f} GiB is free after the prefill's activations: lower "
            f"max_new_tokens (rollout.max_new_tokens) or the prompt length (rollout.max_prompt_tokens), or free "
            f"device memory (rollout.free_cache=true)")
    fit = min(fit, n)
    return fit if fit == n else 1 << (fit.bit_length() - 1)
