"""Post-training quantization: RTN, GPTQ, AWQ and AWQ+GPTQ for every quarl weight format.

    from quarl.calibrate import run_calibrate, CalibrateConfig, load_quantized

    run_calibrate(cfg, model_uri=..., data_uri=..., recipe_uri=None, output_uri=...)  # the stage
    model, tok = load_quantized(artifact_dir)        # a calibrated checkpoint -> QuantLinear model
    gptq_quantize(w, H, cfg) / HessianAccumulator     # one layer (quarl.calibrate.gptq)
    calibrate_model(model, plan, batches, method=...) # in place, block by block (quarl.calibrate.sequential)

See ``gptq`` (algorithm), ``awq`` (scale search and folding), ``sequential`` (the
block-by-block loop), ``pack`` (exact packing of calibrated weights), ``checkpoint``
(compressed-tensors layout, integrity checks, the reader), ``data``, ``metrics``.
"""

from quarl.calibrate.config import AWQConfig, CalibDataConfig, CalibrateConfig, GPTQConfig, HeldOutConfig
from quarl.calibrate.gptq import HessianAccumulator, gptq_quantize, relative_error
from quarl.calibrate.sequential import METHODS, calibrate_model
from quarl.calibrate.stage import run_calibrate
from quarl.quant.checkpoint import CheckpointError, check_checkpoint, load_quantized, save_quantized

__all__ = [
    "METHODS",
    "AWQConfig",
    "CalibDataConfig",
    "CalibrateConfig",
    "CheckpointError",
    "GPTQConfig",
    "HeldOutConfig",
    "HessianAccumulator",
    "calibrate_model",
    "check_checkpoint",
    "gptq_quantize",
    "load_quantized",
    "relative_error",
    "run_calibrate",
    "save_quantized",
]
