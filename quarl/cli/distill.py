"""``quarl distill`` and ``quarl kd-coldstart``: a quantized student distilled from its teacher.

    quarl distill --student runs/r1/calibrate/model --data runs/r1/data_prep/dataset \\
                  --output runs/r1/distill/model --set loss.objective=forward_kl
    quarl kd-coldstart --student runs/r1/calibrate/model --data runs/r1/data_prep/dataset \\
                       --output runs/r1/kd_coldstart/model --teacher default

Thin faces over :func:`quarl.distill.run_distill` (QAD; QAT with ``loss.objective=ce``)
and :func:`quarl.distill.run_kd_coldstart` (Reasoning-QAT's defaults). Re-running the
same command after an interruption resumes from the newest checkpoint.
"""

from __future__ import annotations

from typing import Annotated

import typer

from quarl.cli.common import ConfigOpt, OutputOpt, OverwriteOpt, PrintConfigOpt, SetOpt, run_stage

StudentOpt = Annotated[str, typer.Option("--student", "-m", help="quantized student: a calibrate artifact, "
                                                                 "default, HF id, dir or s3://")]
TeacherOpt = Annotated[str | None, typer.Option("--teacher", help="full-precision teacher (default: the model the "
                                                                  "student was calibrated from)")]
DataOpt = Annotated[str | None, typer.Option("--data", "-d", help="dataset artifact URI (quarl data-prep), or a "
                                                                  "sequence set a distillation run generated "
                                                                  "(needed to run)")]


def _command(stage: str):
    def command(config: ConfigOpt = None, overrides: SetOpt = None, student: StudentOpt = "default",
                teacher: TeacherOpt = None, data: DataOpt = None, output: OutputOpt = None,
                overwrite: OverwriteOpt = False, print_config: PrintConfigOpt = False) -> None:
        from quarl.distill import run_distill, run_kd_coldstart
        from quarl.distill.student import PairingError
        from quarl.distill.trainer import DistillDivergedError

        fn = run_distill if stage == "distill" else run_kd_coldstart

        def run(cfg):
            return fn(cfg, model_uri=student, data_uri=data, output_uri=output, teacher_uri=teacher,
                      overwrite=overwrite)

        run_stage(stage, config, overrides, print_config, run, errors=(ValueError, PairingError, DistillDivergedError),
                  needs={"--data": data, "--output": output})

    command.__doc__ = ("Quantization-aware distillation (QAD/QAT) of a quantized student from its full-precision "
                       "teacher." if stage == "distill" else
                       "Reasoning-QAT's KD cold start: the low-bit student distilled from its teacher before RL.")
    return command


def register(app: typer.Typer) -> None:
    app.command("distill")(_command("distill"))
    app.command("kd-coldstart")(_command("kd_coldstart"))
