"""Batched sampling for evaluation, on the RL stage's generation engines.

Eval does not carry a decoding loop of its own: it drives the engines the RL
stage samples its rollouts with (``quarl.engine.make_generator``): the
reference :class:`quarl.engine.rollout.HFGenerator` (left padding, RoPE positions
that skip the padding, static or dynamic KV cache, per-row stop at EOS, top-p)
and, on a GPU, the CUDA-graph :class:`quarl.engine.FastGenerator` that samples
from the same nucleus. So "the model eval scored" and "the model RL trained"
decode identically, quantized layers and LoRA included. Any other
:class:`~quarl.engine.rollout.Generator` can be passed in.

What this module adds is the evaluation side:

* **batching by length.** Prompts are sorted longest-first and cut into
  batches of ``batch_size`` sequences (``batch_size // n`` prompts x ``n``
  samples), so a batch pads to similar lengths; results are put back in the
  original order. The first batch is the longest, so an out-of-memory shows at
  once, not after an hour.
* **greedy decoding** through the rollout sampler's interface, which refuses
  ``temperature = 0`` on purpose (it must return log-probs to train on):
  ``top_p = 1e-9`` makes the nucleus the single most likely token (its mass
  alone is ``>= 1/V``), valid for any correct top-p sampler and recognised by
  the fast engine as a plain argmax. The reference engine would sort the
  ``[B, V]`` logits for that nucleus every step -- as costly as a small decode
  step on CPU -- so for it greedy is the ``temperature -> 0`` limit instead:
  at ``T = 1e-8`` the softmax of ``logits / T`` is exactly one-hot in float32
  whenever the top two logits differ by more than ~1e-6 (``exp(-1e-6 / 1e-8)``
  underflows to 0), below float32's resolution at the magnitude logits have,
  and ``top_p = 1`` skips the sort. Exact ties (real in bf16 logits) are broken
  by the seeded draw instead of by index.
* **progress** with tqdm: sequences done, generated tokens per second.
* **decoding** each completion to text (special tokens dropped), with its
  token count and whether it hit ``max_new_tokens``.

Seeding: one ``torch.Generator`` seeded from ``sampling.seed`` drives every
draw of a benchmark, so a run is reproducible for a given config and batch
size (changing the batch size changes which draw each row gets).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from quarl.engine.rollout import Generator, HFGenerator, SamplingParams
from quarl.eval.config import SamplingConfig

__all__ = [
    "GREEDY_TEMPERATURE",
    "GREEDY_TOP_P",
    "Completion",
    "sample_completions",
    "sampling_params",
    "stop_token_ids",
]

GREEDY_TEMPERATURE = 1e-8  # reference engine: the T -> 0 limit, no nucleus sort
GREEDY_TOP_P = 1e-9  # any other engine: the top_p -> 0 limit (the fast engine takes an argmax)


@dataclass
class Completion:
    text: str
    tokens: int  # generated tokens, the stop token included
    truncated: bool  # reached max_new_tokens without a stop token


def stop_token_ids(tokenizer, model=None) -> list[int]:
    """EOS ids from the tokenizer and the model's generation config (chat models often list several)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if eos is not None:
        ids.update(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
    if not ids:
        raise ValueError("the tokenizer and model define no EOS token, so generation could never stop; set one")
    return sorted(ids)


def sampling_params(cfg: SamplingConfig, stop_ids: list[int], reference: bool = True) -> SamplingParams:
    """The rollout sampler's parameters for ``cfg``; greedy per engine (module docstring)."""
    if cfg.greedy:
        temperature, top_p = (GREEDY_TEMPERATURE, 1.0) if reference else (1.0, GREEDY_TOP_P)
        return SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=cfg.max_new_tokens,
                              stop_token_ids=stop_ids)  # fmt: skip
    return SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                          stop_token_ids=stop_ids)  # fmt: skip


def sample_completions(
    model,
    tokenizer,
    prompts: list[str],
    cfg: SamplingConfig,
    *,
    generator: Generator | None = None,
    desc: str = "eval",
    progress: bool = True,
) -> tuple[list[list[Completion]], dict]:
    """``n`` completions per prompt -> (``[len(prompts)][n]`` completions, timing stats)."""
    if not prompts:
        raise ValueError("no prompts to generate from")
    n = cfg.n
    stop_ids = stop_token_ids(tokenizer, model)
    if generator is None:
        from quarl.engine import make_generator

        generator = make_generator(model, int(tokenizer.pad_token_id), engine=cfg.engine, cache=cfg.cache)
    engine = generator
    params = sampling_params(cfg, stop_ids, reference=isinstance(engine, HFGenerator))
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]  # list[list[int]]
    empty = [i for i, x in enumerate(ids) if not x]
    if empty:
        raise ValueError(f"{len(empty)} prompt(s) tokenize to nothing (first: #{empty[0]}); check the template")
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # longest first
    per_batch = max(1, cfg.batch_size // n)  # prompts per batch
    rng = torch.Generator(device=_device(model)).manual_seed(cfg.seed)

    out: list[list[Completion] | None] = [None] * len(prompts)
    total_tokens, t0 = 0, time.perf_counter()
    bar = tqdm(total=len(prompts) * n, desc=desc, unit="seq", disable=not progress, dynamic_ncols=True)
    try:
        for b in range(math.ceil(len(order) / per_batch)):
            chunk = order[b * per_batch : (b + 1) * per_batch]
            roll = engine.generate([ids[i] for i in chunk], params, n=n, generator=rng)
            comp = roll.completion_ids.cpu()  # [len(chunk) * n, T], rows grouped by prompt
            lengths = roll.lengths.cpu().tolist()  # [len(chunk) * n]
            truncated = roll.truncated.cpu().tolist()
            texts = tokenizer.batch_decode(
                [comp[r, : lengths[r]] for r in range(comp.shape[0])], skip_special_tokens=True
            )
            for j, i in enumerate(chunk):
                rows = range(j * n, (j + 1) * n)
                out[i] = [Completion(texts[r], int(lengths[r]), bool(truncated[r])) for r in rows]
            total_tokens += sum(lengths)
            bar.update(len(chunk) * n)
            bar.set_postfix(tok_s=f"{total_tokens / max(time.perf_counter() - t0, 1e-9):.1f}")
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    stats = {
        "seconds": round(seconds, 2),
        "generated_tokens": int(total_tokens),
        "tokens_per_second": round(total_tokens / max(seconds, 1e-9), 2),
    }
    return out, stats  # type: ignore[return-value]


def _device(model) -> torch.device:
    """Where the sampling RNG must live: the model's device (cpu for an external engine)."""
    params = getattr(model, "parameters", None)
    if params is None:
        return torch.device("cpu")
    return next(params(), torch.zeros(0)).device
