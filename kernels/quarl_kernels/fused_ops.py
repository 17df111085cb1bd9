"""torch.library custom ops for the rollout engine's fused elementwise kernels, and their references.

    rms_norm(x, weight, eps, residual=None, noise=None, fp8_out=False)
        -> y | (y, h) | (y, q, scale) | (y, h, q, scale)
        h = residual + x (the new residual stream, x's dtype); y = RMSNorm(h) with weight
        (weight + noise under AQN); q, scale = quantize_act_1x128(y) (FP8 E4M3, fp32 per 1x128)
    rope_qk(q, k, cos, sin) -> (q_rot, k_rot)        q [B, H, L, D], k [B, H_kv, L, D], cos/sin [B, L, D]
    rope_qk_cache(q, k, v, cos, sin, k_cache, v_cache, slot) -> q_rot
        and k_cache / v_cache [B, H_kv, S, D] at slot [L] (dim 2) get k_rot / v (a decode step's cache write)
    silu_mul(gate, up) -> silu(gate) * up
    decode_attention(q, k, v, valid, scale) -> o    q [B, H_kv, G, D], k/v [B, H_kv, L, D], valid [B, L] bool:
        softmax(scale * q k^T masked by valid) v, the engine's decode-step attention (o [B, H_kv, G, D])

backed by ``torch.ops.quarl.{rms_norm, add_rms_norm, rms_norm_fp8, add_rms_norm_fp8,
rope_qk, rope_qk_cache, silu_mul, decode_attention}`` (one op per output signature: a custom op's schema has a
fixed number of outputs and an output may not alias an input).

Devices. On CUDA, bf16/fp16 inputs (with a weight of the same dtype) run the
Triton kernels (``norm``, ``rope``, ``act``); everything else -- CPU, fp32,
no Triton, compute capability < 8.0, rows longer than ``norm.MAX_N``, a head
dim the attention kernel does not take -- runs the reference below, so an op is correct on any input it accepts. The
references are the numerics oracle: ``rms_norm_reference`` is HF's
``Qwen2RMSNorm.forward`` / ``LlamaRMSNorm.forward`` written out (the CPU test
holds them bit-equal), ``rope_qk`` uses the engine's ``apply_rope``, the FP8
output is ``quarl.quant.formats.fp8.quantize_act_1x128`` itself, and
``decode_attention_reference`` is the engine's SDPA call. The attention kernel
(``decode_attn``, flash-decoding) is not bit-equal to SDPA: it accumulates in fp32
in its own order (see that module).

The ops have fake implementations (they trace through ``torch.compile`` as
opaque nodes and capture in CUDA graphs) and no autograd: they serve inference
(the rollout engine runs under ``no_grad``; ``quarl.engine.fused`` keeps the
PyTorch path whenever a gradient is required).

Importing this module registers the ops; Triton itself is imported only when a
CUDA kernel first runs, so it imports on CPU-only installs.
"""

from __future__ import annotations

import functools
import importlib.util

import torch
import torch.nn.functional as F

_LIB = "quarl"
ACT_GROUP = 128
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
MAX_N = 32768  # == norm.MAX_N (kept here so this module does not import Triton)
DECODE_ATTN_HEAD_DIMS = (64, 128)  # == decode_attn.HEAD_DIMS

# Test seam: run the decode-attention kernel on CPU tensors too (under TRITON_INTERPRET=1, where
# Triton emulates it on the CPU), so the CPU suite can put the kernel itself into the engine.
_ATTN_ON_CPU = False


# --- references ---------------------------------------------------------------------------
def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                       noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, h)``: ``h = residual + x`` (or ``x``), ``y`` = HF RMSNorm of ``h``, line for line."""
    h = x if residual is None else residual + x
    input_dtype = h.dtype
    hs = h.to(torch.float32)
    variance = hs.pow(2).mean(-1, keepdim=True)
    hs = hs * torch.rsqrt(variance + eps)
    w = weight if noise is None else (weight.float() + noise.to(weight.device, torch.float32)).to(weight.dtype)
    return w * hs.to(input_dtype), h


def rope_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """HF's rotary formula op for op (as ``quarl.engine.fused.apply_rope``; kept here so the kernels
    package does not import the engine that imports it). q/k [B, H, L, D], cos/sin [B, L, D]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, L, D]

    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def decode_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor,
                               scale: float) -> torch.Tensor:
    """The engine's decode attention as SDPA computes it: q [B, H_kv, G, D], k/v [B, H_kv, L, D], valid [B, L]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :], scale=scale)


def _quantize_1x128(y: torch.Tensor):
    from quarl.quant.formats.fp8 import quantize_act_1x128

    return quantize_act_1x128(y)


# --- when the Triton kernels run ------------------------------------------------------------
@functools.cache
def _capable(index: int) -> bool:
    return importlib.util.find_spec("triton") is not None and torch.cuda.get_device_capability(index) >= (8, 0)


def kernel_applies(*tensors: torch.Tensor) -> bool:
    """True when the Triton kernels compute a call on these tensors (all CUDA, one bf16/fp16 dtype)."""
    t0 = tensors[0]
    if not t0.is_cuda or t0.dtype not in KERNEL_DTYPES:
        return False
    if any(t.device != t0.device or t.dtype != t0.dtype for t in tensors[1:]):
        return False
    return _capable(t0.device.index if t0.device.index is not None else torch.cuda.current_device())


def _norm_kernel_applies(x, weight, residual, noise) -> bool:
    ts = (x, weight) if residual is None else (x, weight, residual)
    return x.shape[-1] <= MAX_N and kernel_applies(*ts) and (noise is None or noise.device == x.device)


def _norm(x, weight, eps, residual, noise, fp8):
    """Shared body of the four norm ops: ``(y, h, q, scale)`` (h, q, scale None when not asked)."""
    if _norm_kernel_applies(x, weight, residual, noise):
        from quarl_kernels.norm import rms_norm as launch

        return launch(x, weight, eps, residual, noise, fp8)
    y, h = rms_norm_reference(x, weight, eps, residual, noise)
    y = y.contiguous()  # the fake's (and the kernel's) layout
    q, s = _quantize_1x128(y) if fp8 else (None, None)
    return y, (h.contiguous() if residual is not None else None), q, s


def _fake_y(x, weight):
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


def _fake_q(x):
    return (x.new_empty(x.shape, dtype=torch.float8_e4m3fn),
            x.new_empty((*x.shape[:-1], x.shape[-1] // ACT_GROUP), dtype=torch.float32))


def decode_attn_kernel_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> bool:
    """True when the flash-decoding kernel computes this call: q/k/v of one bf16/fp16 dtype on one CUDA
    device (or the CPU test seam), D in ``DECODE_ATTN_HEAD_DIMS``, unit D strides, a bool ``valid`` beside them."""
    if q.dim() != 4 or q.shape[-1] not in DECODE_ATTN_HEAD_DIMS or valid.dtype != torch.bool \
            or valid.device != q.device or any(t.stride(-1) != 1 for t in (q, k, v)):
        return False
    if _ATTN_ON_CPU and not q.is_cuda:
        return (q.dtype in KERNEL_DTYPES and q.dtype == k.dtype == v.dtype and k.device == v.device == q.device
                and importlib.util.find_spec("triton") is not None)
    return kernel_applies(q, k, v)


# --- ops --------------------------------------------------------------------------------------
@torch.library.custom_op(f"{_LIB}::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float, noise: torch.Tensor | None) -> torch.Tensor:
    return _norm(x, weight, eps, None, noise, False)[0]


@_rms_norm_op.register_fake
def _(x, weight, eps, noise):
    return _fake_y(x, weight)


@torch.library.custom_op(f"{_LIB}::add_rms_norm", mutates_args=())
def _add_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                     noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    y, h, _, _ = _norm(x, weight, eps, residual, noise, False)
    return y, h


@_add_rms_norm_op.register_fake
def _(x, residual, weight, eps, noise):
    return _fake_y(x, weight), torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{_LIB}::rms_norm_fp8", mutates_args=())
def _rms_norm_fp8_op(x: torch.Tensor, weight: torch.Tensor, eps: float,
                     noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, _, q, s = _norm(x, weight, eps, None, noise, True)
    return y, q, s


@_rms_norm_fp8_op.register_fake
def _(x, weight, eps, noise):
    return (_fake_y(x, weight), *_fake_q(x))


@torch.library.custom_op(f"{_LIB}::add_rms_norm_fp8", mutates_args=())
def _add_rms_norm_fp8_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, noise: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _norm(x, weight, eps, residual, noise, True)


@_add_rms_norm_fp8_op.register_fake
def _(x, residual, weight, eps, noise):
    return (_fake_y(x, weight), torch.empty_like(x, memory_format=torch.contiguous_format), *_fake_q(x))


@torch.library.custom_op(f"{_LIB}::rope_qk", mutates_args=())
def _rope_qk_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if kernel_applies(q, k, cos, sin) and q.stride(-1) == 1 and k.stride(-1) == 1 and cos.stride(-1) == 1 \
            and sin.stride(-1) == 1:
        from quarl_kernels.rope import rope_qk as launch

        return launch(q, k, cos, sin)
    rq, rk = rope_reference(q, k, cos, sin)
    qo, ko = torch.empty_like(q), torch.empty_like(k)  # the kernel's (and the fake's) output layouts
    return qo.copy_(rq), ko.copy_(rk)


@_rope_qk_op.register_fake
def _(q, k, cos, sin):
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op(f"{_LIB}::rope_qk_cache", mutates_args=("k_cache", "v_cache"))
def _rope_qk_cache_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    if kernel_applies(q, k, v, cos, sin, k_cache, v_cache) and all(
            t.stride(-1) == 1 for t in (q, k, v, cos, sin, k_cache, v_cache)):
        from quarl_kernels.rope import rope_qk_cache as launch

        return launch(q, k, v, cos, sin, k_cache, v_cache, slot)
    rq, rk = rope_reference(q, k, cos, sin)
    k_cache.index_copy_(2, slot, rk)
    v_cache.index_copy_(2, slot, v)
    return torch.empty_like(q).copy_(rq)


@_rope_qk_cache_op.register_fake
def _(q, k, v, cos, sin, k_cache, v_cache, slot):
    return torch.empty_like(q)


@torch.library.custom_op(f"{_LIB}::silu_mul", mutates_args=())
def _silu_mul_op(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if kernel_applies(gate, up):
        from quarl_kernels.act import silu_mul as launch

        return launch(gate, up)
    return silu_mul_reference(gate, up).contiguous()


@_silu_mul_op.register_fake
def _(gate, up):
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{_LIB}::decode_attention", mutates_args=())
def _decode_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor,
                         scale: float) -> torch.Tensor:
    if decode_attn_kernel_applies(q, k, v, valid):
        from quarl_kernels.decode_attn import decode_attention as launch

        return launch(q, k, v, valid, scale)
    return decode_attention_reference(q, k, v, valid, scale).contiguous()  # the kernel's (and the fake's) layout


@_decode_attention_op.register_fake
def _(q, k, v, valid, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


# --- the Python API ---------------------------------------------------------------------------
def _check_norm_args(x, weight, residual, noise, fp8_out) -> None:
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"rms_norm: weight must be [{n}] (x's last dim), got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"rms_norm: residual must match x ({tuple(x.shape)}, {x.dtype}), got "
                         f"{tuple(residual.shape)}, {residual.dtype}; pass the residual stream of the same layer")
    if noise is not None and (noise.shape != (n,) or noise.dtype != torch.float32):
        raise ValueError(f"rms_norm: noise is AQN's fp32 vector [{n}], got {tuple(noise.shape)}, {noise.dtype}; "
                         f"draw it with torch.randn({n}, dtype=torch.float32) * sigma")
    if fp8_out and n % ACT_GROUP:
        raise ValueError(f"rms_norm(fp8_out=True) quantizes per 1x{ACT_GROUP} block: the hidden size must be a "
                         f"multiple of {ACT_GROUP}, got {n}; keep this layer's activations in bf16")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             noise: torch.Tensor | None = None, fp8_out: bool = False):
    """Fused (residual add +) RMSNorm (+ AQN noise) (+ FP8 1x128 quantization) -- see the module docstring.

    Returns ``y``; ``(y, h)`` with ``residual``; ``(y, q, scale)`` / ``(y, h, q, scale)`` with ``fp8_out``."""
    _check_norm_args(x, weight, residual, noise, fp8_out)
    eps = float(eps)
    ops = torch.ops.quarl
    if residual is None:
        return ops.rms_norm_fp8(x, weight, eps, noise) if fp8_out else ops.rms_norm(x, weight, eps, noise)
    if fp8_out:
        return ops.add_rms_norm_fp8(x, residual, weight, eps, noise)
    return ops.add_rms_norm(x, residual, weight, eps, noise)


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """``(apply_rope(q, cos, sin), apply_rope(k, cos, sin))`` in one kernel; q ``[B, H, L, D]``,
    k ``[B, H_kv, L, D]``, cos/sin ``[B, L, D]``."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:] \
            or cos.shape != (q.shape[0], q.shape[2], q.shape[3]) or sin.shape != cos.shape or q.shape[3] % 2:
        raise ValueError(f"rope_qk expects q [B, H, L, D], k [B, H_kv, L, D], cos/sin [B, L, D] with D even, got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}")
    return torch.ops.quarl.rope_qk(q, k, cos, sin)


def rope_qk_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """A decode step's RoPE and K/V cache write in one kernel: returns ``apply_rope(q)``; writes ``apply_rope(k)`` and
    ``v`` into ``k_cache`` / ``v_cache`` ``[B, H_kv, S, D]`` at positions ``slot [L]`` along dim 2 (``index_copy_``)."""
    B, HK, L, D = k.shape
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != B or q.shape[2:] != (L, D) or v.shape != k.shape \
            or cos.shape != (B, L, D) or sin.shape != cos.shape or D % 2 or k_cache.dim() != 4 \
            or k_cache.shape[:2] != (B, HK) or k_cache.shape[3] != D or v_cache.shape != k_cache.shape \
            or slot.shape != (L,) or slot.dtype != torch.long:
        raise ValueError(f"rope_qk_cache expects q [B, H, L, D], k/v [B, H_kv, L, D], cos/sin [B, L, D] with D even, "
                         f"caches [B, H_kv, S, D] and slot [L] int64, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, cos {tuple(cos.shape)}, caches {tuple(k_cache.shape)} / "
                         f"{tuple(v_cache.shape)}, slot {tuple(slot.shape)} {slot.dtype}")
    return torch.ops.quarl.rope_qk_cache(q, k, v, cos, sin, k_cache, v_cache, slot)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` (HF ``ACT2FN['silu']`` then the product) in one kernel."""
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"silu_mul needs gate and up of one shape and dtype, got {tuple(gate.shape)} "
                         f"{gate.dtype} and {tuple(up.shape)} {up.dtype}")
    return torch.ops.quarl.silu_mul(gate, up)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """``softmax(scale * q k^T, masked by valid) v`` for one query position per row (flash-decoding on CUDA):
    q ``[B, H_kv, G, D]``, k/v ``[B, H_kv, L, D]`` (strided views welcome), valid ``[B, L]`` bool -> ``[B, H_kv, G, D]``.
    A row with no valid slot gives zeros from the kernel (SDPA's reference gives NaN there)."""
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3] \
            or valid.shape != (q.shape[0], k.shape[2]) or valid.dtype != torch.bool:
        raise ValueError(f"decode_attention expects q [B, H_kv, G, D], k/v [B, H_kv, L, D], valid [B, L] bool, got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, valid {tuple(valid.shape)} "
                         f"{valid.dtype}")
    return torch.ops.quarl.decode_attention(q, k, v, valid, float(scale))


__all__ = ["DECODE_ATTN_HEAD_DIMS", "decode_attention", "decode_attention_reference", "decode_attn_kernel_applies",
           "kernel_applies", "rms_norm", "rms_norm_reference", "rope_qk", "rope_qk_cache", "rope_reference", "silu_mul",
           "silu_mul_reference"]
