"""QeRL: quantization-enhanced RL (Huang et al., arXiv:2510.11696).

    data_prep -> calibrate (NVFP4, AWQ) -> rl (GRPO/DAPO on the frozen NVFP4 base + LoRA, AQN) -> eval -> export

The base model is quantized once (NVFP4 weights, calibrated with AWQ); RL trains
only a LoRA adapter on top of it, while adaptive quantization noise (AQN, noise
in the RMSNorm weights decaying over training) widens exploration. Rollouts and
training use the same quantized modules. eval scores the quantized base + adapter
on the held-out split (and any benchmark in the recipe); export writes the
deployable checkpoint. Recipe: quarl/recipes/pipelines/qerl.yaml (Table 4).
"""

from quarl_pipelines._builder import PipelineDef, Step

QERL = PipelineDef(
    name="qerl",
    description="QeRL (arXiv:2510.11696): NVFP4+AWQ calibration, LoRA GRPO/DAPO with adaptive quantization noise, "
                "eval, export",
    paper="arXiv:2510.11696",
    steps=(
        Step("data_prep"),
        Step("calibrate", inputs={"data": "data_prep.dataset"}),
        Step("rl", inputs={"model": "calibrate.model", "data": "data_prep.dataset"}),
        Step("eval", inputs={"model": "calibrate.model", "adapter": "rl.adapter", "data": "data_prep.dataset"}),
        Step("export", inputs={"base": "calibrate.model", "adapter": "rl.adapter"}),
    ),
)
