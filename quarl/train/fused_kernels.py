"""Liger's fused training kernels on a transformers model: RMSNorm, RoPE and SwiGLU, one Triton kernel each.

Why. In a training step, everything but the projections is memory-bound glue, and transformers' eager code
spends it in many small kernels: an RMSNorm is an fp32 upcast, a square, a mean, an rsqrt and two multiplies
forward (each a pass over ``[B*T, H]``) and more backward; RoPE is a ``rotate_half`` (slices and a cat) and
four elementwise ops for q and for k; SwiGLU is a SiLU and a multiply over ``[B*T, I]``. On a Qwen2.5-7B-width
layer at 8k tokens this glue is about a quarter of the full-parameter step in BF16 and more of the FP8 one
(benchmarks/RESULTS.md, Jet-RL, "The whole actor update") -- the part FP8 GEMMs do not speed up, so it also
caps the FP8 step's speed-up. Liger-Kernel (linkedin/Liger-Kernel) fuses each into one kernel forward and one
backward, with transformers' numerics (RMSNorm in the llama casting mode: fp32 math, cast before the weight).

What is patched, on the model instance: every decoder layer's RMSNorms and the final one, every MLP's SwiGLU
(the projections stay whatever they are -- nn.Linear, or a ``QuantLinear`` with FP8 GEMMs or a frozen 4-bit
base + LoRA), and the model family's ``apply_rotary_pos_emb``. Not patched: the cross-entropy / fused linear
cross-entropy -- the rl stage computes token log-probs itself, in chunks (``quarl.rl.logprobs``), and distill
its KL over the vocabulary; neither calls transformers' loss.

The RoPE patch replaces a module-level function of transformers (``modeling_qwen2.apply_rotary_pos_emb``,
...), so it holds for every model of that family in the process -- one stage's pod, one process. Liger's
kernels are Triton kernels: CUDA only. The knob keeps the name TRL's and transformers' trainers give it,
``use_liger_kernel``.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["apply_liger_kernel"]

# Liger's patches, each a boolean argument of its apply_liger_kernel_to_<family> function
PATCHES = {"rope": True, "rms_norm": True, "swiglu": True, "cross_entropy": False, "fused_linear_cross_entropy": False}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("liger-kernel")
    except PackageNotFoundError:  # imported from a source tree
        return "unknown"


def apply_liger_kernel(model: nn.Module, device: torch.device | str, key: str = "policy.use_liger_kernel") -> dict:
    """Patch ``model`` (a transformers causal LM) with Liger's RMSNorm, RoPE and SwiGLU kernels, in place.

    Returns what was patched, for the stage's report: ``{"liger_kernel": version, "model_type": ...,
    "modules": n}``. Raises a ``ValueError`` naming ``key`` and the fix when the run is not on CUDA, Liger is
    not installed or has no kernels for the model's family."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"{key}=true needs a CUDA device (Liger's kernels are Triton kernels); this run trains on "
                         f"{device}: set {key}=false")
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN, _apply_liger_kernel_to_instance
    except ImportError as e:
        raise ValueError(f"{key}=true needs the liger-kernel package ({e}); install quarl's gpu extra "
                         f"(pip install 'quarl[gpu]') or set {key}=false") from e
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise ValueError(f"{key}=true: Liger has no kernels for model_type {model_type!r} (it has "
                         f"{', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}); set {key}=false")
    before = {id(m) for m in model.modules() if "forward" in m.__dict__}
    _apply_liger_kernel_to_instance(model, **PATCHES)
    # Liger binds its forward to each patched module instance (RMSNorms and MLPs)
    patched = sum(1 for m in model.modules() if "forward" in m.__dict__ and id(m) not in before)
    if patched == 0:
        raise ValueError(f"{key}=true: Liger patched no module of this {model_type} model (a layout it does not "
                         f"know); set {key}=false")
    return {"liger_kernel": _version(), "model_type": model_type, "modules": patched,
            "patches": [k for k, v in PATCHES.items() if v]}
