from quarl_components.distill.component import distill

__all__ = ["distill"]
