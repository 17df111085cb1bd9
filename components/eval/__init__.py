from quarl_components.eval.component import eval

__all__ = ["eval"]
