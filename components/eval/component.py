"""KFP component ``eval``: model (+ adapter) on math benchmarks (quarl.eval.run_eval)."""

from kfp.dsl import Artifact, Dataset, Input, Markdown, Metrics, Model, Output
from quarl_components._base import stage_component


@stage_component("eval")
def eval(
    results: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[Markdown],
    model: Input[Model] = None,
    adapter: Input[Model] = None,
    data: Input[Dataset] = None,
    base_model: str = "default",
    s3_root: str = "s3://quarl/runs",
    run_id: str = "",
    kfp_run_id: str = "",
    step: str = "eval",
    benchmarks: list = [],  # noqa: B006 - KFP needs a literal default
    samples: int = 8,
    temperature: float = 0.6,
    top_p: float = 0.95,
    greedy: bool = False,
    max_new_tokens: int = 4096,
    quant: str = "",
    device: str = "auto",
    config_yaml: str = "",
    overrides: list = [],  # noqa: B006 - KFP needs a literal default
):
    """Evaluate a model, optionally with a LoRA adapter, on math benchmarks: avg@n and unbiased pass@k.

    Args:
        model: a model artifact (e.g. calibrate's quantized model); else base_model names it.
        adapter: a LoRA adapter artifact (e.g. from rl) applied on the model.
        data: a data_prep dataset; its eval split is the "heldout" benchmark.
        base_model: the model when no artifact is connected: HF id, "default", s3:// prefix.
        benchmarks: names or "name=path" (gsm8k, math500, aime24, aime25, amc23, heldout); empty = the data input.
        samples: samples per problem (avg@n); 1 with greedy.
        temperature: sampling temperature.
        top_p: nucleus sampling.
        greedy: argmax decoding.
        max_new_tokens: response budget.
        quant: RTN-quantize the loaded model to this format ("" = as loaded).
        device: auto | cpu | cuda | cuda:N.
        s3_root: where artifacts go: <s3_root>/<run_id>/<step>/results.
        run_id: run id in the S3 layout; empty = the Kubeflow run id (kfp_run_id).
        kfp_run_id: the pipeline passes the Kubeflow run id here.
        step: the step's name in the S3 layout.
        config_yaml: YAML of any other EvalConfig fields.
        overrides: "key.sub=value" strings applied last.
    """
    args = dict(locals())  # first: exactly the parameters above
    from quarl.pipeline.runtime import run_component

    run_component("eval", **args)
