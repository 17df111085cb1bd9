"""offload=cpu streaming the dense blocks from the checkpoint: same artifact, one dense block on the host."""

import logging

import pytest
import torch
from torch import nn

from quarl.artifacts import ArtifactExistsError
from quarl.calibrate import CalibrateConfig, run_calibrate, stage
from quarl.calibrate.sequential import decoder_blocks
from quarl.calibrate.streaming import StreamSource, stream_source
from quarl.config import load_config
from quarl.quant import QuantLinear
from tests.calibrate.conftest import SMALL_STAGE

SMALL = SMALL_STAGE


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """tiny-qwen2 (untied head, q/k/v bias) and tiny-llama saved as local safetensors checkpoints."""
    from quarl.models import load_model, save_model

    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for kind in ("qwen2", "llama"):
        m, tok = load_model(f"tiny-{kind}")
        out[kind] = str(save_model(m, tok, root / kind))
    return out


def _run(tmp_path, corpus, model, method, offload, name, overwrite=False, extra=()):
    cfg = load_config(CalibrateConfig, None, [f"method={method}", "format=nvfp4", f"data.path={corpus}",
                                              f"offload={offload}", *SMALL, *extra])
    out = tmp_path / name
    return run_calibrate(cfg, model_uri=model, output_uri=str(out), progress=False, overwrite=overwrite), out


def _same_artifact(a, b):
    """Every weight shard and config file equal byte for byte (the manifests' sha256)."""
    import json

    fa, fb = (json.loads((x / "manifest.json").read_text())["files"] for x in (a, b))
    keep = [k for k in fa if k.endswith((".safetensors", ".json")) and k not in ("metrics.json", "manifest.json")]
    assert "model.safetensors" in keep and "config.json" in keep
    assert {k: fa[k]["sha256"] for k in keep} == {k: fb[k]["sha256"] for k in keep}


def _same_metrics(ma, mb):
    qa, qb = ma["quality"], mb["quality"]
    assert qa.keys() == qb.keys() and qa["tokens"] == qb["tokens"]
    for k in ("kl", "kl_max_token", "nll", "ppl", "ref_nll", "ref_ppl"):
        assert qb[k] == qa[k], k  # the same weights through the same ops: equal to the last bit
    assert [r["rel_error"] for r in ma["layers"]] == [r["rel_error"] for r in mb["layers"]]


@pytest.mark.parametrize("method", ["rtn", "gptq", "awq"])
def test_streamed_writes_the_same_artifact_and_metrics_as_loading_whole(tmp_path, corpus, checkpoints, method):
    """offload=cpu on a local checkpoint streams; offload=none loads it whole (and reloads a reference
    for the held-out metrics): bit-identical artifact, identical metrics."""
    model = checkpoints["qwen2"]
    m_none, a = _run(tmp_path, corpus, model, method, "none", "none")
    m_str, b = _run(tmp_path, corpus, model, method, "cpu", "stream")
    off = m_str["calibration"]["offload"]
    assert off["streamed"] and off["stream_reason"] == "" and off["host_peak_materialized_bytes"] > 0
    assert not m_none["calibration"]["offload"]["streamed"]
    _same_artifact(a, b)
    _same_metrics(m_none, m_str)


def test_streamed_equals_offload_cpu_loaded_whole_with_tied_embeddings(tmp_path, corpus, checkpoints, monkeypatch):
    """tiny-llama (tied lm_head) with gptq: streamed == the old offload=cpu (whole model on the host,
    forced here by making the source look unstreamable)."""
    model = checkpoints["llama"]
    m_str, a = _run(tmp_path, corpus, model, "gptq", "cpu", "stream")
    monkeypatch.setattr(stage, "stream_source", lambda uri, path=None: StreamSource(None, "forced by the test"))
    m_host, b = _run(tmp_path, corpus, model, "gptq", "cpu", "host")
    assert m_str["calibration"]["offload"]["streamed"] and not m_host["calibration"]["offload"]["streamed"]
    assert m_host["calibration"]["offload"]["stream_reason"] == "forced by the test"
    _same_artifact(a, b)
    _same_metrics(m_host, m_str)


def test_the_host_holds_one_dense_block_at_a_time(tmp_path, corpus, checkpoints, monkeypatch):
    """Instrumented fill: when block i is read, blocks after it are still on the meta device and blocks
    before it hold only packed QuantLinear layers (no dense linear weight), so the dense decoder-block
    parameters materialized at once are one block's."""
    seen = []
    real = stage.calibrate_model

    def spy(model, *args, fill=None, **kw):
        assert fill is not None
        _, blocks = decoder_blocks(model)
        assert all(p.is_meta for b in blocks for p in b.parameters())  # nothing of the blocks read before the loop

        def checked(block, prefix):
            i = next(j for j, b in enumerate(blocks) if b is block)
            fill(block, prefix)
            dense = 0
            for j, b in enumerate(blocks):
                metas = [p.is_meta for p in b.parameters()]
                lin = [m for m in b.modules() if isinstance(m, nn.Linear) and not isinstance(m, QuantLinear)]
                if j > i:
                    assert all(metas), f"block {j} read before its turn (now {i})"
                else:
                    assert not any(metas)
                    dense += sum(m.weight.numel() for m in lin)
                    if j < i:
                        assert not lin, f"block {j} still has dense linears while block {i} is read"
            seen.append((i, dense))

        return real(model, *args, fill=checked, **kw)

    monkeypatch.setattr(stage, "calibrate_model", spy)
    m, _ = _run(tmp_path, corpus, checkpoints["qwen2"], "gptq", "cpu", "stream")
    per_block = seen[0][1]
    assert [i for i, _ in seen] == list(range(len(seen))) and len(seen) >= 2
    assert per_block > 0 and all(d == per_block for _, d in seen)  # exactly one block's dense linears each time
    from quarl.calibrate.onload import estimate_dense_bytes

    off = m["calibration"]["offload"]
    assert off["streamed"] and off["host_peak_materialized_bytes"] < estimate_dense_bytes(checkpoints["qwen2"],
                                                                                          torch.float32)


def test_an_unstreamable_source_falls_back_to_the_host_and_says_so(tmp_path, corpus, caplog):
    caplog.set_level(logging.WARNING, logger="quarl.calibrate.stage")
    m, _ = _run(tmp_path, corpus, "tiny-qwen2", "rtn", "cpu", "tiny")
    off = m["calibration"]["offload"]
    assert off["mode"] == "cpu" and not off["streamed"] and "built in memory" in off["stream_reason"]
    assert any("cannot stream tiny-qwen2" in r.getMessage() and "whole dense model" in r.getMessage()
               for r in caplog.records)


def test_stream_source_decides_from_the_directory(tmp_path, checkpoints):
    assert stream_source(checkpoints["qwen2"]).path is not None
    assert stream_source("tiny-llama").path is None
    assert "does not exist" in stream_source(str(tmp_path / "nope")).reason
    no_st = tmp_path / "nost"
    no_st.mkdir()
    (no_st / "config.json").write_text("{}")
    assert "no config.json + *.safetensors" in stream_source(str(no_st)).reason
    # an s3 model the stage has already downloaded: the given directory is used as is
    assert stream_source("s3://bucket/model", path=stage.Path(checkpoints["qwen2"])).path == stage.Path(
        checkpoints["qwen2"])


def test_an_s3_model_is_downloaded_once_then_sized_and_streamed_from_disk(checkpoints, monkeypatch):
    import quarl.models

    calls = []
    monkeypatch.setattr(quarl.models, "resolve_model_dir", lambda ref: calls.append(ref) or stage.Path(
        checkpoints["qwen2"]))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1, 80 * 2**30))  # nothing fits: cpu
    mode, _, dense, local = stage._offload_mode(CalibrateConfig(), "s3://b/m", torch.float32, torch.device("cuda"))
    assert (mode, local, calls) == ("cpu", stage.Path(checkpoints["qwen2"]), ["s3://b/m"]) and dense > 0
    mode, _, dense, local = stage._offload_mode(CalibrateConfig(offload="cpu", device="cpu"), "s3://b/m",
                                                torch.float32, torch.device("cpu"))
    assert (mode, dense, local) == ("cpu", None, stage.Path(checkpoints["qwen2"])) and len(calls) == 2
    # offload=none never needs the directory before load_model
    assert stage._offload_mode(CalibrateConfig(offload="none"), "s3://b/m", torch.float32,
                               torch.device("cpu"))[3] is None


def test_overwrite_is_refused_unless_asked_when_streaming(tmp_path, corpus, checkpoints):
    model = checkpoints["qwen2"]
    m, _ = _run(tmp_path, corpus, model, "rtn", "cpu", "m", extra=["eval.enabled=false"])
    assert m["calibration"]["offload"]["streamed"] and m["quality"] == {}
    with pytest.raises(ArtifactExistsError):
        _run(tmp_path, corpus, model, "rtn", "cpu", "m", extra=["eval.enabled=false"])
    m2, _ = _run(tmp_path, corpus, model, "rtn", "cpu", "m", overwrite=True, extra=["eval.enabled=false"])
    assert [r["rel_error"] for r in m2["layers"]] == [r["rel_error"] for r in m["layers"]]


def test_a_checkpoint_whose_block_tensors_do_not_match_falls_back_before_the_loop(tmp_path, corpus, checkpoints,
                                                                                 caplog):
    """A block tensor under another name: the header check refuses to stream (before any block is read)
    and the stage loads the model whole, saying why. (from_pretrained then initializes the missing
    weight at random with a warning of its own, as load_model always has.)"""
    import shutil

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "renamed"
    shutil.copytree(checkpoints["qwen2"], bad)
    sd = load_file(bad / "model.safetensors")
    sd["model.layers.1.mlp.up_proj.renamed"] = sd.pop("model.layers.1.mlp.up_proj.weight")
    save_file(sd, str(bad / "model.safetensors"), metadata={"format": "pt"})
    caplog.set_level(logging.WARNING, logger="quarl.calibrate.stage")
    m, _ = _run(tmp_path, corpus, str(bad), "rtn", "cpu", "out", extra=["eval.enabled=false"])
    off = m["calibration"]["offload"]
    assert not off["streamed"] and "model.layers.1.mlp.up_proj.weight missing" in off["stream_reason"]
    msg = next(r.getMessage() for r in caplog.records if "cannot stream" in r.getMessage())
    assert "model.layers.1.mlp.up_proj.weight missing" in msg
