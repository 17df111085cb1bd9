"""QeRL's 32B-on-one-GPU claim through the product: ``quarl rl`` on a Qwen2.5-32B-shaped calibrated
checkpoint, on one 80 GB GPU (issue 17).

    # on the CPU host (once): the tiny GSM8K dataset artifact and the checkpoint's quantization_config
    python benchmarks/rl_32b_product_gpu.py prepare --prep .dev/big32
    # on the device (one H100; carry .dev/big32):
    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/rl_32b_product_gpu.py run --prep .dev/big32 \\
        --out $OUT --work /tmp/big32 --budget-s 390
    # dry run here (same code path, tiny shape, CPU):
    .venv/bin/python benchmarks/rl_32b_product_gpu.py run --prep .dev/big32 --out /tmp/b32/out \\
        --work /tmp/b32/work --shape tiny --device cpu --budget-s 300

What it does, in two child processes so each one's GPU memory is its own:

1. **generate** -- writes a Qwen2.5-32B-shaped (hidden 5120, intermediate 27648, 64 layers, 40 heads,
   8 KV heads, vocab 152064, q/k/v bias, untied head) *random-weight* model artifact in the calibrate
   stage's on-disk format at NVFP4 (``quarl.quant.synthetic.write_random_checkpoint``: built one decoder
   layer at a time on the GPU, each packed before the next exists; packed weights + E4M3 scales +
   global scales in compressed-tensors' names, embeddings / norms / ``lm_head`` BF16, manifest with
   checksums). The tokenizer is the embedded SmolLM2-135M-Instruct's (ids < 49152 < 152064): the
   *shapes* are 32B's, the *weights* random, the *tokenizer* SmolLM2's. The device machine has no
   network and 64 GB of disk, so no real 32B snapshot can be there; what ``quarl rl`` reads from a
   calibrated checkpoint is this packed form (~19 GiB), so load, memory and step times are the real
   ones for the shape; answers and rewards are meaningless (a random model never stops: every answer
   runs to ``--new-tokens``, every reward is 0, so every advantage is 0 -- the update still runs
   its full forward and backward).
   The ``quantization_config`` comes from ``prepare`` (computed here with compressed-tensors, which
   the device does not have) and is checked against the built layers before it is written.
2. **rl** -- the product, as a pod runs it: ``python -m quarl.cli.main rl --config
   quarl/recipes/rl/qerl-gsm8k-grpo-7b.yaml --model <artifact> --data <prep>/data/gsm8k-tiny ...``
   (QeRL's GSM8K recipe: NVFP4 base + LoRA r32 on all 7 projections + AQN, GRPO), with the lengths,
   group size and steps cut to fit the time, gradient checkpointing on, ``train.max_time_s`` set from
   what is left of ``--budget-s`` so the stage stops cleanly at a step boundary and writes its
   adapter. ``algo.overlong=none`` because QeRL's mask-truncated filter would drop every answer of a
   random model and skip every update.

Recorded (``$OUT/results.json``, rewritten after every phase and every ~10 s while ``quarl rl``
runs, so a killed run keeps what it did): generation time and sizes, disk use, the stage's own
``summary.json`` (load mode and time, ``policy_load_build`` with the load's CUDA peak), its
``metrics.jsonl`` (per step: rollout / update / step seconds, ``memory/peak_gb`` = CUDA max allocated
in GiB), and ``nvidia-smi`` memory.used sampled every 0.5 s (the whole card: the peak a user sees).
A summary table is printed last and written to ``$OUT/summary.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "kernels"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

SHAPES = {  # Qwen2.5-32B-Instruct's config.json; "tiny" keeps the vocabulary (the 152k LM head is part of the test)
    "32b": {"hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 40,
            "num_key_value_heads": 8, "vocab_size": 152064},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 152064},
}  # fmt: skip
RECIPE = {"default": "nvfp4"}
RL_RECIPE = "quarl/recipes/rl/qerl-gsm8k-grpo-7b.yaml"
DATA = "data/gsm8k-tiny"
QCONFIG = "qconfig_nvfp4.json"
GiB = 2**30


def qwen25_config(shape: str, tokenizer):
    from transformers import Qwen2Config

    return Qwen2Config(**SHAPES[shape], max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, hidden_act="silu", use_sliding_window=False,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)


def smollm2_tokenizer():
    """The embedded SmolLM2-135M-Instruct tokenizer (its GGUF converted once into quarl's model cache)."""
    from transformers import AutoTokenizer

    from quarl.models.loading import resolve_model_dir

    return AutoTokenizer.from_pretrained(resolve_model_dir("default"))


# --------------------------------------------------------------------------- prepare (CPU host)
def prepare(args) -> None:
    """The dataset artifact (``quarl data-prep`` on local GSM8K, SmolLM2's chat template) and the
    NVFP4 checkpoint's quantization_config (needs compressed-tensors: not on the device)."""
    from quarl.quant.synthetic import planned_quantization_config

    prep = Path(args.prep)
    prep.mkdir(parents=True, exist_ok=True)
    g = Path(args.gsm8k)
    sources = (f"[{{name: gsm8k, path: {g / 'train.jsonl'}, split: train, max_samples: {args.train_n}}}, "
               f"{{name: gsm8k, path: {g / 'test.jsonl'}, split: eval, max_samples: 8}}]")
    if not (prep / DATA / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "quarl.cli.main", "data-prep", "--config", "quarl/recipes/data/gsm8k.yaml",
                        "--set", "template=chat", "--set", "tokenizer=default", "--set", f"sources={sources}",
                        "--output", str(prep / DATA)], check=True, cwd=ROOT)
    tok = smollm2_tokenizer()
    qc = planned_quantization_config(qwen25_config("32b", tok), RECIPE)
    (prep / QCONFIG).write_text(json.dumps(qc, indent=2, sort_keys=True) + "\n")
    print(f"prepared {prep}: {DATA} ({args.train_n} train prompts), {QCONFIG}")


# --------------------------------------------------------------------------- generate (child 1)
def generate(args) -> None:
    import torch

    from quarl.quant.synthetic import write_random_checkpoint

    tok = smollm2_tokenizer()
    cfg = qwen25_config(args.shape, tok)
    qc = json.loads((Path(args.prep) / QCONFIG).read_text())
    dev = torch.device(args.device)
    info = write_random_checkpoint(args.model_dir, cfg, tok, RECIPE, seed=0, device=dev, qconfig=qc,
                                   overwrite=True)
    if dev.type == "cuda":
        info["cuda_max_allocated_gib"] = round(torch.cuda.max_memory_allocated(dev) / GiB, 2)
    info["shape"] = SHAPES[args.shape]
    Path(args.info).write_text(json.dumps(info, indent=2, default=str) + "\n")
    print(json.dumps({k: info[k] for k in ("build_s", "save_s", "checksum_publish_s", "total_s", "bytes")}))


# --------------------------------------------------------------------------- run (orchestrator, no CUDA here)
class Recorder:
    """results.json rewritten whole at every update (a killed run keeps everything recorded so far)."""

    def __init__(self, out: Path, args):
        self.out, self.t0 = out, time.monotonic()
        self.data = {"args": vars(args), "env": env_info(args.device), "phases": {}}
        self.lock = threading.Lock()
        self.save()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def set(self, key: str, value) -> None:
        with self.lock:
            self.data["phases"][key] = value
            self.save()

    def save(self) -> None:
        self.data["elapsed_s"] = round(self.elapsed(), 1)
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        os.replace(tmp, self.out / "results.json")


def env_info(device: str) -> dict:
    import torch
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "host": platform.node()}
    if device == "cuda":
        info["nvidia_smi"] = smi("name,memory.total,driver_version")
    return info


def smi(fields: str) -> str | None:
    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", gpu],
                              check=False, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None


class SmiSampler(threading.Thread):
    """nvidia-smi memory.used (MiB) of GPU 0 every ``period`` s: the card's whole use, as a user sees it."""

    def __init__(self, enabled: bool, period: float = 0.5):
        super().__init__(daemon=True)
        self.enabled, self.period, self.samples, self.stop = enabled, period, [], threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while self.enabled and not self.stop.is_set():
            v = smi("memory.used")
            if v and v.split(",")[0].strip().isdigit():
                self.samples.append((round(time.monotonic() - t0, 1), int(v.split(",")[0])))
            self.stop.wait(self.period)

    def peak_gib(self) -> float | None:
        return round(max(v for _, v in self.samples) / 1024, 2) if self.samples else None


def disk(path: Path) -> dict:
    u = shutil.disk_usage(path)
    return {"free_gib": round(u.free / GiB, 1), "total_gib": round(u.total / GiB, 1)}


def dir_gib(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / GiB, 2) if path.exists() else 0.0


def child(cmd: list[str], log: Path, timeout: float, rec: Recorder, poll=None) -> dict:
    """Run ``cmd`` with its output in ``log``; ``poll()`` every 10 s while it runs. Returns rc and seconds."""
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "kernels"), os.environ.get("PYTHONPATH", "")]))
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        rc, timed_out = None, False
        while rc is None:
            try:
                rc = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                if poll:
                    poll()
                if time.monotonic() - t0 > timeout:
                    timed_out = True
                    proc.terminate()
                    try:
                        rc = proc.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        rc = proc.wait()
    if poll:
        poll()
    return {"rc": rc, "seconds": round(time.monotonic() - t0, 1), "killed_at_timeout": timed_out}


def run(args) -> int:
    out, work, prep = Path(args.out), Path(args.work), Path(args.prep).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for need in (prep / DATA / "manifest.json", prep / QCONFIG):
        if not need.is_file():
            print(f"missing {need}: run `python benchmarks/rl_32b_product_gpu.py prepare --prep {args.prep}` on the "
                  f"host and carry {args.prep}", file=sys.stderr)
            return 2
    rec = Recorder(out, args)
    need_gib = 30 if args.shape == "32b" else 1  # the 32B artifact ~20 GiB, the run's checkpoint + adapter ~5
    for cand in (work, ROOT / ".big32-work"):  # /tmp first; the repository's disk if /tmp is small
        if cand.exists():
            shutil.rmtree(cand)
        cand.mkdir(parents=True)
        if disk(cand)["free_gib"] >= need_gib:
            work = cand
            break
        shutil.rmtree(cand)
    else:
        rec.set("disk_before", disk(work.parent))
        print(f"neither {work} nor {ROOT / '.big32-work'} has {need_gib} GiB free; pass --work on a larger disk",
              file=sys.stderr)
        finish(rec, out)
        return 3
    model_dir, adapter = work / "model", work / "adapter"
    rec.set("work", str(work))
    rec.set("disk_before", disk(work))
    cuda = args.device == "cuda"

    # 1. the random 32B-shaped NVFP4 checkpoint, in the calibrate artifact's format
    gen_info = work / "gen.json"
    g = child([sys.executable, __file__, "_generate", "--prep", str(prep), "--shape", args.shape, "--device",
               args.device, "--model-dir", str(model_dir), "--info", str(gen_info)],
              out / "gen.log", args.budget_s * 0.4, rec)
    if gen_info.is_file():
        g.update(json.loads(gen_info.read_text()))
    g.update({"artifact_gib": dir_gib(model_dir), "disk_after": disk(work)})
    rec.set("generate", g)
    print(f"generate: rc {g['rc']} in {g['seconds']} s, artifact {g['artifact_gib']} GiB", flush=True)
    if g["rc"] != 0:
        print((out / "gen.log").read_text()[-3000:])
        return finish(rec, out)

    # 2. the product: quarl rl, the CLI a pod runs, on that artifact
    left = args.budget_s - rec.elapsed()
    # the stage's clock starts after the load (~1 min at 32B) and checks at step boundaries: leave one step + writing
    max_time = max(1.0, left - args.load_reserve_s - args.step_reserve_s)
    sets = {
        "policy.format": "nvfp4", "policy.lora_r": args.lora_r, "policy.lora_alpha": args.lora_r,
        "policy.gradient_checkpointing": "true",
        "policy.load": "stream",  # what auto picks on CUDA for an NVFP4 LoRA base; spelled out so the CPU dry run takes it too
        "rollout.group_size": args.group, "rollout.max_new_tokens": args.new_tokens,
        "rollout.max_prompt_tokens": 512,
        "algo.updates_per_rollout": args.mu, "algo.overlong": "none",
        "optim.micro_batch_size": args.micro_batch, "optim.schedule": "constant", "optim.warmup_ratio": 0.0,
        "train.steps": args.steps, "train.prompts_per_step": args.prompts, "train.max_time_s": round(max_time),
        "train.checkpoint_every": 0, "train.sample_every": 1, "train.device": args.device,
    }
    cmd = [sys.executable, "-m", "quarl.cli.main", "rl", "--config", RL_RECIPE, "--model", str(model_dir),
           "--data", str(prep / DATA), "--output", str(adapter)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    rec.set("rl_command", " ".join(cmd))
    sampler = SmiSampler(cuda)
    sampler.start()
    metrics = adapter.parent / (adapter.name + ".work") / "metrics.jsonl"

    def poll() -> None:
        r = {"smi_peak_gib": sampler.peak_gib(), "steps": read_jsonl(metrics)}
        rec.set("rl_progress", r)

    r = child(cmd, out / "rl.log", max(30.0, args.budget_s - rec.elapsed() - 10), rec, poll)
    sampler.stop.set()
    sampler.join(timeout=5)
    summary = adapter / "summary.json"
    r.update({"max_time_s": round(max_time), "smi_peak_gib": sampler.peak_gib(), "steps": read_jsonl(metrics),
              "summary": json.loads(summary.read_text()) if summary.is_file() else None,
              "adapter_gib": dir_gib(adapter), "work_gib": dir_gib(work), "disk_after": disk(work)})
    (out / "smi.csv").write_text("t_s,memory_used_mib\n" + "".join(f"{t},{v}\n" for t, v in sampler.samples))
    rec.set("rl", r)
    print(f"rl: rc {r['rc']} in {r['seconds']} s, {len(r['steps'])} step(s)", flush=True)
    if r["rc"] != 0:
        print((out / "rl.log").read_text()[-4000:])
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return finish(rec, out)


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for ln in path.read_text().splitlines():
        try:
            rows.append(json.loads(ln))
        except json.JSONDecodeError:
            pass  # a line being written
    return rows


def table(data: dict) -> str:
    ph = data["phases"]
    g, r = ph.get("generate", {}), ph.get("rl", {})
    s = (r.get("summary") or {})
    build = s.get("policy_load_build") or {}
    lines = [f"device: {data['env'].get('nvidia_smi') or 'cpu'}; elapsed {data.get('elapsed_s')} s", "",
             (f"| phase | seconds | peak {'CUDA allocated' if data['args']['device'] == 'cuda' else 'RSS'} GiB | "
              f"nvidia-smi used GiB | notes |"), "|---|---:|---:|---:|---|"]

    def f(x, spec=".2f"):
        return "-" if x is None else format(x, spec)

    lines.append(f"| generate artifact | {f(g.get('total_s'), '.1f')} | {f(g.get('cuda_max_allocated_gib'))} | - | "
                 f"build {f(g.get('build_s'), '.1f')} s, save {f(g.get('save_s'), '.1f')} s, "
                 f"{f(g.get('artifact_gib'))} GiB on disk, rc {g.get('rc')} |")
    peak_load = build.get("cuda_max_allocated_bytes")
    lines.append(f"| quarl rl: load ({s.get('policy_load', '-')}) | {f(s.get('policy_load_s'), '.1f')} | "
                 f"{f(peak_load / GiB if peak_load else None)} | - | mode {build.get('mode', '-')}, "
                 f"{build.get('layers', '-')} layers |")
    for m in r.get("steps") or (ph.get("rl_progress") or {}).get("steps", []):
        lines.append(f"| step {m.get('step')} | {f(m.get('time/step_s'), '.1f')} | {f(m.get('memory/peak_gb'))} | - | "
                     f"rollout {f(m.get('time/rollout_s'), '.1f')} s ({f(m.get('rollout/tokens_per_s'), '.0f')} tok/s), "
                     f"update {f(m.get('time/update_s'), '.1f')} s, {m.get('train/answers', '-')} answers of "
                     f"{f(m.get('response/length_mean'), '.0f')} tokens |")
    lines.append(f"| quarl rl (process) | {f(r.get('seconds'), '.1f')} | - | "
                 f"{f(r.get('smi_peak_gib') or (ph.get('rl_progress') or {}).get('smi_peak_gib'))} | "
                 f"rc {r.get('rc')}, timed_out {s.get('timed_out')}, steps {s.get('end_step')}/{s.get('total_steps')}, "
                 f"trainable {(s.get('policy') or {}).get('trainable_params')} |")
    return "\n".join(lines) + "\n"


def finish(rec: Recorder, out: Path) -> int:
    rec.save()
    t = table(rec.data)
    (out / "summary.md").write_text(t)
    print(t)
    ok = (rec.data["phases"].get("rl") or {}).get("rc") == 0
    return 0 if ok else 1


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--prep", default=".dev/big32")
    p.add_argument("--gsm8k", default="/work/shared/data/gsm8k")
    p.add_argument("--train-n", type=int, default=16)
    g = sub.add_parser("_generate")
    for a in ("--prep", "--shape", "--device", "--model-dir", "--info"):
        g.add_argument(a, required=True)
    r = sub.add_parser("run")
    r.add_argument("--prep", default=".dev/big32")
    r.add_argument("--out", required=True)
    r.add_argument("--work", default="/tmp/big32")
    r.add_argument("--shape", choices=sorted(SHAPES), default="32b")
    r.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    r.add_argument("--budget-s", type=float, default=390.0, help="wall-clock budget of the whole run")
    r.add_argument("--load-reserve-s", type=float, default=90.0, help="kept for the rl process' start and load")
    r.add_argument("--step-reserve-s", type=float, default=45.0, help="kept for the step past the stage's budget")
    r.add_argument("--lora-r", type=int, default=32)
    r.add_argument("--group", type=int, default=8)
    r.add_argument("--prompts", type=int, default=2)
    r.add_argument("--new-tokens", type=int, default=512)
    r.add_argument("--mu", type=int, default=1)
    r.add_argument("--micro-batch", type=int, default=8)
    r.add_argument("--steps", type=int, default=3)
    r.add_argument("--keep", action="store_true", help="keep the work directory (the checkpoint, ~20 GB at 32B)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if args.cmd == "prepare":
        prepare(args)
        return 0
    if args.cmd == "_generate":
        generate(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
