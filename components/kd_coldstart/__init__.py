from quarl_components.kd_coldstart.component import kd_coldstart
from quarl_components.kd_coldstart.launcher import kd_coldstart_trainjob

__all__ = ["kd_coldstart", "kd_coldstart_trainjob"]
