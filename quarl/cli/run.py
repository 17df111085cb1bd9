"""``quarl run | compile | submit | schedule``: recipes as pipelines.

    quarl run qerl                                  # local: SeaweedFS + kfp.local, the recipe's `local` profile
    quarl run qerl --set rl.train.steps=4 --set model=tiny-llama
    quarl run qerl --profile paper                  # the paper's settings (no profile), on this machine
    quarl compile qerl                              # -> pipelines/compiled/qerl.yaml
    quarl compile --all                             # every buildable pipeline + components/<stage>/component.yaml
    quarl submit qerl --host https://kfp.example.com/pipeline
    quarl schedule qerl --host URL --cron "0 0 2 * * *"

Recipes are names under quarl/recipes/pipelines/ or paths to YAML files. Expected
failures (a bad recipe, a stage not implemented yet, a failed step) print one
``error:`` line and exit 1; ``quarl run`` prints the summary first.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated

import typer

PAPER = "paper"  # --profile value meaning "no profile: the recipe's own (paper) settings"


def _recipe(name: str, profile: str | None, overrides: list[str] | None):
    """The recipe with every step's config validated, before any cluster or S3 is contacted."""
    from quarl_pipelines import get_pipeline

    from quarl.pipeline.recipes import load_recipe

    r = load_recipe(name, profile=None if profile in (None, "", PAPER) else profile, overrides=overrides or [])
    pipeline = get_pipeline(r.pipeline)
    pipeline.check_available()  # StageUnavailableError names the missing stage
    pipeline.validate()
    r.check_steps(pipeline)  # each stage config built and validated as its pod would (RecipeError)
    return r


def _fail(e: Exception) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(1) from e


def _expected_errors() -> tuple[type[Exception], ...]:
    from quarl.artifacts import ArtifactError
    from quarl.config import ConfigError
    from quarl.pipeline.stages import StageUnavailableError
    from quarl.storage import StorageError

    return ConfigError, StageUnavailableError, StorageError, ArtifactError, ValueError, KeyError


Recipe = Annotated[str, typer.Argument(help="recipe name (quarl/recipes/pipelines/<name>.yaml) or YAML path")]
Overrides = Annotated[
    list[str] | None, typer.Option("--set", "-s", help="model=..., <step>.<field>=value (repeatable)")
]
Profile = Annotated[str, typer.Option("--profile", "-p", help=f"recipe profile; '{PAPER}' = the paper settings")]
Host = Annotated[str, typer.Option("--host", help="Kubeflow Pipelines API endpoint")]
Namespace = Annotated[str | None, typer.Option("--namespace", "-n", help="Kubeflow profile namespace")]
Experiment = Annotated[str, typer.Option("--experiment", help="KFP experiment")]


def run(
    recipe: Recipe,
    overrides: Overrides = None,
    profile: Profile = "local",
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="run id (default: <recipe>-<timestamp>); reuse to resume")
    ] = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="where runs/<run-id>/ goes")] = Path("runs"),
    external_s3: Annotated[
        bool, typer.Option("--external-s3", help="use the S3 in AWS_* instead of a local SeaweedFS")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="stream every step's full log")] = False,
) -> None:
    """Run a recipe's whole pipeline on this machine (kfp.local) against S3; print a summary."""
    from quarl.pipeline.local import RunFailed, run_local

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        r = _recipe(recipe, profile, overrides)
        summary = run_local(r, run_id=run_id, runs_dir=runs_dir, verbose=verbose, external_s3=external_s3)
    except RunFailed as e:
        typer.echo("\n" + e.summary.to_text())
        _fail(e)
    except _expected_errors() as e:
        _fail(e)
    typer.echo("\n" + summary.to_text())
    typer.echo(f"\nsummary: {Path(runs_dir) / summary.run_id / 'summary.md'}")


def compile_(
    recipe: Annotated[str | None, typer.Argument(help="recipe name or path (omit with --all)")] = None,
    all_: Annotated[bool, typer.Option("--all", help="every buildable recipe, and every component")] = False,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="output dir (default: pipelines/compiled/)")] = None,
    components_out: Annotated[
        Path | None, typer.Option("--components-out", help="component YAML root (default: components/)")
    ] = None,
    overrides: Overrides = None,
    profile: Profile = PAPER,
) -> None:
    """Compile pipelines (and components) to KFP YAML."""
    from quarl.pipeline.compile import compile_all, compile_one

    try:
        if all_:
            if recipe:
                raise ValueError("give a recipe or --all, not both")
            done, skipped = compile_all(out, components_out)
            for p in done:
                typer.echo(f"wrote {p}")
            for name, why in skipped.items():
                typer.echo(f"skipped {name}: {why}")
            return
        if not recipe:
            raise ValueError("name a recipe (quarl compile qerl) or pass --all")
        r = _recipe(recipe, profile, overrides)
        typer.echo(f"wrote {compile_one(r, out)}")
    except _expected_errors() as e:
        _fail(e)


def _client(host: str, namespace: str | None):
    import kfp

    # A token for an authenticated endpoint comes from the environment, never the command line.
    return kfp.Client(host=host, namespace=namespace, existing_token=os.environ.get("QUARL_KFP_TOKEN") or None)


def submit(
    recipe: Recipe,
    host: Host,
    namespace: Namespace = None,
    experiment: Experiment = "quarl",
    run_name: Annotated[str | None, typer.Option("--run-name", help="display name of the run")] = None,
    overrides: Overrides = None,
    profile: Profile = PAPER,
    cache: Annotated[bool, typer.Option("--cache/--no-cache", help="let Kubeflow reuse cached task results")] = False,
) -> None:
    """Upload the recipe's pipeline (a new version only if it changed) and start a run."""
    from quarl.pipeline.remote import submit as do_submit

    try:
        r = _recipe(recipe, profile, overrides)
        out = do_submit(r, _client(host, namespace), experiment=experiment, run_name=run_name, enable_caching=cache)
    except _expected_errors() as e:
        _fail(e)
    typer.echo(json.dumps(out, indent=2))


def schedule(
    recipe: Annotated[str | None, typer.Argument(help="recipe name or path (or use --from)")] = None,
    host: Annotated[str, typer.Option("--host", help="Kubeflow Pipelines API endpoint")] = "",
    cron: Annotated[str, typer.Option("--cron", help="6-field cron with seconds (default: daily 02:00)")] = "0 0 2 * * *",
    name: Annotated[str | None, typer.Option("--name", help="recurring run name (default: nightly-<recipe>)")] = None,
    from_: Annotated[
        Path | None, typer.Option("--from", help="a RecurringRun manifest (manifests/nightly-recurring-run.yaml)")
    ] = None,
    namespace: Namespace = None,
    experiment: Experiment = "quarl",
    overrides: Overrides = None,
    profile: Profile = PAPER,
) -> None:
    """Create (or re-create on a new pipeline version) the recurring run of a recipe."""
    from quarl.pipeline.remote import load_recurring_spec
    from quarl.pipeline.remote import schedule as do_schedule

    try:
        if not host:
            raise ValueError("--host is required (the Kubeflow Pipelines API endpoint)")
        if from_ is not None:
            spec = load_recurring_spec(from_)
            recipe, cron, name, experiment = spec["recipe"], spec["cron"], spec["name"], spec["experiment"]
            profile, overrides, namespace = spec["profile"] or PAPER, spec["overrides"], namespace or spec["namespace"]
        if not recipe:
            raise ValueError("name a recipe or pass --from MANIFEST")
        r = _recipe(recipe, profile, overrides)
        out = do_schedule(r, _client(host, namespace), cron=cron, name=name, experiment=experiment)
    except _expected_errors() as e:
        _fail(e)
    typer.echo(json.dumps(out, indent=2))


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("compile")(compile_)
    app.command("submit")(submit)
    app.command("schedule")(schedule)
