"""KFP component ``calibrate``: full-precision model -> quantized checkpoint (quarl.calibrate.run_calibrate)."""

from kfp.dsl import Artifact, Dataset, Input, Markdown, Metrics, Model, Output
from quarl_components._base import stage_component


@stage_component("calibrate")
def calibrate(
    model: Output[Model],
    metrics: Output[Metrics],
    report: Output[Markdown],
    base: Input[Model] = None,
    data: Input[Dataset] = None,
    recipe: Input[Artifact] = None,
    base_model: str = "default",
    s3_root: str = "s3://quarl/runs",
    run_id: str = "",
    kfp_run_id: str = "",
    step: str = "calibrate",
    method: str = "gptq",
    format: str = "nvfp4",
    num_samples: int = 0,
    seq_len: int = 0,
    device: str = "auto",
    config_yaml: str = "",
    overrides: list = [],  # noqa: B006 - KFP needs a literal default
):
    """Quantize a model with calibration (RTN, GPTQ, AWQ or AWQ+GPTQ) into a compressed-tensors checkpoint.

    Args:
        base: the full-precision model as an artifact (e.g. from distill); else base_model names it.
        data: a data_prep dataset whose prompts are the calibration text (optional: built-in text otherwise).
        recipe: a quantization recipe artifact (e.g. from precision_search); overrides format.
        base_model: the model to quantize: HF id, "default" (SmolLM2-135M-Instruct), s3:// prefix.
        method: rtn | gptq | awq | awq+gptq.
        format: quarl.quant format of every linear layer (nvfp4, mxfp4, nf4, int4-g128, w3g128, fp8-block).
        num_samples: calibration windows (0 = 256 on GPU, 32 on CPU).
        seq_len: tokens per window (0 = 2048 on GPU, 256 on CPU).
        device: auto | cpu | cuda | cuda:N.
        s3_root: where artifacts go: <s3_root>/<run_id>/<step>/model.
        run_id: run id in the S3 layout; empty = the Kubeflow run id (kfp_run_id).
        kfp_run_id: the pipeline passes the Kubeflow run id here.
        step: the step's name in the S3 layout.
        config_yaml: YAML of any other CalibrateConfig fields.
        overrides: "key.sub=value" strings applied last.
    """
    args = dict(locals())  # first: exactly the parameters above
    from quarl.pipeline.runtime import run_component

    run_component("calibrate", **args)
