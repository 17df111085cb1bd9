"""1 process vs 2 gloo processes on tiny models: the same loss and the same weights, up to reduction order.

One spawn of two CPU processes runs every scenario of tests/train/dist_scenarios.py
(module fixture, ~30 s on 2 cores); each test runs its scenario once more in this
process and compares. Tolerances: the two runs add the same per-micro-batch gradients in
a different order (and FSDP2's reduce-scatter adds rank shares), so weights agree to ~1e-7
after a few AdamW steps, never bit for bit.
"""

import math

import pytest
import torch

from quarl.train.distributed import SINGLE, Dist
from tests.threads import one_thread_fixture
from tests.train import dist_scenarios as sc


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return sc.run_two_ranks(tmp_path_factory.mktemp("two-ranks"), list(sc.SCENARIOS))


_one_thread = one_thread_fixture()


def assert_weights_close(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for k, va in a.items():
        torch.testing.assert_close(va, b[k], rtol=1e-5, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


def assert_metrics_close(a: list[dict], b: list[dict], rel: float = 1e-4, abs_: float = 1e-6) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b] and a
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys(), set(ra) ^ set(rb)
        for k, va in ra.items():
            vb = rb[k]
            if isinstance(va, float) and isinstance(vb, float) and not (math.isnan(va) and math.isnan(vb)):
                assert math.isclose(va, vb, rel_tol=rel, abs_tol=abs_), (ra["step"], k, va, vb)
            elif not isinstance(va, float):
                assert va == vb, (ra["step"], k, va, vb)


def test_shard_splits_work_contiguously_and_balanced():
    parts = [Dist(rank=r, world_size=3).shard(8) for r in range(3)]
    assert [(p.start, p.stop) for p in parts] == [(0, 3), (3, 6), (6, 8)]
    assert SINGLE.shard(5) == slice(0, 5) and not SINGLE.enabled and SINGLE.is_main


def test_distill_lora_data_parallel_matches_one_process(two, tmp_path):
    one = sc.distill_lora(SINGLE, tmp_path)
    assert_metrics_close(one["metrics"], two["distill_lora"]["metrics"])
    assert_weights_close(one["weights"], two["distill_lora"]["weights"])
    assert one["weights"] and all("lora_" in k for k in one["weights"])
    for k in ("kl", "ce"):
        # after distillation the held-out KL is ~1e-4: a KL that small is quadratic in the logit gap, so the
        # fp32 reduction-order differences that assert_weights_close allows move it by ~1e-7 absolute (measured
        # 5.7e-8 with torch 2.13 / transformers 5.24, 4e-4 relative); a wrong gradient average moves it by orders more
        assert math.isclose(one["eval_after"][k], two["distill_lora"]["eval_after"][k], rel_tol=1e-4, abs_tol=1e-6)
    assert one["eval_after"]["tokens"] == two["distill_lora"]["eval_after"]["tokens"]  # held-out split, summed


def test_distill_qat_fsdp2_matches_one_process(two, tmp_path):
    res = two["distill_qat"]
    assert res["sharded"] and res["start_step"] == 1  # FSDP2, and the 2-rank run resumed from its own DCP checkpoint
    one = sc.distill_qat(SINGLE, tmp_path)
    assert not one["sharded"]
    assert_metrics_close(one["metrics"], res["metrics"])
    assert_weights_close(one["weights"], res["weights"])
    trained = [k for k in one["weights"] if k.endswith("proj.weight")]
    assert trained and any(not torch.equal(one["weights"][k], res["weights_step1"][k]) for k in trained)


def test_checkpoint_of_two_ranks_resumes_on_one_with_the_same_next_step(two, tmp_path):
    src = two["distill_qat"]
    work = next(p for p in tmp_path.parents if p.name.startswith("pytest-"))  # the module fixture's tmp root
    two_dir = next(work.glob("two-ranks*/distill_qat"))
    ckpt = two_dir / "checkpoints" / "step-000001"
    assert (ckpt / "dcp" / ".metadata").exists() and (ckpt / "rng-rank1.pt").exists()
    assert sorted(p.name for p in (ckpt / "dcp").glob("__*")) == ["__0_0.distcp", "__1_0.distcp"]

    sc.checkpoint_copy(two_dir, tmp_path, step=1)
    tr = sc._distill(SINGLE, tmp_path, "student.mode=qat", "train.checkpoint_every=1")
    assert tr.maybe_resume() == 1
    now = tr.model.state_dict()
    for k, v in src["weights_step1"].items():  # the 2-rank shards, reassembled bit for bit
        assert torch.equal(now[k], v), k
    res = tr.train()
    assert res["start_step"] == 1 and res["end_step"] == 2
    got = {k: v.detach() for k, v in tr.model.state_dict().items()}
    assert_weights_close(got, src["weights"])  # the step 2 the two ranks took
    assert_metrics_close(sc.metrics(tmp_path), src["metrics"])


def test_rl_lora_grpo_data_parallel_matches_one_process(two, tmp_path):
    one = sc.rl_lora(SINGLE, tmp_path)
    assert_metrics_close(one["metrics"], two["rl_lora"]["metrics"])
    assert_weights_close(one["weights"], two["rl_lora"]["weights"])
    assert [r["train/answers"] for r in one["metrics"]] == [8, 8, 8]
    assert one["metrics"][1]["aqn/sigma"] > 0  # the noise, drawn identically on every rank


def test_rl_dapo_dynamic_sampling_keeps_the_same_groups(two, tmp_path):
    one = sc.rl_dapo(SINGLE, tmp_path)
    assert_metrics_close(one["metrics"], two["rl_dapo"]["metrics"])
    assert_weights_close(one["weights"], two["rl_dapo"]["weights"])
    assert any(r["sampling/rounds"] > 1 for r in one["metrics"])  # flat groups were dropped and refilled


def test_rl_full_parameters_fsdp2_matches_one_process(two, tmp_path):
    res = two["rl_full"]
    assert res["sharded"]
    one = sc.rl_full(SINGLE, tmp_path)
    assert_metrics_close(one["metrics"], res["metrics"])
    assert_weights_close(one["weights"], res["weights"])
    assert one["metrics"][1]["policy/kl_ref"] > 0  # the sharded reference model took part


def test_rl_full_parameters_with_compiled_glue_under_fsdp2(two, tmp_path):
    """policy.compile_glue=true under FSDP2: the sharded run equals one process, and both equal the eager-glue run
    (aot_eager runs the same ATen ops: only the reduction order of the two-rank runs differs)."""
    res = two["rl_full_glue"]
    assert res["sharded"] and res["glue"]["rms_norms"] > 0 and res["glue"]["swiglu_mlps"] > 0
    one = sc.rl_full_glue(SINGLE, tmp_path / "glue")
    assert_metrics_close(one["metrics"], res["metrics"])
    assert_weights_close(one["weights"], res["weights"])
    eager = sc.rl_full(SINGLE, tmp_path / "eager")
    assert_weights_close(one["weights"], eager["weights"])


def test_rl_jetrl_fp8_full_parameters_fsdp2_matches_one_process(two, tmp_path):
    res = two["rl_jetrl_full"]
    assert res["sharded"] and res["fp8_layers"] == 14  # every projection of the 2 layers runs the FP8 linear
    one = sc.rl_jetrl_full(SINGLE, tmp_path)
    assert_metrics_close(one["metrics"], res["metrics"])
    assert_weights_close(one["weights"], res["weights"])


def test_rl_full_parameters_roll_out_on_a_synced_replica_with_the_fast_engine(two):
    for res in (two["rl_full_replica"], two["rl_full_replica@1"]):
        assert res["sharded"] and res["engine"] == "FastGenerator on a rollout replica" and res["steps"] == [0, 1]
        assert res["sigma"] > 0 and res["max_diff"] == 0.0  # the replica is the gathered policy, AQN noise included
        assert res["same_storage"]  # synced in place: CUDA graphs captured on it stay valid
        assert res["greedy_fast"] == res["greedy_ref"]


def test_stages_under_two_ranks_write_one_artifact_on_rank_0(two):
    from quarl.artifacts import open_artifact
    from quarl.quant import QuantLinear

    for name, sharded in (("stage_rl_full", True), ("stage_distill_qat", True), ("stage_distill_lora", False)):
        main, other = two[name], two[f"{name}@1"]
        assert main["complete"] and main["output_uri"] and main["world_size"] == 2, name
        assert main["sharded"] == sharded, name
        assert other["complete"] and other["output_uri"] is None and other["rank"] == 1, name
        art = open_artifact(main["output_uri"], kind="model")  # checksums verified
        assert [r["step"] for r in sc.metrics(art.path)] == [0, 1]
    # the distilled student was gathered from its FSDP2 shards and re-quantized into NVFP4 on rank 0
    from quarl.models import load_model

    model, _ = load_model(two["stage_distill_qat"]["output_uri"])
    assert all(m.mode == "frozen" and m.format_name == "nvfp4" for m in model.modules() if isinstance(m, QuantLinear))
    assert two["stage_distill_qat"]["accuracy_before"] is not None and two["stage_distill_qat"]["eval_after"]["tokens"]


@pytest.mark.slow
def test_torchrun_runs_the_rl_command_unchanged(tmp_path):
    """The command a Kubeflow TrainJob runs: ``torchrun ... -m quarl.cli.main rl`` with the stage's own arguments."""
    import json
    import os
    import subprocess
    import sys

    sc.make_dataset(tmp_path / "dataset")
    sets = [x for kv in ["rollout.group_size=4", "rollout.max_new_tokens=8", "rollout.cache=dynamic",
                         "train.prompts_per_step=2", "train.steps=2", "optim.micro_batch_size=4", "train.device=cpu"]
            for x in ("--set", kv)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(sc.free_port()), "-m", "quarl.cli.main", "rl", "--model", "tiny-llama", "--data",
           str(tmp_path / "dataset"), "--output", str(tmp_path / "adapter"), *sets]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout)  # printed once, by rank 0
    assert result["complete"] and result["world_size"] == 2 and result["output_uri"] == str(tmp_path / "adapter")
    ckpt = tmp_path / "adapter.work" / "checkpoints" / "step-000002"
    assert (ckpt / "rng-rank1.pt").exists() and (ckpt / "trainable.safetensors").exists()
