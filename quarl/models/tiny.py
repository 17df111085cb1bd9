"""Tiny random causal LMs for unit tests: one per supported architecture.

Every stage is tested on CPU in seconds, so tests need models that have the
real module structure (``q_proj`` ... ``down_proj``, GQA, RMSNorm, RoPE, tied
embeddings, Qwen2's q/k/v biases, Qwen3's q/k norms) and a real tokenizer, but
almost no compute. A tiny model here is 2 layers, hidden 64, MLP 128, 4 query
heads and 2 KV heads of dim 16 (so GQA is exercised), with SmolLM2's tokenizer
and vocabulary (49152) and tied input/output embeddings like SmolLM2. Almost
all of its ~3.3M parameters are the embedding; the linears are 64x64 / 64x128,
which also divide every quantization group size in use (16, 32, 64, 128 along
the 128-wide MLP input).

Weights come from transformers' own initialisation under a fixed seed inside
``torch.random.fork_rng``, so the same ``(kind, seed, vocab_size)`` gives
bit-identical weights in every call and process, and the caller's global RNG
state is left untouched.

The tokenizer comes from the converted default model (see
:mod:`quarl.models.default`): the first use in a fresh cache pays the one-time
~20 s conversion; afterwards it is loaded once per process and deep-copied per
call (so callers may mutate theirs).
"""

from __future__ import annotations

import copy
import functools
import warnings

import torch

from quarl.models.errors import ModelError
from quarl.models.hf import SUPPORTED_MODEL_TYPES, prepare_tokenizer

#: kind -> ``config.model_type``
_KINDS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
#: Names :func:`quarl.models.load_model` accepts for tiny models.
TINY_MODELS: tuple[str, ...] = tuple(f"tiny-{k}" for k in _KINDS)

HIDDEN = 64
INTERMEDIATE = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
MAX_POSITIONS = 2048


def tiny_config(kind: str = "llama", vocab_size: int = 49152, bos_token_id=1, eos_token_id=2, pad_token_id=2):
    """The ``transformers`` config of a tiny model of ``kind`` (llama | qwen2 | qwen3)."""
    from transformers import AutoConfig

    kind = _normalize_kind(kind)
    kwargs = {
        "architectures": [SUPPORTED_MODEL_TYPES[_KINDS[kind]]],
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": MAX_POSITIONS,
        "tie_word_embeddings": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
    }
    if kind != "qwen2":  # Qwen2 derives head_dim = hidden / heads (= 16 too)
        kwargs["head_dim"] = HEAD_DIM
    return AutoConfig.for_model(_KINDS[kind], **kwargs)


def tiny_model(kind: str = "llama", seed: int = 0, vocab_size: int | None = None):
    """A seeded random tiny causal LM and the SmolLM2 tokenizer -> ``(model, tokenizer)``.

    ``kind``: ``"llama"``, ``"qwen2"`` or ``"qwen3"`` (a ``"tiny-"`` prefix is
    accepted). ``vocab_size`` defaults to the tokenizer's (49152); a smaller one
    gives a cheaper model for tests that feed token ids directly, but then the
    tokenizer can emit ids the model does not have (a warning says so).
    The model is float32, on CPU, in eval mode."""
    from transformers import AutoModelForCausalLM

    tokenizer = _smollm2_tokenizer()
    n_tok = len(tokenizer)
    if vocab_size is None:
        vocab_size = n_tok
    elif vocab_size < 1:
        raise ModelError(f"tiny_model: vocab_size must be positive, got {vocab_size}")
    elif vocab_size < n_tok:
        warnings.warn(
            f"tiny_model(vocab_size={vocab_size}) is smaller than the SmolLM2 tokenizer's {n_tok} tokens: "
            f"feed token ids < {vocab_size} directly rather than tokenizing text",
            stacklevel=2,
        )
    config = tiny_config(
        kind,
        vocab_size=vocab_size,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    prepare_tokenizer(tokenizer, model, ref=f"tiny-{_normalize_kind(kind)}")
    return model, tokenizer


def _normalize_kind(kind: str) -> str:
    k = str(kind).lower().removeprefix("tiny-")
    if k not in _KINDS:
        raise ModelError(
            f"unknown tiny model kind {kind!r}; choose one of {', '.join(_KINDS)} ({', '.join(TINY_MODELS)})"
        )
    return k


@functools.lru_cache(maxsize=1)
def _cached_tokenizer():
    from transformers import AutoTokenizer

    from quarl.models.default import default_model_dir

    return AutoTokenizer.from_pretrained(default_model_dir())


def _smollm2_tokenizer():
    return copy.deepcopy(_cached_tokenizer())
