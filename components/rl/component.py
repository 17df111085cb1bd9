"""KFP component ``rl``: GRPO/DAPO on a quantized policy with LoRA and AQN (quarl.rl.run_rl)."""

from kfp.dsl import Dataset, Input, Markdown, Metrics, Model, Output
from quarl_components._base import stage_component


@stage_component("rl")
def rl(
    adapter: Output[Model],
    metrics: Output[Metrics],
    report: Output[Markdown],
    data: Input[Dataset],
    model: Input[Model] = None,
    init_adapter: Input[Model] = None,
    base_model: str = "default",
    s3_root: str = "s3://quarl/runs",
    run_id: str = "",
    kfp_run_id: str = "",
    step: str = "rl",
    algo: str = "grpo",
    mode: str = "lora",
    format: str = "nvfp4",
    lora_r: int = 32,
    lr: float = 1e-05,
    optimizer: str = "adamw8bit",
    steps: int = 0,
    prompts_per_step: int = 16,
    group_size: int = 8,
    max_new_tokens: int = 4096,
    temperature: float = 1.0,
    updates_per_rollout: int = 4,
    aqn: bool = True,
    aqn_sigma_start: float = 0.01,
    aqn_sigma_end: float = 0.0005,
    device: str = "auto",
    config_yaml: str = "",
    overrides: list = [],  # noqa: B006 - KFP needs a literal default
):
    """Train a quantized policy with GRPO or DAPO: frozen low-bit base + LoRA, adaptive quantization noise.

    The output is a LoRA adapter (mode=lora) or a full model (mode=full); training
    checkpoints are mirrored to <output>.checkpoints in S3, so a retried step resumes.

    Args:
        data: a data_prep dataset (train split).
        model: the policy's base as an artifact (e.g. calibrate's quantized model); else base_model names it.
        init_adapter: a LoRA adapter to start from (e.g. a KD cold start).
        base_model: the model when no artifact is connected: HF id, "default", s3:// prefix.
        algo: grpo | dapo.
        mode: lora (quantized frozen base + LoRA) | full (every weight, high precision).
        format: base weight format: nvfp4 (QeRL), mxfp4, nf4 (QLoRA), fp8-block, bf16.
        lora_r: LoRA rank.
        lr: learning rate.
        optimizer: adamw8bit (bitsandbytes, CUDA) | adamw.
        steps: rollout steps (0 = one epoch of the train split).
        prompts_per_step: prompts per rollout step.
        group_size: answers per prompt (G).
        max_new_tokens: response budget.
        temperature: rollout sampling temperature.
        updates_per_rollout: optimizer steps per rollout batch.
        aqn: adaptive quantization noise on/off.
        aqn_sigma_start: AQN noise std at the first noisy stage.
        aqn_sigma_end: AQN noise std at the last stage.
        device: auto | cpu | cuda | cuda:N.
        s3_root: where artifacts go: <s3_root>/<run_id>/<step>/adapter.
        run_id: run id in the S3 layout; empty = the Kubeflow run id (kfp_run_id).
        kfp_run_id: the pipeline passes the Kubeflow run id here.
        step: the step's name in the S3 layout.
        config_yaml: YAML of any other RLConfig fields.
        overrides: "key.sub=value" strings applied last.
    """
    args = dict(locals())  # first: exactly the parameters above
    from quarl.pipeline.runtime import run_component

    run_component("rl", **args)
