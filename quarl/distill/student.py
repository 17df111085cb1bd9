"""The student and the teacher: pairing checks, QAT/LoRA set-up, and re-quantization at the end.

    check_pairing(teacher, t_tok, student, s_tok)   # before any work: same vocabulary and tokenizer
    report = build_student(model, cfg.student)     # in place: QAT latent weights or LoRA on the frozen base
    finalize_student(model)                        # in place: every QuantLinear frozen, packed, LoRA-free

Initialisation from a calibrate artifact. A calibrated model arrives with
frozen ``QuantLinear`` layers (RTN/GPTQ/AWQ codes and scales). For
``student.mode=qat`` each one becomes a QAT layer whose latent high-precision
weight is the *dequantized* calibrated weight, so training starts at the
calibrated point; the forward fake-quantizes the latent weight with the
format's own quantizer and a straight-through gradient
(``Format.fake_quant``). ``student.scales=recompute`` (the default) derives the
block/group scales from the latent weight at every forward, as ModelOpt's NVFP4
QAT (dynamic block scales, a calibrated global scale, which NVFP4 keeps here too)
and torchao's QAT do: moving a group's extreme weights moves its whole grid. The
price is paid at step 0 by a GPTQ/AWQ init: re-deriving the scales of a
dequantized GPTQ weight picks a smaller range wherever GPTQ's error feedback left
a group's extreme code unused, and re-rounds that group (measured on SmolLM2 INT3
in a CPU dry run of benchmarks/distill_table.py: held-out KL 0.109 of the GPTQ
model, 0.204 at step 0). ``scales=calibrated`` keeps the calibrated grid --
NVFP4's global and block scales, INT's group scales and zero points travel in the
layer's quantization state -- so the step-0 student *is* the calibrated model and
a code changes only when training moves its latent weight across a rounding
midpoint of that grid (half a grid step: far more than lr x steps at QAD's usual
learning rates, so this mode needs a larger one).

A full-precision student input (no calibrate step) is quantized here by RTN
into ``student.format``.

``student.mode=lora`` keeps the calibrated base frozen and trains a LoRA
branch; ``finalize_student`` merges it and re-quantizes into the same format,
so both modes give one quantized model that the rl stage takes as its policy.
"""

from __future__ import annotations

import torch
from torch import nn

from quarl.distill.config import StudentConfig
from quarl.quant import LoRAConfig, QuantLinear, attach_lora, memory_report, quantize_model
from quarl.quant.base import get_format

__all__ = ["PairingError", "build_student", "check_pairing", "finalize_student", "to_qat"]


class PairingError(ValueError):
    """Teacher and student cannot be distilled: different vocabularies or tokenizers."""


def _vocab_rows(model: nn.Module) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def check_pairing(teacher: nn.Module, t_tok, student: nn.Module, s_tok) -> None:
    """Token-level KL needs one vocabulary: same output rows and the same token -> id map."""
    vt, vs = _vocab_rows(teacher), _vocab_rows(student)
    if vt != vs:
        raise PairingError(f"teacher and student have different vocabularies ({vt} vs {vs} output rows): token-"
                           f"level distillation compares distributions over the same tokens; distill from a "
                           f"teacher of the same family/tokenizer as the student (e.g. the model the student "
                           f"was calibrated from)")
    if t_tok is not None and s_tok is not None and t_tok.get_vocab() != s_tok.get_vocab():
        diff = len(set(t_tok.get_vocab().items()) ^ set(s_tok.get_vocab().items()))
        raise PairingError(f"teacher and student tokenizers differ ({diff} token->id entries disagree) although "
                           f"both have {vt} output rows; the same id would mean different text. Use the teacher "
                           f"the student was quantized from")


# The QTensor tensors that fix a format's grid (all but the codes): what scales=calibrated keeps.
FROZEN_SCALES = {"nvfp4": ("weight_scale",), "int": ("weight_scale", "weight_zero_point")}


def to_qat(model: nn.Module, scales: str = "recompute") -> int:
    """Frozen quantized QuantLinears -> QAT layers with the dequantized weight as latent weight. Returns count.

    ``scales="calibrated"`` keeps every layer's calibrated grid (block/group scales, zero points):
    the step-0 student is the calibrated model exactly and a code changes only when its latent
    weight crosses a rounding midpoint of that grid. ``"recompute"`` derives the scales from the
    latent weight at every forward (NVFP4 keeps its calibrated per-tensor scale either way)."""
    if scales not in ("calibrated", "recompute"):
        raise ValueError(f"student.scales must be calibrated|recompute, got {scales!r}")
    n = 0
    for m in model.modules():
        if isinstance(m, QuantLinear) and m.mode == "frozen" and m.config is not None:
            w = m.dequantized_weight(torch.float32).detach()  # [N, K]: the calibrated point
            state = None
            if "weight_global_scale" in m._tensor_names:  # NVFP4: keep the calibrated tensor scale
                state = {"global_scale": m.weight_global_scale.detach().clone()}
            if scales == "calibrated":
                keep = FROZEN_SCALES.get(m.config.name)
                if keep is None:
                    raise ValueError(f"student.scales=calibrated keeps the grid of {sorted(FROZEN_SCALES)} layers; "
                                     f"{m.config.name} is not one -- use student.scales=recompute")
                state = {**(state or {}), **{k: getattr(m, k).detach().clone() for k in keep
                                             if k in m._tensor_names}}
            for name in m._tensor_names:
                delattr(m, name)
            m._tensor_names = ()
            m._wcache = None
            m.weight = nn.Parameter(w.to(m.compute_dtype))
            m._qat_state = state
            m.mode = "qat"
            n += 1
    return n


def build_student(model: nn.Module, cfg: StudentConfig) -> dict:
    """Make ``model`` the trainable student in place; returns a small report."""
    calibrated = any(isinstance(m, QuantLinear) and m.config is not None for m in model.modules())
    if not calibrated:  # a full-precision input: RTN into student.format
        recipe = {"default": cfg.format, "mode": "qat" if cfg.mode == "qat" else "frozen"}
        if cfg.mode == "lora":
            recipe["lora"] = {"r": cfg.lora_r, "alpha": cfg.lora_alpha, "targets": list(cfg.lora_targets)}
        quantize_model(model, recipe)
        init = f"rtn {cfg.format} (full-precision input)"
    else:
        init = "calibrated checkpoint"
        if cfg.mode == "qat":
            to_qat(model, cfg.scales)
        else:
            attach_lora(model, LoRAConfig(r=cfg.lora_r, alpha=cfg.lora_alpha, targets=list(cfg.lora_targets)))
    for name, p in model.named_parameters():
        if cfg.mode == "lora":
            train = "lora_A" in name or "lora_B" in name
        else:
            mod = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            train = (isinstance(mod, QuantLinear) and mod.mode == "qat" and name.endswith(".weight")) \
                or cfg.train_embeddings
        p.requires_grad_(train)
        if train and p.dtype != torch.float32:  # fp32 latent/adapter weights: small steps survive
            p.data = p.data.float()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trainable == 0:
        raise ValueError("the student has no trainable parameters: no quantized linear layer was found (check "
                         "student.lora_targets / the calibrate recipe)")
    layers = sum(1 for m in model.modules() if isinstance(m, QuantLinear))
    return {"mode": cfg.mode, "init": init, "trainable_params": trainable, "quant_layers": layers}


@torch.no_grad()
def finalize_student(model: nn.Module) -> dict:
    """QAT layers -> frozen packed; LoRA merged into the base and re-quantized. Returns the memory report."""
    for m in model.modules():
        if not isinstance(m, QuantLinear):
            continue
        if m.mode == "qat":
            m.weight.data = m.weight.data.float()
            m.freeze()
        if m.lora_cfg is not None:
            w = m.dequantized_weight(torch.float32) + m.lora_delta().float()
            if m.config is not None:
                m.set_qtensor(get_format(m.config.name).quantize(w, m.config))
            else:
                m.weight = w.to(m.compute_dtype)
            del m.lora_A, m.lora_B
            m.lora_cfg = None
            m.lora_dropout = None
    for p in model.parameters():
        p.requires_grad_(False)
    return memory_report(model)
