"""``quarl precision-search``: a PPO agent picks each layer's weight format -> a ``recipe`` artifact.

    quarl precision-search --model default --data runs/r1/data_prep/dataset --output runs/r1/search/recipe
    quarl precision-search --model default --set data.path=/data/gsm8k/train.jsonl --set data.text_field=answer \\
                           --set ppo.episodes=64 --set budget_format=nvfp4 -o out/recipe
    quarl calibrate --model default --recipe out/recipe -o out/model        # the searched recipe applied

A thin face over :func:`quarl.search.run_precision_search`: on success it prints the searched
recipe's metrics and the comparison table (uniform, greedy, random, PPO) as JSON on stdout; the
recipe itself is ``recipe.yaml`` in the artifact. With ``checkpoint_dir`` set, re-running the
same command after an interruption resumes the agent from its last update (``resume=true``,
the default).
"""

from __future__ import annotations

from typing import Annotated

import typer

from quarl.cli.common import ConfigOpt, NoProgressOpt, OutputOpt, OverwriteOpt, PrintConfigOpt, SetOpt, run_stage


def precision_search(
    output: OutputOpt = None,
    model: Annotated[
        str, typer.Option("--model", "-m", help="full-precision model: local dir | s3:// | HF id | default | tiny-llama")
    ] = "default",
    data: Annotated[
        str | None, typer.Option("--data", "-d", help="data-prep artifact URI (train: search batch, eval: held-out); "
                                                      "or set data.path")
    ] = None,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    overwrite: OverwriteOpt = False,
    no_progress: NoProgressOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Search per-layer weight formats under an average-bits budget (PPO); write a recipe for calibrate."""
    from quarl.search import run_precision_search

    run_stage("precision_search", config, overrides, print_config,
              lambda cfg: run_precision_search(cfg, model_uri=model, data_uri=data, output_uri=output,
                                               overwrite=overwrite, progress=not no_progress),
              errors=(ValueError,), summarize=_summary, needs={"--output": output})


def _summary(result: dict) -> dict:
    return {k: result[k] for k in ("stage", "searched", "comparison", "seconds", "evaluations")}


def register(app: typer.Typer) -> None:
    app.command("precision-search")(precision_search)
