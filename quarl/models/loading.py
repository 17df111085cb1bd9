"""``load_model(ref)``: one entry point from a model reference to ``(model, tokenizer)``.

A reference is resolved to a local directory first, then loaded the same way
whatever its origin, so "works from a local dir" means "works from S3 / the hub":

    "tiny-llama" | "tiny-qwen2" | "tiny-qwen3"   seeded random test models (no directory)
    "default" | "smollm2-135m-instruct"           the embedded SmolLM2, converted once from GGUF
    "s3://bucket/prefix/"                         downloaded via quarl.storage; if it is an
                                                  artifact (manifest.json), opened through
                                                  quarl.artifacts so checksums are verified
    "/path/to/dir" | "./dir" | Path               config.json + *.safetensors + tokenizer
    "org/name"                                    Hugging Face hub (snapshot into the HF cache)

Choices:

* **safetensors only.** ``*.bin`` checkpoints are pickles that can run code on
  load; a directory without safetensors is refused with how to convert it.
* **Architecture checked from config.json before any weight is read**, so a
  wrong model fails in milliseconds (see :mod:`quarl.models.hf`).
* **No remote code** unless ``trust_remote_code=True`` is passed explicitly.
* Local directories that hold a ``manifest.json`` are quarl artifacts: they are
  verified through ``quarl.artifacts.open_artifact`` too, so a truncated copy
  fails with the artifact's own "incomplete/corrupt ... re-run <stage>" error
  instead of a confusing safetensors one.
* ``quarl.storage`` / ``quarl.artifacts`` are imported inside the functions that
  need them: loading local or tiny models never touches boto3. Their errors
  (``StorageError``: endpoint/credentials/bucket; ``ArtifactError``: incomplete
  or corrupt artifact) pass through unchanged, since they already name the fix;
  everything else about the model itself is a :class:`ModelError`.
* A plain ``s3://`` prefix without ``manifest.json`` (uploaded by hand) is
  loaded with a warning: nothing proves it is complete.
* **Big models stream.** ``quantize=recipe`` builds the model on the meta device
  and reads it one decoder layer at a time, quantizing each before the next
  (:mod:`quarl.quant.stream`): the way a 32B base fits one 80 GB GPU. Calibrated
  (quantized) checkpoints are always read that way, straight into packed layers.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from quarl.models.default import DEFAULT_MODEL_ALIASES, cache_dir, default_model_dir
from quarl.models.errors import ModelError
from quarl.models.hf import check_architecture, prepare_tokenizer
from quarl.models.tiny import TINY_MODELS, tiny_model

log = logging.getLogger(__name__)

# "org/name" or "name": what huggingface_hub accepts as a repo id.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# Files a causal LM needs from a hub repo (skips ONNX/GGUF/pickle duplicates).
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken", "*.py"]

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}  # fmt: skip


def load_model(ref, dtype=torch.float32, device="cpu", trust_remote_code: bool = False, quantize=None):
    """Load a causal LM and its tokenizer -> ``(model, tokenizer)``.

    ``ref``: see the module docstring. ``dtype``: a ``torch.dtype``, a name
    (``"bfloat16"``, ``"bf16"``, ...) or ``"auto"`` (the checkpoint's own).
    ``device``: where the model ends up. The model is in eval mode; the
    tokenizer pads on the left with a pad token (eos if it had none).

    ``quantize``: a frozen ``quarl.quant`` recipe (``{"default": "nvfp4"}``, no LoRA) to
    load *streamed*: the model is built on the meta device and filled one decoder layer at
    a time from the safetensors shards, each layer quantized before the next is read, so
    the whole model never exists in ``dtype`` (``quarl.quant.stream``; a 32B model in
    NVFP4 peaks near 23 GiB instead of 61). The result is the model ``load_model`` +
    ``quantize_model(model, quantize)`` gives, byte for byte. A calibrated (quantized)
    checkpoint is always read straight into its packed layers and keeps its own formats
    (``quantize`` is then not applied)."""
    ref_str = os.fspath(ref) if isinstance(ref, os.PathLike) else str(ref)
    torch_dtype = _parse_dtype(dtype)
    if not isinstance(ref, os.PathLike) and ref_str.lower() in TINY_MODELS:
        model, tokenizer = tiny_model(ref_str.lower())
        if torch_dtype != "auto":
            model = model.to(dtype=torch_dtype)
        model = model.to(device)
        if quantize is not None:  # built whole in memory anyway: tiny
            from quarl.quant import quantize_model

            quantize_model(model, quantize)
        return model, tokenizer

    path = resolve_model_dir(ref, trust_remote_code=trust_remote_code)
    return _load_dir(path, ref_str, torch_dtype, device, trust_remote_code, quantize)


def resolve_model_dir(ref, trust_remote_code: bool = False) -> Path:
    """The local directory holding model ``ref`` (downloading or converting it
    if needed). Tiny models have none and raise :class:`ModelError`."""
    if isinstance(ref, os.PathLike):
        return _local_dir(Path(ref), os.fspath(ref))
    ref = str(ref).strip()
    if not ref:
        raise ModelError("empty model reference; pass a local directory, an s3:// URI, a Hugging Face id or 'default'")
    low = ref.lower()
    if low in TINY_MODELS:
        raise ModelError(f"{ref} is built in memory and has no directory; save it with quarl.models.save_model first")
    if low in DEFAULT_MODEL_ALIASES:
        return default_model_dir()
    if low.startswith("s3://"):
        return _fetch_s3(ref)
    local = Path(ref).expanduser()
    if local.exists() or _looks_like_path(ref):
        return _local_dir(local, ref)
    if _HUB_ID.match(ref):
        return _fetch_hub(ref)
    raise ModelError(
        f"cannot interpret model reference {ref!r}: it is not an existing directory, an s3:// URI, "
        f"a Hugging Face id (org/name), 'default' or one of {', '.join(TINY_MODELS)}"
    )


# --------------------------------------------------------------------- resolution


def _looks_like_path(ref: str) -> bool:
    return ref.startswith(("/", "./", "../", "~", ".\\")) or "\\" in ref or ref.count("/") > 1 or ref in (".", "..")


def _local_dir(path: Path, ref: str) -> Path:
    path = path.expanduser()
    if not path.exists():
        raise ModelError(f"model directory {ref} does not exist; pass a directory with config.json and *.safetensors")
    if not path.is_dir():
        hint = " (GGUF files are not loaded directly; convert to safetensors first)" if path.suffix == ".gguf" else ""
        raise ModelError(f"{ref} is a file, not a model directory{hint}; pass the directory holding config.json")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ModelError(f"cannot read model directory {ref} (permission denied); fix its permissions or copy it")
    if (path / "manifest.json").is_file():
        from quarl.artifacts import open_artifact

        path = Path(open_artifact(str(path), kind="model").path)
    return path


def _fetch_s3(uri: str) -> Path:
    """Artifact (has manifest.json) -> open_artifact (download + verify);
    a bare prefix -> download into ``cache_dir()/s3/<bucket>/<key>``, replacing
    any earlier copy atomically so a stale file never mixes in."""
    from quarl.storage import NoSuchKeyError, S3Settings, S3Store, split_s3

    uri = uri.rstrip("/")
    store = S3Store(S3Settings.from_env())
    if store.exists(uri + "/manifest.json"):
        from quarl.artifacts import open_artifact

        return Path(open_artifact(uri, kind="model", store=store).path)
    log.warning("%s has no manifest.json (not a quarl artifact): downloading it without an integrity check", uri)
    bucket, key = split_s3(uri)
    target = cache_dir() / "s3" / bucket / key
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        try:
            store.download_dir(uri, tmp)
        except NoSuchKeyError as e:
            raise ModelError(
                f"no model at {uri}/: nothing is stored under that prefix; check the URI "
                f"(a model prefix holds config.json, *.safetensors and tokenizer files)"
            ) from e
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-old-", dir=target.parent))
            os.rename(target, old / "d")
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _fetch_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS))
    except Exception as e:
        raise ModelError(
            f"could not load {repo_id} from the Hugging Face hub (offline?); pass a local directory or s3:// URI "
            f"(no local directory {repo_id} exists either; hub said {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else '-'})"
        ) from e


# --------------------------------------------------------------------- loading


def _parse_dtype(dtype):
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if isinstance(dtype, str) and dtype.lower().removeprefix("torch.") in _DTYPES:
        return _DTYPES[dtype.lower().removeprefix("torch.")]
    raise ModelError(f"unknown dtype {dtype!r}; use a torch.dtype, 'auto' or one of {', '.join(_DTYPES)}")


def _load_dir(path: Path, ref: str, dtype, device, trust_remote_code: bool, quantize=None):
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (path / "config.json").is_file():
        raise ModelError(f"{ref} ({path}) has no config.json; expected a Hugging Face model directory")
    if not any(path.glob("*.safetensors")):
        pickles = sorted(p.name for p in path.glob("*.bin"))
        hint = (
            f" It has pickle weights {pickles[:3]}, which quarl does not load (they can run code); convert them "
            f"with AutoModelForCausalLM.from_pretrained(dir).save_pretrained(new_dir) in a trusted environment."
            if pickles
            else ""
        )
        raise ModelError(f"{ref} ({path}) has no *.safetensors weights.{hint}")
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise ModelError(f"{ref}: cannot read {path / 'config.json'}: {e}") from e
    check_architecture(config, ref)
    qc = getattr(config, "quantization_config", None)
    if qc is not None:
        if quantize is not None:
            log.info("%s is a quantized checkpoint: loading its packed layers as they are (not re-quantizing)", ref)
        return _load_quantized_dir(path, ref, qc, dtype, device)
    if quantize is not None:
        model = _load_streamed(path, ref, config, quantize, dtype, device)
        return model, load_tokenizer(path, ref, model, trust_remote_code)

    kwargs = {"dtype": dtype, "trust_remote_code": trust_remote_code, "use_safetensors": True}
    if torch.device(device).type != "cpu":
        kwargs["device_map"] = {"": torch.device(device)}  # load straight onto the accelerator
    try:
        model = AutoModelForCausalLM.from_pretrained(path, config=config, **kwargs)
    except Exception as e:
        raise ModelError(f"{ref}: failed to load the weights in {path}: {type(e).__name__}: {e}") from e
    model = model.to(device).eval()
    return model, load_tokenizer(path, ref, model, trust_remote_code)


def load_tokenizer(path: Path, ref: str, model, trust_remote_code: bool):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise ModelError(
            f"{ref}: no usable tokenizer in {path} ({type(e).__name__}: {e}); save the tokenizer beside the "
            f"weights (quarl.models.save_model does both)"
        ) from e
    prepare_tokenizer(tokenizer, model, ref=ref)
    return tokenizer


def _load_streamed(path: Path, ref: str, config, recipe, dtype, device):
    """Layer by layer, quantized as read (``quarl.quant.stream``); a bad checkpoint (missing shard,
    missing tensor, a shape config.json does not describe) is a ModelError naming it."""
    from quarl.quant.checkpoint import CheckpointError
    from quarl.quant.stream import load_streamed

    try:
        model, report = load_streamed(path, config, recipe, dtype, torch.device(device))
    except CheckpointError as e:  # its message names the directory already
        raise ModelError(str(e) if str(e).startswith(str(path)) else f"{ref}: {e}") from None
    model.quarl_load = {"mode": "stream", **(report.build or {})}
    return model


def _load_quantized_dir(path: Path, ref: str, qc, dtype, device):
    """A compressed-tensors checkpoint (what `quarl calibrate` writes): rebuild its QuantLinear
    layers with quarl's own reader, so every stage trains/evaluates the calibrated weights
    through the same modules (transformers' compressed Linear has no ``.weight`` to train on)."""
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    if method != "compressed-tensors":
        raise ModelError(
            f"{ref}: quantization_config.quant_method={method!r} is not supported; quarl reads "
            f"compressed-tensors checkpoints (quarl calibrate / quarl export write them)"
        )
    from quarl.quant.checkpoint import load_quantized

    model, tokenizer = load_quantized(path, device=device, dtype=None if dtype == "auto" else dtype)
    if tokenizer is None:
        raise ModelError(f"{ref}: the quantized checkpoint in {path} has no tokenizer; save it beside the weights")
    model = model.eval()
    prepare_tokenizer(tokenizer, model, ref=ref)
    return model, tokenizer
