from quarl_components.distill.component import distill
from quarl_components.distill.launcher import distill_trainjob

__all__ = ["distill", "distill_trainjob"]
