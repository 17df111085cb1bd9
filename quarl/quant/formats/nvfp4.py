"""NVFP4: E2M1 elements, 16-element blocks along K, FP8-E4M3 block scales,
one FP32 global scale per tensor -- byte-compatible with compressed-tensors'
``nvfp4-pack-quantized`` format (what vLLM and llm-compressor read and write).

Two-level scaling. A plain E4M3 block scale ``amax_block / 6`` would waste
most of E4M3's range (and underflow for small weights), so the tensor gets a
global scale that stretches the largest block scale onto E4M3's maximum:

    gs        = 448 * 6 / amax(|W|)                 (fp32; stored as-is)
    s[n, b]   = e4m3( gs * amax(|W[n, block b]|) / 6 )   (stored)
    code      = e2m1( W / (s / gs) )                 (stored, 2 per byte)
    W_hat     = e2m1_value(code) * (s / gs)

Note the stored ``weight_global_scale`` is the *reciprocal* of the "global
scale" in NVIDIA's papers (they multiply by amax/2688); we follow
compressed-tensors (``generate_gparam``, ``calculate_qparams``,
``NVFP4PackedCompressor``) exactly, including its corner cases, so that a
quarl checkpoint is bit-identical to one produced by llm-compressor's RTN path:

  * an all-zero tensor gets gs = 1 (the division overflows; nan_to_num -> 1);
  * a block whose E4M3 scale is 0 (an all-zero block, or one so small that
    the scale underflows E4M3) gets scale 0.125 (compressed-tensors' FP8
    "eps"); its elements then round to 0, so no NaN and no blow-up;
  * all arithmetic is fp32, and the element divisor is ``s / gs`` computed
    once, then ``W / divisor`` -- the same rounding sequence, so ties land on
    the same codes.

Inputs of any float dtype are upcast to fp32 first. For fp32 weights this is
exactly compressed-tensors' computation; for bf16 weights llm-compressor may
form ``amax / 6`` in bf16, which can move a block scale by one E4M3 step --
both checkpoints load the same way, ours is the slightly more accurate one.

Fused shards. vLLM fuses q/k/v (and gate/up) into one GEMM with ONE global
scale; ``shared_global_state(shards)`` returns the state to pass to
``quantize(w, cfg, state=...)`` for each shard (amax over all shards, i.e.
the same value as llm-compressor's min over the per-shard global scales).

Frozen block scales: a ``state`` that also carries ``weight_scale`` (a QTensor's E4M3 scales)
makes ``quantize`` and ``fake_quant`` round onto that grid instead of recomputing it from the
weight -- QAT from a calibrated (e.g. GPTQ) model keeps the calibrated grid, so its step 0 is
the calibrated model exactly.

GPTQ hooks: ``tensor_state`` fixes gs; ``block_scales`` gives the E4M3 scale
of each row of one 16-column group; ``qdq_with_scales`` rounds 1..16 columns
with those scales frozen. Applied group by group to unchanged weights this
equals ``fake_quant`` bit for bit (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from quarl.quant.base import Format, FormatConfig, QTensor, QuantError, cat_group_scales, check_weight, register
from quarl.quant.formats.fp4 import (
    E2M1_MAX,
    blocks,
    check_fp4_block,
    decode_e2m1,
    e2m1_codes_signed,
    encode_e2m1,
    pack_fp4,
    qdq_e2m1,
    unpack_fp4,
)

FP8_E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_SCALE_EPS = 0.125  # compressed-tensors' replacement for a zero E4M3 scale
TENSOR_NAMES = ("weight_packed", "weight_scale", "weight_global_scale")


@dataclass(frozen=True)
class NVFP4Config(FormatConfig):
    """NVFP4 weights. ``block_size`` 16 is the format (vLLM/compressed-tensors
    load only 16); other even sizes are allowed for experiments."""

    name: ClassVar[str] = "nvfp4"
    block_size: int = 16

    def __post_init__(self) -> None:
        check_fp4_block("nvfp4", self.block_size, 16)

    @property
    def bits(self) -> float:
        return 4


def _global_scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """compressed-tensors ``generate_gparam``: 448*6/amax in fp32, shape [1]."""
    amax = amax.float().clamp(min=torch.finfo(torch.float32).tiny)
    gs = (FP8_E4M3_MAX * E2M1_MAX) / amax
    return torch.nan_to_num(gs, nan=1.0, posinf=1.0, neginf=1.0).reshape(1)


def shared_global_state(weights: list[torch.Tensor]) -> dict:
    """One global scale for shards that vLLM fuses into one GEMM (q/k/v, gate/up).

    Pass the result as ``state=`` to ``quantize``/``fake_quant`` of every shard.
    """
    if not weights:
        raise QuantError("shared_global_state: got no weights; pass the list of shard weights to fuse")
    amax = None
    for i, w in enumerate(weights):
        if not torch.isfinite(w).all():
            raise QuantError(f"shared_global_state: shard {i} has NaN/Inf values; fix the checkpoint first")
        a = w.detach().abs().amax().float()
        amax = a if amax is None else torch.maximum(amax, a.to(amax.device))
    return {"global_scale": _global_scale_from_amax(amax)}


def _global_scale(state: dict, device: torch.device, check: bool = True) -> torch.Tensor:
    """The state's global scale as fp32 [1]; ``check=False`` skips the value check (a device sync) on
    hot paths whose state was built by ``tensor_state``/``shared_global_state`` or read from a checkpoint."""
    if "global_scale" not in state:
        raise QuantError(
            f"nvfp4: state has no 'global_scale' (keys: {sorted(state)}); "
            f"build it with NVFP4.tensor_state(w, cfg) or shared_global_state([...])"
        )
    gs = torch.as_tensor(state["global_scale"], dtype=torch.float32, device=device).reshape(-1)
    if gs.numel() != 1 or (check and (not torch.isfinite(gs).all() or (gs <= 0).any())):
        raise QuantError(f"nvfp4: global_scale must be one finite positive number, got {gs.tolist()}")
    return gs


def _e4m3_scales(amax: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    """Block amax (any shape, fp32) -> E4M3 block scales (``calculate_qparams``)."""
    s = gs * (amax / E2M1_MAX)
    s = s.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).float()  # round to E4M3
    return torch.where(s == 0, FP8_SCALE_EPS, s).to(torch.float8_e4m3fn)


def _divisor(scale_fp8: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    return scale_fp8.float() / gs  # effective per-block step for E2M1 values


class NVFP4(Format):
    name = "nvfp4"
    config_cls = NVFP4Config

    def _check_cfg(self, cfg: FormatConfig) -> NVFP4Config:
        if not isinstance(cfg, NVFP4Config):
            raise QuantError(f"nvfp4: expected an NVFP4Config, got {type(cfg).__name__}; use make_config('nvfp4')")
        return cfg

    def tensor_state(self, w: torch.Tensor, cfg: FormatConfig) -> dict:
        return {"global_scale": _global_scale_from_amax(w.detach().abs().amax())}

    def _prepare(self, w: torch.Tensor, cfg: FormatConfig, state: dict | None, check: bool = True):
        cfg = self._check_cfg(cfg)
        check_weight(w, cfg.block_size, self.name, finite=check)
        w32 = blocks(w.detach().float(), cfg.block_size)  # [N, G, B]
        state = self.tensor_state(w, cfg) if state is None else state
        gs = _global_scale(state, w.device, check)  # [1]
        if "weight_scale" in state:  # frozen block scales (QAT that keeps a calibrated grid)
            scale = state["weight_scale"]
            if tuple(scale.shape) != tuple(w32.shape[:2]) or scale.dtype != torch.float8_e4m3fn:
                raise QuantError(f"nvfp4: state weight_scale must be float8_e4m3fn {tuple(w32.shape[:2])}, got "
                                 f"{scale.dtype} {tuple(scale.shape)}")
        else:
            scale = _e4m3_scales(w32.abs().amax(-1), gs)  # [N, G] e4m3
        return cfg, w32, gs, scale

    def quantize(self, w: torch.Tensor, cfg: FormatConfig, *, state: dict | None = None) -> QTensor:
        cfg, w32, gs, scale = self._prepare(w, cfg, state)
        codes = encode_e2m1(w32 / _divisor(scale, gs)[..., None])  # [N, G, B] uint8
        packed = pack_fp4(codes.flatten(-2))  # [N, K/2]
        tensors = {"weight_packed": packed, "weight_scale": scale, "weight_global_scale": gs}
        return QTensor(cfg, (w.shape[0], w.shape[1]), tensors)

    def dequantize(self, q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        missing = [k for k in TENSOR_NAMES if k not in q.tensors]
        if missing:
            raise QuantError(f"nvfp4: QTensor lacks {missing}; it was not produced by the nvfp4 format")
        n, k = q.shape
        b = q.config.block_size
        packed, scale = q.tensors["weight_packed"], q.tensors["weight_scale"]
        if tuple(packed.shape) != (n, k // 2) or tuple(scale.shape) != (n, k // b):
            raise QuantError(
                f"nvfp4: tensor shapes {tuple(packed.shape)}/{tuple(scale.shape)} do not match "
                f"weight {q.shape} with block {b}; the QTensor is corrupt"
            )
        gs = _global_scale({"global_scale": q.tensors["weight_global_scale"]}, packed.device)
        vals = blocks(decode_e2m1(unpack_fp4(packed)), b)  # [N, G, B] fp32
        return (vals * _divisor(scale, gs)[..., None]).flatten(-2).to(dtype)

    def fake_quant(self, w: torch.Tensor, cfg: FormatConfig, *, state: dict | None = None) -> torch.Tensor:
        """STE fake quantization; forward values equal ``dequantize(quantize(w))`` exactly.

        No value checks (device syncs) here: this runs for every layer in every QAT forward; a
        non-finite weight shows up in the loss, which the trainers check, and ``quantize`` checks."""
        cfg, w32, gs, scale = self._prepare(w, cfg, state, check=False)
        q = qdq_e2m1(w32, _divisor(scale, gs)[..., None]).flatten(-2).to(w.dtype)  # [N, K]
        # q + (w - w.detach()) is q bit for bit in forward, identity in backward.
        return q + (w - w.detach()) if w.requires_grad else q

    # --- GPTQ hooks --------------------------------------------------------
    def block_scales(self, w_block: torch.Tensor, cfg: FormatConfig, state: dict) -> torch.Tensor:
        """E4M3 scales ``[N, 1]`` of one aligned ``[N, block_size]`` group."""
        cfg = self._check_cfg(cfg)
        if w_block.dim() != 2 or w_block.shape[1] != cfg.block_size:
            raise QuantError(f"nvfp4: block_scales needs an [N, {cfg.block_size}] group, got {tuple(w_block.shape)}")
        gs = _global_scale(state, w_block.device)
        return _e4m3_scales(w_block.detach().float().abs().amax(-1, keepdim=True), gs)

    def qdq_with_scales(
        self, w_cols: torch.Tensor, scales: torch.Tensor, cfg: FormatConfig, state: dict
    ) -> torch.Tensor:
        cfg = self._check_cfg(cfg)
        if w_cols.dim() != 2 or not 1 <= w_cols.shape[1] <= cfg.block_size:
            raise QuantError(
                f"nvfp4: qdq_with_scales takes [N, 1..{cfg.block_size}] columns, got {tuple(w_cols.shape)}"
            )
        gs = _global_scale(state, w_cols.device, check=False)  # once per column: block_scales checked it
        div = _divisor(scales.reshape(-1, 1), gs)  # [N, 1]
        return qdq_e2m1(w_cols, div).to(w_cols.dtype)

    # --- owned here as well: the GPTQ packer and the compressed-tensors mapping -----------------
    def pack_with_scales(self, cfg: FormatConfig, q: torch.Tensor, scales: list, state: dict) -> dict:
        gs = _global_scale(state, q.device)  # [1]
        scale = cat_group_scales(scales)  # [N, G] float8_e4m3fn
        codes = e2m1_codes_signed(blocks(q, cfg.block_size) / _divisor(scale, gs)[..., None])  # [N, G, B]
        return {"weight_packed": pack_fp4(codes.flatten(-2)), "weight_scale": scale, "weight_global_scale": gs}

    def ct_unrepresentable(self, cfg: FormatConfig) -> str | None:
        if cfg.block_size != 16:
            return f"nvfp4 with block_size {cfg.block_size} (compressed-tensors/vLLM load only 16)"
        return None

    def ct_scheme(self, cfg: FormatConfig, targets: list[str]):
        from compressed_tensors.quantization import preset_name_to_scheme

        s = preset_name_to_scheme("NVFP4A16", targets)
        s.format = "nvfp4-pack-quantized"
        return s

    def from_ct_weights(self, w: dict) -> FormatConfig | None:
        hit = (w.get("type"), w.get("num_bits"), w.get("group_size"), w.get("strategy")) == (
            "float", 4, 16, "tensor_group")
        return self.config_cls() if hit else None


NVFP4_FORMAT = register(NVFP4())
