"""KFP component ``data_prep``: sources -> validated prompt dataset (quarl.data.run_data_prep)."""

from kfp.dsl import Dataset, Markdown, Metrics, Output
from quarl_components._base import stage_component


@stage_component("data_prep")
def data_prep(
    dataset: Output[Dataset],
    metrics: Output[Metrics],
    report: Output[Markdown],
    s3_root: str = "s3://quarl/runs",
    run_id: str = "",
    kfp_run_id: str = "",
    step: str = "data_prep",
    sources: list = ["synthetic"],  # noqa: B006 - KFP needs a literal default
    template: str = "qerl",
    eval_size: float = 0.05,
    max_train_samples: int = 0,
    max_eval_samples: int = 0,
    seed: int = 0,
    config_yaml: str = "",
    overrides: list = [],  # noqa: B006 - KFP needs a literal default
):
    """Prepare a math RL dataset: load sources, filter, dedup, split, validate (Great Expectations).

    Args:
        sources: data sources, each "name" or "name:path" (synthetic, gsm8k, math, bigmath, deepmath, openr1,
            custom) or a mapping of SourceConfig fields.
        template: prompt template (qerl, chat, plain).
        eval_size: held-out eval rows of "auto" sources: a fraction below 1, else a row count.
        max_train_samples: cap on train rows (0 = no cap).
        max_eval_samples: cap on eval rows (0 = no cap).
        seed: seed of sampling and splitting.
        s3_root: where artifacts go: <s3_root>/<run_id>/<step>/dataset.
        run_id: run id in the S3 layout; empty = the Kubeflow run id (kfp_run_id).
        kfp_run_id: the pipeline passes the Kubeflow run id here.
        step: the step's name in the S3 layout.
        config_yaml: YAML of any other DataPrepConfig fields.
        overrides: "key.sub=value" strings applied last.
    """
    args = dict(locals())  # first: exactly the parameters above
    from quarl.pipeline.runtime import run_component

    run_component("data_prep", **args)
