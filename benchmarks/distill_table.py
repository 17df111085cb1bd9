"""PTQ vs QAT vs QAD on SmolLM2-135M-Instruct, from RTN and from GPTQ init, and QAD's data sources side by side.

    python benchmarks/distill_table.py --device cuda --out distill.json            # the RESULTS.md table
    python benchmarks/distill_table.py --device cpu --quick --out /tmp/d.json       # a minutes-long smoke run
    python benchmarks/distill_table.py --device cuda --peak-7b                      # + Qwen2.5-7B-shaped QAD step memory

For each weight format (NVFP4; INT3 asymmetric g128) and init (RTN, GPTQ), with the
full-precision model as teacher:

    PTQ   the calibrated model as is (the student at step 0, after the QAT re-quantization)
    QAT   full QAT (straight-through fake quant) on cross-entropy of the labels
    QAD   full QAT on forward KL(teacher || student), T = 1, full vocabulary

each trained for the same steps on the same SFT text (the built-in generator's problems
with their worked solutions), then re-quantized into the format and measured on held-out
text: KL(teacher || student) and CE per token, and greedy accuracy on the built-in
held-out problems (quarl.rewards). Then QAD from GPTQ init with each data source of QAD
Table 5: sft, teacher completions (all / correct only), BOS-sampled, random tokens.

SmolLM2's hidden size 576 is not a multiple of 128, so calibrate refuses int3-g128 on
the q/k/v/o/gate/up inputs; the INT3 recipe here is g128 where the input width allows
(down_proj, 1536) and g64 on the 576-wide inputs (the same bits, a finer grid there).

Everything is seeded; the numbers are one run each (no error bars): small differences
(a few percent of KL) are within what another seed would move.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FORMATS = {
    "nvfp4": {"default": "nvfp4"},
    "int3-g128": {"default": "w3g128", "overrides": [
        {"pattern": "re:.*\\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj)", "format": "int3-g64"}]},
}
SOURCES = ("sft", "teacher", "teacher_correct", "bos", "random")


def settings(quick: bool, device: str) -> dict:
    if quick:
        return {"train_rows": 48, "heldout": 8, "seq_len": 96, "steps": 4, "batch": 4, "micro": 4, "acc": 4,
                "new_tokens": 24, "gen_new": 24, "calib": (4, 64), "lr": 1e-5}
    return {"train_rows": 256, "heldout": 64, "seq_len": 192, "steps": 50, "batch": 16, "micro": 16, "acc": 64,
            "new_tokens": 64, "gen_new": 128, "calib": (16, 256), "lr": 1e-4}


def make_dataset(root: Path, s: dict) -> str:
    from quarl.config import load_config
    from quarl.data import DataPrepConfig, run_data_prep

    out = root / "dataset" if root.name != "dataset" else root
    n = s["train_rows"] + max(s["heldout"], s["acc"]) + 64
    cfg = load_config(DataPrepConfig, None, [
        f"sources=[{{name: synthetic, num_samples: {n}, max_difficulty: 2}}]", "template=chat", "tokenizer=default",
        f"split.eval_size={max(s['heldout'], s['acc'])}", f"split.max_train_samples={s['train_rows']}",
        "validation.min_train_rows=4"])
    run_data_prep(cfg, output_uri=str(out))
    return str(out)


def calibrate(root: Path, data_uri: str, fmt: str, method: str, s: dict, device: str,
              model: str = "default") -> tuple[str, dict]:
    from quarl.calibrate import CalibrateConfig, run_calibrate
    from quarl.config import load_config

    n, L = s["calib"]
    cfg = load_config(CalibrateConfig, None, [f"method={method}", f"device={device}", f"data.num_samples={n}",
                                              f"data.seq_len={L}", "data.columns=[prompt, solution]",
                                              "eval.num_samples=4"])
    cfg.recipe = FORMATS[fmt]
    out = root / f"calib-{fmt}-{method}"
    m = run_calibrate(cfg, model_uri=model, data_uri=data_uri, output_uri=str(out), progress=False)
    return str(out), m["quality"]


def distill_cfg(s: dict, device: str, objective: str, source: str):
    from quarl.config import load_config
    from quarl.distill import DistillConfig

    return load_config(DistillConfig, None, [
        f"loss.objective={objective}", f"data.source={source}", f"data.seq_len={s['seq_len']}",
        f"data.max_new_tokens={s['gen_new']}", "data.gen_batch_size=128", f"data.num_sequences={s['train_rows']}",
        f"optim.lr={s['lr']}", f"optim.batch_size={s['batch']}", f"optim.micro_batch_size={s['micro']}",
        "optim.warmup_ratio=0.05", f"eval.num_sequences={s['heldout']}", f"eval.seq_len={s['seq_len']}",
        "eval.every=0", f"train.steps={s['steps']}", "train.checkpoint_every=0", "train.resume=false",
        f"train.device={device}", "student.dtype=float32", "loss.chunk=1024"])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default", help="teacher / model to quantize (tiny-llama: a CPU check)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny settings: a smoke run of the whole table")
    ap.add_argument("--formats", default="nvfp4,int3-g128")
    ap.add_argument("--inits", default="gptq,rtn", help="calibrations to start from (the first also runs the sources)")
    ap.add_argument("--sources-format", default="int3-g128", help="format of the data-source comparison")
    ap.add_argument("--steps", type=int, default=0, help="override the training steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peak-7b", action="store_true", help="also measure a Qwen2.5-7B-shaped QAD step's peak memory")
    ap.add_argument("--peak-shape", default="7b", help="shape of the memory step (tiny: a CPU check)")
    ap.add_argument("--skip-table", action="store_true")
    ap.add_argument("--data", default="", help="a data_prep dataset built beforehand (--make-data writes one)")
    ap.add_argument("--make-data", default="", help="only build the dataset at this path and exit")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    s = settings(a.quick, a.device)
    if a.steps:
        s["steps"] = a.steps
    if a.make_data:  # data_prep needs great_expectations, which GPU images may lack: build it here, carry it there
        print(make_dataset(Path(a.make_data), s))
        return {}
    res: dict = {"model": a.model, "settings": s, "device": a.device, "date": time.strftime("%Y-%m-%d"), "host": platform.node(),
                 "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else None, "rows": []}
    t_all = time.time()
    if a.peak_7b:
        try:
            res["peak_7b"] = peak_memory_7b(a.device, a.peak_shape)
        except Exception as e:  # noqa: BLE001 - the table still runs
            import traceback

            traceback.print_exc()
            res["peak_7b"] = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(res["peak_7b"]), flush=True)
    if not a.skip_table:
        table(a, s, res)
    res["wall_s"] = time.time() - t_all
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2, default=str))
    print_table(res)
    return res


def table(a, s: dict, res: dict) -> None:
    from quarl.data import read_dataset
    from quarl.distill.data import generate_sequences, sft_sequences
    from quarl.distill.stage import heldout_accuracy
    from quarl.distill.student import finalize_student
    from quarl.distill.trainer import DistillTrainer
    from quarl.models import load_model

    root = Path(tempfile.mkdtemp(prefix="distill-table-"))
    dev = torch.device(a.device)
    data_uri = a.data or make_dataset(root, s)
    frames = read_dataset(data_uri)
    train_df, ev = frames["train"], frames["eval"]
    teacher, tok = load_model(a.model, dtype=torch.float32, device=a.device)
    teacher.eval().requires_grad_(False)
    cfg0 = distill_cfg(s, a.device, "forward_kl", "sft")
    held = sft_sequences(ev, tok, ["prompt", "solution"], s["seq_len"], s["heldout"])
    acc_p = ev["prompt"].astype(str).tolist()[:s["acc"]]
    acc_a = ev["answer"].astype(str).tolist()[:s["acc"]]
    t0 = time.time()
    res["teacher"] = {"accuracy": heldout_accuracy(teacher, tok, acc_p, acc_a, s["new_tokens"], batch_size=64)}
    print(f"teacher accuracy {res['teacher']['accuracy']:.3f} ({time.time() - t0:.1f}s)", flush=True)

    seqs = {"sft": sft_sequences(train_df, tok, ["prompt", "solution"], s["seq_len"], s["train_rows"])}
    prompts, answers = train_df["prompt"].astype(str).tolist(), train_df["answer"].astype(str).tolist()

    def sequences(source: str):
        if source not in seqs:
            t = time.time()
            dc = cfg0.data
            dc.source = source
            if source == "random":
                from quarl.distill.data import random_sequences

                seqs[source] = random_sequences(int(teacher.get_output_embeddings().weight.shape[0]),
                                                s["train_rows"], s["seq_len"], 0)
            elif source == "bos":
                dc.num_sequences, dc.seq_len = s["train_rows"], s["seq_len"]
                seqs[source] = generate_sequences(teacher, tok, dc, 0)
            else:
                dc.seq_len = s["seq_len"]
                seqs[source] = generate_sequences(teacher, tok, dc, 0, prompts, answers,
                                                  keep_correct=source == "teacher_correct")
            res.setdefault("generation", {})[source] = {**seqs[source].stats, "seconds": time.time() - t}
            print(f"generated {source}: {seqs[source].stats} ({time.time() - t:.1f}s)", flush=True)
        return seqs[source]

    def run(fmt: str, init: str, calib_uri: str, objective: str, source: str, ptq: bool = False) -> dict:
        t = time.time()
        if init == "rtn":  # RTN needs no calibration data: quantize in memory (no checkpoint round trip)
            from quarl.quant import quantize_model

            student, _ = load_model(a.model, dtype=torch.float32, device=a.device)
            quantize_model(student, FORMATS[fmt])
        else:
            student, _ = load_model(calib_uri, dtype=torch.float32, device=a.device)
        cfg = distill_cfg(s, a.device, objective, source)
        tr = DistillTrainer(cfg, student, teacher, tok, sequences(source), held, root / "work" /
                            f"{fmt}-{init}-{objective}-{source}")
        row = {"format": fmt, "init": init, "source": source}
        if ptq:  # the step-0 student: the calibrated model through QAT's re-quantization
            m = copy.deepcopy(tr.model)
            finalize_student(m)
            ev0 = tr.evaluate(m)
            res["rows"].append({**row, "method": "PTQ", "kl": ev0["kl"], "ce": ev0["ce"],
                                "accuracy": heldout_accuracy(m, tok, acc_p, acc_a, s["new_tokens"], batch_size=64)})
            del m
        summ = tr.train()
        finalize_student(tr.model)
        after = tr.evaluate(tr.model)
        out = {**row, "method": "QAD" if objective != "ce" else "QAT", "objective": objective, "kl": after["kl"],
               "ce": after["ce"], "accuracy": heldout_accuracy(tr.model, tok, acc_p, acc_a, s["new_tokens"], batch_size=64),
               "kl_step0": summ["eval_before"]["kl"], "train_sequences": len(tr.train_seqs),
               "seconds": time.time() - t}
        res["rows"].append(out)
        print(json.dumps(out), flush=True)
        if a.out:  # partial results survive a time limit
            Path(a.out).write_text(json.dumps(res, indent=2, default=str))
        del tr, student
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        return out

    for init in a.inits.split(","):  # most important first: a run cut by a time limit keeps them
        for fmt in a.formats.split(","):
            uri = None
            if init != "rtn":
                t = time.time()
                uri, q = calibrate(root, data_uri, fmt, init, s, a.device, a.model)
                res.setdefault("calibration", {})[f"{fmt}/{init}"] = {"kl": q.get("kl"), "seconds": time.time() - t}
            run(fmt, init, uri, "ce", "sft", ptq=True)
            run(fmt, init, uri, "forward_kl", "sft")
            if fmt == a.sources_format and init == a.inits.split(",")[0]:
                for source in SOURCES[1:]:
                    try:
                        run(fmt, init, uri, "forward_kl", source)
                    except ValueError as e:  # e.g. teacher_correct when the teacher solves nothing
                        res["rows"].append({"format": fmt, "init": init, "source": source, "method": "QAD",
                                            "error": str(e)})
                        print(f"{source}: {e}", flush=True)


def _cuda(device: str) -> bool:
    return device.startswith("cuda")


def peak_memory_7b(device: str, shape: str = "7b") -> dict:
    """One QAD step of a Qwen2.5-7B-shaped student (NVFP4 frozen base + LoRA r=32) against a BF16 teacher."""
    from benchmarks.grpo_step_gpu import build_model, qwen25_config
    from quarl.config import load_config
    from quarl.distill import DistillConfig
    from quarl.distill.data import Sequences
    from quarl.distill.trainer import DistillTrainer

    out = {}
    cfg_m = qwen25_config(shape)
    cuda = _cuda(device)
    for chunk in (512, 0):
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        teacher = build_model(cfg_m, device, torch.bfloat16)
        student = build_model(cfg_m, device, torch.bfloat16, quant_format="nvfp4")
        base = torch.cuda.memory_allocated() / 2**30 if cuda else float("nan")

        class Tok:
            pad_token_id = 0

        L = 2048 if cuda else 64
        g = torch.Generator().manual_seed(0)
        seqs = Sequences(ids=torch.randint(1, cfg_m.vocab_size, (2, L), generator=g).tolist(), prompt_len=[0, 0])
        cfg = load_config(DistillConfig, None, [
            "student.mode=lora", "student.dtype=bfloat16", "student.gradient_checkpointing=true", "teacher.dtype=bfloat16",
            f"loss.chunk={chunk}", "optim.batch_size=1", "optim.micro_batch_size=1", "train.steps=1",
            f"train.device={device}"])
        try:
            tr = DistillTrainer(cfg, student, teacher, Tok(), seqs, seqs, tempfile.mkdtemp())
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            t = time.time()
            m = tr.step(0)
            if cuda:
                torch.cuda.synchronize()
            out[f"chunk={chunk or 'none'}"] = {"peak_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                                               "weights_gb": base, "step_s": time.time() - t, "tokens": L,
                                               "kl": m["train/kl"]}
        except torch.OutOfMemoryError as e:
            out[f"chunk={chunk or 'none'}"] = {"oom": str(e)[:200], "weights_gb": base}
        finally:
            tr = teacher = student = None
            if cuda:
                torch.cuda.empty_cache()
    n_lin = sum(cfg_m.num_hidden_layers * x for x in [
        cfg_m.hidden_size * cfg_m.hidden_size * 2 + 2 * cfg_m.hidden_size * 512,  # q, o, k, v (GQA 4 x 128)
        3 * cfg_m.hidden_size * cfg_m.intermediate_size])
    out["full_qat_estimate_gb"] = {"linear_params_b": n_lin / 1e9,
                                   "fp32_latent+grad+adamw": 16 * n_lin / 2**30,
                                   "teacher_bf16": 2 * 7.6e9 / 2**30} if shape == "7b" else None
    return out


def print_table(res: dict) -> None:
    rows = res.get("rows", [])
    if not rows:
        return
    print("\n| format | init | method | data | KL(teacher‖student) | CE | accuracy |")
    print("|---|---|---|---|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['format']} | {r['init'].upper()} | {r['method']} | {r['source']} | {r['error'][:60]} | | |")
            continue
        print(f"| {r['format']} | {r['init'].upper()} | {r['method']} | {r['source']} | {r['kl']:.4f} | "
              f"{r['ce']:.4f} | {r['accuracy']:.3f} |")
    if "teacher" in res:
        print(f"\nteacher accuracy {res['teacher']['accuracy']:.3f}; wall {res.get('wall_s', math.nan):.0f}s")


if __name__ == "__main__":
    main()
