from quarl_components.rl.component import rl

__all__ = ["rl"]
