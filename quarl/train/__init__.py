"""Training scaffolding every trainer shares (rl today; distill, kd_coldstart, precision_search next).

    policy      resolve_device / resolve_dtype, build_policy (quantized base + LoRA, or full),
                place_policy, lora_disabled (the frozen base as a reference)
    optim       make_optimizer (AdamW / AdamW-8bit), lr_at (warmup + cosine, a pure function of the step)
    checkpoint  CheckpointManager: atomic, resumable checkpoints mirrored to S3; trainable_state, RNG state
    metrics     MetricsLogger (metrics.jsonl + TensorBoard), read_metrics
    distributed torchrun: init_distributed / distributed, Dist (shares of a batch, summed LoRA gradients)
    fsdp        FSDP2 for full-parameter training (shard_model, gathered rollouts), DCP sharded checkpoints
    fused_glue  transformers' RMSNorm / RoPE / SwiGLU as torch.compile'd kernels (policy/student compile_glue)
    dequant_cache  a frozen quantized base's BF16 weights held through the log-prob pass and updates
                (optim.dequant_cache: when memory allows)

A trainer owns its loop and its losses; what is here carries no algorithm.
"""
