"""RL precision search: a PPO agent picks each layer's weight format; calibrate takes its recipe.

    from quarl.search import run_precision_search, PrecisionSearchConfig

    run_precision_search(cfg, model_uri="default", data_uri=..., output_uri=...)   # the stage

Modules: ``config`` (the stage config), ``measure`` (decision units, cached
quantized weights, fast measurement of a recipe on a fixed batch), ``reward``
(R and its terms), ``env`` (the episodic environment, budget mask,
sensitivity table), ``ppo`` (the agent), ``baselines`` (uniform, greedy,
random), ``report`` (table and plots), ``stage`` (the artifact).
"""

from quarl.search.baselines import greedy, random_search, uniform
from quarl.search.config import PPOConfig, PrecisionSearchConfig, RewardConfig, SearchDataConfig
from quarl.search.env import BudgetError, PrecisionEnv, sensitivity_table
from quarl.search.measure import ModelEvaluator, Unit, build_units, to_recipe
from quarl.search.ppo import PPO, ActorCritic, gae
from quarl.search.reward import Measurement, mem_save, reward, reward_terms
from quarl.search.stage import run_precision_search, search

__all__ = [
    "PPO",
    "ActorCritic",
    "BudgetError",
    "Measurement",
    "ModelEvaluator",
    "PPOConfig",
    "PrecisionEnv",
    "PrecisionSearchConfig",
    "RewardConfig",
    "SearchDataConfig",
    "Unit",
    "build_units",
    "gae",
    "greedy",
    "mem_save",
    "random_search",
    "reward",
    "reward_terms",
    "run_precision_search",
    "search",
    "sensitivity_table",
    "to_recipe",
    "uniform",
]
