"""KFP component ``precision_search``: model + text -> mixed-precision recipe (quarl.search.run_precision_search)."""

from kfp.dsl import Artifact, Dataset, Input, Markdown, Metrics, Model, Output
from quarl_components._base import stage_component


@stage_component("precision_search")
def precision_search(
    recipe: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[Markdown],
    base: Input[Model] = None,
    data: Input[Dataset] = None,
    base_model: str = "default",
    s3_root: str = "s3://quarl/runs",
    run_id: str = "",
    kfp_run_id: str = "",
    step: str = "precision_search",
    formats: list = ["nf4", "nvfp4", "int8-g64", "bf16"],  # noqa: B006 - KFP needs a literal default
    granularity: str = "block",
    method: str = "rtn",
    budget_bits: float = 4.51,
    episodes: int = 256,
    w_perf: float = 1.0,
    w_kl: float = 1.0,
    w_ent: float = 0.0,
    w_mem: float = 0.01,
    device: str = "cpu",
    config_yaml: str = "",
    overrides: list = [],  # noqa: B006 - KFP needs a literal default
):
    """Search each layer's weight format with a PPO agent under an average-bits budget; write a recipe for calibrate.

    Args:
        base: the full-precision model as an artifact; else base_model names it.
        data: a data_prep dataset: its train split is the search batch, its eval split the held-out batch.
        base_model: the model to search: HF id, "default" (SmolLM2-135M-Instruct), s3:// prefix.
        formats: the formats an agent may pick per unit (any quarl.quant format spec; bf16 = unchanged).
        granularity: one decision per block | group (attention / MLP) | linear.
        method: how a chosen format is applied while searching: rtn | gptq (Hessians of the search batch).
        budget_bits: average storage bits per searched weight must stay <= this (0 = no budget).
        episodes: PPO episodes (= measured recipes; random search gets as many).
        w_perf: reward weight of the loss gap L_ref - L_quant.
        w_kl: reward weight of -KL(p_quant || p_ref).
        w_ent: reward weight of the attention-entropy change E_quant - E_ref.
        w_mem: reward weight of the memory saved vs BF16 (1 - avg_bits / 16).
        device: cpu | cuda | auto.
        s3_root: where artifacts go: <s3_root>/<run_id>/<step>/recipe.
        run_id: run id in the S3 layout; empty = the Kubeflow run id (kfp_run_id).
        kfp_run_id: the pipeline passes the Kubeflow run id here.
        step: the step's name in the S3 layout.
        config_yaml: YAML of any other PrecisionSearchConfig fields.
        overrides: "key.sub=value" strings applied last.
    """
    args = dict(locals())  # first: exactly the parameters above
    from quarl.pipeline.runtime import run_component

    run_component("precision_search", **args)
