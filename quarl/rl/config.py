"""RLConfig: every knob of the RL stage, with QeRL's settings as defaults.

Defaults are QeRL Table 4 (arXiv:2510.11696, App. E) -- the GSM8K/GRPO column
where the table has two -- and, where the paper is silent, the public release
(``utils/configs.py`` and ``training/*.sh`` of NVlabs/QeRL):

    optimizer AdamW-8bit, lr 1e-5 (QeRL/QLoRA; 5e-6 for BF16 LoRA)   Table 4
    batch 128 answers = 16 prompts x G 8 (GSM8K) | 8 x 16 (BigMath)   Table 4
    policy updates per rollout 4 (GSM8K) | 1 (BigMath)               Table 4
    max response 4096 (GSM8K) | 8192 (BigMath), temperature 1.0      Table 4
    clip eps_low / eps_high 0.2 / 0.28                               Table 4
    AQN sigma 1e-2 -> 5e-4, 10 stages, exponential                   Table 4, Eq. 8
    no KL, no entropy loss                                           App. E
    LoRA rank 32 (Sec. 4.1), alpha 32 (release default)
    AdamW betas (0.9, 0.99), weight decay 0.1, warmup 10%, cosine    release
    grad clip 0.2, truncated answers masked                          release scripts

"Training batch size 128" is read as 128 sampled answers per step (TRL counts
completions), hence ``prompts_per_step * group_size = 128``.

Algorithm-dependent fields default to ``None`` and are filled by
:meth:`RLConfig.resolved` from ``algo``: GRPO -> sequence-level averaging,
symmetric clip (``eps_high = eps_low``) unless set, no dynamic sampling, no
overlong shaping; DAPO -> token-level averaging, ``eps_high = 0.28``, dynamic
sampling, overlong filtering, ``beta = 0``. The resolved config is what the
artifact records.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import ClassVar

from quarl.engine.rollout import DEFAULT_MAX_NUM_BATCHED_TOKENS
from quarl.quant.linear import DEFAULT_LORA_TARGETS
from quarl.rewards import RewardConfig
from quarl.rl.aqn import AQNConfig
from quarl.rl.precision import PrecisionConfig, policy_fields
from quarl.train.dequant_cache import check_setting as check_dequant_cache
from quarl.train.fused_glue import check_setting as check_glue_setting

ALGOS = ("grpo", "dapo")
OVERLONG = ("none", "filter", "penalty")


@dataclass
class PolicyConfig:
    # "lora": frozen base in `format` + LoRA (QeRL, QLoRA, BF16-LoRA baselines);
    # "full": no quantization, every parameter trains (the paper's "Full" baseline).
    mode: str = "lora"
    format: str = "nvfp4"  # nvfp4 | mxfp4 | nf4 | bf16 (any quarl.quant spec)
    quant_recipe: dict | None = None  # a full quarl.quant QuantRecipe; overrides `format` when set
    lora_r: int = 32
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    lora_targets: list[str] = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    dtype: str = "auto"  # auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16
    gradient_checkpointing: bool = False
    # RMSNorm / RoPE / SwiGLU as torch.compile'd kernels (quarl.train.fused_glue): auto (on CUDA) | true | false
    compile_glue: str = "auto"
    # How the base is loaded (quarl.train.policy.resolve_load): dense (whole model in `dtype`, then quantized) |
    # stream (built layer by layer, each quantized as read: a 32B NVFP4 base fits one 80 GB GPU) |
    # auto (stream for a quantized lora base on CUDA, else dense). The policy is the same either way.
    load: str = "auto"


@dataclass
class RolloutConfig:
    group_size: int = 8  # G answers per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 4096
    max_prompt_tokens: int = 1024  # longer prompts are skipped (logged), never silently cut
    engine: str = "auto"  # auto (quarl.engine.FastGenerator on CUDA, else reference) | fast | reference; under FSDP the fast engine runs on a rollout replica (quarl.engine.replica)
    cache: str = "static"  # static | dynamic (the reference HFGenerator's KV cache)
    batch_size: int = 0  # rows per generate call; 0 = all at once (the fast engine: as many as its KV cache fits in free memory)
    cache_dequantized: str = "auto"  # auto (on CPU) | true | false: keep dequantized base weights in memory
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS  # vLLM's knob: prompt tokens a prefill pass of the fast engine takes (whole rows); bounds its activation memory
    free_cache: bool = True  # verl's free_cache_engine: free the fast engine's KV cache + CUDA graphs after each rollout; false keeps them (no re-capture next step) at their memory during the update


@dataclass
class AlgoConfig:
    algo: str = "grpo"  # grpo | dapo
    eps_low: float = 0.2
    eps_high: float | None = 0.28  # None -> eps_low (GRPO) / 0.28 (DAPO)
    beta: float = 0.0  # KL-to-reference coefficient (k3 estimator); QeRL uses none
    loss_agg: str | None = None  # token | sequence; None -> by algo
    adv_eps: float = 1e-4
    scale_advantages: bool = True  # False = Dr. GRPO (mean-centering only)
    updates_per_rollout: int = 4  # mu: optimizer steps on each rollout batch
    old_logprobs: str = "trainer"  # trainer (clean recompute, TRL/QeRL) | rollout (as sampled, incl. AQN noise)
    dynamic_sampling: bool | None = None  # None -> by algo
    max_sampling_rounds: int = 3  # dynamic sampling: at most this many rollout rounds per step
    overlong: str | None = None  # none | filter | penalty; None -> by algo
    overlong_buffer: int = 512  # soft penalty ramp length (tokens), DAPO Eq. 13


@dataclass
class OptimConfig:
    optimizer: str = "adamw8bit"  # adamw8bit (bitsandbytes, CUDA) | adamw
    lr: float = 1e-5
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    weight_decay: float = 0.1
    max_grad_norm: float = 0.2
    schedule: str = "cosine"  # cosine | constant
    warmup_ratio: float = 0.1
    micro_batch_size: int = 8  # rows per forward/backward (memory knob; does not change the math)
    logprob_chunk: int = 1024  # completion positions projected to the vocabulary at once (0 = all)
    # the frozen quantized base's BF16 weights held through the log-prob pass and updates instead of decoded per call
    # (quarl.train.dequant_cache): auto (CUDA, as much as the memory left after the measured working set holds) |
    # true (the whole base) | false (decode per call: the smallest footprint)
    dequant_cache: str = "auto"


@dataclass
class TrainConfig:
    steps: int = 0  # rollout steps; 0 -> epochs * len(train prompts) // prompts_per_step
    epochs: float = 1.0
    prompts_per_step: int = 16
    split: str = "train"
    seed: int = 2025  # release scripts' --random-state
    checkpoint_every: int = 50  # release save_steps
    keep_checkpoints: int = 2
    resume: bool = True  # continue from the newest checkpoint under the output when there is one
    log_every: int = 1
    sample_every: int = 10  # write example completions to samples.jsonl every N steps (0 = never)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # CPU intra-op threads (torch.set_num_threads); 0 = torch's default
    # Wall-clock budget (seconds of training in this process; 0 = none). The run ends at the first
    # step boundary past it and the stage writes its artifact from the steps done; the LR and AQN
    # schedules still span train.steps (use optim.schedule=constant when the budget decides the length).
    max_time_s: float = 0.0


@dataclass
class RLConfig:
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    aqn: AQNConfig = field(default_factory=AQNConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)  # training/rollout precision flow

    # Knob names from TRL's GRPOConfig / verl's ppo_trainer.yaml / PEFT -> (quarl's key, where the name comes from):
    # an unknown key ending in one of these gets quarl's key in its error (quarl.config._check_foreign_names).
    FOREIGN_NAMES: ClassVar[dict[str, tuple[str, str]]] = {
        "n": ("rollout.group_size", "verl actor_rollout_ref.rollout.n"),
        "num_generations": ("rollout.group_size", "TRL num_generations"),
        "response_length": ("rollout.max_new_tokens", "verl data.max_response_length"),
        "max_response_length": ("rollout.max_new_tokens", "verl data.max_response_length"),
        "max_completion_length": ("rollout.max_new_tokens", "TRL max_completion_length"),
        "max_tokens": ("rollout.max_new_tokens", "vLLM SamplingParams.max_tokens"),
        "prompt_length": ("rollout.max_prompt_tokens", "verl data.max_prompt_length"),
        "max_prompt_length": ("rollout.max_prompt_tokens", "verl data.max_prompt_length; TRL max_prompt_length"),
        "free_cache_engine": ("rollout.free_cache", "verl actor_rollout_ref.rollout.free_cache_engine"),
        "learning_rate": ("optim.lr", "TRL learning_rate; verl actor_rollout_ref.actor.optim.lr"),
        "lr_warmup_steps_ratio": ("optim.warmup_ratio", "verl actor.optim.lr_warmup_steps_ratio"),
        "warmup_style": ("optim.schedule", "verl actor.optim.warmup_style"),
        "lr_scheduler_type": ("optim.schedule", "TRL lr_scheduler_type"),
        "grad_clip": ("optim.max_grad_norm", "verl actor.grad_clip"),
        "ppo_micro_batch_size": ("optim.micro_batch_size", "verl actor.ppo_micro_batch_size"),
        "ppo_micro_batch_size_per_gpu": ("optim.micro_batch_size", "verl actor.ppo_micro_batch_size_per_gpu"),
        "per_device_train_batch_size": ("optim.micro_batch_size", "TRL per_device_train_batch_size"),
        "clip_ratio": ("algo.eps_low", "verl actor.clip_ratio"),
        "clip_ratio_low": ("algo.eps_low", "verl actor.clip_ratio_low"),
        "epsilon": ("algo.eps_low", "TRL epsilon"),
        "clip_ratio_high": ("algo.eps_high", "verl actor.clip_ratio_high"),
        "epsilon_high": ("algo.eps_high", "TRL epsilon_high"),
        "kl_loss_coef": ("algo.beta", "verl actor.kl_loss_coef"),
        "kl_coef": ("algo.beta", "verl algorithm.kl_ctrl.kl_coef"),
        "ppo_epochs": ("algo.updates_per_rollout", "verl actor.ppo_epochs"),
        "num_iterations": ("algo.updates_per_rollout", "TRL num_iterations"),
        "loss_agg_mode": ("algo.loss_agg", "verl actor.loss_agg_mode"),
        "loss_type": ("algo.loss_agg / algo.scale_advantages", "TRL loss_type (grpo / bnpo / dr_grpo)"),
        "lora_rank": ("policy.lora_r", "verl actor_rollout_ref.model.lora_rank"),
        "r": ("policy.lora_r", "PEFT LoraConfig.r"),
        "target_modules": ("policy.lora_targets", "PEFT LoraConfig.target_modules"),
        "use_liger_kernel": ("policy.compile_glue", "TRL use_liger_kernel (fused RMSNorm / RoPE / SwiGLU)"),
        "use_liger": ("policy.compile_glue", "verl actor_rollout_ref.model.use_liger"),
        "enable_gradient_checkpointing": ("policy.gradient_checkpointing",
                                          "verl actor_rollout_ref.model.enable_gradient_checkpointing"),
        "total_training_steps": ("train.steps", "verl trainer.total_training_steps"),
        "max_steps": ("train.steps", "TRL max_steps"),
        "total_epochs": ("train.epochs", "verl trainer.total_epochs"),
        "num_train_epochs": ("train.epochs", "TRL num_train_epochs"),
        "save_freq": ("train.checkpoint_every", "verl trainer.save_freq"),
        "save_steps": ("train.checkpoint_every", "TRL save_steps"),
        "train_batch_size": ("train.prompts_per_step", "verl data.train_batch_size (prompts a step)"),
        "logging_steps": ("train.log_every", "TRL logging_steps"),
    }

    def __post_init__(self) -> None:
        # Validate at construction (the resolved copy: algorithm defaults filled in), so `quarl compile`/`submit`
        # reject `algo.algo=ppo` or a bad AQN schedule instead of the GPU pod.
        self.resolved()
        if self.policy.mode == "lora" and self.policy.quant_recipe is None:
            from quarl.quant.spec import check_format

            check_format(self.policy.format, "policy.format")

    def resolved(self) -> RLConfig:
        """A copy with the algorithm-dependent ``None`` fields filled in, validated."""
        c = copy.deepcopy(self)
        a = c.algo
        if a.algo not in ALGOS:
            raise ValueError(f"algo.algo must be one of {ALGOS}, got {a.algo!r}")
        dapo = a.algo == "dapo"
        if a.eps_high is None:
            a.eps_high = 0.28 if dapo else a.eps_low
        if a.loss_agg is None:
            a.loss_agg = "token" if dapo else "sequence"
        if a.dynamic_sampling is None:
            a.dynamic_sampling = dapo
        if a.overlong is None:
            a.overlong = "filter" if dapo else "none"
        c.policy.format, c.policy.quant_recipe = policy_fields(c.precision, c.policy.mode, c.policy.format,
                                                               c.policy.quant_recipe)
        c.validate()
        return c

    def validate(self) -> None:
        p, r, a, o, t = self.policy, self.rollout, self.algo, self.optim, self.train
        if p.mode not in ("lora", "full"):
            raise ValueError(f"policy.mode must be 'lora' or 'full', got {p.mode!r}")
        full_qat = (p.quant_recipe or {}).get("mode") == "qat"  # full-parameter through fake/FP8 GEMMs (Jet-RL)
        if p.mode == "full" and not full_qat and str(p.format).lower() not in ("bf16", "none", "full", "fp32", "fp16"):
            raise ValueError(f"policy.mode=full trains every weight in high precision; set policy.format=bf16 "
                             f"(got {p.format!r}), or use policy.mode=lora for a quantized base")
        check_glue_setting(p.compile_glue, "policy.compile_glue")
        if p.load not in ("auto", "dense", "stream"):
            raise ValueError(f"policy.load must be auto|dense|stream, got {p.load!r}")
        if p.load == "stream" and (p.mode != "lora" or full_qat):
            raise ValueError("policy.load=stream quantizes the frozen base while loading it; it needs policy.mode=lora "
                             "with a frozen (not qat) recipe. Use policy.load=dense (or auto) here")
        if p.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"policy.dtype must be auto|float32|bfloat16|float16, got {p.dtype!r}")
        if r.group_size < 2:
            raise ValueError(f"rollout.group_size must be >= 2 (GRPO's baseline is the group mean), got {r.group_size}")
        if r.engine not in ("auto", "fast", "reference"):
            raise ValueError(f"rollout.engine must be auto|fast|reference, got {r.engine!r}")
        if r.max_num_batched_tokens < 1:
            raise ValueError(f"rollout.max_num_batched_tokens must be >= 1 (prompt tokens a prefill pass takes), got "
                             f"{r.max_num_batched_tokens}")
        if r.cache not in ("static", "dynamic"):
            raise ValueError(f"rollout.cache must be static|dynamic, got {r.cache!r}")
        if str(r.cache_dequantized).lower() not in ("auto", "true", "false"):
            raise ValueError(f"rollout.cache_dequantized must be auto|true|false, got {r.cache_dequantized!r}")
        if a.loss_agg not in ("token", "sequence"):
            raise ValueError(f"algo.loss_agg must be token|sequence, got {a.loss_agg!r}")
        if a.overlong not in OVERLONG:
            raise ValueError(f"algo.overlong must be one of {OVERLONG}, got {a.overlong!r}")
        if a.overlong == "penalty" and not 0 < a.overlong_buffer <= r.max_new_tokens:
            raise ValueError(f"algo.overlong_buffer={a.overlong_buffer} must be in (0, rollout.max_new_tokens="
                             f"{r.max_new_tokens}]")
        if a.old_logprobs not in ("trainer", "rollout"):
            raise ValueError(f"algo.old_logprobs must be trainer|rollout, got {a.old_logprobs!r}")
        if a.updates_per_rollout < 1:
            raise ValueError(f"algo.updates_per_rollout must be >= 1, got {a.updates_per_rollout}")
        if a.beta < 0 or a.eps_low < 0 or (a.eps_high is not None and a.eps_high < 0):
            raise ValueError("algo.beta, algo.eps_low and algo.eps_high must be >= 0")
        if o.optimizer not in ("adamw8bit", "adamw"):
            raise ValueError(f"optim.optimizer must be adamw8bit|adamw, got {o.optimizer!r}")
        if o.schedule not in ("cosine", "constant"):
            raise ValueError(f"optim.schedule must be cosine|constant, got {o.schedule!r}")
        if len(o.betas) != 2:
            raise ValueError(f"optim.betas must be two numbers, got {o.betas!r}")
        check_dequant_cache(o.dequant_cache, "optim.dequant_cache")
        if o.micro_batch_size < 1 or t.prompts_per_step < 1:
            raise ValueError("optim.micro_batch_size and train.prompts_per_step must be >= 1")
        if t.max_time_s < 0:
            raise ValueError(f"train.max_time_s must be >= 0 (0 = no limit), got {t.max_time_s}")
        if t.steps < 0 or (t.steps == 0 and t.epochs <= 0):
            raise ValueError("set train.steps > 0 or train.epochs > 0")
        self.aqn.validate()
        self.precision.validate()
