"""Reasoning QAT: low-bit reasoning models via KD cold start then RL.

    data_prep -> calibrate (GPTQ, low-bit) -> kd_coldstart -> rl -> eval -> export

GPTQ gives a low-bit (e.g. W3/W4 g128) start; a knowledge-distillation cold
start recovers the reasoning format from the full-precision teacher; RL then
optimizes the quantized policy directly. """

from quarl_pipelines._builder import PipelineDef, Step

REASONING_QAT = PipelineDef(
    name="reasoning_qat",
    description="Low-bit reasoning QAT: GPTQ calibration, KD cold start from the teacher, RL, eval, export",
    steps=(
        Step("data_prep"),
        Step("calibrate", inputs={"data": "data_prep.dataset"}),
        Step("kd_coldstart", inputs={"student": "calibrate.model", "data": "data_prep.dataset"}),
        Step("rl", inputs={"model": "kd_coldstart.model", "data": "data_prep.dataset"}),
        Step("eval", inputs={"model": "kd_coldstart.model", "adapter": "rl.adapter", "data": "data_prep.dataset"}),
        Step("export", inputs={"base": "kd_coldstart.model", "adapter": "rl.adapter"}),
    ),
)
