"""The data_prep stage as a pipeline step: its inputs, output, run-form parameters and resources.

Declared once here; the component (components/data_prep/), its README and YAML, the
``quarl data-prep`` command and the pipelines' ``data_prep_*`` parameters derive from it
and from :class:`quarl.data.config.DataPrepConfig` (types and defaults). See
:mod:`quarl.pipeline.stages`.
"""

from quarl.pipeline.stages import OutputSpec, Param, Resources, StageSpec

SPEC = StageSpec(
    name="data_prep",
    run="quarl.data:run_data_prep",
    config="quarl.data:DataPrepConfig",
    output=OutputSpec("dataset", "dataset", kfp_type="Dataset"),
    params={
        "sources": Param("sources", form_default=["synthetic"],
                         help='data sources, each "name" or "name:path" (synthetic, gsm8k, math, bigmath, deepmath, '
                              "openr1, custom) or a mapping of SourceConfig fields."),
        "template": Param("template", help="prompt template (qerl, chat, plain)."),
        "eval_size": Param("split.eval_size",
                           help='held-out eval rows of "auto" sources: a fraction below 1, else a row count.'),
        "max_train_samples": Param("split.max_train_samples", none=0, help="cap on train rows (0 = no cap)."),
        "max_eval_samples": Param("split.max_eval_samples", none=0, help="cap on eval rows (0 = no cap)."),
        "seed": Param("seed", help="seed of sampling and splitting."),
    },
    report_file="summary.md",
    metrics=("rows", "dropped", "sources"),
    resources=Resources(image="cpu", cpu="2", memory="8Gi", timeout_s=2 * 3600),
    description="Sources -> filtered, deduplicated, split and validated prompts (parquet).",
    doc="Prepare a math RL dataset: load sources, filter, dedup, split, validate (Great Expectations).",
)
