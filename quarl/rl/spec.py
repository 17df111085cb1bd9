"""The rl stage as a pipeline step: its inputs, output, run-form parameters and resources.

Declared once here; the component (components/rl/), its README and YAML and the
pipelines' ``rl_*`` parameters derive from it and from :class:`quarl.rl.config.RLConfig`
(types and defaults). A new run-form parameter is one ``Param`` line below naming an
existing config field. See :mod:`quarl.pipeline.stages`.
"""

from quarl.pipeline.stages import GPU, InputSpec, OutputSpec, Param, StageSpec

SPEC = StageSpec(
    name="rl",
    run="quarl.rl.stage:run_rl",
    config="quarl.rl.config:RLConfig",
    # kind "adapter" (policy.mode=lora) or "model" (policy.mode=full)
    output=OutputSpec("adapter", None),
    inputs=(
        InputSpec("model", "model", "model_uri", ref_param="base_model",
                  help="the policy's base as an artifact (e.g. calibrate's quantized model); else base_model "
                       "names it.",
                  ref_help='the model when no artifact is connected: HF id, "default", s3:// prefix.'),
        InputSpec("data", "dataset", "data_uri", help="a data_prep dataset (train split)."),
        InputSpec("init_adapter", "adapter", "init_adapter_uri", optional=True,
                  help="a LoRA adapter to start from (e.g. a KD cold start)."),
    ),
    params={
        "algo": Param("algo.algo", help="grpo | dapo."),
        "mode": Param("policy.mode", help="lora (quantized frozen base + LoRA) | full (every weight, high precision)."),
        "format": Param("policy.format", help="base weight format: nvfp4 (QeRL), mxfp4, nf4 (QLoRA), fp8-block, bf16."),
        "load": Param("policy.load", help="how the base is loaded: auto (stream a quantized base on CUDA) | dense | "
                                          "stream (layer by layer, each layer quantized as read: 32B on one 80 GB "
                                          "GPU)."),
        "lora_r": Param("policy.lora_r", help="LoRA rank."),
        "lr": Param("optim.lr", help="learning rate."),
        "optimizer": Param("optim.optimizer", help="adamw8bit (bitsandbytes, CUDA) | adamw."),
        "steps": Param("train.steps", help="rollout steps (0 = one epoch of the train split)."),
        "prompts_per_step": Param("train.prompts_per_step", help="prompts per rollout step."),
        "group_size": Param("rollout.group_size", help="answers per prompt (G)."),
        "max_new_tokens": Param("rollout.max_new_tokens", help="response budget."),
        "temperature": Param("rollout.temperature", help="rollout sampling temperature."),
        "updates_per_rollout": Param("algo.updates_per_rollout", help="optimizer steps per rollout batch."),
        "aqn": Param("aqn.enabled", help="adaptive quantization noise on/off."),
        "aqn_sigma_start": Param("aqn.sigma_start", help="AQN noise std at the first noisy stage."),
        "aqn_sigma_end": Param("aqn.sigma_end", help="AQN noise std at the last stage."),
        "precision": Param("precision.mode", help="precision flow: policy (the base format's own) | bf16 | "
                                                  "fp8-rollout (BF16 train, FP8 rollout) | jetrl (FP8 in both)."),
        "device": Param("train.device", help="auto | cpu | cuda | cuda:N."),
    },
    report_file="report.md",
    metrics=("reward/accuracy", "reward/mean", "reward", "response", "policy/entropy", "mismatch",
             "total_steps", "time/step_s_mean", "time/total_s", "rollout/tokens_per_s_mean", "memory"),
    resources=GPU.with_(memory="128Gi", timeout_s=48 * 3600),
    distributed=True,  # torchrun on N GPUs: rollouts and LoRA gradients data-parallel (docs/distributed.md)
    description="GRPO/DAPO on the quantized policy (frozen low-bit base + LoRA) with adaptive quantization "
                "noise; resumable from checkpoints mirrored to S3.",
    doc="Train a quantized policy with GRPO or DAPO: frozen low-bit base + LoRA, adaptive quantization noise.\n\n"
        "The output is a LoRA adapter (mode=lora) or a full model (mode=full); training\n"
        "checkpoints are mirrored to <output>.checkpoints in S3, so a retried step resumes.",
)
