"""The precision_search stage's config: formats, reward weights, budget, PPO, data.

    cfg = PrecisionSearchConfig(formats=["nf4", "nvfp4", "int8-g64", "bf16"], budget_bits=4.51,
                                reward=RewardConfig(w_kl=1.0), ppo=PPOConfig(episodes=256))

Every section validates at construction: a bad value fails with the key, the
problem and the fix, before a model is loaded.

Defaults and why:

* ``formats``: the issue's set (NF4, NVFP4, INT8, BF16) -- but INT8 is
  ``int8-g64``, because SmolLM2's hidden size 576 is not a multiple of 128
  (``int8`` means group 128 and cannot quantize a K=576 layer);
* ``granularity: block``: one decision per decoder block (30 for SmolLM2).
  ``group`` decides attention and MLP separately, ``linear`` each projection;
  an episode costs one forward pass whatever the granularity, but the agent
  needs more episodes for longer episodes;
* ``budget_bits: 4.51``: NVFP4's storage (4 bits + an FP8 scale per 16 + an
  FP32 scale per tensor = 4.5001 bits on SmolLM2; NF4 with FP32 absmax per 64
  is 4.5), so the searched recipe is compared with uniform NVFP4/NF4 at equal
  average bits;
* reward weights: loss gap and KL at weight 1, attention entropy measured but
  not rewarded (its sign as a PTQ objective is unclear), memory savings a small
  tie-breaker; the budget is a hard constraint (action masking), not a penalty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from quarl.quant.base import QuantError
from quarl.quant.spec import make_config, spec_string

Granularity = Literal["block", "group", "linear"]


@dataclass
class RewardConfig:
    """R = w_perf (L_ref - L_quant) - w_kl KL(p_quant || p_ref) + w_ent (E_quant - E_ref) + w_mem MemSave."""

    w_perf: float = 1.0
    w_kl: float = 1.0
    w_ent: float = 0.0
    w_mem: float = 0.01
    # "episode": the whole recipe is measured once, at the last layer (one forward pass per episode);
    # "step": every step is measured and rewarded by the change of R (sums to the same episode return).
    mode: Literal["episode", "step"] = "episode"

    def __post_init__(self) -> None:
        for k in ("w_perf", "w_kl", "w_ent", "w_mem"):
            if getattr(self, k) < 0:
                raise ValueError(f"reward.{k} must be >= 0 (the sign is part of the formula), got {getattr(self, k)}")
        if self.mode not in ("episode", "step"):
            raise ValueError(f"reward.mode must be 'episode' or 'step', got {self.mode!r}")


@dataclass
class PPOConfig:
    """PPO (Schulman et al. 2017) with GAE; one update per ``episodes_per_update`` episodes."""

    episodes: int = 256  # total episodes (= measured recipes, the random baseline gets as many)
    episodes_per_update: int = 16
    epochs: int = 4  # optimisation passes over each batch
    lr: float = 3e-3
    gamma: float = 1.0  # finite episodes, reward at the end: no discounting
    gae_lambda: float = 0.95
    clip: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    hidden: int = 64
    max_grad_norm: float = 0.5
    checkpoint_every: int = 1  # updates between checkpoints (0: none)

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.episodes_per_update < 1:
            raise ValueError(f"ppo.episodes and ppo.episodes_per_update must be >= 1, got {self.episodes}, "
                             f"{self.episodes_per_update}")
        if self.epochs < 1 or self.hidden < 1:
            raise ValueError("ppo.epochs and ppo.hidden must be >= 1")
        if not 0 < self.clip < 1:
            raise ValueError(f"ppo.clip must be in (0, 1), e.g. 0.2; got {self.clip}")
        if not (0 < self.gamma <= 1 and 0 <= self.gae_lambda <= 1):
            raise ValueError(f"ppo.gamma must be in (0, 1] and ppo.gae_lambda in [0, 1]; got {self.gamma}, "
                             f"{self.gae_lambda}")
        if self.lr <= 0:
            raise ValueError(f"ppo.lr must be > 0, got {self.lr}")


@dataclass
class SearchDataConfig:
    """The fixed token batches: one the search optimises on, one held out for the comparison table."""

    columns: list[str] = field(default_factory=lambda: ["prompt", "solution"])  # data_prep columns, joined
    path: str | None = None  # a local .txt/.jsonl/.parquet when no data artifact is given
    text_field: str = "text"
    num_samples: int = 2  # windows in the search batch
    seq_len: int = 64  # tokens per window
    heldout_samples: int = 4  # windows of the held-out batch (0: no held-out comparison)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_samples < 1 or self.seq_len < 2:
            raise ValueError(f"data.num_samples must be >= 1 and data.seq_len >= 2; got {self.num_samples}, "
                             f"{self.seq_len}")
        if self.heldout_samples < 0:
            raise ValueError(f"data.heldout_samples must be >= 0, got {self.heldout_samples}")


@dataclass
class PrecisionSearchConfig:
    formats: list[str] = field(default_factory=lambda: ["nf4", "nvfp4", "int8-g64", "bf16"])
    granularity: Granularity = "block"
    method: Literal["rtn", "gptq"] = "rtn"  # how a chosen format is applied (GPTQ: Hessians of the search batch)
    budget_bits: float | None = 4.51  # average storage bits per searched weight <= this (None: no budget)
    recovery_steps: int = 0  # Adam steps on the norms' gains (KL to the reference) before measuring; 0: none
    recovery_lr: float = 1e-3
    measure_entropy: bool = True  # eager attention, to measure attention entropy (slower)
    baselines: list[str] = field(default_factory=lambda: ["uniform", "greedy", "random"])
    # the single-unit sensitivity table (units x formats evaluations): greedy's ranking and part of the
    # agent's observation; off saves those evaluations (the observation then carries zeros there)
    sensitivity: bool = True
    reward: RewardConfig = field(default_factory=RewardConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    data: SearchDataConfig = field(default_factory=SearchDataConfig)
    exclude: list[str] = field(default_factory=lambda: ["lm_head", "*embed_tokens*"])
    checkpoint_dir: str | None = None  # PPO checkpoints (None: <QUARL_CACHE>/precision_search/<fingerprint>)
    resume: bool = True  # continue from a checkpoint in checkpoint_dir when one is there
    seed: int = 0
    device: str = "cpu"  # the search is small; cpu | cuda | auto
    threads: int | None = None  # torch CPU threads (None: torch's default)

    def __post_init__(self) -> None:
        if not self.formats:
            raise ValueError("formats is empty; list at least one quarl.quant format spec, e.g. [nvfp4, bf16]")
        specs = []
        for f in self.formats:
            try:
                specs.append(spec_string(make_config(f)))
            except QuantError as e:
                raise ValueError(f"formats: {e}") from None
        if len(set(specs)) != len(specs):
            raise ValueError(f"formats lists a format twice: {self.formats}")
        if self.granularity not in ("block", "group", "linear"):
            raise ValueError(f"granularity must be block, group or linear; got {self.granularity!r}")
        if self.method not in ("rtn", "gptq"):
            raise ValueError(f"method must be rtn or gptq; got {self.method!r}")
        if self.budget_bits is not None and self.budget_bits <= 0:
            raise ValueError(f"budget_bits must be > 0 (or null for no budget), got {self.budget_bits}")
        if self.recovery_steps < 0:
            raise ValueError(f"recovery_steps must be >= 0, got {self.recovery_steps}")
        unknown = set(self.baselines) - {"uniform", "greedy", "random"}
        if unknown:
            raise ValueError(f"unknown baselines {sorted(unknown)}; choose from uniform, greedy, random")
        if "greedy" in self.baselines and not self.sensitivity:
            raise ValueError("the greedy baseline ranks units by the sensitivity table: set sensitivity: true or "
                             "drop greedy from baselines")
        if self.reward.w_ent > 0 and not self.measure_entropy:
            raise ValueError("reward.w_ent > 0 needs measure_entropy: true (attention entropy is not measured)")
