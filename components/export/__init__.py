from quarl_components.export.component import export

__all__ = ["export"]
