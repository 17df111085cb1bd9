"""Export: a calibrated (and RL-adapted) model -> checkpoints vLLM / transformers / PEFT load unchanged.

    from quarl.export import ExportConfig, run_export
    run_export(cfg, model_uri=..., adapter_uri=None, output_uri=..., overwrite=False)

See ``stage`` (layout and order of work), ``verify`` (reloading through
compressed-tensors and PEFT, tolerances), ``card`` (the model card).
"""

from quarl.export.config import ExportConfig
from quarl.export.stage import run_export
from quarl.export.verify import ExportError, load_with_compressed_tensors

__all__ = ["ExportConfig", "ExportError", "load_with_compressed_tensors", "run_export"]
