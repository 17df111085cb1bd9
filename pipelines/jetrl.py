"""Jet-RL: FP8 RL with a unified precision flow (arXiv:2601.14243).

    data_prep -> rl (FP8 training and FP8 rollout through the same modules) -> eval -> export

Jet-RL's finding is that BF16 training with FP8 rollout (the common speed-up)
makes the rollout policy drift from the trained one, and that using the *same*
FP8 quantization in the training GEMMs and in rollout removes the mismatch.
quarl's rl stage runs both through the same modules (``quarl.quant.fp8_linear``),
and the baseline is one setting away: ``rl.precision.mode`` = ``jetrl`` (default
here) | ``fp8-rollout`` (BF16 train / FP8 rollout) | ``bf16``; see
``quarl/rl/precision.py``. No calibration step: FP8 (E4M3, block scales) is
quantized on the fly. Recipe: quarl/recipes/pipelines/jetrl.yaml.
"""

from quarl_pipelines._builder import PipelineDef, Step

JETRL = PipelineDef(
    name="jetrl",
    description="Jet-RL: unified FP8 precision flow for RL training and rollout, eval, export",
    paper="arXiv:2601.14243",
    steps=(
        Step("data_prep"),
        Step("rl", inputs={"data": "data_prep.dataset"}),
        Step("eval", inputs={"adapter": "rl.adapter", "data": "data_prep.dataset"}),
        Step("export", inputs={"adapter": "rl.adapter"}),
    ),
)
