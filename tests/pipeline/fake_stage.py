"""A tiny stage for runtime tests: writes one ``report`` artifact, or fails on request."""

from __future__ import annotations

from dataclasses import dataclass, field

from quarl.artifacts import write_artifact
from quarl.pipeline.stages import InputSpec, OutputSpec, Param, StageSpec

CALLS: list[dict] = []


@dataclass
class Inner:
    size: int = 3
    limit: int | None = None


@dataclass
class EchoConfig:
    message: str = "hello"
    inner: Inner = field(default_factory=Inner)
    fail: bool = False
    tags: list[str] = field(default_factory=list)


def run_echo(cfg: EchoConfig, *, output_uri: str, source_uri: str | None = None) -> dict:
    CALLS.append({"cfg": cfg, "output_uri": output_uri, "source_uri": source_uri})
    with write_artifact(output_uri, "report", "echo", config=cfg, inputs=[source_uri] if source_uri else []) as art:
        (art.path / "echo.md").write_text(f"# {cfg.message}\n\n{'x' * cfg.inner.size}\n")
        if cfg.fail:
            raise RuntimeError("asked to fail half-way")
    return {"chars": cfg.inner.size, "nested": {"score": 0.5, "skip": "text"}, "flag": True}


SPEC = StageSpec(
    name="echo",
    run="tests.pipeline.fake_stage:run_echo",
    config="tests.pipeline.fake_stage:EchoConfig",
    output=OutputSpec("out", "report", kfp_type="Artifact"),
    inputs=(InputSpec("source", "report", "source_uri", optional=True),),
    params={"message": Param("message"), "size": Param("inner.size"), "limit": Param("inner.limit", none=0)},
    report_file="echo.md",
    metrics=("nested", "chars"),
    description="test stage",
)
