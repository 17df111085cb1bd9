"""``quarl rl``: GRPO/DAPO on a quantized base with LoRA and AQN (QeRL).

    quarl rl --config quarl/recipes/rl/smollm2-cpu.yaml --model default \\
             --data runs/r1/data_prep/dataset --output runs/r1/rl/adapter
    quarl rl --config quarl/recipes/rl/qerl-gsm8k-grpo-7b.yaml --model Qwen/Qwen2.5-7B-Instruct \\
             --data s3://quarl/r1/data_prep/gsm8k --output s3://quarl/r1/rl/adapter --set policy.format=mxfp4

A thin face over :func:`quarl.rl.run_rl`. Re-running the same command after an
interruption resumes from the newest checkpoint. On success the result is printed
as JSON; expected failures (bad config, missing/corrupt artifact, storage,
divergence) are one ``error:`` line on stderr and exit status 1.
"""

from __future__ import annotations

from typing import Annotated

import typer

from quarl.cli.common import ConfigOpt, OutputOpt, OverwriteOpt, PrintConfigOpt, SetOpt, run_stage

# --data / --output are checked by run_stage (not required by typer) so --print-config works without them
DataOpt = Annotated[
    str | None, typer.Option("--data", "-d", help="dataset artifact URI written by `quarl data-prep` (needed to run)")
]


def rl(
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    model: Annotated[str, typer.Option("--model", "-m", help="model: default | tiny-llama | HF id | dir | s3://")] = (
        "default"
    ),
    data: DataOpt = None,
    output: OutputOpt = None,
    init_adapter: Annotated[
        str | None, typer.Option("--init-adapter", help="adapter artifact to start the LoRA from")
    ] = None,
    overwrite: OverwriteOpt = False,
    print_config: PrintConfigOpt = False,
) -> None:
    """Reinforcement learning (GRPO/DAPO) of a quantized policy with LoRA and adaptive quantization noise."""
    from quarl.rl import RLDivergedError, run_rl

    def run(cfg):
        return run_rl(cfg, model_uri=model, data_uri=data, output_uri=output, init_adapter_uri=init_adapter,
                      overwrite=overwrite)

    run_stage("rl", config, overrides, print_config, run, errors=(ValueError, RLDivergedError),
              show=lambda cfg: cfg.resolved(), needs={"--data": data, "--output": output})


def register(app: typer.Typer) -> None:
    app.command("rl")(rl)
