"""What every stage subcommand shares, declared once: its options (flags and help agree) and its body."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

# Not required by typer (default None): a stage checks it in ``run_stage(needs=...)`` after ``--print-config``, so
# ``quarl <stage> --print-config`` shows the defaults without naming a model or an output.
OutputOpt = Annotated[
    str | None,
    typer.Option("--output", "-o", help="artifact URI: local directory or s3://bucket/prefix (needed to run)"),
]
ConfigOpt = Annotated[
    str | None, typer.Option("--config", "-c", help="YAML file with the stage's config fields (see --print-config)")
]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="override a field: key.sub=value (repeatable)")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="replace a complete artifact at --output")]
NoProgressOpt = Annotated[bool, typer.Option("--no-progress", help="no progress bars (logs only)")]
PrintConfigOpt = Annotated[bool, typer.Option("--print-config", help="print the resolved config and exit")]


def run_stage(stage: str, config: str | None, overrides: list[str] | None, print_config: bool,
              run: Callable[[Any], Any], *, errors: tuple[type[Exception], ...] = (),
              show: Callable[[Any], Any] | None = None, summarize: Callable[[Any], Any] | None = None,
              needs: dict[str, Any] | None = None) -> None:
    """The body every stage command shares, written once.

    Loads the stage's config class (named by its spec, quarl/<area>/spec.py) from
    ``--config`` and ``--set`` (validated at construction), prints it for
    ``--print-config`` (``show`` may resolve it first), else calls ``run(cfg)`` and prints
    the result (or ``summarize(result)``) as JSON. ``needs`` ({"--output": output, ...}): options a run
    cannot do without, checked after ``--print-config`` (one error naming the missing ones). Expected
    failures -- a bad config,
    a missing or corrupt artifact, storage, a model or format error, plus ``errors`` --
    are one ``error:`` line on stderr and exit status 1; anything else is a bug and
    keeps its traceback.
    """
    import json
    import logging
    import os

    from quarl.artifacts import ArtifactError
    from quarl.config import ConfigError, config_to_dict, load_config
    from quarl.models import ModelError
    from quarl.pipeline.stages import get_stage
    from quarl.quant import QuantError
    from quarl.storage import StorageError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = load_config(get_stage(stage).load_config_class(), config, overrides or [])
        if print_config:
            import yaml

            typer.echo(yaml.safe_dump(config_to_dict(show(cfg) if show else cfg), sort_keys=False))
            return
        missing = [flag for flag, value in (needs or {}).items() if not value]
        if missing:
            raise ConfigError(f"quarl {stage.replace('_', '-')} needs {' and '.join(missing)} "
                              f"(see quarl {stage.replace('_', '-')} --help)")
        result = run(cfg)
    except (ConfigError, ArtifactError, StorageError, ModelError, QuantError, *errors) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    if int(os.environ.get("RANK", "0") or 0) != 0:  # under torchrun the result is printed once, by rank 0
        return
    typer.echo(json.dumps(summarize(result) if summarize else result, indent=2, default=str))
