"""The search reward and the memory accounting it uses.

    R = w_perf (L_ref - L_quant) - w_kl KL(p_quant || p_ref) + w_ent (E_quant - E_ref) + w_mem MemSave

* ``L``: mean next-token cross-entropy (nats) on the fixed search batch;
* ``KL(p_quant || p_ref)``: mean over positions of the per-token KL of the
  next-token distributions, in the issue's direction (quantized first) by
  default; ``reward.kl: ref_quant`` charges ``KL(p_ref || p_quant)`` instead,
  the direction calibrate and eval report. The table shows both;
* ``E``: mean attention entropy (nats) over layers, heads and query positions;
* ``MemSave = 1 - avg_bits / 16``: the fraction of BF16 weight storage saved,
  over the quantizable linear weights (lm_head and embeddings are excluded
  from the search and from the average).

Each term is a plain difference of measured numbers, so R of the BF16 model
is exactly 0 and the "step" reward mode (the change of R per step) telescopes
to the episode's R.
"""

from __future__ import annotations

from dataclasses import dataclass

from quarl.search.config import RewardConfig

BF16_BITS = 16.0


@dataclass(frozen=True)
class Measurement:
    """What one evaluation of a (partial) recipe returns."""

    loss: float  # mean NLL of the next token, nats
    kl: float  # mean KL(p_quant || p_ref), nats
    entropy: float  # mean attention entropy, nats (0.0 when not measured)
    avg_bits: float  # average storage bits per quantizable weight
    kl_ref_quant: float = 0.0  # mean KL(p_ref || p_quant): calibrate's direction, reported only


def mem_save(avg_bits: float) -> float:
    """Fraction of the BF16 storage saved: 0 for BF16, 0.72 for NVFP4 (4.5 bits)."""
    return 1.0 - avg_bits / BF16_BITS


def charged_kl(m: Measurement, w: RewardConfig) -> float:
    """The KL the reward charges (``w.kl`` picks the direction)."""
    return m.kl if w.kl == "quant_ref" else m.kl_ref_quant


def reward_terms(m: Measurement, ref: Measurement, w: RewardConfig) -> dict[str, float]:
    """Each weighted term of R separately (they sum to R), for logs and tests."""
    return {
        "perf": w.w_perf * (ref.loss - m.loss),
        "kl": -w.w_kl * charged_kl(m, w),
        "ent": w.w_ent * (m.entropy - ref.entropy),
        "mem": w.w_mem * mem_save(m.avg_bits),
    }


def reward(m: Measurement, ref: Measurement, w: RewardConfig) -> float:
    return float(sum(reward_terms(m, ref, w).values()))


def average_bits(bits: list[float], params: list[int]) -> float:
    """Parameter-weighted average of per-unit storage bits."""
    total = sum(params)
    return sum(b * p for b, p in zip(bits, params, strict=True)) / max(total, 1)
