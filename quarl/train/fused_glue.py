"""The glue between a decoder layer's projections -- RMSNorm, RoPE, SwiGLU -- as ``torch.compile``d functions.

Why. In a full-parameter training step everything but the projections and attention is memory-bound glue, and
transformers' eager code runs it as many small kernels over the whole activation: an RMSNorm is an fp32 upcast,
a square, a mean, an rsqrt, a multiply, a downcast and the weight's multiply forward (each a pass over
``[B*T, H]``, the fp32 ones twice the bytes) and more backward; RoPE is ``rotate_half`` (two slices, a negation
and a cat) and four elementwise ops for q and again for k; SwiGLU a SiLU and a multiply over ``[B*T, I]``. FP8
GEMMs do not touch this time, so it also caps what Jet-RL's FP8 flow can gain on the whole step
(benchmarks/RESULTS.md, Jet-RL). Compiled, each function becomes one or two Triton kernels forward and backward
(inductor generates the backward from the same graph), with the eager code's math.

What is patched, on the model instance, in the families whose math these functions are (``FAMILIES``: Llama,
Mistral, Qwen2, Qwen3; anything else is left eager): every ``*RMSNorm`` (decoder layers' two, the final one;
Qwen3's q/k norms too), every ``*MLP`` with ``gate_proj``/``up_proj``/``down_proj`` and a SiLU activation
(the projections stay whatever they are: ``nn.Linear``, a ``QuantLinear`` on the FP8 flow, a frozen 4-bit base
+ LoRA; three full-parameter FP8 projections run as one :mod:`quarl.quant.fp8_swiglu` function instead, SwiGLU's
backward inside their quantizers), an attention's full-parameter FP8 q / k / v (one stacked GEMM,
:mod:`quarl.quant.fp8_stack`), and the model family's module-level ``apply_rotary_pos_emb`` -- process-wide, for every model of that
family in the stage's process, as Liger-Kernel patches it. The functions are compiled once per process (``dynamic=None``: a second sequence length recompiles them shape-generic, so
RL's varying batch shapes do not recompile every step).

Numerics: the eager code rounds to bf16 after every op; a fused kernel keeps fp32 in registers and rounds once,
so outputs differ by bf16 rounding (<= 1-2 ulp; ``tests/train/test_fused_glue*.py``).
"""

from __future__ import annotations

import sys
import types
from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FAMILIES", "SETTINGS", "apply_compile_glue", "check_setting", "compile_glue", "is_glue_forward", "rms_norm",
           "rope", "rope_by_tokens", "silu_mul"]

BACKEND = "inductor"  # torch.compile's backend for the stages (tests set aot_eager: the same graph, no kernel build)
SETTINGS = ("auto", "true", "false")  # policy.compile_glue / student.compile_glue: auto = on CUDA, off elsewhere
# transformers families whose RMSNorm, SiLU MLP and apply_rotary_pos_emb are exactly the functions below
# (tests/train/test_fused_glue.py checks each against transformers' own). Others are left alone: Gemma's RMSNorm
# scales by (1 + weight), Phi-3 rotates part of the head, GLM interleaves -- a name match would be silently wrong.
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def check_setting(value, key: str) -> str:
    """``policy.compile_glue`` / ``student.compile_glue`` -> its normalized value; the configs call it when built."""
    setting = str(value).lower()
    if setting not in SETTINGS:
        raise ValueError(f"{key} must be one of {', '.join(SETTINGS)}; got {value!r}")
    return setting


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm (Llama / Qwen2 / Qwen3): fp32 statistics, cast back before the weight."""
    xf = x.float()  # [..., H]
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's elementwise part: SiLU(gate) * up, ``[..., I]``."""
    return F.silu(gate) * up


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(q, k, cos, sin, unsqueeze_dim: int = 1):
    """transformers' ``apply_rotary_pos_emb``: q ``[B, Hq, T, D]``, k ``[B, Hk, T, D]``, cos/sin ``[B, T, D]``."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def rope_by_tokens(q, k, cos, sin, unsqueeze_dim: int = 1, core=rope):
    """:func:`rope` computed on the token-major tensors the projections wrote: q ``[B, Hq, T, D]`` (the heads a view
    of ``[B, T, Hq, D]``, as transformers makes it), results in that memory order too -- the same values. ``core``:
    :func:`rope` or its compiled form, called on the ``[B, T, H, D]`` tensors with ``unsqueeze_dim=2`` (the transposes
    stay outside the graph).

    Why (session 35, an H100 profile at 7B width): compiled on the head-major view, the RoPE's backward made its
    incoming gradient contiguous ``[B, H, T, D]`` (AOTAutograd's tangent) and returned a head-major gradient that the
    projection's ``view`` then copied back to token-major: two ~0.2 ms copies of q's gradient a layer (and k's), in
    the BF16 and the FP8 flow alike. On ``[B, T, H, D]`` every gradient stays in the projections' order, and SDPA's
    cuDNN kernel, which lays its output and gradients out like q, gets token-major q / k as well."""
    if unsqueeze_dim != 1 or q.dim() != 4 or cos.dim() != 3:  # another layout: the head-major function
        return rope(q, k, cos, sin, unsqueeze_dim)
    qt, kt = core(q.transpose(1, 2), k.transpose(1, 2), cos, sin, 2)  # [B, T, H, D]
    return qt.transpose(1, 2), kt.transpose(1, 2)


@cache
def _compiled(backend: str) -> types.SimpleNamespace:
    """The three functions compiled once per process and backend (``inductor`` in a stage; tests use the
    cheaper ``aot_eager`` to check the wiring and the autograd graph)."""
    # not fullgraph: past dynamo's recompile limit (8 variants of a function per process: grad mode, requires_grad,
    # dtype, static vs dynamic shapes...) a new variant then runs eager, with dynamo's warning, instead of failing
    c = lambda f: torch.compile(f, backend=backend, dynamic=None)
    return types.SimpleNamespace(rms_norm=c(rms_norm), silu_mul=c(silu_mul), rope=c(rope))


def _rope_patched(fns):
    """The module-level ``apply_rotary_pos_emb`` :func:`compile_glue` installs (transformers' signature)."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
        return rope_by_tokens(q, k, cos, sin, unsqueeze_dim, core=fns.rope)

    return apply_rotary_pos_emb


def _norm_forward(self, x: torch.Tensor) -> torch.Tensor:
    return self._glue_fns.rms_norm(x, self.weight, self._glue_eps)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    from quarl.quant import fp8_swiglu

    if fp8_swiglu.fusable(self):  # full-parameter Jet-RL: SwiGLU's backward inside the FP8 quantizers (no BF16 dg, du)
        return fp8_swiglu.mlp_forward(self, x, self._glue_fns.silu_mul)
    return self.down_proj(self._glue_fns.silu_mul(self.gate_proj(x), self.up_proj(x)))


# the rollout engine (quarl.engine.fused) runs its own no-grad kernels for a module whose forward is transformers'
# own -- or one of these, the same math: it asks is_glue_forward
_norm_forward.quarl_glue = _mlp_forward.quarl_glue = True


def is_glue_forward(forward) -> bool:
    """``forward`` (a module instance's own) is one :func:`compile_glue` bound: transformers' math, compiled."""
    return getattr(getattr(forward, "__func__", forward), "quarl_glue", False) is True


def _is_silu(act) -> bool:
    # transformers' ACT2FN["silu"] is its own SiLUActivation module, not nn.SiLU
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _own_family(cls: type) -> str | None:
    """The :data:`FAMILIES` entry whose ``transformers.models.<family>.modeling_<family>`` defines ``cls`` and its
    forward (a subclass elsewhere, or a forward swapped on the class, is not transformers' math any more)."""
    parts = cls.__module__.split(".")
    if (len(parts) == 4 and parts[:2] == ["transformers", "models"] and parts[2] in FAMILIES
            and parts[3] == f"modeling_{parts[2]}" and getattr(cls.forward, "__module__", None) == cls.__module__):
        return parts[2]
    return None


def _eps(m: nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        v = getattr(m, name, None)
        if isinstance(v, float):
            return v
    return None


def compile_glue(model: nn.Module, key: str = "policy.compile_glue", backend: str | None = None) -> dict:
    """Patch ``model`` (a transformers causal LM) in place: its RMSNorms, SwiGLU MLPs and its family's RoPE run
    the compiled functions. Returns what was patched, for the stage's report. Raises a ``ValueError`` naming
    ``key`` and the fix when nothing in the model has the layout patched here."""
    backend = backend or BACKEND
    fns = _compiled(backend)
    norms = mlps = stacks = 0
    families: set[str] = set()
    for m in model.modules():
        cls = type(m)
        if _own_family(cls) is None:
            continue
        if cls.__name__.endswith("RMSNorm") and isinstance(getattr(m, "weight", None), torch.Tensor) \
                and _eps(m) is not None:
            m._glue_fns, m._glue_eps = fns, _eps(m)
            m.forward = types.MethodType(_norm_forward, m)
            norms += 1
        elif cls.__name__.endswith("MLP") and all(hasattr(m, p) for p in ("gate_proj", "up_proj", "down_proj")) \
                and _is_silu(getattr(m, "act_fn", None)):
            m._glue_fns = fns
            m.forward = types.MethodType(_mlp_forward, m)
            mlps += 1
        mod = sys.modules[cls.__module__]
        if cls.__name__.endswith("Attention") and all(hasattr(m, p) for p in ("q_proj", "k_proj", "v_proj")):
            from quarl.quant import fp8_stack

            stacks += fp8_stack.attach((m.q_proj, m.k_proj, m.v_proj))
        if cls.__name__.endswith("Attention") and callable(getattr(mod, "apply_rotary_pos_emb", None)):
            if getattr(mod.apply_rotary_pos_emb, "_quarl_glue", None) != backend:
                patched = _rope_patched(fns)
                patched._quarl_glue = backend
                mod.apply_rotary_pos_emb = patched
            families.add(cls.__module__)
    if not (norms or mlps or families):
        raise ValueError(f"{key}=true: no RMSNorm, SwiGLU MLP or RoPE attention of a family it knows "
                         f"({', '.join(FAMILIES)}) in this {type(model).__name__}; set {key}=false")
    report = {"backend": backend, "rms_norms": norms, "swiglu_mlps": mlps, "rope_modules": sorted(families)}
    if stacks:
        report["fp8_qkv_stacks"] = stacks
    return report


def apply_compile_glue(model: nn.Module, setting: str, device: torch.device | str, key: str,
                       distributed: bool = False) -> dict | None:
    """The stages' knob (``policy.compile_glue``, ``student.compile_glue``): ``auto`` compiles the glue in a
    one-process CUDA run (where a compiled step is measured faster: benchmarks/RESULTS.md, "The glue between the
    projections") and leaves CPU runs eager (inductor would build C++ kernels there, for tiny models) and
    ``torchrun`` runs too (FSDP2 swaps a sharded module's parameters around its forward: with ``true`` that path
    matches one process on CPU, tests/train/test_distributed.py, but has not run on several GPUs); ``true``
    compiles it on any device; ``false`` never. Returns
    :func:`compile_glue`'s report, or ``None`` when left eager."""
    setting = check_setting(setting, key)
    if setting == "false" or (setting == "auto" and (torch.device(device).type != "cuda" or distributed)):
        return None
    if setting == "auto":  # a model this does not know stays eager rather than failing the stage
        try:
            return compile_glue(model, key)
        except ValueError:
            return None
    return compile_glue(model, key)
