"""The ``quarl`` command line. Each stage lives in its own module under
``quarl/cli/`` exposing ``register(app)``; this file only discovers them, so a
new stage adds a subcommand without touching anything shared."""

from __future__ import annotations

import importlib
import pkgutil

import typer

import quarl.cli as _pkg

app = typer.Typer(
    name="quarl",
    help="Quantization-enhanced RL of LLMs: stages (data-prep, calibrate, eval, rl, ...) and pipelines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)



@app.callback()
def _check_switches() -> None:
    # Before every command: a QUARL_* variable quarl does not read (a typo, a removed switch) stops the command with
    # the closest known names, instead of being ignored (quarl/switches.py). No docstring: it would replace the help.
    from quarl.switches import UnknownSwitchError, check_environment

    try:
        check_environment()
    except UnknownSwitchError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e


for _m in sorted(pkgutil.iter_modules(_pkg.__path__), key=lambda m: m.name):
    if _m.name in ("main", "common") or _m.name.startswith("_"):
        continue
    _mod = importlib.import_module(f"quarl.cli.{_m.name}")
    if hasattr(_mod, "register"):
        _mod.register(app)


if __name__ == "__main__":
    app()
