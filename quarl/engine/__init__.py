"""quarl.engine: generation for rollouts and eval -- the contract, the reference sampler, the fast engine.

    rollout.Generator / Rollout / SamplingParams   the generation contract every engine meets
    rollout.HFGenerator                            the reference KV-cache sampler (any device)

    FastGenerator(model, pad_id, *, max_batch_size=None, cuda_graphs=None, compile=False,
                  kv_block=256, sync_every=16, keep_cache=True, fused=None, lora_pack=None, compact=None)
        .generate(prompts, params, n, generator) -> quarl.engine.rollout.Rollout
    make_generator(model, pad_id, *, engine="auto", **kw) -> Generator
        "auto": FastGenerator on CUDA for Llama/Qwen2/Qwen3, else the reference HFGenerator
    DecoderRunner(model, fused=None)   the minimal forward over the HF model's own modules (prefill / decode);
        fused: Triton norm/RoPE/SiLU kernels on CUDA bf16 (None: $QUARL_ENGINE_FUSED, default on)
    sample(logits, temperature, top_p, generator) -> (tokens, logprobs);  top_p_mask(logits, top_p)
    lora.LoraPack(layers, dtype)       the adapters of q/k/v and gate/up packed per layer (one A GEMM each),
        refreshed per generation; lora_pack: $QUARL_ENGINE_LORA_PACK, default on

See ``docs/engine.md`` and the module docstrings (``rollout``, ``model``, ``generator``, ``sampling``).
The contract lives here rather than in ``quarl.rl`` because rl, eval and distillation all generate.
"""

from __future__ import annotations

from torch import nn

from quarl.engine.generator import FastGenerator
from quarl.engine.model import SUPPORTED_MODEL_TYPES, DecoderRunner, DecodeState, EngineError
from quarl.engine.rollout import Generator, HFGenerator, Rollout, SamplingParams
from quarl.engine.sampling import GREEDY_TOP_P, sample, top_p_mask

ENGINES = ("auto", "fast", "reference")


def make_generator(
    model: nn.Module,
    pad_id: int,
    *,
    engine: str = "auto",
    cache: str = "static",
    batch_size: int | None = None,
    **fast_kwargs,
):
    """The rollout engine for ``model``: ``"fast"`` (:class:`FastGenerator`), ``"reference"``
    (:class:`quarl.engine.rollout.HFGenerator` with ``cache``), or ``"auto"`` -- fast when the model
    sits on a CUDA device and is a Llama/Qwen2/Qwen3, the reference otherwise (CPU runs keep
    the simple engine). ``batch_size`` caps the rows per forward for either engine."""
    if engine not in ENGINES:
        raise ValueError(f"unknown rollout engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "auto":
        on_cuda = next(model.parameters()).device.type == "cuda"
        mtype = getattr(getattr(model, "config", None), "model_type", None)
        engine = "fast" if on_cuda and mtype in SUPPORTED_MODEL_TYPES else "reference"
    if engine == "fast":
        return FastGenerator(model, pad_id, max_batch_size=batch_size, **fast_kwargs)
    return HFGenerator(model, pad_id, cache=cache, batch_size=batch_size)


__all__ = [
    "ENGINES",
    "GREEDY_TOP_P",
    "SUPPORTED_MODEL_TYPES",
    "DecodeState",
    "DecoderRunner",
    "EngineError",
    "FastGenerator",
    "Generator",
    "HFGenerator",
    "Rollout",
    "SamplingParams",
    "make_generator",
    "sample",
    "top_p_mask",
]
