"""Host memory of ``quarl calibrate`` with offload=cpu: the whole dense model on the host vs. streamed blocks (CPU).

    nice .venv/bin/python benchmarks/calibrate_stream_cpu.py --work /tmp/calib_stream --out out/calibrate_stream
    # smoke: --layers 2 --hidden 256 --intermediate 512 --vocab 4096

Issue 17: with sequential onloading the device holds one decoder block, but ``load_model`` put the whole
dense model in host memory (140 GB for a 70B BF16 model, more than the calibrate pod's 96Gi).
``offload=cpu`` now streams the dense blocks from the checkpoint (quarl.calibrate.streaming). This
measures both on a CPU, where the host *is* the compute device, so the moves are no-ops and what
remains is exactly the host side:

1. write a random-weight dense BF16 Qwen2-shaped checkpoint (``--hidden``/``--intermediate``/``--layers``/
   ``--vocab``; default 1536 / 8960 / 12 / 32768 = 0.66 B params, 1.32 GB) with the GPU benchmark's writer
   (benchmarks/calibrate_offload_gpu.py: one part in memory at a time, a BPE tokenizer trained here);
2. run the calibrate stage (``quarl.calibrate.run_calibrate``: RTN, NVFP4, dtype bfloat16, held-out
   KL/ppl on ``--eval-samples`` x ``--seq-len`` windows block by block) in a child process per mode, each
   recording its peak RSS (``ru_maxrss``), its RSS right after the imports, and wall time:
   ``host`` = offload=cpu loading the whole dense model on the host (the path before streaming, forced by
   making the source look unstreamable), ``stream`` = offload=cpu streaming from the checkpoint;
3. compare the two artifacts' weight shards (sha256) and print a table; ``$OUT/results.json`` is
   rewritten after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "kernels", ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

GiB = 2**30


def child(args) -> None:
    import resource

    from quarl.calibrate import CalibrateConfig, run_calibrate, stage
    from quarl.calibrate.streaming import StreamSource
    from quarl.config import load_config

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if args.mode == "host":  # the path before streaming: the whole dense model loaded on the host
        stage.stream_source = lambda uri, path=None: StreamSource(None, "benchmark: whole model on the host")
    work = Path(args.work)
    cfg = load_config(CalibrateConfig, None, [
        "method=rtn", "format=nvfp4", "device=cpu", "dtype=bfloat16", "offload=cpu", "threads=2",
        f"eval.path={work / 'heldout.txt'}", f"eval.num_samples={args.eval_samples}", f"eval.seq_len={args.seq_len}",
        "eval.batch_size=1"])
    out = work / f"artifact-{args.mode}"
    t0 = time.perf_counter()
    m = run_calibrate(cfg, model_uri=str(work / "model"), output_uri=str(out), overwrite=True, progress=False)
    wall = time.perf_counter() - t0
    files = json.loads((out / "manifest.json").read_text())["files"]
    off = m["calibration"]["offload"]
    rec = {"mode": args.mode, "streamed": off["streamed"], "wall_s": round(wall, 1),
           "calibrate_s": round(m["calibration"]["seconds"], 1),
           "rss_after_imports_gib": round(rss0, 3),
           "rss_peak_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
           "host_peak_materialized_gib": (round(off["host_peak_materialized_bytes"] / GiB, 3)
                                          if off["host_peak_materialized_bytes"] else None),
           "packed_gib": round(m["memory"]["total_bytes"] / GiB, 3), "quality": m["quality"],
           "weight_sha256": {k: v["sha256"] for k, v in files.items() if k.endswith(".safetensors")}}
    Path(args.record).write_text(json.dumps(rec, indent=2) + "\n")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        ap = argparse.ArgumentParser()
        for k in ("--mode", "--work", "--record"):
            ap.add_argument(k, required=True)
        ap.add_argument("--eval-samples", type=int, required=True)
        ap.add_argument("--seq-len", type=int, required=True)
        child(ap.parse_args(argv[1:]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/calib_stream")
    ap.add_argument("--out", default="out/calibrate_stream")
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--intermediate", type=int, default=8960)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--eval-samples", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--modes", default="host,stream")
    args = ap.parse_args(argv)
    if args.vocab < 16384:
        ap.error("--vocab must be >= 16384 (the BPE tokenizer trained here has 16384 tokens)")

    import torch
    from calibrate_offload_gpu import write_checkpoint, write_text
    from transformers import Qwen2Config

    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    shape = {"hidden_size": args.hidden, "intermediate_size": args.intermediate, "num_hidden_layers": args.layers,
             "num_attention_heads": args.hidden // 128, "num_key_value_heads": 2, "vocab_size": args.vocab}
    cfg = Qwen2Config(**shape, max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, hidden_act="silu", use_sliding_window=False, bos_token_id=None,
                      eos_token_id=2, pad_token_id=1, dtype="bfloat16")
    res = {"shape": shape, "env": {"python": platform.python_version(), "torch": torch.__version__,
                                   "cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine()},
           "date": time.strftime("%Y-%m-%d"), "runs": {}}
    if not (work / "model" / "config.json").is_file():
        res["write"] = write_checkpoint(work / "model", cfg, "cpu")
    res["checkpoint_gib"] = round(sum(f.stat().st_size for f in (work / "model").glob("*.safetensors")) / GiB, 3)
    write_text(work / "heldout.txt", int(args.eval_samples * args.seq_len * 1.05), seed=2)
    for mode in args.modes.split(","):
        record = work / f"record-{mode}.json"
        record.unlink(missing_ok=True)
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, __file__, "_child", "--mode", mode, "--work", str(work), "--record",
                            str(record), "--eval-samples", str(args.eval_samples), "--seq-len", str(args.seq_len)],
                           check=False, cwd=ROOT, capture_output=True, text=True)
        r = json.loads(record.read_text()) if record.is_file() else {"log_tail": (p.stdout + p.stderr)[-3000:]}
        r.update(rc=p.returncode, child_wall_s=round(time.monotonic() - t0, 1))
        res["runs"][mode] = r
        (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
        print(f"[{mode}] rc={p.returncode} " + json.dumps({k: v for k, v in r.items() if k != "weight_sha256"}),
              flush=True)
    runs = res["runs"]
    if all(runs.get(m, {}).get("weight_sha256") for m in ("host", "stream")):
        res["same_weights"] = runs["host"]["weight_sha256"] == runs["stream"]["weight_sha256"]
        (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    print(f"\ncheckpoint {res['checkpoint_gib']} GiB dense BF16, shape {shape}\n")
    print("| offload=cpu | peak RSS GiB | RSS after imports GiB | materialized peak GiB | wall s | KL | same weights |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for m, r in runs.items():
        q = r.get("quality") or {}
        print(f"| {m} | {r.get('rss_peak_gib')} | {r.get('rss_after_imports_gib')} | "
              f"{r.get('host_peak_materialized_gib')} | {r.get('wall_s')} | {q.get('kl', float('nan')):.4g} | "
              f"{res.get('same_weights')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
