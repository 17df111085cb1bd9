"""Options every stage subcommand shares, declared once so their flags and help agree."""

from __future__ import annotations

from typing import Annotated

import typer

OutputOpt = Annotated[str, typer.Option("--output", "-o", help="artifact URI: local directory or s3://bucket/prefix")]
ConfigOpt = Annotated[
    str | None, typer.Option("--config", "-c", help="YAML file with the stage's config fields (see --print-config)")
]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="override a field: key.sub=value (repeatable)")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="replace a complete artifact at --output")]
NoProgressOpt = Annotated[bool, typer.Option("--no-progress", help="no progress bars (logs only)")]
PrintConfigOpt = Annotated[bool, typer.Option("--print-config", help="print the resolved config and exit")]
