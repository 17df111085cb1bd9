"""``model_info(ref)``: what a model is, without loading its weights.

Reads ``config.json`` and the safetensors *headers* only (a few KB per shard),
so it answers in milliseconds for a 70B checkpoint as well as for SmolLM2.
Parameter counts are of the tensors actually stored: tied embeddings count
once, exactly as ``sum(p.numel() for p in model.parameters())`` does. Tiny
models have no files, so they are built (a fraction of a second) and counted.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

from quarl.models.default import read_metadata
from quarl.models.hf import SUPPORTED_MODEL_TYPES
from quarl.models.tiny import TINY_MODELS, tiny_model


def model_info(ref, trust_remote_code: bool = False) -> dict:
    """Summary of model ``ref`` (any reference :func:`quarl.models.load_model`
    accepts): architecture, shape, parameter count, stored dtypes, size on disk."""
    from quarl.models.loading import resolve_model_dir

    if not isinstance(ref, Path) and str(ref).lower() in TINY_MODELS:
        model, _ = tiny_model(str(ref).lower())
        dtypes = collections.Counter()
        for p in model.parameters():
            dtypes[str(p.dtype).removeprefix("torch.")] += p.numel()
        info = _config_info(model.config.to_dict())
        info.update(ref=str(ref), path=None, params=sum(dtypes.values()), dtypes=dict(dtypes), size_bytes=None)
        return info

    path = resolve_model_dir(ref, trust_remote_code=trust_remote_code)
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    info = _config_info(config)
    params, dtypes = _safetensors_stats(path)
    info.update(
        ref=str(ref),
        path=str(path),
        params=params,
        dtypes=dtypes,
        size_bytes=sum(f.stat().st_size for f in path.rglob("*") if f.is_file()),
        files=sorted(f.name for f in path.iterdir() if f.is_file()),
    )
    meta = read_metadata(path)
    if meta:
        info["provenance"] = meta
    return info


def _config_info(cfg: dict) -> dict:
    text = cfg.get("text_config") or {}
    get = lambda k: cfg.get(k, text.get(k))
    heads = get("num_attention_heads")
    hidden = get("hidden_size")
    return {
        "model_type": cfg.get("model_type"),
        "architectures": cfg.get("architectures"),
        "supported": cfg.get("model_type") in SUPPORTED_MODEL_TYPES,
        "layers": get("num_hidden_layers"),
        "hidden_size": hidden,
        "intermediate_size": get("intermediate_size"),
        "attention_heads": heads,
        "kv_heads": get("num_key_value_heads") or heads,
        "head_dim": get("head_dim") or (hidden // heads if hidden and heads else None),
        "vocab_size": get("vocab_size"),
        "max_position_embeddings": get("max_position_embeddings"),
        "tie_word_embeddings": get("tie_word_embeddings"),
        "config_dtype": str(cfg.get("dtype") or cfg.get("torch_dtype") or "") or None,
        "quantization": (cfg.get("quantization_config") or {}).get("quant_method"),
    }


def _safetensors_stats(path: Path) -> tuple[int, dict[str, int]]:
    """(total elements, {dtype: elements}) over every ``*.safetensors`` in ``path``."""
    from safetensors import safe_open

    dtypes: collections.Counter = collections.Counter()
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in list(st.keys()):
                sl = st.get_slice(name)
                n = 1
                for d in sl.get_shape():
                    n *= d
                dtypes[_dtype_name(sl.get_dtype())] += n
    return sum(dtypes.values()), dict(dtypes)


_ST_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64",
              "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
              "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}  # fmt: skip


def _dtype_name(st_dtype: str) -> str:
    return _ST_DTYPES.get(st_dtype, st_dtype.lower())


def format_info(info: dict) -> str:
    """Human-readable lines for :func:`model_info`'s result."""

    def human(n, unit=""):
        for suffix in ("", "K", "M", "G", "T"):
            if abs(n) < 1000 or suffix == "T":
                return f"{n:.1f}{suffix}{unit}" if suffix else f"{n}{unit}"
            n /= 1000
        return str(n)

    arch = (info.get("architectures") or [None])[0]
    lines = [
        f"model:         {info['ref']}",
        f"path:          {info['path'] or '(built in memory)'}",
        (
            f"architecture:  {arch} (model_type={info['model_type']}, "
            f"{'supported' if info['supported'] else 'NOT supported by quarl'})"
        ),
        (
            f"shape:         {info['layers']} layers, hidden {info['hidden_size']}, mlp {info['intermediate_size']}, "
            f"{info['attention_heads']} heads / {info['kv_heads']} kv heads x {info['head_dim']}, "
            f"vocab {info['vocab_size']}, tied embeddings {info['tie_word_embeddings']}"
        ),
        f"params:        {human(info['params'])} ({info['params']:,})",
        "dtype:         "
        + ", ".join(f"{d} {100 * n / max(info['params'], 1):.0f}%" for d, n in info["dtypes"].items()),
    ]
    if info.get("quantization"):
        lines.append(f"quantization:  {info['quantization']}")
    if info.get("size_bytes") is not None:
        lines.append(f"size on disk:  {human(info['size_bytes'], 'B')} ({info['size_bytes']:,} bytes)")
    prov = info.get("provenance")
    if prov:
        src = prov.get("source", {})
        lines.append(
            f"source:        {src.get('package')} {src.get('package_version')} / {src.get('file')} "
            f"({src.get('quantization')}, dequantized, saved as {prov.get('saved_dtype')})"
        )
    return "\n".join(lines)
