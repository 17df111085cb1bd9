"""KFP component ``distill``: quantization-aware distillation of a quantized student from its teacher (quarl.distill.run_distill)."""

from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output
from quarl_components._base import stage_component


@stage_component("distill")
def distill(
    model: Output[Model],
    metrics: Output[Metrics],
    report: Output[Markdown],
    data: Input[Dataset],
    student: Input[Model] = None,
    teacher: Input[Model] = None,
    base_model: str = "default",
    teacher_model: str = "",
    s3_root: str = "s3://quarl/runs",
    run_id: str = "",
    kfp_run_id: str = "",
    step: str = "distill",
    objective: str = "forward_kl",
    mode: str = "qat",
    source: str = "sft",
    num_sequences: int = 0,
    seq_len: int = 512,
    lr: float = 1e-05,
    batch_size: int = 8,
    steps: int = 0,
    teacher_dtype: str = "auto",
    device: str = "auto",
    config_yaml: str = "",
    overrides: list = [],  # noqa: B006 - KFP needs a literal default
):
    """Quantization-aware distillation (QAD): train the quantized student to match its full-precision teacher.

    The output is one quantized model (compressed-tensors, the student's format), which the
    rl, eval and export stages load like a calibrate output; training checkpoints are
    mirrored to <output>.checkpoints in S3, so a retried step resumes.

    Args:
        data: a data_prep dataset (train split for training text or prompts, eval split held out), or a
            sequence set an earlier distillation run generated (<output>.data).
        student: the quantized student to start from (a calibrate model); else base_model names it.
        teacher: the full-precision teacher as an artifact; else teacher_model names it.
        base_model: the student when no artifact is connected: HF id, "default", s3:// prefix.
        teacher_model: the teacher when no artifact is connected (empty = the model the student was calibrated from).
        objective: forward_kl (QAD) | reverse_kl | jsd | mse (logit MSE) | ce (plain QAT on the labels).
        mode: qat (every quantized weight trains through straight-through fake quantization) | lora.
        source: training text: sft | teacher | teacher_correct | bos | random (QAD Table 5).
        num_sequences: training sequences (0 = every row of the split).
        seq_len: tokens per training sequence.
        lr: learning rate (cosine schedule).
        batch_size: sequences per optimizer step.
        steps: optimizer steps (0 = one epoch of the training sequences).
        teacher_dtype: auto (the student's dtype) | bfloat16 | float32 | float16.
        device: auto | cpu | cuda | cuda:N.
        s3_root: where artifacts go: <s3_root>/<run_id>/<step>/model.
        run_id: run id in the S3 layout; empty = the Kubeflow run id (kfp_run_id).
        kfp_run_id: the pipeline passes the Kubeflow run id here.
        step: the step's name in the S3 layout.
        config_yaml: YAML of any other DistillConfig fields.
        overrides: "key.sub=value" strings applied last.
    """
    args = dict(locals())  # first: exactly the parameters above
    from quarl.pipeline.runtime import run_component

    run_component("distill", **args)
