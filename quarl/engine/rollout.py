"""Rollouts: batched sampling of G answers per prompt with the trainer's own modules.

QeRL's point is that the rollout runs the *quantized* policy (NVFP4 base + LoRA,
with AQN merged into the norms). Here the rollout calls the very ``nn.Module``
the trainer differentiates -- same QuantLinear layers, same norms, same LoRA --
so whatever precision or noise the policy has, the sampler has too. A faster
engine (a paged-KV GPU generator, vLLM) is a drop-in :class:`Generator`: anything
with ``generate(prompts, params, n, generator) -> Rollout``.

:class:`HFGenerator` is the reference engine, a gpt-fast-style loop over the
model's forward with a KV cache:

* prompts are *left*-padded so every row's next token sits in the last column;
  position ids are ``cumsum(mask) - 1`` so padding does not shift RoPE positions
  (the trainer's forward uses the same rule, which is what makes rollout and
  trainer log-probs agree);
* ``cache="static"`` preallocates ``[B, H, P + T, D]`` (transformers'
  ``StaticCache``, the shape ``torch.compile`` and CUDA graphs need);
  ``"dynamic"`` grows the cache (cheaper for short answers on CPU);
* a row stops at its first stop token (EOS, kept in the completion and in the
  loss, so the policy learns to stop); the loop ends when all rows stopped or
  after ``max_new_tokens`` (those rows are marked ``truncated``, which DAPO's
  overlong filter/penalty uses).

Log-probabilities. For each sampled token we keep ``log softmax(logits / T)``, the
log-prob under the tempered distribution *before* top-p truncation -- the same
quantity the trainer recomputes (TRL and verl divide the training logits by the
rollout temperature too), so the ratio and the rollout/trainer mismatch compare
like with like. With QeRL's temperature 1.0 and top-p 1.0 it is exactly the
policy's probability. Top-p < 1 makes the true sampling distribution differ from
the one the ratio uses; that is the usual, documented approximation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

# vLLM's knob (max_num_batched_tokens): prompt tokens the fast engine's prefill takes in one pass (whole rows, at
# least one); the rl stage's rollout.max_num_batched_tokens defaults to it
DEFAULT_MAX_NUM_BATCHED_TOKENS = 16384


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop_token_ids: list[int] = field(default_factory=list)

    def validate(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"rollout temperature must be > 0 (greedy decoding has no log-probs to train on), "
                             f"got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Rollout:
    """N sampled answers (groups of G consecutive rows share a prompt)."""

    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P] 1 = real token
    completion_ids: torch.Tensor  # [N, T] right-padded
    completion_mask: torch.Tensor  # [N, T] 1 = generated (up to and including the stop token)
    logprobs: torch.Tensor  # [N, T] rollout-time log-probs of the sampled tokens (0 on padding)
    truncated: torch.Tensor  # [N] bool: hit max_new_tokens without a stop token
    pad_id: int = 0

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def lengths(self) -> torch.Tensor:  # [N]
        return self.completion_mask.sum(dim=1)

    @property
    def input_ids(self) -> torch.Tensor:  # [N, P + T]
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:  # [N, P + T]
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    def select(self, idx: torch.Tensor | list[int]) -> Rollout:
        idx = torch.as_tensor(idx, dtype=torch.long, device=self.prompt_ids.device)
        return Rollout(self.prompt_ids[idx], self.prompt_mask[idx], self.completion_ids[idx],
                       self.completion_mask[idx], self.logprobs[idx], self.truncated[idx], self.pad_id)

    @staticmethod
    def cat(parts: list[Rollout]) -> Rollout:
        """Concatenate rows, re-padding prompts (left) and completions (right) to the widest."""
        if not parts:
            raise ValueError("Rollout.cat needs at least one rollout")
        pad = parts[0].pad_id
        P = max(r.prompt_ids.shape[1] for r in parts)
        T = max(r.completion_ids.shape[1] for r in parts)

        def left(t, width, value):
            return F.pad(t, (width - t.shape[1], 0), value=value)

        def right(t, width, value):
            return F.pad(t, (0, width - t.shape[1]), value=value)

        return Rollout(
            prompt_ids=torch.cat([left(r.prompt_ids, P, pad) for r in parts]),
            prompt_mask=torch.cat([left(r.prompt_mask, P, 0) for r in parts]),
            completion_ids=torch.cat([right(r.completion_ids, T, pad) for r in parts]),
            completion_mask=torch.cat([right(r.completion_mask, T, 0) for r in parts]),
            logprobs=torch.cat([right(r.logprobs, T, 0.0) for r in parts]),
            truncated=torch.cat([r.truncated for r in parts]),
            pad_id=pad,
        )


class Generator(Protocol):
    """A rollout engine. Must sample from the *current* policy (weights, LoRA, AQN noise)."""

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int,
                 generator: torch.Generator | None = None) -> Rollout:
        """Sample ``n`` answers to each prompt (token ids, no padding); rows ordered
        ``[p0 a0, p0 a1, ..., p1 a0, ...]``."""
        ...


def left_pad(prompts: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists -> ``([N, P] ids, [N, P] mask)``, left-padded."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), P), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, P - len(p):] = 1
    return ids.to(device), mask.to(device)


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """RoPE positions that skip left padding: ``[N, L]`` mask -> ``[N, L]`` positions."""
    return (mask.long().cumsum(dim=1) - 1).clamp(min=0)


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering of ``[N, V]`` logits: keep the smallest set with mass >= top_p."""
    if top_p >= 1.0:
        return logits
    sorted_logits, sorted_idx = torch.sort(logits, descending=True, dim=-1)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cum - sorted_logits.softmax(dim=-1) >= top_p  # mass *before* this token already enough
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, sorted_idx, sorted_logits)


class HFGenerator:
    """Reference rollout engine over a transformers causal LM (see module docstring)."""

    def __init__(self, model: nn.Module, pad_id: int, *, cache: str = "static", batch_size: int | None = None):
        if cache not in ("static", "dynamic"):
            raise ValueError(f"rollout cache must be 'static' or 'dynamic', got {cache!r}")
        self.model, self.pad_id, self.cache, self.batch_size = model, pad_id, cache, batch_size

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int,
                 generator: torch.Generator | None = None) -> Rollout:
        params.validate()
        rows = [p for p in prompts for _ in range(n)]  # [N = len(prompts) * n]
        bs = self.batch_size or len(rows)
        was_training = self.model.training
        self.model.eval()
        try:
            parts = [self._generate_rows(rows[i:i + bs], params, generator) for i in range(0, len(rows), bs)]
        finally:
            self.model.train(was_training)
        return Rollout.cat(parts) if len(parts) > 1 else parts[0]

    @torch.no_grad()
    def _generate_rows(self, rows: list[list[int]], params: SamplingParams,
                       generator: torch.Generator | None) -> Rollout:
        from transformers import DynamicCache, StaticCache

        model = self.model
        device = next(model.parameters()).device
        prompt_ids, prompt_mask = left_pad(rows, self.pad_id, device)  # [N, P]
        N, P = prompt_ids.shape
        T = params.max_new_tokens
        if self.cache == "static":
            cache = StaticCache(config=model.config, max_cache_len=P + T)
        else:
            cache = DynamicCache(config=model.config)
        stop = torch.tensor(sorted(set(params.stop_token_ids)) or [-1], device=device)

        tokens = torch.full((N, T), self.pad_id, dtype=torch.long, device=device)
        logps = torch.zeros((N, T), dtype=torch.float32, device=device)
        mask = torch.zeros((N, T), dtype=torch.long, device=device)
        done = torch.zeros(N, dtype=torch.bool, device=device)

        attn = prompt_mask  # grows by one column per step
        pos = position_ids_from_mask(prompt_mask)  # [N, P]
        out = model(input_ids=prompt_ids, attention_mask=attn, position_ids=pos, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        next_pos = pos[:, -1:] + 1  # [N, 1]
        steps = 0
        for t in range(T):
            logits = out.logits[:, -1, :].float() / params.temperature  # [N, V]
            logp_all = torch.log_softmax(logits, dim=-1)
            probs = top_p_filter(logits, params.top_p).softmax(dim=-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # [N]
            live = ~done
            tokens[:, t] = torch.where(live, tok, torch.full_like(tok, self.pad_id))
            logps[:, t] = torch.where(live, logp_all.gather(1, tok[:, None]).squeeze(1), torch.zeros_like(logps[:, t]))
            mask[:, t] = live.long()
            done = done | (live & torch.isin(tok, stop))
            steps = t + 1
            if bool(done.all()) or t == T - 1:
                break
            attn = torch.cat([attn, torch.ones((N, 1), dtype=attn.dtype, device=device)], dim=1)
            out = model(input_ids=tokens[:, t:t + 1], attention_mask=attn, position_ids=next_pos,
                        past_key_values=cache, use_cache=True)
            next_pos = next_pos + 1
        return Rollout(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=tokens[:, :steps],
            completion_mask=mask[:, :steps],
            logprobs=logps[:, :steps],
            truncated=~done,
            pad_id=self.pad_id,
        )
