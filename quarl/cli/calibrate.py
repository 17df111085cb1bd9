"""``quarl calibrate``: post-training quantization (RTN / GPTQ / AWQ / AWQ+GPTQ) -> a model artifact.

    quarl calibrate --model default --data runs/r1/data_prep/dataset --output runs/r1/calibrate/model
    quarl calibrate --model default --set data.path=/data/c4.jsonl --set method=awq --set format=int4-g128 -o out
    quarl calibrate --config quarl/recipes/calibrate/qerl-nvfp4.yaml --model Qwen/Qwen2.5-7B-Instruct \\
                    --data s3://quarl/r1/data_prep/gsm8k --recipe s3://quarl/r1/search/recipe -o s3://...

A thin face over :func:`quarl.calibrate.run_calibrate`: on success it prints
the metrics summary (KL, perplexity, memory) as JSON on stdout; any expected
failure (bad config or recipe, missing data, unsupported layer shape, existing
artifact) is one ``error:`` line on stderr and exit status 1.
"""

from __future__ import annotations

from typing import Annotated

import typer

from quarl.cli.common import ConfigOpt, NoProgressOpt, OutputOpt, OverwriteOpt, PrintConfigOpt, SetOpt, run_stage


def calibrate(
    model: Annotated[
        str | None,
        typer.Option("--model", "-m",
                     help="full-precision model: local dir | s3:// | HF id | default | tiny-llama (needed to run)"),
    ] = None,
    output: OutputOpt = None,
    data: Annotated[
        str | None, typer.Option("--data", "-d", help="data-prep artifact URI (calibration prompts); or set data.path")
    ] = None,
    recipe: Annotated[
        str | None, typer.Option("--recipe", "-r", help="mixed-precision recipe: YAML/JSON file or recipe artifact")
    ] = None,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    overwrite: OverwriteOpt = False,
    no_progress: NoProgressOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Calibrate a full-precision model into quantized weights (compressed-tensors checkpoint + metrics)."""
    from quarl.calibrate import run_calibrate
    from quarl.calibrate.stage import resolve_config, resolve_device

    run_stage("calibrate", config, overrides, print_config,
              lambda cfg: run_calibrate(cfg, model_uri=model, data_uri=data, recipe_uri=recipe, output_uri=output,
                                        overwrite=overwrite, progress=not no_progress),
              show=lambda cfg: resolve_config(cfg, resolve_device(cfg.device)), summarize=_summary,
              needs={"--model": model, "--output": output})


def _summary(result: dict) -> dict:
    summary = {k: result[k] for k in ("inputs", "calibration", "quality", "rel_error")}
    summary["memory"] = {
        "total_bytes": result["memory"]["total_bytes"],
        "by_format": {f: r["bits_per_param"] for f, r in result["memory"]["by_format"].items()},
    }
    return summary


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)
