"""The export stage as a pipeline step: its inputs, output, run-form parameters and resources.

Declared once here; the component (components/export/), its README and YAML and the
pipelines' ``export_*`` parameters derive from it and from
:class:`quarl.export.config.ExportConfig` (types and defaults). See :mod:`quarl.pipeline.stages`.
"""

from quarl.pipeline.stages import InputSpec, OutputSpec, Param, Resources, StageSpec

SPEC = StageSpec(
    name="export",
    run="quarl.export:run_export",
    config="quarl.export:ExportConfig",
    output=OutputSpec("model", "model"),
    inputs=(
        InputSpec("adapter", "adapter", "adapter_uri", optional=True,
                  help="a LoRA adapter artifact (e.g. from rl), exported beside the base (and merged with merge)."),
        InputSpec("base", "model", "model_uri", ref_param="base_model", ref_default="",
                  help="the quantized model artifact (e.g. calibrate's); else base_model names a local directory.",
                  ref_help="a model directory or s3:// prefix when no artifact is connected."),
    ),
    params={
        "verify": Param("verify", help="reload the export with transformers + compressed-tensors (+ PEFT) and "
                                       "compare logits."),
        "merge": Param("merge", help="also write merged/: the LoRA merged into a full-precision copy, re-quantized."),
        "requant_format": Param("requant_format", none="",
                                help='format of the merged model ("" = each layer\'s input format).'),
        "model_name": Param("model_name", none="", help='title of the model card ("" = derived from the lineage).'),
    },
    report_file="README.md",  # the model card
    metrics=("verification",),
    resources=Resources(image="cpu", cpu="8", memory="64Gi", timeout_s=4 * 3600),
    description="Quantized base (+ LoRA adapter, optionally merged) -> compressed-tensors/PEFT checkpoints "
                "that vLLM and transformers load unchanged, verified by reloading them.",
    doc="Export a quantized model and its LoRA adapter as checkpoints vLLM/transformers load unchanged, verified.",
)
