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

import json
import logging

import typer

from quarl.cli.common import ConfigOpt, OutputOpt, OverwriteOpt, PrintConfigOpt, SetOpt


def data_prep(
    output: OutputOpt,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    overwrite: OverwriteOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Prepare, validate and write a math RL dataset (parquet + summary) as a dataset artifact."""
    from quarl.artifacts import ArtifactError
    from quarl.config import ConfigError, config_to_dict, load_config
    from quarl.data import DataPrepConfig, DataValidationError, SourceError, TemplateError, run_data_prep
    from quarl.storage import StorageError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = load_config(DataPrepConfig, config, overrides or [])
        if print_config:
            import yaml

            typer.echo(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
            return
        result = run_data_prep(cfg, output_uri=output, overwrite=overwrite)
    except (ConfigError, DataValidationError, SourceError, TemplateError, ArtifactError, StorageError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo(json.dumps(result, indent=2))


def register(app: typer.Typer) -> None:
    app.command("data-prep")(data_prep)
