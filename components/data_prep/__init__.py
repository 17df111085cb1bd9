from quarl_components.data_prep.component import data_prep

__all__ = ["data_prep"]
