"""The Triton weight-only GEMMs as entries for ``quarl.quant.dispatch``.

``kernel_specs()`` describes one kernel per
format -- NVFP4, MXFP4 and INT4 (group-wise, symmetric or not). Each predicate
accepts a call only when the kernel computes the same function as the
reference path and can run:

  * a CUDA tensor in bf16 (fp16 / fp32 activations keep the reference path:
    the tensor-core operand would round them to bf16);
  * compute capability >= 8.0 (``fma.rn.bf16x2``); the kernels are tuned for
    sm_90, and Triton must be importable;
  * a frozen layer whose buffers sit on the activation's device, with
    K % 8 == 0 and a block / group size that is a multiple of 8 (a 32-bit word
    of 8 codes never straddles two scales), FP4 bytes 4-aligned (read as int32),
    and the scale dtypes the formats produce.

Anything else falls through to the reference (dequantize, then matmul), so
enabling the kernels can never change which inputs are accepted.

The dependency points one way: ``quarl.quant.dispatch.load_kernels`` imports this
package and registers what ``kernel_specs()`` lists; nothing here imports the
dispatcher (it used to call back into it, an import circle).
"""

from __future__ import annotations

import functools
import importlib.util

import torch

KERNEL_PRIORITY = 10


@functools.cache
def _capable(index: int) -> bool:
    return importlib.util.find_spec("triton") is not None and torch.cuda.get_device_capability(index) >= (8, 0)


def _shapes_ok(layer, block: int) -> bool:
    return layer.in_features % 8 == 0 and block % 8 == 0 and layer.in_features % block == 0


def applies(x: torch.Tensor, layer) -> bool:
    """True when the Triton kernel computes this call (see the module docstring)."""
    if not x.is_cuda or x.dtype != torch.bfloat16 or getattr(layer, "mode", "frozen") != "frozen":
        return False
    cfg = layer.config
    if cfg is None or x.shape[-1] != layer.in_features or not _capable(x.device.index or 0):
        return False
    packed = getattr(layer, "weight_packed", None)
    if packed is None or packed.device != x.device or not packed.is_contiguous():
        return False
    scale = layer.weight_scale
    if cfg.name == "nvfp4":
        ok = (scale.dtype == torch.float8_e4m3fn and packed.dtype == torch.uint8
              and getattr(layer, "weight_global_scale", None) is not None and _shapes_ok(layer, cfg.block_size))
    elif cfg.name == "mxfp4":
        ok = scale.dtype == torch.uint8 and packed.dtype == torch.uint8 and _shapes_ok(layer, cfg.block_size)
    elif cfg.name == "int":
        ok = (cfg.bits == 4 and packed.dtype == torch.int32 and scale.is_floating_point()
              and _shapes_ok(layer, cfg.group_size))
    else:
        return False
    return ok and packed.data_ptr() % 4 == 0 and scale.device == x.device


def forward(x: torch.Tensor, layer) -> torch.Tensor:
    """``dispatch.KernelFn``: x [..., K] -> y [..., N] through ``torch.ops.quarl.wo_linear``'s kernels: the custom
    op under ``torch.compile``, else called directly (``ops.WoLinearEager`` when a backward will follow: the op's
    autograd without its dispatch cost). A large-M call whose backward will need ``dy @ W`` keeps its dense BF16
    weight for it (``recent_weights``)."""
    from quarl_kernels import recent_weights
    from quarl_kernels.ops import WoLinearEager, _wo_linear_cuda, layer_args

    args = layer_args(layer)
    if torch.compiler.is_compiling():
        return torch.ops.quarl.wo_linear(x, *args)
    grad = x.requires_grad and torch.is_grad_enabled()
    with recent_weights.keeping(grad):
        return WoLinearEager.apply(x, *args) if grad else _wo_linear_cuda(x, *args)


def forward_epilogue(x: torch.Tensor, layer, a: torch.Tensor | None, b: torch.Tensor | None,
                     scaling: float, gate: torch.Tensor | None = None) -> torch.Tensor:
    """``dispatch.EpilogueFn``: ``x @ W^T + layer.bias + scaling * a @ b^T`` through
    ``torch.ops.quarl.wo_linear_epilogue`` (the bias and the LoRA branch added in the GEMM's last pass).
    No autograd: inference only (the rollout engine's decode and prefill). ``a [..., r]`` may be a
    column slice; ``b [N, r]``. ``gate [..., N]``: ``silu(gate) * y`` instead (the MLP's up projection)."""
    from quarl_kernels.ops import layer_args

    return torch.ops.quarl.wo_linear_epilogue(x, *layer_args(layer), layer.bias, a, b, float(scaling), gate)


def forward_epilogue_a(x: torch.Tensor, layer, a_w: torch.Tensor, a_lo: int, b: torch.Tensor,
                       scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``dispatch.EpilogueAFn``: :func:`forward_epilogue` for the first projection of a LoRA group that also
    computes the group's ``x @ a_w^T`` inside its launch (``torch.ops.quarl.wo_linear_epilogue_a``): returns
    ``(y, parts)``, ``parts [S, ..., R]`` fp32 split partials whose column slices the group's other projections
    pass to :func:`forward_epilogue` as ``a``."""
    from quarl_kernels import lora_a
    from quarl_kernels.ops import layer_args

    k = layer.in_features
    return torch.ops.quarl.wo_linear_epilogue_a(x, *layer_args(layer), layer.bias, a_w, int(a_lo), b, float(scaling),
                                               lora_a.splits_for(k, x.numel() // k))


def forward_group(x: torch.Tensor, layers: list, a_w: torch.Tensor, bs: list, scalings: list,
                  gate_act: bool = False, rope: tuple | None = None) -> list[torch.Tensor] | None:
    """``dispatch.GroupFn``: a packed LoRA group's projections that read the same ``x`` (q/k/v, gate/up), each
    ``x @ W_j^T + bias_j + scaling_j * a_j @ B_j^T`` with ``a = x @ a_w^T`` computed by the same launch
    (``lora_a``) -- one GEMV launch for the group's weights at one row (``wo_gemm.wo_matmul_group``). ``gate_act``:
    the second output is ``silu(out_0) * out_1``. ``rope = (cos, sin, k_cache, v_cache, slot)`` (q/k/v at a decode
    step, ``group_pass.RopeCache``): returns ``[q_rot]`` with k / v written into the caches -- or None, computing
    nothing, where no group launch serves ``x`` (the caller then runs the group and its RoPE as usual). Inference
    only (no autograd, no custom op: the engine calls it outside ``torch.compile``)."""
    from quarl_kernels import lora_a
    from quarl_kernels.group_pass import RopeCache
    from quarl_kernels.launch import Epilogue
    from quarl_kernels.ops import _packed_weight, layer_args
    from quarl_kernels.wo_gemm import group_route, wo_matmul_group

    k = layers[0].in_features
    x2 = x.reshape(-1, k)
    x2 = x2 if x2.stride(1) == 1 else x2.contiguous()
    pws = [_packed_weight(*layer_args(lay)) for lay in layers]
    r = bs[0].shape[-1]
    if group_route(x2, pws) is None:  # one launch each, through the custom ops (the A GEMM in the first)
        if rope is not None:
            return None
        y0, parts = forward_epilogue_a(x, layers[0], a_w, 0, bs[0], scalings[0])
        return [y0] + [forward_epilogue(x, lay, parts[..., j * r:(j + 1) * r], bs[j], scalings[j],
                                        gate=y0 if gate_act and j == 1 else None)
                       for j, lay in enumerate(layers) if j > 0]
    la = lora_a.new_partials(x2, a_w)
    epis = [Epilogue(lay.bias, la.out[..., j * r:(j + 1) * r], bs[j], float(scalings[j]),
                     lora_a=la if j == 0 else None) for j, lay in enumerate(layers)]
    ys = wo_matmul_group(x2, pws, epis, gate_act=gate_act, rope=None if rope is None else RopeCache(*rope))
    return [y.reshape(*x.shape[:-1], y.shape[-1]) for y in ys]


def dense_weight(layer) -> torch.Tensor:
    """``dispatch.Kernel.dense_weight``: the BF16 ``[N, K]`` copy the dense path (``dense.py``) decodes for this layer at
    every large-M call, made once (a trainer holds it through a phase: ``quarl.train.dequant_cache``)."""
    from quarl_kernels.dense import dequantize
    from quarl_kernels.ops import _packed_weight, layer_args

    return dequantize(_packed_weight(*layer_args(layer)))


def dense_route(x: torch.Tensor, layer) -> bool:
    """``dispatch.Kernel.dense_route``: whether :func:`forward` runs this call (and its backward) as the dense path's
    plain BF16 product on :func:`dense_weight` (``wo_gemm.dense_route``)."""
    from quarl_kernels.ops import _packed_weight, layer_args
    from quarl_kernels.wo_gemm import dense_route as route

    return route(x.reshape(-1, layer.in_features), _packed_weight(*layer_args(layer)))


def kernel_specs() -> list[dict]:
    """The kernels for ``quarl.quant.dispatch.Kernel(**spec)``: name, format, fn, applies, priority, epilogue,
    epilogue_a, group, dense_weight, dense_route."""
    return [{"name": f"triton-wo-{fmt}", "format": fmt, "fn": forward, "applies": applies, "priority": KERNEL_PRIORITY,
             "epilogue": forward_epilogue, "epilogue_a": forward_epilogue_a, "group": forward_group,
             "dense_weight": dense_weight, "dense_route": dense_route}
            for fmt in ("nvfp4", "mxfp4", "int")]
