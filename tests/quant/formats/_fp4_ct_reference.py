"""compressed-tensors as the reference for quarl's FP4 formats.

Drives compressed-tensors 0.20 the way llm-compressor's RTN path does for one
nn.Linear: attach a preset scheme ("NVFP4A16" / "MXFP4A16") with
``initialize_module_for_quantization``, compute the weight qparams with its own
``generate_gparam`` (NVFP4's per-tensor global scale) and ``calculate_qparams``
(per-group scales), then ``compress_module`` -- which picks the
nvfp4-/mxfp4-pack-quantized compressor by itself -- and ``decompress_module``.
Kept out of the test files so both FP4 test modules share one reference.
"""

from __future__ import annotations

import torch


def ct_compress(w: torch.Tensor, preset: str) -> tuple[dict[str, torch.Tensor], torch.Tensor, str]:
    """Returns (compressed state dict, decompressed weight, compression format)."""
    from compressed_tensors.compressors.base import compress_module, decompress_module
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.initialize import initialize_module_for_quantization
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=w.dtype)
    lin.weight.data = w.clone()
    scheme = preset_name_to_scheme(preset, ["Linear"])
    initialize_module_for_quantization(lin, scheme)
    args = scheme.weights
    groups = w.unflatten(-1, (w.shape[1] // args.group_size, args.group_size))  # [N, G, B]
    global_scale = None
    if hasattr(lin, "weight_global_scale"):
        global_scale = generate_gparam(w.amin(), w.amax())
        lin.weight_global_scale.data.copy_(global_scale)
    scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), args, global_scale=global_scale)
    lin.weight_scale.data = scale.to(lin.weight_scale.dtype)
    if hasattr(lin, "weight_zero_point"):
        lin.weight_zero_point.data = zero_point
    compress_module(lin)
    compressed = {k: v.detach().clone() for k, v in lin.state_dict().items()}
    fmt = scheme.format.value
    decompress_module(lin)
    return compressed, lin.weight.detach().clone(), fmt


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise tensor equality (dtype, shape and every byte; -0.0 != 0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    ref, approx = ref.double(), approx.double()
    return (10 * torch.log10(ref.pow(2).sum() / (ref - approx).pow(2).sum())).item()
