"""The engine's fused-kernel switch: Triton kernels for the glue and the decode attention of a decoder step.

Between its projections a HF Llama / Qwen2 / Qwen3 layer runs ~50 small
kernels per decode token: each RMSNorm is ~8 elementwise ops, RoPE on q and k
~20, plus residual adds and ``silu(gate) * up``. In a CUDA-graph decode step at
batch 1 those launches, not the weights, decide the step time once the GEMMs
are 4-bit. The functions here replace them with the ``quarl_kernels.fused_ops``
Triton kernels where that computes the same function, and run the module's own
code (or, for RoPE, the reference :func:`apply_rope`) everywhere else:

    rms_norm(norm, x, residual=None, *, fused)  -> norm(x)  |  (norm(residual + x), residual + x)
    rope_qk(q, k, cos, sin, *, fused)            -> (apply_rope(q, cos, sin), apply_rope(k, cos, sin))
    mlp(mlp, x, *, fused)                        -> mlp(x)  (gate/up/down called as modules)
    decode_attention(q, k, v, valid, scale, *, fused)
                                                 -> SDPA(q, k, v, attn_mask=valid[:, None, None, :], scale=scale)

The last one is the decode step's attention (one query position per row, GQA folded
as ``q [B, H_kv, G, D]`` against the cache prefix ``k, v [B, H_kv, L, D]``): fused, it is
``quarl_kernels.decode_attn``'s flash-decoding kernel (split-KV, fp32 online softmax,
deterministic combine), which the runner asks for only when ``QUARL_ENGINE_DECODE_ATTN``
(``decode_attn=`` of ``DecoderRunner`` / ``FastGenerator``; default on) is on as well as
the fused switch. It is not bit-equal to SDPA (fp32 sums in another order; ``p`` rounded
to the cache dtype before ``p @ v``), so it has its own switch; it needs D of 64 or 128.

The fused path is taken only when all of these hold -- otherwise the call is
*exactly* the reference code, so turning it on can never change what is accepted:

* ``fused`` is true: the runner passes its resolved flag (``fused=`` argument of
  ``DecoderRunner`` / ``FastGenerator``, else ``QUARL_ENGINE_FUSED``, default on)
  and'ed with :func:`kernels_available` for the model's device (CUDA, compute
  capability >= 8.0, Triton and ``quarl_kernels`` importable);
* the activation is a CUDA bf16/fp16 tensor (fp32 models keep PyTorch: their
  result is the reference by definition) and no gradient is required (the ops
  have no autograd);
* for the attention: q, k, v of one dtype and device, D in ``fused_ops.DECODE_ATTN_HEAD_DIMS``,
  ``valid`` a bool ``[B, L]``;
* the module is the plain HF one: class ``LlamaRMSNorm`` / ``Qwen2RMSNorm`` /
  ``Qwen3RMSNorm`` (``LlamaMLP`` / ``Qwen2MLP`` / ``Qwen3MLP`` with a SiLU
  ``act_fn``) whose ``forward`` is transformers' own (not overridden on the
  instance -- except by ``quarl.train.fused_glue``, the same math compiled --, not
  swapped by a hub kernel), with no forward hooks, a 1-D weight
  of the activation's dtype and a float ``variance_epsilon``. Anything else --
  a subclass, a wrapper, a hook, an fp32 weight under bf16 activations -- is
  called as a module.

Weights are read where they live at every call: the kernels take
``module.weight`` itself, so a captured CUDA graph reads the current norm
weights at each replay (AQN's in-place noise, optimizer steps), as the unfused
graph did. The MLP's projections are always called as modules (LoRA, QuantLinear
kernel dispatch, hooks on them all apply); only ``act_fn(gate) * up`` is fused.

Numerics (``docs/kernels.md``, "Fused norm / RoPE / activation kernels"): the
residual add and RoPE are bit-identical to PyTorch; RMSNorm differs from HF
only by the order of its fp32 sum of squares (an occasional 1-ulp bf16
difference); ``silu * up`` uses the same ``expf`` and division as PyTorch's kernel.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch
import torch.nn.functional as F
from torch import nn

from quarl.train.fused_glue import is_glue_forward

ENV = "QUARL_ENGINE_FUSED"
ENV_DECODE_ATTN = "QUARL_ENGINE_DECODE_ATTN"
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
HF_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
HF_MLPS = ("LlamaMLP", "Qwen2MLP", "Qwen3MLP")
_SILU_MODULES = ("transformers.activations", "torch.nn.modules.activation")

# Test seam: route eligible calls through the ops on any device and dtype (there they run their
# PyTorch reference), so the CPU suite exercises the fused wiring of the engine. Never set in production.
_FORCE_OPS = False


def _switch(flag: bool | None, env: str, on: str, off: str, default: bool = True) -> bool:
    """``flag`` if given, else ``$env`` (unset, empty or ``auto``: ``default``); a value that is neither on nor off
    is an error."""
    if flag is not None:
        return bool(flag)
    v = os.environ.get(env, "auto").strip().lower()
    if v in ("auto", ""):
        return default
    if v in ("1", "true", "on", "yes"):
        return True
    if v in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{env}={v!r} is not understood; set it to 1 ({on}{', the default' if default else ''}) or 0 "
                     f"({off}{'' if default else ', the default'})")


def resolve(fused: bool | None) -> bool:
    """The requested switch: ``fused`` if given, else ``$QUARL_ENGINE_FUSED`` (default on)."""
    return _switch(fused, ENV, "fused kernels", "PyTorch only")


def resolve_decode_attn(decode_attn: bool | None) -> bool:
    """The decode-attention switch: ``decode_attn`` if given, else ``$QUARL_ENGINE_DECODE_ATTN`` (default
    on). It acts only where the fused kernels are on too (:func:`resolve` and :func:`kernels_available`)."""
    return _switch(decode_attn, ENV_DECODE_ATTN, "the flash-decoding kernel", "SDPA")


_OPS = None  # quarl_kernels.fused_ops once imported (registers torch.ops.quarl.*)
_OPS_TRIED = False


def _ops_module():
    """``quarl_kernels.fused_ops``, or None when it cannot be imported (imported once; a plain global,
    not a cache decorator, so a ``torch.compile``'d step reads it without a graph break)."""
    global _OPS, _OPS_TRIED
    if not _OPS_TRIED:
        _OPS_TRIED = True
        try:
            from quarl_kernels import fused_ops
        except Exception:  # noqa: BLE001 - no quarl_kernels install: the reference path serves
            fused_ops = None
        _OPS = fused_ops
    return _OPS


def _ops():
    return _OPS if _OPS is not None else _ops_module()


def kernels_available(device: torch.device) -> bool:
    """True when the fused kernels can run on ``device`` (or the test seam is set and the ops import)."""
    if _FORCE_OPS:
        return _ops_module() is not None
    return device.type == "cuda" and _capable(device.index if device.index is not None else 0)


@functools.cache
def _capable(index: int) -> bool:
    if importlib.util.find_spec("triton") is None or torch.cuda.get_device_capability(index) < (8, 0):
        return False
    return _ops_module() is not None


# --- references ---------------------------------------------------------------------------------
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [B, H, L, D]``, ``cos/sin [B, L, D]`` -> rotated ``x`` (HF's formula, op for op)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, L, D]
    return (x * cos) + (rotate_half(x) * sin)


# --- eligibility ------------------------------------------------------------------------------------
def _no_grad_needed(*ts: torch.Tensor) -> bool:
    return not torch.is_grad_enabled() or not any(t.requires_grad for t in ts)


def _kernel_input(x: torch.Tensor) -> bool:
    return _FORCE_OPS or (x.is_cuda and x.dtype in KERNEL_DTYPES)


def _no_hooks(m: nn.Module) -> bool:
    g = torch.nn.modules.module
    return not (m._forward_hooks or m._forward_pre_hooks or getattr(g, "_global_forward_hooks", None)
                or getattr(g, "_global_forward_pre_hooks", None))


def _plain_hf(m: nn.Module, names: tuple[str, ...]) -> bool:
    """``m`` is transformers' own class of one of ``names``, running its own, unhooked forward (or the same math
    compiled by quarl.train.fused_glue for the trainer's backward: the engine's no-grad kernels stand in for it)."""
    cls = type(m)
    return (cls.__name__ in names and cls.__module__.startswith("transformers.models.")
            and getattr(cls.forward, "__module__", None) == cls.__module__
            and ("forward" not in vars(m) or is_glue_forward(vars(m)["forward"])) and _no_hooks(m))


def norm_eligible(norm: nn.Module, x: torch.Tensor) -> bool:
    """The fused kernel computes ``norm(x)`` (see the module docstring)."""
    w = getattr(norm, "weight", None)
    return (_plain_hf(norm, HF_NORMS) and isinstance(w, torch.Tensor) and w.dim() == 1 and w.shape[0] == x.shape[-1]
            and w.dtype == x.dtype and w.device == x.device and isinstance(getattr(norm, "variance_epsilon", None), float))


def mlp_eligible(mlp: nn.Module) -> bool:
    """``mlp`` is HF's ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with a SiLU ``act_fn``."""
    act = getattr(mlp, "act_fn", None)
    if act is None or not _plain_hf(mlp, HF_MLPS) or not all(hasattr(mlp, p) for p in ("gate_proj", "up_proj",
                                                                                           "down_proj")):
        return False
    acls = type(act)
    return (acls.__name__ in ("SiLUActivation", "SiLU") and acls.__module__ in _SILU_MODULES
            and getattr(acls.forward, "__module__", None) == acls.__module__ and "forward" not in vars(act)
            and _no_hooks(act))


# --- the switch ---------------------------------------------------------------------------------------
def rms_norm(norm: nn.Module, x: torch.Tensor, residual: torch.Tensor | None = None, *, fused: bool = True):
    """``norm(x)``; with ``residual``: ``(norm(h), h)`` where ``h = residual + x`` (one kernel when fused)."""
    if (fused and _kernel_input(x) and norm_eligible(norm, x) and _no_grad_needed(x, norm.weight)
            and (residual is None or (residual.shape == x.shape and residual.dtype == x.dtype
                                      and residual.device == x.device and _no_grad_needed(residual)))):
        return _ops().rms_norm(x, norm.weight, norm.variance_epsilon, residual=residual)
    if residual is None:
        return norm(x)
    h = residual + x
    return norm(h), h


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, fused: bool = True):
    """``q [B, H, L, D]``, ``k [B, H_kv, L, D]``, ``cos/sin [B, L, D]`` -> both rotated (one kernel when fused)."""
    if (fused and _kernel_input(q) and q.dtype == k.dtype == cos.dtype == sin.dtype and q.device == k.device
            and _no_grad_needed(q, k)):
        return _ops().rope_qk(q, k, cos, sin)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


def rope_qk_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, slot: torch.Tensor, *, fused: bool = True):
    """A decode step's :func:`rope_qk` and K/V cache write: returns rotated ``q``; ``k_cache`` / ``v_cache``
    ``[B, H_kv, S, D]`` get rotated ``k`` / ``v`` at positions ``slot`` along dim 2 (one kernel when fused)."""
    if (fused and _kernel_input(q) and q.dtype == k.dtype == v.dtype == cos.dtype == sin.dtype == k_cache.dtype
            == v_cache.dtype and q.device == k.device == k_cache.device and _no_grad_needed(q, k, v)):
        return _ops().rope_qk_cache(q, k, v, cos, sin, k_cache, v_cache, slot)
    q, k = rope_qk(q, k, cos, sin, fused=fused)
    k_cache.index_copy_(2, slot, k)
    v_cache.index_copy_(2, slot, v)
    return q


def mlp(module: nn.Module, x: torch.Tensor, *, fused: bool = True) -> torch.Tensor:
    """``module(x)``; for HF's SiLU MLP when fused: ``down_proj(silu_mul(gate_proj(x), up_proj(x)))``."""
    if fused and _kernel_input(x) and mlp_eligible(module) and _no_grad_needed(x):
        gate = module.gate_proj(x)  # [.., I]
        up = module.up_proj(x)  # [.., I]
        return module.down_proj(act_mul(module, gate, up, fused=fused))
    return module(x)


def act_mul(module: nn.Module, gate: torch.Tensor, up: torch.Tensor, *, fused: bool = True) -> torch.Tensor:
    """``module.act_fn(gate) * up`` for an :func:`mlp_eligible` module (one kernel when fused)."""
    if (fused and _kernel_input(gate) and gate.shape == up.shape and gate.dtype == up.dtype
            and _no_grad_needed(gate, up)):
        return _ops().silu_mul(gate, up)
    return module.act_fn(gate) * up  # what HF's forward computes from the same values


def attn_eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> bool:
    """The flash-decoding kernel computes this decode attention (see the module docstring)."""
    ops = _ops()
    return (ops is not None and q.dim() == 4 and k.dim() == 4 and q.shape[-1] in ops.DECODE_ATTN_HEAD_DIMS
            and k.shape == v.shape and k.shape[:2] == q.shape[:2] and k.shape[3] == q.shape[3]
            and q.dtype == k.dtype == v.dtype and q.device == k.device == v.device == valid.device
            and valid.dtype == torch.bool and valid.shape == (q.shape[0], k.shape[2]))


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, scale: float, *,
                     fused: bool = True) -> torch.Tensor:
    """``q [B, H_kv, G, D]`` attending ``k, v [B, H_kv, L, D]`` where ``valid [B, L]`` -> ``[B, H_kv, G, D]``
    (the flash-decoding kernel when fused and eligible; else exactly the engine's SDPA call)."""
    if fused and _kernel_input(q) and attn_eligible(q, k, v, valid) and _no_grad_needed(q, k, v):
        return _ops().decode_attention(q, k, v, valid, scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :], scale=scale)


__all__ = ["ENV", "ENV_DECODE_ATTN", "act_mul", "apply_rope", "attn_eligible", "decode_attention", "kernels_available",
           "mlp", "mlp_eligible", "norm_eligible", "resolve", "resolve_decode_attn", "rms_norm", "rope_qk",
           "rotate_half"]
