"""run_calibrate end to end on tiny models, the CLI, and the shipped recipes."""

import json
from pathlib import Path

import pytest
import torch

from quarl.artifacts import ArtifactExistsError, open_artifact, write_artifact
from quarl.calibrate import CalibrateConfig, load_quantized, run_calibrate
from quarl.calibrate.data import CalibrationDataError
from quarl.config import load_config
from quarl.quant import QuantError, QuantLinear

RECIPES = Path(__file__).resolve().parents[2] / "quarl" / "recipes" / "calibrate"
SMALL = ["data.num_samples=4", "data.seq_len=32", "data.batch_size=2", "eval.num_samples=2", "awq.n_grid=5"]


def _problem(i: int) -> dict:
    a, b = 3 + i, 7 + 2 * i
    return {
        "prompt": f"<|user|>Tom has {a} apples and buys {b} more. How many apples does he have?<|assistant|>",
        "solution": f"Tom has {a} + {b} = {a + b} apples.",
        "answer": str(a + b),
    }


@pytest.fixture(scope="module")
def data_artifact(tmp_path_factory):
    """A data_prep-shaped dataset artifact: train.parquet / eval.parquet with a prompt column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    uri = tmp_path_factory.mktemp("data") / "dataset"
    with write_artifact(uri, "dataset", "data_prep") as art:
        pq.write_table(pa.Table.from_pylist([_problem(i) for i in range(60)]), art.path / "train.parquet")
        pq.write_table(pa.Table.from_pylist([_problem(100 + i) for i in range(10)]), art.path / "eval.parquet")
    return str(uri)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("method", ["rtn", "gptq", "awq"])
def test_calibrate_end_to_end(tmp_path, data_artifact, kind, method):
    cfg = load_config(CalibrateConfig, None, [f"method={method}", "format=nvfp4", *SMALL])
    out = tmp_path / "model"
    m = run_calibrate(cfg, model_uri=f"tiny-{kind}", data_uri=data_artifact, output_uri=str(out), progress=False)
    art = open_artifact(str(out), kind="model")
    assert art.manifest["stage"] == "calibrate" and art.manifest["inputs"] == [f"tiny-{kind}", data_artifact]
    assert art.manifest["config"]["data"]["num_samples"] == 4  # the resolved config is recorded
    for f in ("config.json", "model.safetensors", "tokenizer.json", "metrics.json", "report.md"):
        assert (out / f).is_file(), f
    q = m["quality"]
    assert 0 <= q["kl"] < 0.01 and q["tokens"] == 2 * 31 and q["ppl"] > 1 and q["ref_ppl"] > 1
    assert "eval" in m["calibration"]["data"]["held_out"]  # the artifact's eval split, not calibration text
    assert m["calibration"]["windows"] == 4 and m["calibration"]["seq_len"] == 32
    assert len(m["layers"]) == 14 and all(r["rel_error"] > 0 for r in m["layers"])
    assert "nvfp4" in m["memory"]["by_format"]
    assert json.loads((out / "metrics.json").read_text())["quality"]["kl"] == pytest.approx(q["kl"])
    assert "| kl |" in (out / "report.md").read_text()
    model, tok = load_quantized(out)
    assert sum(isinstance(x, QuantLinear) for x in model.modules()) == 14
    with torch.no_grad():
        assert torch.isfinite(model(**tok("Tom has 3 apples", return_tensors="pt")).logits).all()


def test_rtn_needs_no_data(tmp_path, data_artifact):
    """RTN quantizes the weights alone: without calibration text it writes the same weights as with it."""
    cfg = load_config(CalibrateConfig, None, ["method=rtn", "format=nvfp4", "eval.enabled=false", *SMALL])
    m = run_calibrate(cfg, model_uri="tiny-llama", output_uri=str(tmp_path / "a"), progress=False)
    run_calibrate(cfg, model_uri="tiny-llama", data_uri=data_artifact, output_uri=str(tmp_path / "b"), progress=False)
    assert m["calibration"]["windows"] == 0 and "none" in m["calibration"]["data"]["calibration"]
    assert len(m["layers"]) == 14 and all(r["rel_error"] > 0 for r in m["layers"])  # weight-space error
    a, _ = load_quantized(tmp_path / "a")
    b, _ = load_quantized(tmp_path / "b")
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_overwrite_is_refused_unless_asked(tmp_path, data_artifact):
    cfg = load_config(CalibrateConfig, None, ["method=rtn", *SMALL, "eval.enabled=false"])
    out = str(tmp_path / "m")
    m = run_calibrate(cfg, model_uri="tiny-llama", data_uri=data_artifact, output_uri=out, progress=False)
    assert m["quality"] == {}
    with pytest.raises(ArtifactExistsError):
        run_calibrate(cfg, model_uri="tiny-llama", data_uri=data_artifact, output_uri=out, progress=False)
    run_calibrate(cfg, model_uri="tiny-llama", data_uri=data_artifact, output_uri=out, overwrite=True, progress=False)


def test_recipe_file_and_text_calibration(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(f"Paragraph {i}: the quick brown fox jumps over {i} lazy dogs." for i in range(80)))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "default: int4-g32\noverrides:\n  - {pattern: '*.down_proj', format: mxfp4}\n"
        "  - {pattern: 're:model\\.layers\\.1\\.self_attn\\..*', format: bf16}\n"
    )
    cfg = load_config(CalibrateConfig, None, ["method=awq+gptq", f"data.path={text}", *SMALL])
    out = tmp_path / "m"
    m = run_calibrate(cfg, model_uri="tiny-qwen3", recipe_uri=str(recipe), output_uri=str(out), progress=False)
    fmts = {r["name"]: r["format"] for r in m["layers"]}
    assert fmts["model.layers.0.mlp.down_proj"] == "mxfp4" and fmts["model.layers.0.mlp.up_proj"] == "int4-g32"
    assert fmts["model.layers.1.self_attn.q_proj"] == "bf16"
    assert m["calibration"]["data"]["held_out"].startswith("last ")  # no eval source: a held-out tail
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "mixed-precision" and "model.layers.1.self_attn.q_proj" in qc["ignore"]
    assert m["awq_scales"]  # AWQ ran


def test_clear_errors(tmp_path, data_artifact):
    cfg = load_config(CalibrateConfig, None, SMALL)
    with pytest.raises(CalibrationDataError, match="calibration needs text"):
        run_calibrate(cfg, model_uri="tiny-llama", output_uri=str(tmp_path / "a"), progress=False)
    with pytest.raises(QuantError, match="mode='qat'|mode=.qat"):
        bad = tmp_path / "r.yaml"
        bad.write_text("default: nvfp4\nmode: qat\n")
        run_calibrate(
            cfg,
            model_uri="tiny-llama",
            data_uri=data_artifact,
            recipe_uri=str(bad),
            output_uri=str(tmp_path / "b"),
            progress=False,
        )
    cfg = load_config(CalibrateConfig, None, [*SMALL, "data.columns=[question]"])
    with pytest.raises(CalibrationDataError, match="columns \\['question'\\] not found"):
        run_calibrate(
            cfg, model_uri="tiny-llama", data_uri=data_artifact, output_uri=str(tmp_path / "c"), progress=False
        )


def test_cli(tmp_path, data_artifact):
    from typer.testing import CliRunner

    from quarl.cli.main import app

    runner = CliRunner()
    out = tmp_path / "cli"
    args = [
        "calibrate",
        "--model",
        "tiny-llama",
        "--data",
        data_artifact,
        "--output",
        str(out),
        "--no-progress",
        "--set",
        "method=gptq",
        "--set",
        "format=int4-g32",
    ]
    for s in SMALL:
        args += ["--set", s]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{") :])
    assert summary["calibration"]["method"] == "gptq" and summary["quality"]["kl"] >= 0
    r = runner.invoke(app, args)  # exists -> one error line, exit 1
    assert r.exit_code == 1 and "error:" in r.output and "overwrite" in r.output
    r = runner.invoke(
        app, ["calibrate", "--model", "tiny-llama", "-o", str(tmp_path / "x"), "--print-config", "--set", "device=cpu"]
    )
    assert r.exit_code == 0 and "num_samples: 32" in r.stdout  # CPU default resolved
    r = runner.invoke(app, ["calibrate", "--model", "tiny-llama", "-o", str(tmp_path / "y"), "--set", "metod=gptq"])
    assert r.exit_code == 1 and "did you mean" in r.output


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_recipes_load(path):
    cfg = load_config(CalibrateConfig, path)
    from quarl.calibrate.stage import load_recipe

    load_recipe(cfg, None)  # the recipe section / format parses
