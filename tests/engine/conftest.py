"""Tiny models for the engine tests, built from quarl's tiny configs without a tokenizer.

A 2048-token vocabulary keeps the LM head (49152 wide in the real tiny models) from
dominating the cost; tests feed token ids directly. ``pad = eos = 2`` as in the configs.
The LM head is *untied*: a tiny random model with tied embeddings greedily repeats its
last prompt token forever, which would make "same tokens as HF" a vacuous check.
"""

from __future__ import annotations

import torch

from quarl.engine.rollout import left_pad
from quarl.models import tiny_config

VOCAB = 2048
PAD = 2


def make_model(kind: str = "llama", seed: int = 0, dtype=torch.float32, device="cpu", rope: dict | None = None):
    """Seeded random tiny ``kind`` model (fp32, eval mode); ``rope`` replaces ``config.rope_parameters``."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(kind, vocab_size=VOCAB)
    cfg.tie_word_embeddings = False
    if rope is not None:
        cfg.rope_parameters = {"rope_theta": cfg.rope_parameters["rope_theta"], **rope}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.to(device).eval()


def prompts(lengths=(5, 11, 2, 8), seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


def hf_greedy(model, rows: list[list[int]], max_new_tokens: int, eos: list[int] | None = None) -> torch.Tensor:
    """HF ``generate(do_sample=False)`` on left-padded rows -> ``[N, T]`` completions (pad after EOS)."""
    dev = next(model.parameters()).device
    ids, mask = left_pad(rows, PAD, dev)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=PAD,
        eos_token_id=eos or None,
        min_new_tokens=0,
    )
    return out[:, ids.shape[1] :]


def full_forward_logprobs(model, roll, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / T)`` of the sampled tokens from one forward over prompt + completion."""
    ids, am = roll.input_ids, roll.attention_mask
    pos = (am.cumsum(1) - 1).clamp(min=0)
    P = roll.prompt_ids.shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=am, position_ids=pos).logits.float()
    lp = torch.log_softmax(logits[:, P - 1 : -1] / temperature, dim=-1)
    return lp.gather(-1, roll.completion_ids[..., None]).squeeze(-1) * roll.completion_mask


def lora_model(kind="qwen2", dtype=torch.float32, fp32_adapter=False, fmt="nvfp4"):
    """A tiny model quantized to ``fmt`` with a rank-4 LoRA whose B is non-zero (so it matters)."""
    from quarl.quant import quantize_model

    model = make_model(kind, dtype=dtype)
    quantize_model(model, {"default": fmt, "lora": {"r": 4, "alpha": 8.0}})
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # make the adapter matter
        torch.manual_seed(5)
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(0, 0.05)
            if fp32_adapter and ("lora_A" in name or "lora_B" in name):
                p.data = p.data.float()  # what quarl.train.policy does
    return model


@torch.no_grad()
def teacher_forced_logits(runner, rows, tokens: torch.Tensor, block: int = 64) -> torch.Tensor:
    """Prefill, then decode feeding ``tokens[:, t]`` with kv lengths in buckets of ``block`` (as the GPU
    graphs do) -> ``[N, T, V]`` fp32: a runner's decode path on fixed tokens, to compare runners."""
    from quarl.engine.rollout import left_pad

    ids, mask = left_pad(rows, PAD, runner.device)
    N, P = ids.shape
    T = tokens.shape[1]
    S = -(-(P + T) // block) * block
    st = runner.new_state(N, S)
    out = [runner.prefill(st, ids, mask)]
    st.pos[:N] = mask.sum(dim=1, keepdim=True)
    st.slot.fill_(P)
    for t in range(T - 1):
        st.tok[:N, 0] = tokens[:, t]
        runner.decode(st, N, min(S, -(-(P + t + 1) // block) * block))
        out.append(st.logits[:N].clone())
        st.slot.add_(1)
        st.pos.add_(1)
    return torch.stack(out, dim=1).float()


def seeded_rollout(model, rows, params, n: int = 2, pad=None, **engine_kw):
    """One ``FastGenerator(model, pad, **engine_kw).generate`` with a CPU generator seeded 0: the reference and
    the variant of an engine comparison sample the same stream."""
    from quarl.engine import FastGenerator

    return FastGenerator(model, pad, **engine_kw).generate(rows, params, n=n, generator=torch.Generator().manual_seed(0))
