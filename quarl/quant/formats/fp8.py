"""FP8 E4M3 weights (per-tensor or 128x128 blockwise) and the 1x128 activation quantizer.

Number system: ``torch.float8_e4m3fn`` (max 448, no inf, subnormals down to 2**-9).
Values are scaled into range, clamped to [-448, 448] (saturating; we clamp rather
than rely on the cast's overflow behaviour, which has differed between torch
releases) and cast with torch's round-to-nearest-even.

Granularities
  * ``"tensor"``: one fp32 ``weight_scale`` ``[1]`` = amax(|W|) / 448; ``q = W / s``.
    This is compressed-tensors' FP8 scheme (``float-quantized``; symmetric, scale =
    max|x| / (bit_range / 2) with bit_range = 896), so the dequantized values match
    ``compressed_tensors...fake_quantize`` bit for bit.
  * ``"block"`` (DeepSeek-V3 / Jet-RL): ``weight_scale`` ``[ceil(N/128), ceil(K/128)]``,
    one fp32 scale per 128x128 tile. The last row tile and the last column tile may
    be short (SmolLM2's hidden size is 576 = 4.5 x 128): the tile is treated as if it
    were padded with zeros, which change no amax, so a short tile's scale is its own
    amax / 448 and every full tile is bit-identical to compressed-tensors. Activations
    are quantized on the fly per 1x128 group along K with :func:`quantize_act_1x128`
    (the last group padded the same way); :func:`fake_quant_act_1x128` is the STE
    version. The real FP8 GEMMs of the training flow (forward, DGrad, WGrad) are in
    :mod:`quarl.quant.fp8_linear`.

A scale of 0 (all-zero tensor/tile/group) is replaced by float32 eps, as
compressed-tensors does, so zeros round-trip to exact zeros without NaN.

GPU layouts (verified on an H200 with torch 2.11 + CUDA 13, test marked ``gpu``)::

    y[M, N] = torch.nn.functional.scaled_mm(
        x_fp8 [M, K] row-major,           ScalingType.BlockWise1x128 with x_scale [M, K/128]
                                          stored M-major (stride (1, M)),
        w_fp8.t() [K, N] column-major,    ScalingType.BlockWise128x128 with w_scale [N/128, K/128]
                                          padded to [N/128, L4], L4 = round_up(K/128, 4), then .t(),
        output_dtype=torch.bfloat16)

:func:`cublas_blockwise_scales` builds both scale operands. The L4 padding matters:
the legacy ``torch._scaled_mm`` accepts the unpadded ``[K/128, N/128]`` shape and
silently returns garbage when K/128 is not a multiple of 4. cuBLAS also needs M a
multiple of 4 (M = 5 or 6 is rejected: pad the tokens) and N a multiple of 16; a short
last row tile (N = 272, three scale rows) is accepted. Per-tensor mode passes the two
scalar scales (tensorwise).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from quarl.quant.base import Format, FormatConfig, QTensor, QuantError, check_weight, register

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
_EPS = torch.finfo(torch.float32).eps
ACT_GROUP = 128


@dataclass(frozen=True)
class FP8Config(FormatConfig):
    """FP8 E4M3 weights; ``granularity`` "tensor" (one scale) or "block" (block_size x block_size tiles)."""

    name = "fp8"
    granularity: str = "tensor"
    block_size: int = 128

    def __post_init__(self) -> None:
        if self.granularity not in ("tensor", "block"):
            raise QuantError(f"fp8: unknown granularity {self.granularity!r}; use 'tensor' or 'block'")
        if self.block_size <= 0:
            raise QuantError(f"fp8: block_size must be positive (DeepSeek-V3 uses 128), got {self.block_size}")

    @property
    def bits(self) -> float:
        return 8.0

    @property
    def scale_bits(self) -> float:
        # per-tensor: one fp32 for the whole matrix (negligible)
        return 32 / self.block_size**2 if self.granularity == "block" else 0.0

    @property
    def memory_bits(self) -> float:
        return self.bits + self.scale_bits


def _scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    s = amax.float() / FP8_MAX
    return torch.where(s == 0, torch.full_like(s, _EPS), s)


def _to_fp8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def _row_scales(scales: torch.Tensor, n: int, block: int) -> torch.Tensor:
    """[ceil(N/B), ...] tile scales -> [N, ...] one per row."""
    return scales.repeat_interleave(block, dim=0)[:n]


# --- activations: 1 x 128 groups along K ------------------------------------------
def quantize_act_1x128(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [..., K] -> (``x_fp8`` [..., K] float8_e4m3fn, ``scale`` [..., ceil(K/128)] fp32).

    One scale per token per 128 consecutive K elements, scale = amax / 448 (DeepSeek-V3
    ``act_quant``), so ``x ~= x_fp8 * scale`` group-wise. A K that is not a multiple of
    128 gets a short last group (zero padding, which changes no amax).
    """
    k = x.shape[-1]
    pad = -k % ACT_GROUP
    xf = x.float()
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    xg = xf.unflatten(-1, ((k + pad) // ACT_GROUP, ACT_GROUP))  # [..., ceil(K/128), 128]
    scale = _scale_from_amax(xg.abs().amax(dim=-1))  # [..., ceil(K/128)]
    q = _to_fp8(xg / scale.unsqueeze(-1)).flatten(-2)  # [..., K (+pad)]
    return (q[..., :k] if pad else q), scale


def dequantize_act_1x128(x_fp8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    k = x_fp8.shape[-1]
    pad = -k % ACT_GROUP
    xf = x_fp8.float()
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    xg = xf.unflatten(-1, (scale.shape[-1], ACT_GROUP))
    out = (xg * scale.unsqueeze(-1)).flatten(-2)
    return (out[..., :k] if pad else out).to(dtype)


def fake_quant_act_1x128(x: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize activations per 1x128 group; straight-through gradient."""
    q = dequantize_act_1x128(*quantize_act_1x128(x.detach()), dtype=x.dtype)
    return x + (q - x).detach()


def cublas_blockwise_scales(x_scale: torch.Tensor, w_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(``x_scale`` [M, K/128], ``w_scale`` [N/128, K/128]) -> the scale operands of
    ``F.scaled_mm(..., BlockWise1x128, ..., BlockWise128x128)``: ``x_scale`` M-major,
    ``w_scale`` K-blocks zero-padded to a multiple of 4 and transposed to [L4, N/128]."""
    kb = w_scale.shape[1]
    pad = -kb % 4
    return x_scale.t().contiguous().t(), torch.nn.functional.pad(w_scale, (0, pad)).t()


def fp8_blockwise_matmul_reference(x: torch.Tensor, qweight: QTensor) -> torch.Tensor:
    """Numerics oracle for the FP8 GEMM: ``x`` [..., K] -> [..., N] fp32.

    Quantizes ``x`` per 1x128 group, dequantizes both operands exactly (fp8 * fp32
    scale is exact in fp32 up to one rounding) and multiplies in fp32. A scaled-mm
    kernel computes the same sum with per-K-block partial products, so it agrees up
    to fp32 summation order.
    """
    if qweight.config.name != "fp8":
        raise QuantError(f"fp8_blockwise_matmul_reference needs an fp8 weight, got {qweight.config.name!r}")
    x_dq = dequantize_act_1x128(*quantize_act_1x128(x))  # [..., K]
    return x_dq @ FORMAT.dequantize(qweight, torch.float32).t()


# --- weights -----------------------------------------------------------------------
class FP8Format(Format):
    name = "fp8"
    config_cls = FP8Config

    @staticmethod
    def _check(w: torch.Tensor, cfg: FP8Config) -> None:
        # block: a short last column tile is padded (see the module docstring), so any K is accepted
        check_weight(w, 1, f"fp8-{cfg.granularity}")

    def _tile_scales(self, w: torch.Tensor, cfg: FP8Config) -> torch.Tensor:
        n, k = w.shape
        b = cfg.block_size
        nb, kb = -(-n // b), -(-k // b)
        # pad rows and columns with zeros (they do not change any tile's amax)
        wp = torch.nn.functional.pad(w.float().abs(), (0, kb * b - k, 0, nb * b - n))
        return _scale_from_amax(wp.view(nb, b, kb, b).amax(dim=(1, 3)))  # [ceil(N/B), ceil(K/B)]

    def quantize(self, w: torch.Tensor, cfg: FP8Config, *, state: dict | None = None) -> QTensor:
        self._check(w, cfg)
        n, k = w.shape
        if cfg.granularity == "tensor":
            scale = (state or self.tensor_state(w, cfg))["scale"].to(w.device).reshape(1)
            q = _to_fp8(w.float() / scale)
        else:
            scale = self._tile_scales(w, cfg)  # [N/B, K/B]
            s_full = _row_scales(scale, n, cfg.block_size).repeat_interleave(cfg.block_size, dim=1)[:, :k]  # [N, K]
            q = _to_fp8(w.float() / s_full)
        return QTensor(cfg, (n, k), {"weight": q, "weight_scale": scale})

    def dequantize(self, q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        cfg: FP8Config = q.config  # type: ignore[assignment]
        w, s = q.tensors["weight"].float(), q.tensors["weight_scale"]
        if cfg.granularity == "block":
            s = _row_scales(s, q.shape[0], cfg.block_size).repeat_interleave(cfg.block_size, dim=1)[:, :q.shape[1]]
        return (w * s).to(dtype)

    # --- GPTQ hooks ----------------------------------------------------------
    def tensor_state(self, w: torch.Tensor, cfg: FP8Config) -> dict:
        if cfg.granularity == "block":
            return {}
        self._check(w, cfg)
        return {"scale": _scale_from_amax(w.detach().abs().amax()).reshape(1)}

    def block_scales(self, w_block: torch.Tensor, cfg: FP8Config, state: dict) -> torch.Tensor:
        """Per-tensor: the state's ``[1]`` scale. Block: ``[ceil(N/B)]`` scales of this column tile."""
        if cfg.granularity == "tensor":
            if "scale" not in state:
                raise QuantError("fp8 per-tensor: block_scales needs the state from tensor_state(w, cfg)")
            return state["scale"]
        n, b = w_block.shape
        if b > cfg.block_size:  # the last column tile of a K that is not a multiple of 128 is short
            raise QuantError(f"fp8-block: block_scales expects at most {cfg.block_size} columns, got {b}")
        rb = cfg.block_size
        nb = -(-n // rb)
        wp = torch.nn.functional.pad(w_block.float().abs(), (0, 0, 0, nb * rb - n))
        return _scale_from_amax(wp.view(nb, rb * b).amax(dim=1))  # [N/B]

    def qdq_with_scales(self, w_cols: torch.Tensor, scales: torch.Tensor, cfg: FP8Config, state: dict) -> torch.Tensor:
        s = (
            scales.reshape(1, 1)
            if cfg.granularity == "tensor"
            else _row_scales(scales, w_cols.shape[0], cfg.block_size)[:, None]
        )
        return (_to_fp8(w_cols.float() / s).float() * s).to(w_cols.dtype)

    # --- owned here as well: the spec grammar, the GPTQ packer and the compressed-tensors mapping -----------------
    def parse_spec(self, s: str) -> FormatConfig | None:
        if s in ("fp8", "fp8-tensor"):
            return FP8Config(granularity="tensor")
        m = re.fullmatch(r"fp8-block(?:wise)?(?:-b(\d+))?", s)  # fp8-block[-b128]
        if m:
            return FP8Config(granularity="block", **({"block_size": int(m[1])} if m[1] else {}))
        return None

    def spec_string(self, cfg: FormatConfig) -> str:
        if cfg.granularity == "tensor":
            return "fp8"
        return "fp8-block" + ("" if cfg.block_size == 128 else f"-b{cfg.block_size}")

    def pack_with_scales(self, cfg: FormatConfig, q: torch.Tensor, scales: list, state: dict) -> dict:
        n, _k = q.shape
        if cfg.granularity == "tensor":
            s = state["scale"].to(q.device).reshape(1)
            return {"weight": _to_fp8(q / s), "weight_scale": s}
        tiles = torch.stack([s.reshape(-1) for s in scales], dim=1)  # [N/B, K/B]
        s_full = _row_scales(tiles, n, cfg.block_size).repeat_interleave(cfg.block_size, dim=1)  # [N, K]
        return {"weight": _to_fp8(q / s_full), "weight_scale": tiles}

    def ct_unrepresentable(self, cfg: FormatConfig) -> str | None:
        return None

    def ct_scheme(self, cfg: FormatConfig, targets: list[str]):
        from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

        if cfg.granularity == "tensor":
            args = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="tensor", dynamic=False)
        else:
            args = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="block", dynamic=False,
                                    block_structure=[cfg.block_size, cfg.block_size])
        s = QuantizationScheme(targets=targets, weights=args)
        s.format = "float-quantized"
        return s

    def from_ct_weights(self, w: dict) -> FormatConfig | None:
        if w.get("type") != "float" or w.get("num_bits") != 8:
            return None
        if w.get("strategy") == "tensor":
            return FP8Config(granularity="tensor")
        if w.get("strategy") == "block":
            b = w.get("block_structure") or [128, 128]
            if b[0] != b[1]:
                raise QuantError(f"fp8 block structure {b} is not square; quarl's fp8-block uses square tiles")
            return FP8Config(granularity="block", block_size=b[0])
        return None


FORMAT = register(FP8Format())
