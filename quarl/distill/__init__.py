"""Distillation of a quantized student from its full-precision teacher: QAD, the QAT baseline, KD cold start.

    from quarl.distill import DistillConfig, run_distill, KDColdStartConfig, run_kd_coldstart

Modules: ``config`` (the stage configs), ``losses`` (KL/JSD/MSE/CE, chunked over
positions), ``data`` (the data sources of QAD Table 5 and saved generated sets),
``student`` (pairing checks, QAT/LoRA set-up, re-quantization), ``trainer`` (the
loop), ``report`` and ``stage`` (the two stage entry points).
"""

from quarl.distill.config import DistillConfig, KDColdStartConfig
from quarl.distill.stage import run_distill, run_kd_coldstart

__all__ = ["DistillConfig", "KDColdStartConfig", "run_distill", "run_kd_coldstart"]
