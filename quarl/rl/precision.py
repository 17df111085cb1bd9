"""Precision flows of RL training and rollout, the correction for their mismatch, and its metrics.

``precision.mode`` picks one of four flows (Jet-RL, arXiv:2601.14243, Sec. 3-4):

    policy       train and roll out with the policy built from ``policy.format`` /
                 ``policy.quant_recipe`` -- one module for both, so one precision (QeRL's NVFP4
                 LoRA, the BF16 LoRA baseline; the default, and what the stage did before)
    bf16         BF16 training, BF16 rollout: the reference
    fp8-rollout  BF16 training, FP8 rollout: before each rollout the current weights (LoRA
                 merged in, as verl syncs them to vLLM) are cast to FP8 128x128 tiles and every
                 projection runs the FP8 GEMM on 1x128-quantized activations; training stays
                 BF16. The common speed-up, and the source of the train/rollout mismatch that
                 Jet-RL measures
    jetrl        one FP8 flow: every projection is FP8 (128x128 weights, 1x128 activations)
                 in the training forward pass, in both gradients and in rollout, through the
                 same modules (``quarl.quant.fp8_linear``): full-parameter with a BF16/FP32
                 master weight (``policy.mode=full``), or a frozen FP8 base + BF16 LoRA

``precision.fp8_wgrad`` (jetrl, full-parameter only): ``1x128`` (Jet-RL: X^T in 1x128 groups along the tokens
in the weight gradient) or ``tiles`` (X^T in 128x128 tiles: WGrad on the faster 1x128 x 128x128 GEMM, a
coarser X; not Jet-RL's recipe -- ``quarl.quant.fp8_linear`` and benchmarks/RESULTS.md have its speed and
error).

``bf16`` and ``fp8-rollout`` share their training path exactly, so with the same seed the
only difference between them is the rollout precision.

Mismatch correction (verl's ``algorithm.rollout_is*`` knobs, same names and meaning). The
trainer's log-probs of the sampled tokens (``old``) and the rollout's (``rollout``) give
``w = pi_train / pi_rollout``; at ``rollout_is_level=token`` per token, at ``sequence`` the
product over the answer (``exp`` of the summed log-ratio, clamped to +-20 for safety).
``rollout_is_mode=truncate`` caps ``w`` at ``rollout_is_threshold`` (TIS); ``mask`` zeroes
tokens (or whole answers) whose ``w`` is outside ``[rollout_is_threshold_lower, threshold]``
(lower defaults to ``1 / threshold``; MIS). ``rollout_is_threshold: null`` switches the
correction off; ``rollout_is: false`` with a threshold logs the weights' metrics without
applying them. The weights multiply the policy-gradient term only (not the KL term) and are
constants (no gradient).

Per step (``mismatch/*`` in metrics.jsonl, from :func:`quarl.rl.logprobs.mismatch`):
mean and max ``|log p_train - log p_rollout|``, the k3 estimate of KL(rollout || train),
and the fraction of tokens whose ratio is outside [0.5, 2]; with a threshold also
``mismatch/rollout_is_mean``, ``_max``, ``_truncated_fraction`` / ``_masked_fraction``.
"""

from __future__ import annotations

import contextlib
import fnmatch
from dataclasses import dataclass

import torch
from torch import nn

from quarl.quant.fp8_linear import WGRAD_MODES

PRECISION_MODES = ("policy", "bf16", "fp8-rollout", "jetrl")
IS_LEVELS = ("token", "sequence")
IS_MODES = ("truncate", "mask")
JETRL_RECIPE = {"default": "fp8-block", "act_quant": "fp8-1x128"}
ROLLOUT_EXCLUDE = ("lm_head", "*embed_tokens*")  # kept high precision, as quantize_model does
_LOG_CLAMP = 20.0


@dataclass
class PrecisionConfig:
    mode: str = "policy"  # policy | bf16 | fp8-rollout | jetrl (module docstring)
    rollout_is: bool = True  # apply the IS weights to the loss (False: metrics only); verl's name
    rollout_is_threshold: float | None = None  # upper bound of w; None = no correction (verl)
    rollout_is_threshold_lower: float | None = None  # mask mode: lower bound; None -> 1 / threshold
    rollout_is_level: str = "token"  # token | sequence
    rollout_is_mode: str = "truncate"  # truncate (TIS) | mask (MIS)
    # jetrl, full-parameter: X^T's grouping in the weight gradient. 1x128 along the tokens is Jet-RL's recipe;
    # tiles (128x128) lets WGrad run the faster 1x128 x 128x128 GEMM, at a coarser X (quarl.quant.fp8_linear)
    fp8_wgrad: str = "1x128"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.mode not in PRECISION_MODES:
            raise ValueError(f"precision.mode must be one of {PRECISION_MODES}, got {self.mode!r}")
        if self.rollout_is_level not in IS_LEVELS:
            raise ValueError(f"precision.rollout_is_level must be token|sequence, got {self.rollout_is_level!r}")
        if self.rollout_is_mode not in IS_MODES:
            raise ValueError(f"precision.rollout_is_mode must be truncate|mask, got {self.rollout_is_mode!r}")
        if self.fp8_wgrad not in WGRAD_MODES:
            raise ValueError(f"precision.fp8_wgrad must be one of {WGRAD_MODES}, got {self.fp8_wgrad!r}")
        if self.fp8_wgrad != "1x128" and self.mode != "jetrl":
            raise ValueError(f"precision.fp8_wgrad={self.fp8_wgrad} applies to precision.mode=jetrl (the FP8 "
                             f"weight gradient), got mode {self.mode!r}; remove it or set precision.mode=jetrl")
        t, lo = self.rollout_is_threshold, self.rollout_is_threshold_lower
        if t is not None and t <= 1.0:
            raise ValueError(f"precision.rollout_is_threshold must be > 1 (verl uses 2.0), got {t}; null turns "
                             f"the correction off")
        if lo is not None and (t is None or not 0 <= lo < 1.0):
            raise ValueError(f"precision.rollout_is_threshold_lower must be in [0, 1) and needs "
                             f"rollout_is_threshold, got {lo}")

    @property
    def lower(self) -> float:
        return self.rollout_is_threshold_lower if self.rollout_is_threshold_lower is not None else (
            1.0 / self.rollout_is_threshold)


def policy_fields(prec: PrecisionConfig, mode: str, fmt: str, recipe: dict | None) -> tuple[str, dict | None]:
    """The (policy.format, policy.quant_recipe) a precision mode trains with; ``policy`` keeps them.

    A format other than the default contradicting the mode is an error rather than silently replaced."""
    if prec.mode == "policy":
        return fmt, recipe
    want = "bf16" if prec.mode in ("bf16", "fp8-rollout") else "fp8-block"
    if str(fmt).lower() not in ("nvfp4", want) or (recipe and recipe != _jetrl_recipe(mode, prec.fp8_wgrad)):
        raise ValueError(f"precision.mode={prec.mode} trains with policy.format={want}; remove policy.format="
                         f"{fmt!r} / policy.quant_recipe, or use precision.mode=policy to train with them")
    if want == "bf16":
        return "bf16", None
    return "fp8-block", _jetrl_recipe(mode, prec.fp8_wgrad)


def _jetrl_recipe(policy_mode: str, fp8_wgrad: str = "1x128") -> dict:
    # full-parameter: a trainable master weight per linear (QuantLinear "qat"), FP8 in every GEMM; a frozen
    # FP8 base under LoRA has no weight gradient, so fp8_wgrad changes nothing there (and is not written)
    if policy_mode != "full":
        return dict(JETRL_RECIPE)
    recipe = dict(JETRL_RECIPE, mode="qat")
    if fp8_wgrad != "1x128":
        recipe["fp8_wgrad"] = fp8_wgrad
    return recipe


# --------------------------------------------------------------------------- FP8-cast rollout
def _rollout_linears(model: nn.Module) -> list[nn.Module]:
    from quarl.quant import QuantLinear

    out = []
    for name, m in model.named_modules():
        if not isinstance(m, (nn.Linear, QuantLinear)):
            continue
        if any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "*." + p) for p in ROLLOUT_EXCLUDE):
            continue
        out.append(m)
    return out


def _effective_weight(m: nn.Module) -> torch.Tensor:
    """The weight the rollout engine would receive: base (dequantized) + merged LoRA, [N, K] fp32."""
    from quarl.quant import QuantLinear

    if isinstance(m, QuantLinear):
        w = m.dequantized_weight(torch.float32).detach()
        d = m.lora_delta()
        return w + d.detach().float() if d is not None else w
    return m.weight.detach().float()


def _fp8_cast_forward(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    from quarl.quant.fp8_linear import FP8LinearFunction

    q, s, n = m._quarl_rollout_fp8
    y = FP8LinearFunction.apply(x, None, None, q, s, q.shape[0])[..., :n]  # padded rows -> true N
    return y + m.bias.to(y.dtype) if m.bias is not None else y


@contextlib.contextmanager
def fp8_cast_rollout(model: nn.Module):
    """Inside: every projection runs as an FP8 cast of its current (LoRA-merged) weight.

    The FP8 tiles are written in place into tensors kept on each module, so a CUDA graph the
    fast engine captured in an earlier rollout reads the new weights (their addresses never change)."""
    from quarl.quant.fp8_linear import quantize_weight_padded

    mods = _rollout_linears(model)
    with torch.no_grad():
        for m in mods:
            w = _effective_weight(m)
            n = w.shape[0]
            q, s = quantize_weight_padded(w)  # [Np, Kp] zero-padded to multiples of 128, [Np/128, Kp/128]
            held = getattr(m, "_quarl_rollout_fp8", None)
            if held is not None and held[0].shape == q.shape and held[0].device == q.device:
                held[0].copy_(q)
                held[1].copy_(s)
            else:
                m._quarl_rollout_fp8 = (q, s, n)
            m.forward = _bind(m)
    try:
        yield
    finally:
        for m in mods:
            m.__dict__.pop("forward", None)


def _bind(m: nn.Module):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return _fp8_cast_forward(m, x)

    return forward


class Precision:
    """The trainer's handle on the precision flow: the rollout context and the IS correction."""

    def __init__(self, cfg: PrecisionConfig):
        self.cfg = cfg

    def rollout(self, model: nn.Module):
        return fp8_cast_rollout(model) if self.cfg.mode == "fp8-rollout" else contextlib.nullcontext()

    def _raw_weights(self, old_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` w = pi_train / pi_rollout, per token or per answer (broadcast over its tokens)."""
        d = (old_lp.detach().float() - rollout_lp.float()) * mask  # [B, T] log w
        if self.cfg.rollout_is_level == "sequence":
            d = d.sum(dim=1, keepdim=True).expand_as(d)
        return torch.exp(d.clamp(-_LOG_CLAMP, _LOG_CLAMP))

    def is_weights(self, old_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        """``[B, T]`` weights for the policy-gradient term, or None (no correction / metrics only)."""
        c = self.cfg
        if c.rollout_is_threshold is None or not c.rollout_is:
            return None
        w = self._raw_weights(old_lp, rollout_lp.to(old_lp.device), mask)
        if c.rollout_is_mode == "truncate":
            return w.clamp(max=c.rollout_is_threshold)
        return w * ((w >= c.lower) & (w <= c.rollout_is_threshold)).to(w.dtype)

    @torch.no_grad()
    def is_metrics(self, train_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
        c = self.cfg
        if c.rollout_is_threshold is None:
            return {}
        m = mask.bool()
        if not m.any():
            return {}
        w = self._raw_weights(train_lp, rollout_lp.to(train_lp.device), mask.to(train_lp.device))[m]
        out = {"mismatch/rollout_is_mean": float(w.mean()), "mismatch/rollout_is_max": float(w.max())}
        if c.rollout_is_mode == "truncate":
            out["mismatch/rollout_is_truncated_fraction"] = float((w > c.rollout_is_threshold).float().mean())
        else:
            out["mismatch/rollout_is_masked_fraction"] = float(((w < c.lower) | (w > c.rollout_is_threshold))
                                                               .float().mean())
        return out


__all__ = ["PRECISION_MODES", "Precision", "PrecisionConfig", "fp8_cast_rollout", "policy_fields"]
