"""``quarl export``: a calibrated (and RL-adapted) model -> verified checkpoints + model card.

    quarl export --model runs/r1/calibrate/model --output runs/r1/export/model
    quarl export --model s3://quarl/r1/calibrate/model --adapter s3://quarl/r1/rl/adapter \\
                 --set merge=true --output s3://quarl/r1/export/model

A thin face over :func:`quarl.export.run_export`: on success it prints the
verification summary as JSON on stdout; any expected failure (a corrupt or
partial input, an NF4 checkpoint, a failed verification, an existing export)
is one ``error:`` line on stderr and exit status 1.
"""

from __future__ import annotations

from typing import Annotated

import typer

from quarl.cli.common import ConfigOpt, OutputOpt, OverwriteOpt, PrintConfigOpt, SetOpt, run_stage


def export(
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="quantized model: calibrate artifact | local dir | s3:// (needed to run)"),
    ] = None,
    output: OutputOpt = None,
    adapter: Annotated[
        str | None, typer.Option("--adapter", "-a", help="LoRA adapter: adapter artifact | PEFT dir | s3://")
    ] = None,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    overwrite: OverwriteOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Export a quantized model (+ adapter) as compressed-tensors / PEFT checkpoints, verified, with a model card."""
    from quarl.export import run_export

    run_stage("export", config, overrides, print_config,
              lambda cfg: run_export(cfg, model_uri=model, adapter_uri=adapter, output_uri=output,
                                     overwrite=overwrite),
              summarize=lambda report: _summary(report, output), needs={"--model": model, "--output": output})


def _summary(report: dict, output: str) -> dict:
    return {
        "output": output,
        "files": report["files"],
        "adapter": report["adapter"],
        "merged": None if not report["merged"] else {k: v for k, v in report["merged"].items() if k != "recipe"},
        "verification": {
            k: {
                "passed": v["passed"],
                "logits_max_abs": v["logits"]["max_abs"],
                "tolerance": v["tolerance"]["logits_max_abs"],
            }
            for k, v in report["verification"].items()
        },
    }


def register(app: typer.Typer) -> None:
    app.command("export")(export)
