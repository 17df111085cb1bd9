"""QAD: quantization-aware distillation.

    data_prep -> calibrate -> distill (quantized student, full-precision teacher) -> eval -> export

Calibration gives the low-bit student a good start; distillation then trains it
(QAT with straight-through fake quantization) to match the teacher's token
distributions.
"""

from quarl_pipelines._builder import PipelineDef, Step

QAD = PipelineDef(
    name="qad",
    description="Quantization-aware distillation: calibrate, distill a quantized student from its teacher, eval, "
                "export",
    steps=(
        Step("data_prep"),
        Step("calibrate", inputs={"data": "data_prep.dataset"}),
        Step("distill", inputs={"student": "calibrate.model", "data": "data_prep.dataset"}),
        Step("eval", inputs={"model": "distill.model", "data": "data_prep.dataset"}),
        Step("export", inputs={"base": "distill.model"}),
    ),
)
