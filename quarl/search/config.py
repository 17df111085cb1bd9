"""The precision_search stage's config: formats, reward weights, budget, PPO, data.

    cfg = PrecisionSearchConfig(formats=["nf4-dq", "nvfp4", "int8-g64", "bf16"], budget_format="nvfp4",
                                reward=RewardConfig(w_kl=1.0), ppo=PPOConfig(episodes=256))

Every section validates at construction: a bad value fails with the key, the
problem and the fix, before a model is loaded.

Defaults and why (measured on SmolLM2-135M, benchmarks/RESULTS.md "Precision search (CPU)"):

* ``formats``: the issue's set (NF4, NVFP4, INT8, BF16), with two spellings
  chosen for the budget trade. NF4 is ``nf4-dq``, QLoRA's NF4 with double
  quantization (4.127 bits; plain ``nf4`` stores an FP32 absmax per 64 and
  costs 4.5, NVFP4's bits at a higher KL, so it could never pay for a more
  precise layer elsewhere). INT8 is ``int8-g64``, because SmolLM2's hidden
  size 576 is not a multiple of 128 (``int8`` means group 128);
* ``granularity: fused``: one decision per projection an inference engine
  fuses (qkv, o, gate_up, down: 120 units for SmolLM2). Finer than a block,
  and the sensitivity of the four differs by up to 10x within a block; the
  q/k/v and gate/up shards must share a format for vLLM anyway. ``block``
  (30 units), ``group`` (attention / MLP) and ``linear`` also exist;
* budget: ``budget_format: nvfp4``, i.e. at most the average bits of uniform
  NVFP4 on this model (4 bits + an FP8 scale per 16 + an FP32 scale per
  tensor = 4.50006 on SmolLM2), so the searched recipe is compared with
  uniform NVFP4 at equal or fewer bits; ``budget_bits`` sets a number instead;
* reward: KL at weight 1 in calibrate's direction (``kl: ref_quant``), the
  loss gap at weight 0, attention entropy measured but not rewarded (its sign
  as a PTQ objective is unclear), memory savings a small tie-breaker; the
  budget is a hard constraint (action masking), not a penalty. Why no loss
  term: on a search batch of a few hundred tokens the loss gap is mostly
  noise -- quantizing one unit alone *lowers* the loss for about half of
  SmolLM2's 120 units -- and an agent rewarded by it learns that noise.
  KL(p_ref || p_quant) is the same cross-entropy against the reference's full
  next-token distribution instead of one sampled token, with far less
  variance. ``w_perf: 1`` restores the issue's formula;
* PPO: 8 episodes per update, 8 epochs of 4 minibatches, GAE lambda 0.5,
  rewards scaled by the returns' standard deviation, entropy bonus decayed to
  0 -- tuned on a table environment built from SmolLM2's measured
  single-unit KLs (additive), where the mean reward of 128 episodes climbs
  from random search's level to within 7% of greedy's; with lambda 0.95 it
  barely moved in 128 episodes, and the old 16 episodes x 4 full-batch epochs
  with the reward at the end did not learn in 32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from quarl.quant.base import QuantError
from quarl.quant.spec import make_config, spec_string

Granularity = Literal["block", "group", "fused", "linear"]


@dataclass
class RewardConfig:
    """R = w_perf (L_ref - L_quant) - w_kl KL + w_ent (E_quant - E_ref) + w_mem MemSave (KL: see ``kl``)."""

    w_perf: float = 0.0  # the loss gap on a small batch is mostly noise (module docstring); 1 = the formula
    w_kl: float = 1.0
    w_ent: float = 0.0
    w_mem: float = 0.01
    # which KL the w_kl term charges: "quant_ref" = KL(p_quant || p_ref) (the formula); "ref_quant" =
    # KL(p_ref || p_quant), what calibrate and eval report (the reference's tokens scored under the quantized model)
    kl: Literal["quant_ref", "ref_quant"] = "ref_quant"
    # When R is paid (every mode's episode return is R of the whole recipe; see quarl.search.env):
    # "shaped": step t pays unit t's single-unit estimate (sensitivity table), the last step the rest of R;
    # "episode": all of R at the last step; "step": the measured change of R at every step (a forward pass each).
    mode: Literal["shaped", "episode", "step"] = "shaped"

    def __post_init__(self) -> None:
        for k in ("w_perf", "w_kl", "w_ent", "w_mem"):
            if getattr(self, k) < 0:
                raise ValueError(f"reward.{k} must be >= 0 (the sign is part of the formula), got {getattr(self, k)}")
        if self.kl not in ("quant_ref", "ref_quant"):
            raise ValueError(f"reward.kl must be 'quant_ref' or 'ref_quant', got {self.kl!r}")
        if self.mode not in ("shaped", "episode", "step"):
            raise ValueError(f"reward.mode must be 'shaped', 'episode' or 'step', got {self.mode!r}")


@dataclass
class PPOConfig:
    """PPO (Schulman et al. 2017) with GAE; one update per ``episodes_per_update`` episodes."""

    episodes: int = 256  # total episodes (= measured recipes, the random baseline gets as many)
    episodes_per_update: int = 8
    epochs: int = 8  # optimisation passes over each batch ...
    minibatches: int = 4  # ... each in this many shuffled minibatches (an Adam step each)
    normalize_rewards: bool = True  # rewards / std of the episode returns so far (the critic's targets ~ unit scale)
    lr: float = 3e-3
    gamma: float = 1.0  # finite episodes, reward at the end: no discounting
    # a short credit horizon: a shaped step reward carries its own effect (0.95 learnt ~3x slower on the SmolLM2
    # table); with reward.mode episode (all of R at the end) use ~0.95, so credit reaches the first steps
    gae_lambda: float = 0.5
    clip: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01  # entropy bonus at the first update ...
    entropy_final: float = 0.0  # ... decayed linearly to this at the last (explore early, commit late)
    hidden: int = 64
    max_grad_norm: float = 0.5
    checkpoint_every: int = 1  # updates between checkpoints (0: none)

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.episodes_per_update < 1:
            raise ValueError(f"ppo.episodes and ppo.episodes_per_update must be >= 1, got {self.episodes}, "
                             f"{self.episodes_per_update}")
        if self.epochs < 1 or self.hidden < 1 or self.minibatches < 1:
            raise ValueError("ppo.epochs, ppo.minibatches and ppo.hidden must be >= 1")
        if not 0 < self.clip < 1:
            raise ValueError(f"ppo.clip must be in (0, 1), e.g. 0.2; got {self.clip}")
        if not (0 < self.gamma <= 1 and 0 <= self.gae_lambda <= 1):
            raise ValueError(f"ppo.gamma must be in (0, 1] and ppo.gae_lambda in [0, 1]; got {self.gamma}, "
                             f"{self.gae_lambda}")
        if self.lr <= 0:
            raise ValueError(f"ppo.lr must be > 0, got {self.lr}")


@dataclass
class SearchDataConfig:
    """The fixed token batches: the search batch (every reward), the selection batch (the search's top
    recipes re-measured, the best kept) and the held-out batch (the comparison table only)."""

    columns: list[str] = field(default_factory=lambda: ["prompt", "solution"])  # data_prep columns, joined
    path: str | None = None  # a local .txt/.jsonl/.parquet when no data artifact is given
    text_field: str = "text"
    num_samples: int = 4  # windows in the search batch
    seq_len: int = 128  # tokens per window
    select_samples: int = 4  # windows of the selection batch, other train text (0: keep the best search episode)
    heldout_samples: int = 4  # windows of the held-out batch (0: no held-out comparison)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_samples < 1 or self.seq_len < 2:
            raise ValueError(f"data.num_samples must be >= 1 and data.seq_len >= 2; got {self.num_samples}, "
                             f"{self.seq_len}")
        if self.heldout_samples < 0 or self.select_samples < 0:
            raise ValueError(f"data.heldout_samples and data.select_samples must be >= 0, got "
                             f"{self.heldout_samples}, {self.select_samples}")


@dataclass
class PrecisionSearchConfig:
    formats: list[str] = field(default_factory=lambda: ["nf4-dq", "nvfp4", "int8-g64", "bf16"])
    granularity: Granularity = "fused"
    method: Literal["rtn", "gptq"] = "rtn"  # how a chosen format is applied (GPTQ: Hessians of the search batch)
    # the budget: average storage bits per searched weight <= budget_bits, or, when that is None, <= the average
    # bits of `budget_format` applied to every searched weight (one of formats; None too: no budget)
    budget_bits: float | None = None
    budget_format: str | None = "nvfp4"
    recovery_steps: int = 0  # Adam steps on the norms' gains (KL to the reference) before measuring; 0: none
    recovery_lr: float = 1e-3
    measure_entropy: bool = True  # eager attention, to measure attention entropy (slower)
    baselines: list[str] = field(default_factory=lambda: ["uniform", "greedy", "random"])
    # the searched recipe: of the `select_top` best distinct episodes (by search-batch reward), the one with the
    # best reward on the selection batch -- the search batch is small, and its very best episode is partly noise
    select_top: int = 8
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
        if self.granularity not in ("block", "group", "fused", "linear"):
            raise ValueError(f"granularity must be block, group, fused or linear; got {self.granularity!r}")
        if self.method not in ("rtn", "gptq"):
            raise ValueError(f"method must be rtn or gptq; got {self.method!r}")
        if self.budget_bits is not None and self.budget_bits <= 0:
            raise ValueError(f"budget_bits must be > 0 (or null for no budget), got {self.budget_bits}")
        if self.budget_bits is None and self.budget_format is not None:
            try:
                spec = spec_string(make_config(self.budget_format))
            except QuantError as e:
                raise ValueError(f"budget_format: {e}") from None
            if spec not in specs:
                raise ValueError(f"budget_format {self.budget_format!r} is not one of formats {self.formats}; add it "
                                 "to formats or set budget_bits")
        if self.select_top < 1:
            raise ValueError(f"select_top must be >= 1 (1: the best search-batch episode), got {self.select_top}")
        if self.recovery_steps < 0:
            raise ValueError(f"recovery_steps must be >= 0, got {self.recovery_steps}")
        unknown = set(self.baselines) - {"uniform", "greedy", "random"}
        if unknown:
            raise ValueError(f"unknown baselines {sorted(unknown)}; choose from uniform, greedy, random")
        if self.reward.mode == "shaped" and not self.sensitivity:
            raise ValueError("reward.mode=shaped pays each step its estimate from the sensitivity table: set "
                             "sensitivity: true, or reward.mode: episode")
        if "greedy" in self.baselines and not self.sensitivity:
            raise ValueError("the greedy baseline ranks units by the sensitivity table: set sensitivity: true or "
                             "drop greedy from baselines")
        if self.reward.w_ent > 0 and not self.measure_entropy:
            raise ValueError("reward.w_ent > 0 needs measure_entropy: true (attention entropy is not measured)")
