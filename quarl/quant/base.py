"""The contract every weight format implements, and the registry that finds them.

A *format* (NVFP4, MXFP4, NF4, FP8, INT-k) is one module under
``quarl/quant/formats/`` holding a config dataclass and one ``Format`` object.
Everything above this layer -- QuantLinear, calibration (RTN/GPTQ/AWQ), export,
the precision search -- talks to formats only through the methods below, so a
new format is one new module plus one ``register()`` call: the module also owns its
spec grammar (``parse_spec``/``spec_string``), its GPTQ packer (``pack_with_scales``) and
its compressed-tensors mapping (``ct_*``), which the shared layers only dispatch to.

Layout conventions (shared by all formats, and by the GPU kernels):
  * a weight is ``[N, K]`` = ``[out_features, in_features]`` as in nn.Linear;
  * blocks/groups run along K (the reduction dimension), ``block_size`` columns
    each; FP8 blockwise additionally blocks rows (128x128);
  * ``QTensor.tensors`` uses compressed-tensors' parameter names
    (``weight_packed``, ``weight``, ``weight_scale``, ``weight_global_scale``,
    ``weight_zero_point``) so that export is a rename-free copy.

GPTQ needs to quantize one column at a time with scales frozen at the start of
each group; ``tensor_state`` / ``block_scales`` / ``qdq_with_scales`` expose that
without GPTQ knowing anything about the format's number system.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch


class QuantError(ValueError):
    """Bad input to a quantizer: the message names the problem and the fix."""


@dataclass(frozen=True)
class FormatConfig:
    """Base of every format's config. Subclasses are frozen dataclasses."""

    name: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.name, **dataclasses.asdict(self)}

    @property
    def block_size(self) -> int:  # columns of K sharing one scale
        raise NotImplementedError

    @property
    def bits(self) -> float:  # storage bits per weight element, scales excluded
        raise NotImplementedError


@dataclass
class QTensor:
    """A quantized ``[N, K]`` weight: packed payload and scales, on one device."""

    config: FormatConfig
    shape: tuple[int, int]
    tensors: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def to(self, device: torch.device | str) -> QTensor:
        return QTensor(self.config, self.shape, {k: v.to(device) for k, v in self.tensors.items()})

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return get_format(self.config.name).dequantize(self, dtype)


class Format(abc.ABC):
    """One number format. Stateless; all state lives in the config and QTensor."""

    name: ClassVar[str]
    config_cls: ClassVar[type[FormatConfig]]

    @abc.abstractmethod
    def quantize(self, w: torch.Tensor, cfg: FormatConfig, *, state: dict | None = None) -> QTensor:
        """``w`` [N, K] float -> QTensor. ``state`` overrides ``tensor_state(w)``
        (e.g. a global scale shared by fused q/k/v shards)."""

    @abc.abstractmethod
    def dequantize(self, q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """QTensor -> [N, K] tensor of ``dtype``."""

    def fake_quant(self, w: torch.Tensor, cfg: FormatConfig, *, state: dict | None = None) -> torch.Tensor:
        """Quantize-dequantize with a straight-through estimator (grad = identity)."""
        q = self.dequantize(self.quantize(w.detach(), cfg, state=state), w.dtype)
        # q + (w - w.detach()) is bit-exact q in the forward (w + (q - w) can round).
        return q + (w - w.detach())

    # --- hooks for column-wise calibration (GPTQ) ---------------------------
    def tensor_state(self, w: torch.Tensor, cfg: FormatConfig) -> dict:
        """Per-tensor parameters fixed before any block is quantized (e.g.
        NVFP4's global scale). Default: none."""
        return {}

    @abc.abstractmethod
    def block_scales(self, w_block: torch.Tensor, cfg: FormatConfig, state: dict) -> Any:
        """Scales for one aligned group of ``cfg.block_size`` columns ``[N, B]``."""

    @abc.abstractmethod
    def qdq_with_scales(self, w_cols: torch.Tensor, scales: Any, cfg: FormatConfig, state: dict) -> torch.Tensor:
        """Quantize-dequantize ``[N, c]`` columns (c <= block) with frozen scales."""

    # --- what else a format module owns: its spelling, its packer, its compressed-tensors mapping -----
    # (quarl.quant.spec, quarl.quant.pack and quarl.quant.checkpoint ask these; a new format is its
    # module plus its kernel, nothing elsewhere.)
    def parse_spec(self, s: str) -> FormatConfig | None:
        """The config a lower-case spec string names in this format's grammar, else None."""
        return self.config_cls() if s == self.name else None

    def spec_string(self, cfg: FormatConfig) -> str:
        """Inverse of ``parse_spec``: ``parse_spec(spec_string(cfg)) == cfg``."""
        return self.name

    def pack_with_scales(self, cfg: FormatConfig, q: torch.Tensor, scales: list, state: dict) -> dict:
        """``q`` [N, K] exactly on the grid of the frozen per-group ``scales`` (GPTQ) -> QTensor tensors."""
        raise QuantError(f"calibration cannot pack format {self.name!r} yet (no pack_with_scales)")

    def ct_unrepresentable(self, cfg: FormatConfig) -> str | None:
        """None if compressed-tensors can store ``cfg``, else why not."""
        return f"format {self.name!r} has no compressed-tensors mapping"

    def ct_scheme(self, cfg: FormatConfig, targets: list[str]):
        """compressed-tensors ``QuantizationScheme`` (weight-only) for ``cfg``, its ``format`` set."""
        raise QuantError(self.ct_unrepresentable(cfg) or f"format {self.name!r}: no compressed-tensors scheme")

    def from_ct_weights(self, w: dict) -> FormatConfig | None:
        """The config a compressed-tensors ``weights`` args dict describes, if it is this format's; else None."""
        return None

    def to_ct_tensors(self, q: QTensor) -> dict[str, torch.Tensor]:
        """The QTensor's tensors under compressed-tensors' names and layout (default: as stored)."""
        return dict(q.tensors)

    def from_ct_tensors(self, cfg: FormatConfig, shape: tuple[int, int], t: dict) -> dict[str, torch.Tensor]:
        """Inverse of ``to_ct_tensors`` (``weight_shape`` already dropped)."""
        return t


def cat_group_scales(scales: list[torch.Tensor]) -> torch.Tensor:
    """Per-group scales recorded column block by column block (GPTQ) -> one [N, G] tensor."""
    return torch.cat([s.reshape(s.shape[0], -1) for s in scales], dim=1)


_REGISTRY: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    _REGISTRY[fmt.name] = fmt
    return fmt


def _ensure_loaded() -> None:
    if not _REGISTRY:
        import quarl.quant.formats  # noqa: F401  (registers every built-in format)


def available_formats() -> list[str]:
    _ensure_loaded()
    return sorted(_REGISTRY)


def get_format(name: str) -> Format:
    _ensure_loaded()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise QuantError(
            f"unknown quantization format {name!r}; known formats: {', '.join(sorted(_REGISTRY))}"
        ) from None


def check_weight(w: torch.Tensor, block: int, fmt: str, *, finite: bool = True) -> None:
    """Shared input validation: 2-D, K a multiple of the block, finite values (``finite=False``: not
    checked -- the check reads a value back, a device sync, which a training forward must not pay per
    layer; the trainer checks its loss and gradients instead)."""
    if w.dim() != 2:
        raise QuantError(f"{fmt}: expected a 2-D weight [out, in], got shape {tuple(w.shape)}")
    if w.shape[1] % block:
        raise QuantError(
            f"{fmt}: in_features={w.shape[1]} is not a multiple of the block size {block}; "
            f"exclude this layer in the quantization recipe or pick a format with a smaller block"
        )
    if finite and not torch.isfinite(w).all():
        bad = (~torch.isfinite(w)).sum().item()
        raise QuantError(f"{fmt}: weight has {bad} NaN/Inf values; fix the checkpoint before quantizing")
