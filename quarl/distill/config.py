"""DistillConfig: every knob of the distill stage (QAD) and of kd_coldstart (Reasoning-QAT's KD start).

Two stages, one machinery (quarl.distill.trainer); they differ in defaults only:

    distill (QAD, arXiv:2601.20088)           kd_coldstart (Reasoning-QAT)
    objective   forward KL(teacher||student)  forward KL
    temperature 1.0 (full vocabulary)         1.0
    student     full QAT (STE fake-quant)     full QAT
    init        the calibrate artifact        the calibrate artifact (GPTQ W3G128 asym expected)
    lr          1e-5 cosine, warmup 0.0       1e-5 cosine, warmup 0.05
    data        sft text of the dataset       teacher completions of the RL prompts

Objectives (``loss.objective``): ``forward_kl`` (QAD), ``reverse_kl``, ``jsd``
(generalised JSD, ``loss.jsd_beta``), ``mse`` (logit MSE, an ablation) and
``ce`` (cross-entropy on the labels: plain QAT, the baseline QAD compares
against; the teacher is then only used for the held-out KL curve).

Student (``student.mode``): ``qat`` trains a latent high-precision copy of
every quantized weight through straight-through fake quantization
(``QuantLinear`` mode ``qat``) and re-quantizes it into the same format at the
end; ``lora`` trains a LoRA branch on the frozen quantized base and, at the end,
merges it and re-quantizes (the output is always one quantized ``model``
artifact, what the rl stage and eval take).

Every field is validated at construction (``__post_init__``) with a message
that names the field and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from quarl.quant.linear import DEFAULT_LORA_TARGETS
from quarl.train.dequant_cache import check_setting as check_dequant_cache
from quarl.train.fused_glue import check_setting as check_glue_setting

OBJECTIVES = ("forward_kl", "reverse_kl", "jsd", "mse", "ce")
SOURCES = ("sft", "teacher", "teacher_correct", "bos", "random", "tokens")
DTYPES = ("auto", "float32", "bfloat16", "float16")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass
class StudentConfig:
    mode: str = "qat"  # qat (full fine-tuning, straight-through fake quant) | lora (frozen quantized base + LoRA)
    # The format used when the student input is a full-precision model (quantized here by RTN);
    # a calibrated model keeps the formats it was calibrated to.
    format: str = "nvfp4"
    # qat from a calibrated model: recompute (block/group scales from the latent weight at every forward, as
    # ModelOpt's NVFP4 QAT and torchao's QAT do) | calibrated (keep the calibrated grid: step 0 = the calibrated
    # model exactly; a code changes only when its weight crosses a rounding midpoint, which needs a larger lr)
    scales: str = "recompute"
    lora_r: int = 32
    lora_alpha: float = 32.0
    lora_targets: list[str] = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    dtype: str = "auto"  # compute dtype: auto (bfloat16 on CUDA, float32 on CPU)
    train_embeddings: bool = False  # qat: also train norms/embeddings (QAD trains the quantized linears)
    gradient_checkpointing: bool = False
    # RMSNorm / RoPE / SwiGLU as torch.compile'd kernels (quarl.train.fused_glue): auto (on CUDA) | true | false
    compile_glue: str = "auto"

    def __post_init__(self) -> None:
        check_glue_setting(self.compile_glue, "student.compile_glue")
        _check(self.mode in ("qat", "lora"), f"student.mode must be qat|lora, got {self.mode!r}")
        _check(self.scales in ("calibrated", "recompute"), f"student.scales must be calibrated|recompute, got "
                                                           f"{self.scales!r}")
        _check(self.dtype in DTYPES, f"student.dtype must be one of {DTYPES}, got {self.dtype!r}")
        _check(self.lora_r >= 1, f"student.lora_r must be >= 1, got {self.lora_r}")


@dataclass
class TeacherConfig:
    # The full-precision model; "" = the pipeline's model (the student's source before calibration).
    dtype: str = "auto"  # auto = the student's dtype; bfloat16 halves the teacher's memory (QAD's teacher in BF16)

    def __post_init__(self) -> None:
        _check(self.dtype in DTYPES, f"teacher.dtype must be one of {DTYPES}, got {self.dtype!r}")


@dataclass
class LossConfig:
    objective: str = "forward_kl"
    temperature: float = 1.0  # QAD: T = 1 over the full vocabulary
    jsd_beta: float = 0.5  # mixture weight of the generalised JSD (0.5 = symmetric JSD)
    chunk: int = 512  # positions projected to the vocabulary at once (0 = all): a 150k vocab fits
    # Positions the loss covers: all (every non-pad next token; QAD) | completion (after the prompt).
    tokens: str = "all"

    def __post_init__(self) -> None:
        _check(self.objective in OBJECTIVES, f"loss.objective must be one of {OBJECTIVES}, got {self.objective!r}")
        _check(self.temperature > 0, f"loss.temperature must be > 0, got {self.temperature}")
        _check(0 < self.jsd_beta < 1, f"loss.jsd_beta must be in (0, 1), got {self.jsd_beta}")
        _check(self.chunk >= 0, f"loss.chunk must be >= 0 (0 = no chunking), got {self.chunk}")
        _check(self.tokens in ("all", "completion"), f"loss.tokens must be all|completion, got {self.tokens!r}")


@dataclass
class DataConfig:
    """Where training sequences come from (QAD Table 5)."""

    source: str = "sft"  # sft | teacher | teacher_correct | bos | random | tokens (a saved generated set)
    split: str = "train"
    text_columns: list[str] = field(default_factory=lambda: ["prompt", "solution"])  # sft: concatenated
    num_sequences: int = 0  # sequences to train on (generated or read); 0 = every row of the split
    seq_len: int = 512  # tokens per sequence (longer texts are cut, shorter ones padded)
    max_new_tokens: int = 256  # generated sources: completion length
    gen_temperature: float = 1.0  # generated sources: sampling temperature of the teacher
    gen_batch_size: int = 16  # generated sources: rows per generate call
    save: bool = True  # generated sources: publish the set as a dataset artifact (<output>.data) for reuse

    def __post_init__(self) -> None:
        _check(self.source in SOURCES, f"data.source must be one of {SOURCES}, got {self.source!r}")
        _check(self.split in ("train", "eval"), f"data.split must be train|eval, got {self.split!r}")
        _check(self.num_sequences >= 0, "data.num_sequences must be >= 0 (0 = all rows)")
        _check(self.seq_len >= 8, f"data.seq_len must be >= 8, got {self.seq_len}")
        _check(self.max_new_tokens >= 1, "data.max_new_tokens must be >= 1")
        _check(self.gen_temperature > 0, "data.gen_temperature must be > 0 (sampling, not greedy)")
        _check(self.gen_batch_size >= 1, "data.gen_batch_size must be >= 1")
        _check(bool(self.text_columns), "data.text_columns must name at least one column (e.g. [prompt, solution])")


@dataclass
class OptimConfig:
    """Same names as quarl.rl's OptimConfig, so quarl.rl.trainer.lr_at / make_optimizer take it."""

    optimizer: str = "adamw"  # adamw | adamw8bit (bitsandbytes, CUDA)
    lr: float = 1e-5
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    schedule: str = "cosine"  # cosine | constant
    warmup_ratio: float = 0.0
    batch_size: int = 8  # sequences per optimizer step
    micro_batch_size: int = 4  # sequences per forward/backward (memory knob; the step's math is the same)
    # a LoRA student's frozen quantized base held in BF16 through each step instead of decoded per call
    # (quarl.train.dequant_cache, as the rl stage's optim.dequant_cache): auto | true | false
    dequant_cache: str = "auto"

    def __post_init__(self) -> None:
        check_dequant_cache(self.dequant_cache, "optim.dequant_cache")
        _check(self.optimizer in ("adamw", "adamw8bit"), f"optim.optimizer must be adamw|adamw8bit, got "
                                                          f"{self.optimizer!r}")
        _check(self.lr > 0, f"optim.lr must be > 0, got {self.lr}")
        _check(len(self.betas) == 2, f"optim.betas must be two numbers, got {self.betas!r}")
        _check(self.schedule in ("cosine", "constant"), f"optim.schedule must be cosine|constant, got "
                                                        f"{self.schedule!r}")
        _check(0 <= self.warmup_ratio < 1, f"optim.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        _check(self.batch_size >= 1 and self.micro_batch_size >= 1,
               "optim.batch_size and optim.micro_batch_size must be >= 1")


@dataclass
class EvalConfig:
    """Held-out KL to the teacher and CE over training (QAD Table 1), before/after accuracy."""

    split: str = "eval"  # held-out text: this split of the dataset (prompt + solution text)
    num_sequences: int = 16
    seq_len: int = 256
    every: int = 10  # steps between held-out evaluations (0 = before and after only)
    accuracy_samples: int = 16  # greedy answers to eval-split prompts scored before/after (0 = skip)
    max_new_tokens: int = 128

    def __post_init__(self) -> None:
        _check(self.split in ("train", "eval"), f"eval.split must be train|eval, got {self.split!r}")
        _check(self.num_sequences >= 1, "eval.num_sequences must be >= 1 (the held-out KL needs text)")
        _check(self.every >= 0 and self.accuracy_samples >= 0, "eval.every and eval.accuracy_samples must be >= 0")


@dataclass
class TrainConfig:
    steps: int = 0  # optimizer steps; 0 -> epochs * num sequences // batch_size
    epochs: float = 1.0
    seed: int = 0
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    resume: bool = True
    device: str = "auto"
    threads: int = 0  # CPU intra-op threads; 0 = torch's default

    def __post_init__(self) -> None:
        _check(self.steps >= 0, f"train.steps must be >= 0, got {self.steps}")
        _check(self.steps > 0 or self.epochs > 0, "set train.steps > 0 or train.epochs > 0")
        _check(self.checkpoint_every >= 0 and self.keep_checkpoints >= 1,
               "train.checkpoint_every must be >= 0 and train.keep_checkpoints >= 1")


@dataclass
class DistillConfig:
    student: StudentConfig = field(default_factory=StudentConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    # Knob names from TRL's GKD / SFT trainers, HF TrainingArguments and PEFT -> (quarl's key, where the name comes
    # from): an unknown key ending in one of these gets quarl's key in its error (quarl.config._check_foreign_names).
    FOREIGN_NAMES: ClassVar[dict[str, tuple[str, str]]] = {
        "learning_rate": ("optim.lr", "HF TrainingArguments learning_rate"),
        "use_liger_kernel": ("student.compile_glue", "HF TrainingArguments use_liger_kernel (fused norm/RoPE/SwiGLU)"),
        "per_device_train_batch_size": ("optim.micro_batch_size", "HF TrainingArguments per_device_train_batch_size"),
        "gradient_accumulation_steps": ("optim.batch_size", ("HF gradient_accumulation_steps; quarl counts the "
                                                             "sequences of an optimizer step")),
        "lr_scheduler_type": ("optim.schedule", "HF TrainingArguments lr_scheduler_type"),
        "max_steps": ("train.steps", "HF TrainingArguments max_steps"),
        "num_train_epochs": ("train.epochs", "HF TrainingArguments num_train_epochs"),
        "save_steps": ("train.checkpoint_every", "HF TrainingArguments save_steps"),
        "eval_steps": ("eval.every", "HF TrainingArguments eval_steps"),
        "max_seq_length": ("data.seq_len", "TRL SFTConfig max_seq_length"),
        "max_length": ("data.seq_len", "TRL SFTConfig / GKDConfig max_length"),
        "lmbda": ("data.source", ("TRL GKDConfig lmbda, the on-policy fraction; quarl: data.source=teacher "
                                   "(the teacher's completions) or sft (the dataset's text)")),
        "beta": ("loss.jsd_beta", "TRL GKDConfig beta, the generalized JSD's mixture weight (loss.objective=jsd)"),
        "kd_loss": ("loss.objective", "ModelOpt / distillation recipes' loss name"),
        "distill_loss": ("loss.objective", "ModelOpt / distillation recipes' loss name"),
        "r": ("student.lora_r", "PEFT LoraConfig.r"),
        "lora_rank": ("student.lora_r", "LoRA rank"),
        "target_modules": ("student.lora_targets", "PEFT LoraConfig.target_modules"),
    }

    def __post_init__(self) -> None:
        if self.loss.objective == "ce" and self.data.source in ("random",):
            raise ValueError("loss.objective=ce trains on the labels of the text; random tokens have no meaningful "
                             "labels -- use a distillation objective (forward_kl) with data.source=random")


# Reasoning-QAT's defaults as subclasses (not default factories): a config file that sets one field of a
# section builds that section from its *type*, so the type must carry the defaults.
@dataclass
class KDStudentConfig(StudentConfig):
    format: str = "w3g128"  # W3G128 asymmetric (used when the student input is not already calibrated)


@dataclass
class KDDataConfig(DataConfig):
    source: str = "teacher"  # the teacher's own reasoning traces on the RL prompts


@dataclass
class KDOptimConfig(OptimConfig):
    warmup_ratio: float = 0.05  # cosine with warmup


@dataclass
class KDColdStartConfig(DistillConfig):
    """Reasoning-QAT's KD cold start: low-bit (W3G128 asymmetric by GPTQ upstream), forward KL on the
    teacher's own reasoning traces, cosine LR with warmup."""

    student: KDStudentConfig = field(default_factory=KDStudentConfig)
    data: KDDataConfig = field(default_factory=KDDataConfig)
    optim: KDOptimConfig = field(default_factory=KDOptimConfig)
