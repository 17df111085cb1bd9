from quarl_components.rl.component import rl
from quarl_components.rl.launcher import rl_trainjob

__all__ = ["rl", "rl_trainjob"]
