"""The distill and kd_coldstart stages as pipeline steps: inputs, output, run-form parameters, resources.

One library, two stage names: ``distill`` (QAD: KL to the full-precision teacher, QAT/MSE as
options) and ``kd_coldstart`` (Reasoning-QAT's defaults: W3G128 student, teacher traces, cosine
LR with warmup). Both share the inputs and the run form below; their defaults differ through
their config classes (:class:`quarl.distill.config.DistillConfig`,
:class:`quarl.distill.config.KDColdStartConfig`). The components, their README/YAML and the
pipelines' ``distill_*`` / ``kd_coldstart_*`` parameters derive from this declaration.
See :mod:`quarl.pipeline.stages`.
"""

from quarl.pipeline.stages import GPU, InputSpec, OutputSpec, Param, StageSpec

_INPUTS = (
    # named "student", not "model": KFP cannot have an input and an output of the same name
    InputSpec("student", "model", "model_uri", ref_param="base_model",
              help="the quantized student to start from (a calibrate model); else base_model names it.",
              ref_help='the student when no artifact is connected: HF id, "default", s3:// prefix.'),
    InputSpec("data", "dataset", "data_uri",
              help="a data_prep dataset (train split for training text or prompts, eval split held out), or a "
                   "sequence set an earlier distillation run generated (<output>.data)."),
    InputSpec("teacher", "model", "teacher_uri", optional=True, ref_param="teacher_model", ref_default="",
              help="the full-precision teacher as an artifact; else teacher_model names it.",
              ref_help="the teacher when no artifact is connected (empty = the model the student was "
                       "calibrated from)."),
)

_PARAMS = {
    "objective": Param("loss.objective", help="forward_kl (QAD) | reverse_kl | jsd | mse (logit MSE) | ce (plain "
                                              "QAT on the labels)."),
    "mode": Param("student.mode", help="qat (every quantized weight trains through straight-through fake "
                                       "quantization) | lora."),
    "source": Param("data.source", help="training text: sft | teacher | teacher_correct | bos | random "
                                        "(QAD Table 5)."),
    "num_sequences": Param("data.num_sequences", help="training sequences (0 = every row of the split)."),
    "seq_len": Param("data.seq_len", help="tokens per training sequence."),
    "lr": Param("optim.lr", help="learning rate (cosine schedule)."),
    "batch_size": Param("optim.batch_size", help="sequences per optimizer step."),
    "steps": Param("train.steps", help="optimizer steps (0 = one epoch of the training sequences)."),
    "teacher_dtype": Param("teacher.dtype", help="auto (the student's dtype) | bfloat16 | float32 | float16."),
    "device": Param("train.device", help="auto | cpu | cuda | cuda:N."),
}

_METRICS = ("eval_before", "eval_after", "accuracy_before", "accuracy_after", "total_steps", "wall_s", "memory_bytes")


def _spec(name: str, config: str, description: str, doc: str) -> StageSpec:
    """The two stages differ only in name, config class (their defaults) and words."""
    return StageSpec(name=name, run=f"quarl.distill:run_{name}", config=f"quarl.distill:{config}",
                     output=OutputSpec("model", "model"), inputs=_INPUTS, params=_PARAMS, report_file="report.md",
                     metrics=_METRICS, resources=GPU.with_(memory="128Gi", timeout_s=24 * 3600),
                     distributed=True,  # torchrun on N GPUs (docs/distributed.md)
                     description=description, doc=doc)


SPECS = (
    _spec("distill", "DistillConfig",
          "Quantization-aware distillation: the quantized student (calibrated, trained with straight-through fake "
          "quantization or LoRA) matches its full-precision teacher's token distributions (KL over the full "
          "vocabulary); re-quantized at the end.",
          "Quantization-aware distillation (QAD): train the quantized student to match its full-precision teacher."),
    _spec("kd_coldstart", "KDColdStartConfig",
          "Reasoning-QAT's KD cold start: the low-bit (GPTQ W3G128) student distilled from the teacher's own "
          "reasoning traces before RL; the rl stage starts from its model.",
          "Reasoning-QAT's KD cold start: distill the low-bit student from the teacher's own traces before RL."),
)
