"""The calibrate stage's config. Defaults follow the papers; ``None`` sizes resolve per device.

QeRL calibrates NVFP4 with 256 sequences of 2048 tokens; that is the default on
a GPU. On a CPU (tests, laptops, the 2-core CI box) the same ``None`` resolves
to 32 x 256, which keeps a SmolLM2-135M calibration in minutes. The resolved
values are what the artifact records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

Method = Literal["rtn", "gptq", "awq", "awq+gptq"]
Offload = Literal["auto", "none", "cpu"]


@dataclass
class CalibDataConfig:
    """Calibration text: a data_prep artifact (``data_uri``) or a local text file (``path``)."""

    path: str | None = None  # .txt/.jsonl/.json/.parquet, used when no data artifact is given
    text_field: str = "text"  # field of .jsonl/.json/.parquet records holding the text
    columns: list[str] = field(default_factory=lambda: ["prompt"])  # data_prep columns, joined per row
    split: str = "train"
    num_samples: int | None = None  # windows; None: 256 on GPU (QeRL), 32 on CPU
    seq_len: int | None = None  # tokens per window; None: 2048 on GPU (QeRL), 256 on CPU
    batch_size: int = 4  # windows per forward pass during calibration
    seed: int = 0  # document shuffle

    def __post_init__(self) -> None:
        if self.num_samples is not None and self.num_samples < 1:
            raise ValueError(f"data.num_samples must be >= 1, got {self.num_samples}")
        if self.batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1, got {self.batch_size}")


@dataclass
class HeldOutConfig:
    """Held-out text for KL / perplexity (see quarl.calibrate.data for the defaults)."""

    enabled: bool = True
    path: str | None = None
    text_field: str = "text"
    columns: list[str] = field(default_factory=lambda: ["prompt"])
    split: str = "eval"
    num_samples: int = 8
    seq_len: int | None = None  # None: the calibration seq_len
    batch_size: int = 1
    holdout_fraction: float = 0.1  # of the calibration documents, when there is no other held-out source

    def __post_init__(self) -> None:
        if not 0 < self.holdout_fraction < 1:
            raise ValueError(f"eval.holdout_fraction must be in (0, 1), got {self.holdout_fraction}")


@dataclass
class GPTQConfig:
    block_size: int = 128  # columns per lazy-batch block (GPTQ paper)
    percdamp: float = 0.01  # dampening, fraction of mean(diag(H))
    act_order: bool = True  # with static groups (compressed-tensors actorder "static")
    # Hessian GEMM: "fp32" (reference) | "native" (bf16/fp16 activations on the tensor cores, fp32
    # accumulation: exact products, only the summation order differs; see HessianAccumulator)
    hessian: str = "fp32"

    def __post_init__(self) -> None:
        if self.hessian not in ("fp32", "native"):
            raise ValueError(f"gptq.hessian must be 'fp32' or 'native', got {self.hessian!r}")


@dataclass
class AWQConfig:
    n_grid: int = 20  # alpha in {0, 1/20, ..., 19/20} (AWQ paper / AutoAWQ)
    duo_scaling: bool = False  # AutoAWQ's option: s = x^a / w^(1-a)
    # Batches the alpha search evaluates (None: all). The scales' statistics always use every batch. 16 batches
    # of 4 x 2048 tokens is ~2x AutoAWQ's search set (128 x 512) and bounds the stored activations on a GPU.
    search_batches: int | None = 16

    def __post_init__(self) -> None:
        if self.n_grid < 1:
            raise ValueError(f"awq.n_grid must be >= 1, got {self.n_grid}")
        if self.search_batches is not None and self.search_batches < 1:
            raise ValueError(f"awq.search_batches must be >= 1 or null, got {self.search_batches}")


@dataclass
class CalibrateConfig:
    method: Method = "gptq"
    format: str = "nvfp4"  # shorthand for a recipe {default: <format>} (lm_head and embeddings excluded)
    recipe: dict | None = None  # inline quarl.quant.QuantRecipe; a recipe_uri input overrides both
    data: CalibDataConfig = field(default_factory=CalibDataConfig)
    eval: HeldOutConfig = field(default_factory=HeldOutConfig)
    gptq: GPTQConfig = field(default_factory=GPTQConfig)
    awq: AWQConfig = field(default_factory=AWQConfig)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # Sequential onloading (quarl.calibrate.onload): "cpu" keeps the model in host memory and moves one
    # decoder block at a time to the device -- reading each dense block from the checkpoint just before
    # its turn when the model is one on disk or in S3 (quarl.calibrate.streaming), so the host holds one
    # dense block + the packed ones; "none" loads it whole onto the device; "auto" offloads on CUDA when
    # the dense model would not fit comfortably (the rule is in quarl.calibrate.onload).
    offload: Offload = "auto"
    threads: int = 0  # torch CPU threads for the run (0: torch's default, one per core; 1 on a shared host)
    dtype: str = "float32"  # compute dtype of the model during calibration
    propagate_quantized: bool = True  # feed each block the outputs of the quantized blocks before it
    save_dtype: str | None = None  # dense tensors in the checkpoint (None: the compute dtype)
    max_shard_size: str = "5GB"

    # Knob names from llm-compressor / AutoAWQ / GPTQModel -> (quarl's key, where the name comes from): an unknown key
    # ending in one of these gets quarl's key in its error (quarl.config._check_foreign_names).
    FOREIGN_NAMES: ClassVar[dict[str, tuple[str, str]]] = {
        "num_calibration_samples": ("data.num_samples", "llm-compressor oneshot num_calibration_samples"),
        "nsamples": ("data.num_samples", "GPTQ reference code nsamples"),
        "max_seq_length": ("data.seq_len", "llm-compressor oneshot max_seq_length"),
        "seqlen": ("data.seq_len", "GPTQ reference code seqlen"),
        "dampening_frac": ("gptq.percdamp", "llm-compressor GPTQModifier dampening_frac"),
        "damp_percent": ("gptq.percdamp", "GPTQModel / AutoGPTQ damp_percent"),
        "actorder": ("gptq.act_order", "llm-compressor GPTQModifier actorder (quarl: static groups when true)"),
        "desc_act": ("gptq.act_order", "GPTQModel / AutoGPTQ desc_act"),
        "scheme": ("format", "llm-compressor QuantizationModifier scheme (e.g. NVFP4 -> format=nvfp4)"),
        "ignore": ("recipe", "llm-compressor's ignore list: a quarl recipe's per-layer formats (bf16 = kept)"),
        "sequential_targets": ("offload", "llm-compressor sequential onloading (quarl: offload=cpu, block by block)"),
        "pipeline": ("offload", "llm-compressor oneshot pipeline=sequential (quarl: offload=cpu)"),
        "group_size": ("format", "a format names its group size: int4-g128, w3g128, nvfp4 (16), mxfp4 (32)"),
        "bits": ("format", "the format names its bits: nvfp4, mxfp4, int4-g128, w3g128 ..."),
    }

    def __post_init__(self) -> None:
        # Checked here, at construction, so `quarl compile`/`submit` reject what the pod would.
        from quarl.calibrate.onload import check_offload
        from quarl.devices import check_device_name, check_dtype_name
        from quarl.quant.model import QuantRecipe
        from quarl.quant.spec import check_format

        check_format(self.format)
        if self.recipe is not None:
            QuantRecipe.load(self.recipe)
        check_device_name(self.device)
        check_offload(self.offload)
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0 = torch's default), got {self.threads}")
        check_dtype_name(self.dtype, auto=False)
        if self.save_dtype is not None:
            check_dtype_name(self.save_dtype, key="save_dtype", auto=False)
