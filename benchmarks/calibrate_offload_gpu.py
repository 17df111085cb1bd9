"""``quarl calibrate`` of a 14B-shaped dense BF16 checkpoint with sequential onloading (offload=cpu), on one GPU.

    # on the device (one H100, <= 390 s by --budget-s; nothing to carry, no network, no GGUF):
    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/calibrate_offload_gpu.py --out $OUT --work /tmp/calib14 \\
        --budget-s 390
    # dry run here (same code path, tiny shape, CPU; QUARL_BENCH_NO_CT=1: no compressed-tensors, as there):
    QUARL_BENCH_NO_CT=1 .venv/bin/python benchmarks/calibrate_offload_gpu.py --out /tmp/co/out --work /tmp/co/work \\
        --shape tiny --device cpu --budget-s 300 --samples 8 --seq-len 128 --eval-samples 2 --compare-layers 2

What it does (issue 17: the calibrate stage must not need the whole dense model on the GPU):

1. **write** (in this process) a Qwen2.5-14B-shaped (hidden 5120, intermediate 13824, 48 layers, 40
   heads, 8 KV heads, vocab 152064, q/k/v bias, untied head) *random-weight dense BF16* Hugging Face
   checkpoint to ``--work``/model, one part at a time: each part (embeddings, decoder layer i, norm,
   lm_head) is materialized on the device with seeded random weights
   (``quarl.quant.synthetic.seeded_fill``), copied to the host, written as its own safetensors shard and
   dropped, so neither memory ever holds more than one layer (~0.6 GB); then the shard index, config.json
   and a tokenizer. The tokenizer is a byte-level BPE trained here in a few seconds with the ``tokenizers``
   library on random letter words (no download, no GGUF), and the calibration / held-out text is more
   random words: the windows are near-random token ids, which is what a random-weight model deserves.
2. **calibrate** (a child process per run, so each one's GPU and host peaks are its own): the stage's
   Python entry ``quarl.calibrate.run_calibrate`` with method gptq, NVFP4, dtype bfloat16,
   ``--samples`` x ``--seq-len`` calibration windows (default 32 x 2048), ``--eval-samples`` held-out
   windows of 2048 (default 4):
   a. ``full_cpu``: the whole 48-layer model with ``offload=cpu`` (loaded on the host, one decoder block
      at a time on the GPU, held-out KL/ppl block by block) -- the headline: peak device memory against
      the 29.5 GB dense model;
   b. ``8L_cpu`` / ``8L_none``: the same on a checkpoint of the first ``--compare-layers`` (8) layers
      (links to the same shards), once with ``offload=cpu`` and once with ``offload=none`` (today's path:
      the model and, for the held-out check, a second full reference copy on the GPU), if the budget still
      has room (estimated from run a): what onloading costs in time, and whether the two write the same
      weights (sha256 of the shards). ``--full-modes cpu,none`` runs ``none`` on the whole model too
      (2 x 29.5 GB fits an 80 GB card at 14B; it needs ~200 s more than the default budget).

The device has no compressed-tensors, which ``save_quantized`` uses to build the checkpoint's
``quantization_config``; the JSON it would build for an all-NVFP4 recipe (``lm_head`` kept dense) is
shape-independent and is committed beside this script (``calibrate_offload_qconfig.json``, written by
``--write-qconfig`` on a machine with the package); the child passes it to ``save_quantized``, which
checks it against the model's layers before writing.

Recorded in ``$OUT/results.json`` (rewritten after every phase; a killed run keeps what it finished):
checkpoint write time and size; per mode: wall time (load / calibrate+eval / save, total), the stage's
own peak device memory per block (``calibration.offload``), ``torch.cuda.max_memory_allocated`` and the
device's used memory sampled every 0.25 s (``mem_get_info``: what nvidia-smi would show), the child's host
RSS peak (``ru_maxrss``), the artifact's size, the held-out KL / perplexities; with both modes, whether
the two artifacts' weight shards are byte-identical (sha256 from their manifests; each artifact is
deleted after its run, so the 64 GB disk holds the 28 GB checkpoint and one ~10 GB artifact at a time). A summary table is printed last and written to ``$OUT/summary.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "kernels", ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from grpo_step_gpu import SHAPES as _QWEN25  # the Qwen2.5 shapes, one table

SHAPES = {**_QWEN25, "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3,  # CPU dry run
                              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 40000}}
VOCAB = 16384  # the BPE tokenizer trained here (< every shape's vocab)
QCONFIG = Path(__file__).with_name("calibrate_offload_qconfig.json")
RECIPE = {"default": "nvfp4"}
GiB = 2**30


def qwen25_config(shape: str, layers: int | None):
    from transformers import Qwen2Config

    kw = dict(SHAPES[shape])
    if layers:
        kw["num_hidden_layers"] = layers
    return Qwen2Config(**kw, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, hidden_act="silu", use_sliding_window=False,
                       bos_token_id=None, eos_token_id=2, pad_token_id=1, dtype="bfloat16")


# --------------------------------------------------------------------------- the checkpoint
def random_words(n: int, seed: int) -> list[str]:
    """``n`` random lower-case words of 2-7 letters (letters only: every pre-tokenizer keeps them whole)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(n)]


def train_tokenizer():
    """A byte-level BPE tokenizer (GPT-2 / Qwen2 style, vocab VOCAB, <unk>/<pad>/<eos> = 0/1/2) trained
    here on random words: no download. Byte-level because transformers 5 loads a qwen2 checkpoint's
    tokenizer.json into its own Qwen2Tokenizer (Qwen2's pre-tokenizer + byte-level BPE) whatever class
    the file names: a BPE vocabulary with merges tokenizes the same text the same way in both."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<pad>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    words = random_words(200_000, seed=0)
    tk.train_from_iterator((" ".join(words[i : i + 100]) for i in range(0, len(words), 100)), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")


def write_text(path: Path, tokens: int, seed: int, doc_words: int = 500) -> None:
    """Random-word documents (blank-line separated) with at least ``tokens`` words (>= 1 token each)."""
    words = random_words(tokens, seed)
    path.write_text("\n\n".join(" ".join(words[i : i + doc_words]) for i in range(0, len(words), doc_words)) + "\n")


def write_checkpoint(model_dir: Path, config, device: str, seed: int = 0) -> dict:
    """A dense BF16 HF checkpoint of ``config``'s shape, random weights, one part in memory at a time."""
    import torch
    from safetensors.torch import save_file

    from quarl.quant.stream import empty_model
    from quarl.quant.synthetic import seeded_fill

    t0 = time.perf_counter()
    model_dir.mkdir(parents=True, exist_ok=True)
    model = empty_model(config, torch.bfloat16)
    fill = seeded_fill(seed, device)
    base = model.model
    parts = [("model.embed_tokens", base.embed_tokens)]
    parts += [(f"model.layers.{i}", layer) for i, layer in enumerate(base.layers)]
    parts += [("model.norm", base.norm), ("lm_head", model.lm_head)]
    weight_map, total = {}, 0
    for i, (prefix, mod) in enumerate(parts):
        fill(mod, prefix)
        sd = {f"{prefix}.{k}": v.detach().to("cpu").contiguous() for k, v in mod.state_dict().items()}
        fname = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
        save_file(sd, str(model_dir / fname), metadata={"format": "pt"})
        for k, v in sd.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
        mod.to("meta")  # drop it
        del sd
    (model_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    config.save_pretrained(model_dir)
    train_tokenizer().save_pretrained(model_dir)
    return {"seconds": round(time.perf_counter() - t0, 2), "bytes": total, "shards": len(parts),
            "params": total // 2}


# --------------------------------------------------------------------------- calibrate (child)
def child(args) -> None:
    """One run_calibrate in this process; writes its record to ``args.record``."""
    import functools
    import resource

    import torch

    from quarl.calibrate import CalibrateConfig, run_calibrate, stage
    from quarl.config import load_config
    from quarl.quant.checkpoint import save_quantized

    logging_setup()
    if os.environ.get("QUARL_BENCH_NO_CT"):  # the CPU dry run: behave as on the device (no compressed-tensors)
        sys.modules["compressed_tensors"] = None
    dev = torch.device(args.device)
    qc = json.loads(QCONFIG.read_text())
    stage.save_quantized = functools.partial(save_quantized, qconfig=qc)  # no compressed-tensors on the device
    work = Path(args.work)
    cfg = load_config(CalibrateConfig, None, [
        "method=gptq", "format=nvfp4", f"device={args.device}", "dtype=bfloat16", f"offload={args.mode}",
        f"data.path={work / 'calib.txt'}", f"data.num_samples={args.samples}", f"data.seq_len={args.seq_len}",
        f"data.batch_size={args.batch_size}", f"eval.path={work / 'heldout.txt'}",
        f"eval.num_samples={args.eval_samples}", f"eval.seq_len={args.seq_len}", "eval.batch_size=1",
        f"gptq.hessian={args.hessian}",
    ])
    used = {"max": 0}
    stop = threading.Event()

    def sample():  # device memory as the driver sees it (allocator cache, CUDA context, graphs included)
        total = torch.cuda.mem_get_info(dev)[1]
        while not stop.is_set():
            used["max"] = max(used["max"], total - torch.cuda.mem_get_info(dev)[0])
            stop.wait(0.25)

    if dev.type == "cuda":
        torch.cuda.init()
        base_used = torch.cuda.mem_get_info(dev)[1] - torch.cuda.mem_get_info(dev)[0]
        threading.Thread(target=sample, daemon=True).start()
    out = work / f"artifact-{args.tag}"
    t0 = time.perf_counter()
    m = run_calibrate(cfg, model_uri=args.model, output_uri=str(out), overwrite=True, progress=True)
    wall = time.perf_counter() - t0
    stop.set()
    off = m["calibration"]["offload"]
    rec = {
        "mode": args.mode, "model": args.model, "offload": {k: v for k, v in off.items() if k != "block_peak_device_bytes"},
        "wall_s": round(wall, 1), "calibrate_s": round(m["calibration"]["seconds"], 1),
        "stage_total_s": round(m["calibration"].get("total_seconds", wall), 1),
        "quality": m["quality"], "rel_error_mean": m["rel_error"]["mean"],
        "windows": m["calibration"]["windows"], "seq_len": m["calibration"]["seq_len"],
        "host_rss_peak_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "artifact_bytes": sum(f.stat().st_size for f in out.rglob("*") if f.is_file()),
        "packed_bytes": m["memory"]["total_bytes"],
    }
    if dev.type == "cuda":
        peaks = off.get("block_peak_device_bytes") or []
        rec.update(
            cuda_max_allocated_gib=round(max(off.get("peak_device_bytes") or 0,
                                             torch.cuda.max_memory_allocated(dev)) / GiB, 2),
            block_peak_gib={"min": round(min(peaks) / GiB, 2), "max": round(max(peaks) / GiB, 2)} if peaks else None,
            device_used_peak_gib=round(used["max"] / GiB, 2), device_used_before_gib=round(base_used / GiB, 2),
        )
    Path(args.record).write_text(json.dumps(rec, indent=2, default=str) + "\n")


def logging_setup():
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)


# --------------------------------------------------------------------------- orchestrator
class Recorder:
    """results.json rewritten whole at every update."""

    def __init__(self, out: Path, args):
        self.out, self.t0 = out, time.monotonic()
        self.data = {"args": vars(args), "env": env_info(args.device), "phases": {}}
        self.save()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def put(self, key: str, value) -> None:
        self.data["phases"][key] = value
        self.data["elapsed_s"] = round(self.elapsed(), 1)
        self.save()

    def save(self) -> None:
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        os.replace(tmp, self.out / "results.json")


def env_info(device: str) -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "host_cpus": os.cpu_count()}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_total_gib"] = round(torch.cuda.mem_get_info(0)[1] / GiB, 1)
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def run_mode(args, model: Path, mode: str, tag: str, rec: Recorder, timeout: float) -> dict:
    """One calibrate child on ``model`` with ``offload=mode``; its record under phases[calibrate_<tag>]."""
    out, work = Path(args.out), Path(args.work)
    record = work / f"record-{tag}.json"
    record.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "_child", "--mode", mode, "--tag", tag, "--model", str(model), "--record",
           str(record), "--work", args.work, "--device", args.device, "--samples", str(args.samples), "--seq-len",
           str(args.seq_len), "--batch-size", str(args.batch_size), "--eval-samples", str(args.eval_samples),
           "--hessian", args.hessian]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels"),
                                                        os.environ.get("PYTHONPATH", "")])}
    t0 = time.monotonic()
    with open(out / f"calibrate-{tag}.log", "w") as log:
        try:
            p = subprocess.run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, env=env,
                               cwd=ROOT)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    r = json.loads(record.read_text()) if record.is_file() else {"mode": mode}
    r.update(rc=rc, child_wall_s=round(time.monotonic() - t0, 1))
    if rc != 0:
        tail = (out / f"calibrate-{tag}.log").read_text()[-2000:]
        r["log_tail"] = tail
        print(f"[{tag}] rc={rc}; log tail:\n{tail}", flush=True)
    art = work / f"artifact-{tag}"
    if (art / "manifest.json").is_file():
        r["weight_sha256"] = weight_checksums(art)
        shutil.rmtree(art, ignore_errors=True)  # disk: 64 GB holds the checkpoint and one artifact at a time
    rec.put(f"calibrate_{tag}", r)
    print(f"[{tag}] " + json.dumps({k: v for k, v in r.items() if k not in ("weight_sha256", "log_tail")},
                                   default=str), flush=True)
    return r


def first_layers(src: Path, dst: Path, n: int) -> Path:
    """A checkpoint of the first ``n`` decoder layers of ``src`` (one shard per part): links to its
    shards, its config with ``num_hidden_layers = n``, an index of just those tensors."""
    import re

    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    keep = {k: f for k, f in index["weight_map"].items()
            if not (m := re.match(r"model\.layers\.(\d+)\.", k)) or int(m.group(1)) < n}
    for f in sorted(set(keep.values())):
        os.symlink(src / f, dst / f)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["num_hidden_layers"] = n
    cfg.pop("layer_types", None)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    total = sum((src / f).stat().st_size for f in set(keep.values()))
    (dst / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": keep}, indent=2))
    return dst


def weight_checksums(art: Path) -> dict[str, str]:
    """sha256 of each weight shard, from the artifact's manifest (equal bytes <=> equal tensors + metadata)."""
    files = json.loads((art / "manifest.json").read_text())["files"]
    return {k: v["sha256"] for k, v in files.items() if k.endswith(".safetensors")}


def summary(rec: Recorder) -> str:
    ph = rec.data["phases"]
    w = ph.get("write", {})
    lines = [f"# calibrate offload benchmark ({rec.data['args']['shape']}, {rec.data['env'].get('gpu', 'cpu')})", "",
             (f"checkpoint: {w.get('bytes', 0) / GiB:.1f} GiB dense BF16 "
              f"({w.get('shape', {}).get('num_hidden_layers')} layers) written in {w.get('seconds', '-')} s"), "",
             ("| run | offload | rc | wall s | calibrate s | CUDA max alloc GiB | block peak GiB | device used GiB "
              "| host RSS GiB | artifact GiB | KL | ppl / ref ppl |"),
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for key, r in ph.items():
        if not key.startswith("calibrate_"):
            continue
        q = r.get("quality") or {}
        bp = r.get("block_peak_gib") or {}
        lines.append(
            f"| {key.removeprefix('calibrate_')} | {r.get('mode')} | {r.get('rc')} | {r.get('wall_s', '-')} "
            f"| {r.get('calibrate_s', '-')} | {r.get('cuda_max_allocated_gib', '-')} | {bp.get('max', '-')} "
            f"| {r.get('device_used_peak_gib', '-')} | {r.get('host_rss_peak_gib', '-')} "
            f"| {r.get('artifact_bytes', 0) / GiB:.2f} | {q.get('kl', float('nan')):.4g} "
            f"| {q.get('ppl', float('nan')):.4g} / {q.get('ref_ppl', float('nan')):.4g} |")
    lines.append("")
    for key, v in ph.items():
        if key.startswith(("same_", "skipped_")):
            lines.append(f"{key}: {v}")
    lines += ["", f"total {rec.elapsed():.0f} s"]
    return "\n".join(lines) + "\n"


def orchestrate(args) -> int:
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    rec = Recorder(out, args)
    import torch

    cfg = qwen25_config(args.shape, args.layers)
    model = work / "model"
    if not (model / "model.safetensors.index.json").is_file():
        shutil.rmtree(model, ignore_errors=True)
        info = write_checkpoint(model, cfg, args.device)
        if args.device.startswith("cuda"):
            info["cuda_max_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GiB, 2)
            torch.cuda.empty_cache()
    else:
        info = {"reused": True, "bytes": json.loads((model / "model.safetensors.index.json").read_text())
                ["metadata"]["total_size"]}
    info["shape"] = {**SHAPES[args.shape], "num_hidden_layers": cfg.num_hidden_layers}
    write_text(work / "calib.txt", int(args.samples * args.seq_len * 1.05), seed=1)
    write_text(work / "heldout.txt", int(args.eval_samples * args.seq_len * 1.05), seed=2)
    info["disk_free_gib_after"] = round(shutil.disk_usage(work).free / GiB, 1)
    info["seconds_total"] = round(rec.elapsed(), 1)
    rec.put("write", info)
    print(f"checkpoint: {json.dumps(info)}", flush=True)

    # 1. The headline: the whole model, offload=cpu (and whatever else --full-modes asks, time permitting).
    full: dict[str, dict] = {}
    for mode in [m for m in args.full_modes.split(",") if m]:
        left = args.budget_s - rec.elapsed() - 5
        if full and left < 1.15 * max(r["child_wall_s"] for r in full.values()):
            rec.put(f"skipped_full_{mode}", f"{left:.0f} s left, less than the previous run took")
            continue
        full[mode] = run_mode(args, model, mode, f"full_{mode}", rec, left)
    if {"cpu", "none"} <= full.keys():
        rec.put("same_weights_full", full["cpu"].get("weight_sha256") == full["none"].get("weight_sha256"))

    # 2. cpu vs none on the first --compare-layers layers (same shapes per block): the cost of onloading.
    n = min(args.compare_layers, cfg.num_hidden_layers)
    if n > 0:
        ref = next(iter(full.values()), None)
        # a run = ~25 s of start, load and save + the loop's share (x1.3: none also reloads its reference)
        per = ref["calibrate_s"] / cfg.num_hidden_layers if ref and ref.get("rc") == 0 else 4.0
        est = 25.0 + 1.3 * per * n
        left = args.budget_s - rec.elapsed() - 5
        if left < 2 * est:
            rec.put("skipped_compare", f"{left:.0f} s left < 2 x ~{est:.0f} s (two runs of {n} layers)")
        else:
            sub = first_layers(model, work / f"model-{n}L", n)
            runs = {}
            for mode in ("cpu", "none"):
                left = args.budget_s - rec.elapsed() - 5
                if left < 20:
                    rec.put(f"skipped_compare_{mode}", f"only {left:.0f} s left")
                    continue
                runs[mode] = run_mode(args, sub, mode, f"{n}L_{mode}", rec, left)
            if len(runs) == 2:
                rec.put(f"same_weights_{n}L", runs["cpu"].get("weight_sha256") == runs["none"].get("weight_sha256"))
    text = summary(rec)
    (out / "summary.md").write_text(text)
    print(text, flush=True)
    return 0


def write_qconfig() -> None:
    """The quantization_config save_quantized writes for RECIPE (needs compressed-tensors; run where it is)."""
    from quarl.quant.synthetic import planned_quantization_config

    qcs = {s: planned_quantization_config(qwen25_config(s, 2), RECIPE) for s in SHAPES}
    assert all(q == qcs["tiny"] for q in qcs.values()), "the quantization_config depends on the shape"
    QCONFIG.write_text(json.dumps(qcs["tiny"], indent=2, sort_keys=True) + "\n")
    print(f"wrote {QCONFIG}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        ap = argparse.ArgumentParser()
        for k in ("--mode", "--tag", "--model", "--record", "--work", "--device", "--hessian"):
            ap.add_argument(k, required=True)
        for k in ("--samples", "--seq-len", "--batch-size", "--eval-samples"):
            ap.add_argument(k, type=int, required=True)
        child(ap.parse_args(argv[1:]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/calibrate_offload")
    ap.add_argument("--work", default="/tmp/calib_offload", help="checkpoint, text and artifacts (local disk)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="14b")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--full-modes", default="cpu", help="offload modes run on the whole model, in order")
    ap.add_argument("--compare-layers", type=int, default=8,
                    help="then cpu vs none on the first N layers, if the budget has room (0: skip)")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--eval-samples", type=int, default=4)
    ap.add_argument("--hessian", choices=("fp32", "native"), default="fp32")
    ap.add_argument("--budget-s", type=float, default=390.0, help="wall-clock budget of the whole run")
    ap.add_argument("--write-qconfig", action="store_true", help=f"(re)write {QCONFIG.name} and exit")
    args = ap.parse_args(argv)
    if args.write_qconfig:
        write_qconfig()
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
