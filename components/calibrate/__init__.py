from quarl_components.calibrate.component import calibrate

__all__ = ["calibrate"]
