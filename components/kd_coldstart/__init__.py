from quarl_components.kd_coldstart.component import kd_coldstart

__all__ = ["kd_coldstart"]
