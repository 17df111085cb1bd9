"""Weight formats, the quantized linear layer, and whole-model quantization.

    from quarl.quant import make_config, get_format, QuantLinear, quantize_model
"""

from quarl.quant.base import Format, FormatConfig, QTensor, QuantError, available_formats, get_format
from quarl.quant.linear import LoRAConfig, QuantLinear
from quarl.quant.lora import attach_lora, load_adapter, merge_lora, save_adapter
from quarl.quant.model import QuantRecipe, QuantReport, memory_report, quantize_model
from quarl.quant.spec import make_config, spec_string

__all__ = [
    "Format",
    "FormatConfig",
    "LoRAConfig",
    "QTensor",
    "QuantError",
    "QuantLinear",
    "QuantRecipe",
    "QuantReport",
    "attach_lora",
    "available_formats",
    "get_format",
    "load_adapter",
    "make_config",
    "memory_report",
    "merge_lora",
    "quantize_model",
    "save_adapter",
    "spec_string",
]
