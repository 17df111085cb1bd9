"""KFP component ``export``: quantized model (+ adapter) -> servable, verified checkpoints (quarl.export.run_export)."""

from kfp.dsl import Input, Markdown, Metrics, Model, Output
from quarl_components._base import stage_component


@stage_component("export")
def export(
    model: Output[Model],
    metrics: Output[Metrics],
    report: Output[Markdown],
    adapter: Input[Model] = None,
    base: Input[Model] = None,
    base_model: str = "",
    s3_root: str = "s3://quarl/runs",
    run_id: str = "",
    kfp_run_id: str = "",
    step: str = "export",
    verify: bool = True,
    merge: bool = False,
    requant_format: str = "",
    model_name: str = "",
    config_yaml: str = "",
    overrides: list = [],  # noqa: B006 - KFP needs a literal default
):
    """Export a quantized model and its LoRA adapter as checkpoints vLLM/transformers load unchanged, verified.

    Args:
        adapter: a LoRA adapter artifact (e.g. from rl), exported beside the base (and merged with merge).
        base: the quantized model artifact (e.g. calibrate's); else base_model names a local directory.
        base_model: a model directory or s3:// prefix when no artifact is connected.
        verify: reload the export with transformers + compressed-tensors (+ PEFT) and compare logits.
        merge: also write merged/: the LoRA merged into a full-precision copy, re-quantized.
        requant_format: format of the merged model ("" = each layer's input format).
        model_name: title of the model card ("" = derived from the lineage).
        s3_root: where artifacts go: <s3_root>/<run_id>/<step>/model.
        run_id: run id in the S3 layout; empty = the Kubeflow run id (kfp_run_id).
        kfp_run_id: the pipeline passes the Kubeflow run id here.
        step: the step's name in the S3 layout.
        config_yaml: YAML of any other ExportConfig fields.
        overrides: "key.sub=value" strings applied last.
    """
    args = dict(locals())  # first: exactly the parameters above
    from quarl.pipeline.runtime import run_component

    run_component("export", **args)
