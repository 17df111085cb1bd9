"""``quarl data-prep``: build a validated dataset artifact.

    quarl data-prep --output runs/r1/data_prep/dataset                    # embedded default (generator)
    quarl data-prep --config quarl/recipes/data/gsm8k.yaml --output s3://quarl/r1/data_prep/gsm8k
    quarl data-prep --set 'sources=[gsm8k:/data/gsm8k/train.jsonl]' --set split.eval_size=500 --output out

A thin face over :func:`quarl.data.run_data_prep`: on success it prints the
result as JSON on stdout; any expected failure (bad config, unreadable source,
failed validation, existing artifact) is one ``error:`` line on stderr and exit
status 1 — a failed validation also names the report artifact it left.
"""

from __future__ import annotations

import typer

from quarl.cli.common import ConfigOpt, OutputOpt, OverwriteOpt, PrintConfigOpt, SetOpt, run_stage


def data_prep(
    output: OutputOpt = None,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    overwrite: OverwriteOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Prepare, validate and write a math RL dataset (parquet + summary) as a dataset artifact."""
    from quarl.data import DataValidationError, SourceError, TemplateError, run_data_prep

    run_stage("data_prep", config, overrides, print_config,
              lambda cfg: run_data_prep(cfg, output_uri=output, overwrite=overwrite),
              errors=(DataValidationError, SourceError, TemplateError), needs={"--output": output})


def register(app: typer.Typer) -> None:
    app.command("data-prep")(data_prep)
