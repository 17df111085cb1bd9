"""The export stage's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class ExportConfig:
    verify: bool = True  # reload the export through compressed-tensors and compare with the in-memory model
    threads: int = 0  # torch CPU threads for the run (0: torch's default, one per core; 1 on a shared host)
    verify_text: str = (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May? Let's think step by step."
    )
    verify_tokens: int = 64  # the verification prompt is cut to this many tokens
    # Tolerance on logits: max|delta| <= logits_atol + rtol * max|logits|, with rtol = logits_rtol_fp4 when
    # any layer is FP4 (compressed-tensors decompresses FP4 weights in bfloat16) and logits_rtol otherwise
    # (fp32 decompression: only summation order differs).
    logits_atol: float = 1e-3
    logits_rtol: float = 1e-5
    logits_rtol_fp4: float = 5e-2
    # Element-wise tolerance on the decompressed weights: |W_ct - W_quarl| <= rtol * |W_quarl|
    # (FP4: two bfloat16 roundings in compressed-tensors' decompression; others: float32, identical).
    weights_rtol: float = 1e-6
    weights_rtol_fp4: float = 2.0**-7
    merge: bool = False  # also write merged/: LoRA merged into a full-precision copy, re-quantized
    merge_base: Literal["source", "dequantized"] = "source"  # full-precision weights to merge into
    base_model: str | None = None  # the source model for merge_base=source (default: from the model's lineage)
    requant_format: str | None = None  # merged model's format (default: each layer's format in the input)
    model_name: str | None = None  # title of the model card (default: derived from the lineage)

    def __post_init__(self) -> None:
        # Checked here, at construction, so `quarl compile`/`submit` reject what the pod would.
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0 = torch's default), got {self.threads}")
        if self.verify_tokens < 1:
            raise ValueError(f"verify_tokens must be >= 1, got {self.verify_tokens}")
        tols = {k: getattr(self, k) for k in ("logits_atol", "logits_rtol", "logits_rtol_fp4", "weights_rtol",
                                              "weights_rtol_fp4")}
        bad = {k: v for k, v in tols.items() if not v >= 0}
        if bad:
            raise ValueError(f"tolerances must be >= 0, got {bad}")
        if self.requant_format is not None:
            from quarl.quant.spec import check_format

            check_format(self.requant_format, "requant_format")
