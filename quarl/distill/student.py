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
(``Format.fake_quant``). NVFP4 keeps the calibrated per-tensor global scale
(passed as the layer's quantization state) so re-quantizing does not move the
grid; block scales (and INT's group scales/zero points) are recomputed from the
latent weight, as QAT does. Re-quantizing a dequantized GPTQ weight can pick a
slightly different scale where GPTQ's error feedback left a group's extreme
code unused; the stage measures the held-out KL of the step-0 student, so any
such drift is visible next to the calibrate stage's own KL.

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


def to_qat(model: nn.Module) -> int:
    """Frozen quantized QuantLinears -> QAT layers with the dequantized weight as latent weight. Returns count."""
    n = 0
    for m in model.modules():
        if isinstance(m, QuantLinear) and m.mode == "frozen" and m.config is not None:
            w = m.dequantized_weight(torch.float32).detach()  # [N, K]: the calibrated point
            state = None
            if "weight_global_scale" in m._tensor_names:  # NVFP4: keep the calibrated tensor scale
                state = {"global_scale": m.weight_global_scale.detach().clone()}
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
            to_qat(model)
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
