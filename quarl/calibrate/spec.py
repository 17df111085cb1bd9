"""The calibrate stage as a pipeline step: its inputs, output, run-form parameters and resources.

Declared once here; the component (components/calibrate/), its README and YAML and the
pipelines' ``calibrate_*`` parameters derive from it and from
:class:`quarl.calibrate.config.CalibrateConfig` (types and defaults). See :mod:`quarl.pipeline.stages`.
"""

from quarl.pipeline.stages import GPU, InputSpec, OutputSpec, Param, StageSpec

SPEC = StageSpec(
    name="calibrate",
    run="quarl.calibrate:run_calibrate",
    config="quarl.calibrate:CalibrateConfig",
    output=OutputSpec("model", "model"),
    inputs=(
        InputSpec("base", "model", "model_uri", ref_param="base_model",
                  help="the full-precision model as an artifact (e.g. from distill); else base_model names it.",
                  ref_help='the model to quantize: HF id, "default" (SmolLM2-135M-Instruct), s3:// prefix.'),
        InputSpec("data", "dataset", "data_uri", optional=True,
                  help="a data_prep dataset whose prompts are the calibration text (optional: built-in text "
                       "otherwise)."),
        InputSpec("recipe", "recipe", "recipe_uri", optional=True,
                  help="a quantization recipe artifact (e.g. from precision_search); overrides format."),
    ),
    params={
        "method": Param("method", help="rtn | gptq | awq | awq+gptq."),
        "format": Param("format", help="quarl.quant format of every linear layer (nvfp4, mxfp4, nf4, int4-g128, "
                                       "w3g128, fp8-block)."),
        "num_samples": Param("data.num_samples", none=0, help="calibration windows (0 = 256 on GPU, 32 on CPU)."),
        "seq_len": Param("data.seq_len", none=0, help="tokens per window (0 = 2048 on GPU, 256 on CPU)."),
        "device": Param("device", help="auto | cpu | cuda | cuda:N."),
        "offload": Param("offload", help="auto | none | cpu: cpu keeps the model on the host and calibrates one "
                                         "decoder block at a time on the GPU (sequential onloading; 32B/70B on "
                                         "one GPU); auto picks cpu when the dense model would not fit."),
    },
    report_file="report.md",
    metrics=("quality.kl", "quality.ppl", "quality.ref_ppl", "rel_error", "quality", "memory.total_bytes",
             "calibration.windows", "calibration.seconds"),
    resources=GPU.with_(memory="96Gi", timeout_s=4 * 3600),
    description="Full-precision model -> quantized compressed-tensors checkpoint (RTN/GPTQ/AWQ), with "
                "held-out KL and perplexity.",
    doc="Quantize a model with calibration (RTN, GPTQ, AWQ or AWQ+GPTQ) into a compressed-tensors checkpoint.",
)
