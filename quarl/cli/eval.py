"""``quarl eval``: score a model on math benchmarks and write a metrics artifact.

    quarl eval --model default --output runs/r1/eval/bf16                      # built-in held-out split
    quarl eval --model default --set quant=nvfp4 --data gsm8k=/data/gsm8k/test.jsonl --output out
    quarl eval --config quarl/recipes/eval/gsm8k.yaml --model s3://quarl/r1/calibrate/model \
               --adapter s3://quarl/r1/rl/adapter --output s3://quarl/r1/eval/metrics

    quarl eval-compare runs/r1/eval/bf16 runs/r1/eval/nvfp4                 # paired comparison table

A thin face over :func:`quarl.eval.run_eval` (and :mod:`quarl.eval.compare`): on success it prints the summary
(accuracy, pass@k per benchmark) as JSON on stdout; any expected failure (bad
config, unknown benchmark, unreadable data or model, existing artifact) is one
``error:`` line on stderr and exit status 1.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from quarl.cli.common import ConfigOpt, NoProgressOpt, OutputOpt, OverwriteOpt, PrintConfigOpt, SetOpt, run_stage


def eval_cmd(
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="model: local dir | s3:// | HF id | default | tiny-llama (needed to run)"),
    ] = None,
    output: OutputOpt = None,
    data: Annotated[
        list[str] | None,
        typer.Option("--data", "-d", help="benchmark data: name=URI, or a data-prep artifact URI (repeatable)"),
    ] = None,
    adapter: Annotated[
        str | None, typer.Option("--adapter", "-a", help="LoRA adapter: PEFT dir | artifact | s3://")
    ] = None,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    overwrite: OverwriteOpt = False,
    no_progress: NoProgressOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Evaluate a model (full precision, RTN-quantized or calibrated; optional LoRA) on math benchmarks."""
    import dataclasses

    from quarl.eval import EvalError, resolve_benchmarks, run_eval

    run_stage("eval", config, overrides, print_config,
              lambda cfg: run_eval(cfg, model_uri=model, data_uris=data, adapter_uri=adapter, output_uri=output,
                                   overwrite=overwrite, progress=not no_progress),
              errors=(EvalError,),
              show=lambda cfg: dataclasses.replace(cfg, benchmarks=resolve_benchmarks(cfg, data)),
              needs={"--model": model, "--output": output})


def eval_compare(
    runs: Annotated[list[str], typer.Argument(help="eval artifact URIs; the first is the baseline")],
    as_json: Annotated[bool, typer.Option("--json", help="print the rows as JSON instead of a table")] = False,
) -> None:
    """Compare eval artifacts problem by problem (paired accuracy delta, answer agreement)."""
    from quarl.artifacts import ArtifactError
    from quarl.eval.compare import compare_markdown, compare_runs
    from quarl.storage import StorageError

    try:
        rows = compare_runs(runs)
    except (ArtifactError, StorageError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from e
    typer.echo(json.dumps(rows, indent=2) if as_json else compare_markdown(rows))


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)
    app.command("eval-compare")(eval_compare)
