"""Does quarl's GRPO/DAPO improve a model? QeRL's learning claims on SmolLM2-135M-Instruct, on one GPU.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/rl_learning.py --task builtin \
        --data DATA/builtin-l1 --policies bf16-lora,nvfp4-lora,nvfp4-lora-aqn,bf16-lora-dapo \
        --steps 200 --prompts-per-step 16 --max-new-tokens 128 --lr 2e-4 --micro-batch 16 \
        --train-seconds 330 --work /tmp/rll/builtin --out $OUT

(``benchmarks/rl_learning_gpu.sh`` runs both tasks, the entropy control and a CLI run in
one device call; the measured table is in ``benchmarks/RESULTS.md``, "RL that learns".)

Every policy is trained by the product's own stage (:func:`quarl.rl.run_rl`, the
function behind ``quarl rl`` and the ``rl`` component) and evaluated by
:func:`quarl.eval.run_eval` (greedy, the dataset's held-out split, the training
token budget), against its *own* untrained base: the BF16-LoRA adapter against
the BF16 model, the NVFP4 adapters against the RTN NVFP4 model they were trained
on. What varies between policies is only what the name says; the seed, data
order, sampler and hyper-parameters are shared:

    bf16-lora        frozen BF16 base + LoRA                  (QeRL's "16-bit LoRA")
    nvfp4-lora       frozen NVFP4 (RTN) base + LoRA           (QeRL without AQN)
    nvfp4-lora-aqn   ... + adaptive quantization noise        (QeRL: exponential sigma 1e-2 -> 5e-4)
    <policy>@<lr>    the same policy at another learning rate
    <policy>-dapo    the same policy under DAPO (clip-higher 0.28, token-level loss,
                     dynamic sampling, overlong filtering) instead of GRPO
    <policy>-fp8dense  the same policy *trained* with ``QUARL_KERNELS_DENSE_FP8=1`` (the 4-bit base's large-M
                     GEMMs on FP8 tiles with FP8 activations, ``quarl_kernels.dense_fp8``: rollout prefill,
                     log-prob pass and update); its adapter is evaluated as the others' are (weight-only), so
                     the comparison is of what was learned
    <policy>-plainrows the same policy trained with the engine's row handling off (``QUARL_ENGINE_COMPACT=0``,
                     ``QUARL_ENGINE_SHARE_PREFILL=0``: every row decodes to the end of its batch, every row
                     prefilled), the engine as it was before session 20

The GPU is far from busy with a 135M model, so the policies run side by side as
separate processes (``--parallel``); each process is exactly what one
``quarl rl`` would run. Per-step curves come from each run's ``metrics.jsonl``
(reward, accuracy, entropy, response length, the rollout / log-prob / update
time split), held-out figures from the eval artifacts, and the paired statistics
(delta, paired s.e., problems gained / lost) from :func:`quarl.eval.compare_runs`.

Outputs (``--out``): ``rl_learning_<task>.json`` (one entry per policy with
``policy, task, base_accuracy, trained_accuracy, paired_se, gained, lost, curves``),
``rl_learning_<task>.md`` and ``rl_learning_<task>.png`` (the curves).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import unittest.mock
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# policy -> (rl overrides, quant of its own base for eval)
POLICIES: dict[str, tuple[list[str], str | None]] = {
    "bf16-lora": (["policy.format=bf16", "aqn.enabled=false"], None),
    "nvfp4-lora": (["policy.format=nvfp4", "aqn.enabled=false"], "nvfp4"),
    "nvfp4-lora-aqn": (["policy.format=nvfp4", "aqn.enabled=true"], "nvfp4"),
    # Jet-RL's three precision flows (quarl/rl/precision.py), LoRA r32 on the same base and seed:
    # BF16 train + rollout; BF16 train + FP8-cast rollout (evaluated in BF16, the precision it was
    # trained in); FP8 train + rollout on a frozen FP8 base (evaluated on that FP8 base, act quant on)
    "bf16": (["precision.mode=bf16", "aqn.enabled=false"], None),
    "fp8-rollout": (["precision.mode=fp8-rollout", "aqn.enabled=false"], None),
    "jetrl": (["precision.mode=jetrl", "aqn.enabled=false"], "fp8-jetrl"),
    # full-parameter training (every weight; the trained model is evaluated, not an adapter): BF16, and Jet-RL's
    # FP8 flow with its 1x128 X^T in the weight gradient or X^T in 128x128 tiles (precision.fp8_wgrad)
    "bf16-full": (["precision.mode=bf16", "policy.mode=full", "aqn.enabled=false"], None),
    "jetrl-full": (["precision.mode=jetrl", "policy.mode=full", "aqn.enabled=false"], "fp8-jetrl"),
    "jetrl-full-tiles": (["precision.mode=jetrl", "policy.mode=full", "precision.fp8_wgrad=tiles",
                          "aqn.enabled=false"], "fp8-jetrl"),
}
# eval bases that a format spec cannot name: their eval overrides
EVAL_BASES = {"fp8-jetrl": ["quant=null", "quant_recipe={default: fp8-block, act_quant: fp8-1x128}"]}
DAPO = ["algo.algo=dapo"]
# training-only switches: a policy-name suffix -> the environment of its training job (policy_spec, train_env)
TRAIN_SWITCHES = {"-fp8dense": {"QUARL_KERNELS_DENSE_FP8": "1"},
                  "-plainrows": {"QUARL_ENGINE_COMPACT": "0", "QUARL_ENGINE_SHARE_PREFILL": "0"}}
# optimizer suffix: every run here trains with torch AdamW (``optim.optimizer=adamw`` below) unless named -8bit:
# bitsandbytes' 8-bit AdamW, QeRL's optimizer and the rl stage's default (needs bitsandbytes on the machine)
OPTIM_8BIT = "-8bit"
# config suffixes (any order, after the training switches): a policy-name suffix -> its extra rl overrides
CONFIG_SUFFIXES = {OPTIM_8BIT: ["optim.optimizer=adamw8bit"],
                   "-eager": ["policy.compile_glue=false"]}  # transformers' eager glue, not quarl.train.fused_glue
CURVE_KEYS = ("reward/mean", "reward/accuracy", "policy/entropy", "response/length_mean",
              "response/truncated_fraction", "grad_norm", "policy/clip_fraction", "aqn/sigma",
              "mismatch/abs_logprob_diff", "mismatch/max_abs_logprob_diff", "mismatch/kl",
              "mismatch/ratio_outside_0.5_2", "time/rollout_s", "time/logprob_s", "time/update_s", "time/step_s",
              "rollout/tokens_per_s", "update/skipped", "sampling/rounds")


def policy_spec(name: str) -> tuple[list[str], str | None]:
    """``<policy>[-dapo][-fp8dense|-plainrows][-8bit][-eager][@<lr>]`` -> (rl overrides, quant of its own base);
    ``@<lr>`` overrides --lr (``-fp8dense`` / ``-plainrows`` are environment switches of the training job,
    :func:`train_env`; ``-8bit`` trains with bitsandbytes' 8-bit AdamW instead of torch's; ``-eager`` with
    transformers' eager RMSNorm / RoPE / SwiGLU instead of the compiled glue ``policy.compile_glue=auto`` gives a
    CUDA run)."""
    name, _, lr = name.partition("@")
    extra: list[str] = []
    while suffix := next((x for x in CONFIG_SUFFIXES if name.endswith(x)), None):
        extra = CONFIG_SUFFIXES[suffix] + extra
        name = name.removesuffix(suffix)
    for suffix in TRAIN_SWITCHES:
        name = name.removesuffix(suffix)
    base, dapo = (name[:-5], True) if name.endswith("-dapo") else (name, False)
    if base not in POLICIES:
        raise SystemExit(f"unknown policy {name!r}; known: {', '.join(POLICIES)} (each may end in -dapo)")
    ov, quant = POLICIES[base]
    return ov + (DAPO if dapo else []) + ([f"optim.lr={float(lr)}"] if lr else []) + extra, quant


def rl_overrides(args, name: str) -> list[str]:
    ov, _ = policy_spec(name)
    return [
        f"train.steps={args.steps}",
        f"train.prompts_per_step={args.prompts_per_step}",
        f"rollout.group_size={args.group_size}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        "rollout.max_prompt_tokens=512",
        "rollout.temperature=1.0",
        f"optim.lr={args.lr}",
        "optim.optimizer=adamw",
        f"optim.warmup_ratio={args.warmup}",
        f"optim.schedule={args.schedule}",
        f"train.max_time_s={args.train_seconds}",
        f"optim.micro_batch_size={args.micro_batch}",
        f"algo.updates_per_rollout={args.updates}",
        f"policy.lora_r={args.lora_r}",
        f"policy.lora_alpha={args.lora_r}",
        f"train.seed={args.seed}",
        "train.checkpoint_every=0",
        "train.sample_every=20",
        f"train.device={args.device}",
        *args.rl_set,
        *ov,  # last: a policy's own settings (and an @lr) win
    ]


def eval_overrides(args, quant: str | None) -> list[str]:
    base = EVAL_BASES.get(quant, [f"quant={quant or 'null'}"])
    return [
        f"benchmarks=[{{name: heldout, source: dataset, template: dataset, max_problems: {args.eval_problems}}}]",
        "sampling.greedy=true",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        "sampling.batch_size=256",
        f"device={args.device}",
        *base,
    ]


def _complete(p: Path) -> bool:
    m = p / "manifest.json"
    return m.is_file() and json.loads(m.read_text()).get("complete") is True


def train_env(name: str) -> dict[str, str]:
    """Environment switches of a policy's training job (:data:`TRAIN_SWITCHES`): ``-fp8dense`` -> the dense path
    in FP8, ``-plainrows`` -> the engine without compaction or a shared prefill."""
    base = name.partition("@")[0]
    return next((env for suffix, env in TRAIN_SWITCHES.items() if base.endswith(suffix)), {})


# --------------------------------------------------------------------------- one job (a subprocess)
def job(args) -> None:
    """``--job train:<policy>`` (train, then evaluate the adapter) or ``--job base:<quant|bf16>``."""
    import torch

    from quarl.config import load_config
    from quarl.eval import EvalConfig, run_eval
    from quarl.rl import RLConfig, run_rl

    work = Path(args.work)
    kind, _, name = args.job.partition(":")
    t0 = time.time()
    timings = {}
    if kind == "base":
        quant = None if name == "bf16" else name
        cfg = load_config(EvalConfig, None, eval_overrides(args, quant))
        out = work / "eval" / f"base-{name}"
        if not _complete(out):
            run_eval(cfg, model_uri=args.model, data_uris={"heldout": args.data}, output_uri=str(out), progress=False)
        timings["eval_s"] = time.time() - t0
    else:
        out = work / "rl" / name
        if not _complete(out):
            cfg = load_config(RLConfig, None, rl_overrides(args, name))
            with unittest.mock.patch.dict(os.environ, train_env(name)):
                run_rl(cfg, model_uri=args.model, data_uri=args.data, output_uri=str(out))
        timings["train_s"] = time.time() - t0
        t1 = time.time()
        ov, quant = policy_spec(name)
        ev = work / "eval" / name
        if not _complete(ev):
            cfg = load_config(EvalConfig, None, eval_overrides(args, quant))
            # a full-parameter run's output is the trained model itself; a LoRA run's is an adapter on the base
            model, adapter = (str(out), None) if "policy.mode=full" in ov else (args.model, str(out))
            run_eval(cfg, model_uri=model, data_uris={"heldout": args.data}, adapter_uri=adapter,
                     output_uri=str(ev), progress=False)
        timings["eval_s"] = time.time() - t1
    if torch.cuda.is_available():
        timings["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
    (work / "timings").mkdir(parents=True, exist_ok=True)
    (work / "timings" / f"{kind}-{name}.json").write_text(json.dumps(timings))


def run_jobs(args, jobs: list[str]) -> dict[str, int]:
    """Run ``jobs`` as subprocesses, ``--parallel`` at a time; returns exit codes."""
    work = Path(args.work)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    pending, running, codes = list(jobs), {}, {}
    argv = [a for a in sys.argv[1:]]
    while pending or running:
        while pending and len(running) < args.parallel:
            j = pending.pop(0)
            log = open(work / "logs" / f"{j.replace(':', '-')}.log", "w")  # noqa: SIM115 - closed below
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_MININTERVAL": "30"}
            p = subprocess.Popen([sys.executable, __file__, *argv, "--job", j], stdout=log, stderr=subprocess.STDOUT,
                                 env=env)
            running[j] = (p, log)
            print(f"[{time.strftime('%H:%M:%S')}] started {j}", flush=True)
        for j, (p, log) in list(running.items()):
            if p.poll() is not None:
                log.close()
                codes[j] = p.returncode
                del running[j]
                print(f"[{time.strftime('%H:%M:%S')}] {j} exited {p.returncode}", flush=True)
                if p.returncode:
                    print((work / "logs" / f"{j.replace(':', '-')}.log").read_text()[-3000:], flush=True)
        time.sleep(1)
    return codes


# --------------------------------------------------------------------------- report
def per_level(data: str, eval_dir: Path) -> dict[str, float]:
    """Held-out accuracy by the dataset's ``difficulty`` column (the built-in generator's levels)."""
    import pandas as pd

    df = pd.read_parquet(Path(data) / "eval.parquet", columns=["id", "difficulty"])
    level = dict(zip(df["id"], df["difficulty"]))
    hits: dict[str, list[float]] = {}
    for line in (eval_dir / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        lv = level.get(s["problem_id"])
        hits.setdefault("none" if pd.isna(lv) else str(lv), []).append(float(s["correct"]))  # GSM8K: no levels
    return {k: sum(v) / len(v) for k, v in sorted(hits.items())}


def collect(args, policies: list[str]) -> dict:
    from quarl.eval import compare_runs
    from quarl.train.metrics import read_metrics

    work = Path(args.work)
    res = {"task": args.task, "date": datetime.now(UTC).strftime("%Y-%m-%d"), "command": "python3 " + " ".join(
        a for a in sys.argv if not a.startswith("--job")), "settings": {k: v for k, v in vars(args).items()
                                                                      if k not in ("job",)}, "policies": []}
    import torch

    res["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    res["torch"] = torch.__version__
    res["bases"] = {b.name: per_level(args.data, b) for b in sorted((work / "eval").glob("base-*")) if _complete(b)}
    for name in policies:
        _, quant = policy_spec(name)
        base = work / "eval" / f"base-{quant or 'bf16'}"
        ev, run = work / "eval" / name, work / "rl" / name
        entry = {"policy": name, "task": args.task, "base": f"base-{quant or 'bf16'}",
                 "rl_overrides": rl_overrides(args, name)}
        if _complete(base) and _complete(ev):
            rows = compare_runs([str(base), str(ev)])
            b, t = rows[0], rows[-1]
            entry.update(base_accuracy=b["accuracy"], trained_accuracy=t["accuracy"], delta=t.get("delta"),
                         paired_se=t.get("delta_stderr"), gained=t.get("gained"), lost=t.get("lost"),
                         problems=t["problems"], base_format_rate=b["format_rate"],
                         trained_format_rate=t["format_rate"], base_mean_tokens=b["mean_tokens"],
                         trained_mean_tokens=t["mean_tokens"])
            entry["base_accuracy_by_level"] = per_level(args.data, base)
            entry["trained_accuracy_by_level"] = per_level(args.data, ev)
        mf = run / "metrics.jsonl"
        if not mf.exists():  # stopped before the artifact was written: the live log in the work directory
            mf = run.parent / (run.name + ".work") / "metrics.jsonl"
        if mf.exists():
            rows = read_metrics(mf)
            entry["curves"] = {k: [r.get(k) for r in rows] for k in ("step", *CURVE_KEYS)}
        sf = run / "summary.json"
        if sf.exists():
            sm = json.loads(sf.read_text())
            entry.update(steps_done=sm.get("end_step"), steps_planned=sm.get("total_steps"),
                         timed_out=sm.get("timed_out"))
        tf = work / "timings" / f"train-{name}.json"
        if tf.exists():
            entry["timings"] = json.loads(tf.read_text())
        res["policies"].append(entry)
    return res


def _smooth(v: list, k: int = 10) -> list[float]:
    out, acc = [], []
    for x in v:
        acc.append(float("nan") if x is None else x)
        w = [a for a in acc[-k:] if not math.isnan(a)]
        out.append(sum(w) / len(w) if w else float("nan"))
    return out


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("reward/mean", "train reward (accuracy + 0.2 format)"),
              ("reward/accuracy", "train accuracy (mean of the step's answers)"),
              ("policy/entropy", "policy entropy (nats/token)"),
              ("response/length_mean", "response length (tokens)"), ("time/step_s", "step time (s)")]
    if any(any(x for x in (e.get("curves") or {}).get("mismatch/abs_logprob_diff") or [] if x) for e in res["policies"]):
        panels.insert(2, ("mismatch/abs_logprob_diff", "rollout/train mismatch, mean |d log p|"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.6))
    for ax, (key, title) in zip(axes, panels):
        for e in res["policies"]:
            c = e.get("curves")
            if c and c.get(key):
                ax.plot(c["step"], _smooth(c[key]), label=e["policy"], lw=1.4)
        ax.set_title(title, fontsize=10)
        if key.startswith("mismatch/"):
            ax.set_yscale("log")  # bf16 ~1e-3, FP8 flows ~1e-2..1e-1
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    model = res.get("settings", {}).get("model", "default")
    model = "SmolLM2-135M-Instruct" if model == "default" else model
    fig.suptitle(f"GRPO on {model}, task {res['task']} (10-step moving mean)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def mean(v: list) -> float:
    return sum(v) / len(v) if v else float("nan")


def markdown(res: dict) -> str:
    L = [f"Task `{res['task']}`, {res.get('gpu', '?')}, {res['date']}", "",
         ("| policy | base acc % | trained acc % | delta (pts) | paired s.e. | delta / s.e. | gained / lost | "
          "steps | train acc first 20 -> last 20 steps | entropy first 10 -> last 10 | "
          "step s (rollout / logprob / update) |"),
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in res["policies"]:
        c = e.get("curves") or {}
        acc = [x for x in c.get("reward/accuracy", []) if x is not None]
        ent = [x for x in c.get("policy/entropy", []) if x is not None and not math.isnan(x)]

        def tsplit(c=c):
            parts = [mean([x for x in c.get(k, []) if x is not None]) for k in
                     ("time/step_s", "time/rollout_s", "time/logprob_s", "time/update_s")]
            return f"{parts[0]:.2f} ({parts[1]:.2f} / {parts[2]:.2f} / {parts[3]:.2f})"

        if "base_accuracy" in e:
            d, se = e["delta"], e["paired_se"]
            L.append(f"| {e['policy']} | {100 * e['base_accuracy']:.1f} | {100 * e['trained_accuracy']:.1f} | "
                     f"{100 * d:+.1f} | {100 * se:.1f} | {d / se if se else float('nan'):.1f} | "
                     f"{e['gained']} / {e['lost']} | {len(acc)} | {mean(acc[:20]):.3f} -> {mean(acc[-20:]):.3f} | "
                     f"{mean(ent[:10]):.3f} -> {mean(ent[-10:]):.3f} | {tsplit()} |")
        else:
            L.append(f"| {e['policy']} | - | - | - | - | - | - | {len(acc)} | {mean(acc[:20]):.3f} -> {mean(acc[-20:]):.3f} | "
                     f"- | {tsplit() if c else '-'} |")
    L += ["", equal_steps(res)]
    return "\n".join(L)


def equal_steps(res: dict, window: int = 20) -> str:
    """QeRL Fig. 1/6's comparison: every policy's train reward over the same step windows, up to the
    last step that *all* policies reached (a time budget may end them at different steps)."""
    curves = {e["policy"]: e["curves"]["reward/mean"] for e in res["policies"] if e.get("curves")}
    if not curves:
        return ""
    n = min(len(v) for v in curves.values())
    edges = sorted({min(n, k) for k in (window, n // 2, n)} - {0})
    head = " | ".join(f"reward, steps {max(0, k - window)}-{k - 1}" for k in edges)
    L = [f"Train reward at equal steps (mean over {window}-step windows; all policies reached step {n - 1}):", "",
         f"| policy | {head} |", "|---|" + "---:|" * len(edges)]
    for p, v in curves.items():
        cells = [sum(v[max(0, k - window):k]) / len(v[max(0, k - window):k]) for k in edges]
        L.append(f"| {p} | " + " | ".join(f"{x:.3f}" for x in cells) + " |")
    return "\n".join(L)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", required=True, help="a label: builtin | gsm8k | ...")
    ap.add_argument("--data", required=True, help="a data_prep dataset artifact (train + eval splits)")
    ap.add_argument("--policies", default="bf16-lora,nvfp4-lora,nvfp4-lora-aqn")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--prompts-per-step", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=float, default=0.05)
    ap.add_argument("--schedule", default="constant", help="optim.schedule (constant: a time budget may end the run)")
    ap.add_argument("--train-seconds", type=float, default=0.0,
                    help="train.max_time_s: each run stops at the first step past this (0 = all --steps)")
    ap.add_argument("--updates", type=int, default=1, help="algo.updates_per_rollout")
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--lora-r", type=int, default=32)
    ap.add_argument("--seed", type=int, default=2025)
    ap.add_argument("--eval-problems", type=int, default=500)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="default", help="model for training and eval (tiny-qwen2: a CPU dry run)")
    ap.add_argument("--parallel", type=int, default=4, help="processes on the GPU at once")
    ap.add_argument("--rl-set", action="append", default=[], help="extra rl override key=value (repeatable)")
    ap.add_argument("--work", default="runs/bench/rl_learning")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results"))
    ap.add_argument("--name", default="", help="results file stem (default rl_learning_<task>)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--bases-only", action="store_true", help="evaluate the untrained bases only (pick levels)")
    ap.add_argument("--job", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.job:
        return job(args)
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:
        policy_spec(p)  # fail early on a typo
    t0 = time.time()
    if not args.report_only:
        bases = sorted({f"base:{policy_spec(p)[1] or 'bf16'}" for p in policies})
        run_jobs(args, ([] if args.bases_only else [f"train:{p}" for p in policies]) + bases)
    res = collect(args, policies)
    if not args.report_only:
        res["wall_s"] = round(time.time() - t0, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.name or f"rl_learning_{args.task}"
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1) + "\n")
    md = markdown(res)
    (out / f"{stem}.md").write_text(md + "\n")
    try:
        plot(res, out / f"{stem}.png")
    except Exception as e:  # noqa: BLE001 - the JSON is the result; a plot failure must not lose it
        print(f"plot failed: {e}")
    print(md)


if __name__ == "__main__":
    main()
