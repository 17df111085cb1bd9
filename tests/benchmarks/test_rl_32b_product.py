"""benchmarks/rl_32b_product_gpu.py without running it (its CPU dry run takes ~1 min and is run by hand
before a device call): the 32B shape is Qwen2.5-32B's, a missing prepare step is refused before any work,
and the summary table reads what the run records."""

import importlib.util
import types
from pathlib import Path

import torch

from quarl.quant.stream import empty_model

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("rl_32b_product_gpu", ROOT / "benchmarks" / "rl_32b_product_gpu.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_the_32b_shape_is_qwen25_32b():
    tok = types.SimpleNamespace(bos_token_id=None, eos_token_id=2, pad_token_id=2)
    model = empty_model(bench.qwen25_config("32b", tok), torch.bfloat16)  # meta: no memory
    n = sum(p.numel() for p in model.parameters())
    assert abs(n / 1e9 - 32.76) < 0.01  # Qwen2.5-32B: 32.76 B parameters
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None  # q/k/v bias, as Qwen2.5
    assert model.lm_head.weight.shape == (152064, 5120) and not model.config.tie_word_embeddings


def test_run_refuses_a_missing_prepare(tmp_path, capsys):
    rc = bench.main(["run", "--prep", str(tmp_path / "nope"), "--out", str(tmp_path / "out"), "--work",
                     str(tmp_path / "work"), "--shape", "tiny", "--device", "cpu"])
    assert rc == 2 and "prepare" in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


def test_table_reads_the_recorded_phases():
    step = {"step": 0, "time/step_s": 30.0, "memory/peak_gb": 31.5, "time/rollout_s": 20.0,
            "rollout/tokens_per_s": 400.0, "time/update_s": 9.0, "train/answers": 16, "response/length_mean": 512.0}
    data = {"args": {"device": "cuda"}, "env": {"nvidia_smi": "NVIDIA H100"}, "elapsed_s": 300.0, "phases": {
        "generate": {"rc": 0, "total_s": 60.0, "build_s": 5.0, "save_s": 30.0, "artifact_gib": 19.4,
                     "cuda_max_allocated_gib": 23.0},
        "rl": {"rc": 0, "seconds": 200.0, "smi_peak_gib": 40.2, "steps": [step],
               "summary": {"policy_load": "stream", "policy_load_s": 50.0, "timed_out": False, "end_step": 1,
                           "total_steps": 1, "policy": {"trainable_params": 268435456},
                           "policy_load_build": {"mode": "packed", "layers": 64,
                                                 "cuda_max_allocated_bytes": 21 * 2**30}}}}}
    t = bench.table(data)
    assert "| step 0 | 30.0 | 31.50 |" in t and "| quarl rl: load (stream) | 50.0 | 21.00 |" in t
    assert "40.20" in t and "19.40 GiB on disk" in t and "peak CUDA allocated GiB" in t
