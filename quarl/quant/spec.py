"""Format specs: the short strings (and dicts) that recipes use to name a format.

Recipes are plain data so that a search stage can write them, so every format
must be nameable by a string. Grammar (case-insensitive):

    bf16 | none                 keep the layer in high precision (no QTensor)
    nvfp4                       E2M1, block 16, E4M3 block scales, FP32 global scale
    mxfp4                       E2M1, block 32, E8M0 scales
    nf4[-dq[256]][-b64]         NF4 codebook, block 64, optional double quantization
                                (-dq<n>: n absmax values per second-level block, default 256)
    fp8 | fp8-block[-b128]      E4M3 per-tensor | 128x128 blockwise weights
    int{2,3,4,8}[-g128][-sym]   group-wise integer, asymmetric unless -sym
    w{bits}g{group}             Reasoning-QAT's spelling: w3g128 == int3-g128

Each spelling is parsed by its format's module (``Format.parse_spec`` / ``spec_string``),
so a new format brings its own. A dict ``{"format": "int", "bits": 3, "group_size": 128}`` is also accepted, as
is a FormatConfig instance (returned unchanged). ``spec_string`` is the inverse:
``make_config(spec_string(cfg)) == cfg`` for every config the grammar can express.
"""

from __future__ import annotations

from quarl.quant.base import FormatConfig, QuantError, available_formats, get_format

HIGH_PRECISION = {"bf16", "fp16", "fp32", "none", "full"}


def make_config(spec: str | dict | FormatConfig | None) -> FormatConfig | None:
    """Parse a format spec; ``None`` means "leave this layer in high precision"."""
    if spec is None or isinstance(spec, FormatConfig):
        return spec
    if isinstance(spec, dict):
        d = dict(spec)
        name = str(d.pop("format", d.pop("name", ""))).lower()
        if name in HIGH_PRECISION:
            return None
        cls = get_format(name).config_cls
        try:
            return cls(**d)
        except TypeError as e:
            raise QuantError(f"bad options for format {name!r}: {e}") from None
    if not isinstance(spec, str):
        raise QuantError(f"a format spec must be a string or a dict, got {type(spec).__name__}")
    s = spec.strip().lower()
    if s in HIGH_PRECISION:
        return None
    for name in available_formats():  # each format module owns its spellings (Format.parse_spec)
        cfg = get_format(name).parse_spec(s)
        if cfg is not None:
            return cfg
    raise QuantError(
        f"unknown format spec {spec!r}; use one of bf16, nvfp4, mxfp4, nf4[-dq][-b<block>], fp8, fp8-block, "
        f"int{{2,3,4,8}}[-g<group>][-sym], w<bits>g<group> (registered formats: {available_formats()})"
    )


def spec_string(cfg: FormatConfig | None) -> str:
    """Inverse of make_config for reports and recipes (each format writes its own spelling)."""
    if cfg is None:
        return "bf16"
    return get_format(cfg.name).spec_string(cfg)


def check_format(spec: str | dict | FormatConfig | None, key: str = "format") -> None:
    """Config validation: ``spec`` parses (None/bf16 included); ValueError naming the config key otherwise."""
    try:
        make_config(spec)
    except QuantError as e:
        raise ValueError(f"{key}={spec!r}: {e}") from None
