"""Conventions quarl applies to every Hugging Face causal LM it touches.

* **Architectures.** Only decoder-only ``llama``, ``qwen2`` and ``qwen3`` models
  are accepted. Quantized linears, GPTQ hooks, LoRA targets and the vLLM export
  all assume their module names (``q_proj`` ... ``down_proj``) and layouts, so
  an unknown architecture fails here with a clear message rather than
  silently producing an unquantized or mis-exported model later.
* **Tokenizers for generation.** RL rollouts and evaluation batch prompts of
  different lengths and generate after them, which needs *left* padding and a
  pad token. Models without one (Llama-style) get ``pad = eos``; the model's
  ``generation_config.pad_token_id`` is set to match so ``generate`` neither
  warns nor guesses.
* **Portable files.** :func:`save_model` writes safetensors (never pickles)
  plus the tokenizer. transformers 5 records ``tokenizer_class:
  "TokenizersBackend"``, which transformers 4.x (still used by some vLLM
  images) cannot resolve; we record the equivalent ``PreTrainedTokenizerFast``,
  which both major versions load from ``tokenizer.json`` identically.
"""

from __future__ import annotations

import json
from pathlib import Path

from quarl.models.errors import ModelError

#: ``config.model_type`` values quarl accepts, with their causal-LM classes.
SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def check_architecture(config, ref: str) -> None:
    """Raise :class:`ModelError` unless ``config`` is a supported causal LM."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(f"{t} ({c})" for t, c in SUPPORTED_MODEL_TYPES.items())
        raise ModelError(
            f"{ref}: unsupported architecture model_type={model_type!r} "
            f"(architectures={getattr(config, 'architectures', None)}); "
            f"quarl supports decoder-only causal LMs of model_type {supported}"
        )


def prepare_tokenizer(tokenizer, model=None, ref: str = "model"):
    """Make ``tokenizer`` ready for batched generation (in place; also returned):
    a pad token (eos if missing) and left padding. If ``model`` is given, its
    generation config learns the pad id."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelError(
                f"{ref}: the tokenizer has neither a pad nor an eos token, so batched generation cannot pad; "
                f"set tokenizer.pad_token (and save it) before using this model"
            )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if model is not None:
        gen = getattr(model, "generation_config", None)
        if gen is not None and gen.pad_token_id is None:
            gen.pad_token_id = tokenizer.pad_token_id
    return tokenizer


def save_model(model, tokenizer, directory: str | Path) -> Path:
    """Save ``model`` (config, generation config, ``*.safetensors``) and
    ``tokenizer`` into ``directory`` (created if needed; existing files with
    the same names are overwritten, others left alone, so this can write into
    an artifact's staging directory). Returns the directory.

    Not atomic by itself: wrap it in ``quarl.artifacts.write_artifact`` (which
    marks the directory complete only after it returns) or write to a temporary
    directory and rename."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)  # safetensors by default; tied weights stored once
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
        _portable_tokenizer_config(out / "tokenizer_config.json")
    return out


def _portable_tokenizer_config(path: Path) -> None:
    if not path.is_file():
        return
    cfg = json.loads(path.read_text())
    if cfg.get("tokenizer_class") == "TokenizersBackend":
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
