from quarl_components.precision_search.component import precision_search

__all__ = ["precision_search"]
