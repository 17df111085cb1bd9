"""PTQ vs QAT vs QAD on SmolLM2-135M-Instruct, from RTN and from GPTQ init, and QAD's data sources side by side.

    python benchmarks/distill_table.py --make-data .dev/distill-data               # the dataset (CPU host)
    python benchmarks/distill_table.py --device cuda --data .dev/distill-data --out OUT --budget 200
    python benchmarks/distill_table.py --device cpu --quick --model tiny-llama --data D --out OUT   # dry run
    python benchmarks/distill_table.py --render OUT/distill_table.json             # the RESULTS.md table
    python benchmarks/distill_table.py --device cuda --peak-7b --out OUT            # 7B-shaped QAD step memory

For each weight format (NVFP4; INT3 asymmetric) and init (RTN, GPTQ), with the full-precision
model as teacher:

    PTQ   the initial quantized model as is (RTN codes, or GPTQ's codes)
    QAT   full QAT (straight-through fake quant of latent weights) on cross-entropy of the labels
    QAD   full QAT on forward KL(teacher || student), T = 1, full vocabulary

each trained for the same steps on the same SFT text (the built-in generator's problems with
their worked solutions), then re-quantized into the format and measured on held-out text:
KL(teacher || student) and CE per token, and greedy accuracy on the built-in held-out problems
(quarl.rewards). Then QAD from the GPTQ INT3 init with each other data source of QAD Table 5:
teacher completions of the training prompts (all / only the correct ones), sequences the
teacher samples from BOS, random tokens.

How it fits one GPU call. The table is a set of jobs, each a process of its own (a 135M model
leaves an H100 mostly idle; a process is bound by its own kernel launches), started as slots
(--parallel) free up and as their inputs appear:

    gptq-int3, gptq-nvfp4   GPTQ in process (no checkpoint): Hessians on the device, the column
                            loop on the host (--gptq-device; per column it is a few dozen tiny
                            kernels), q/k/v and gate/up sharing one loop; then PTQ, QAT, QAD.
                            gptq-int3 also saves its student for the source jobs
    rtn-int3, rtn-nvfp4     RTN in memory; PTQ, QAT, QAD
    gen                     teacher accuracy; teacher / teacher_correct / bos sequences
    src-<source>            QAD from the saved GPTQ INT3 student on one source

Every finished row is appended to OUT/rows-<job>.jsonl at once; at --budget seconds the
remaining jobs are stopped (a row in progress is lost, the finished ones stay) and
OUT/distill_table.json gathers what exists. --render turns it into the markdown table with
the seeds' claims checked against the rows.

SmolLM2's hidden size 576 is not a multiple of 128, so calibrate refuses int3-g128 on
the q/k/v/o/gate/up inputs; the INT3 recipe here is g128 where the input width allows
(down_proj, 1536) and g64 on the 576-wide inputs (the same bits, a finer grid there).

Everything is seeded; the numbers are one run each (no error bars): small differences
(a few percent of KL) are within what another seed would move.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import platform
import signal
import subprocess
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
SRC_FORMAT, SRC_INIT = "int3-g128", "gptq"  # the student of the data-source comparison
COLUMNS = ["prompt", "solution"]


def settings(quick: bool) -> dict:
    if quick:
        return {"train_rows": 16, "heldout": 4, "seq_len": 48, "steps": 2, "batch": 4, "micro": 4, "acc": 2,
                "new_tokens": 8, "gen_new": 8, "calib": (4, 32), "lr": 1e-4}
    return {"train_rows": 256, "heldout": 64, "seq_len": 192, "steps": 50, "batch": 16, "micro": 16, "acc": 64,
            "new_tokens": 64, "gen_new": 128, "calib": (16, 256), "lr": 1e-4}


# ----------------------------------------------------------------------------------------- jobs
def job_list() -> list[dict]:
    """name, the files it needs before it starts, what it runs. Longest chains first."""
    student = f"student-{SRC_INIT}-{SRC_FORMAT}.pt"
    jobs = [{"name": f"{i}-{f.split('-')[0]}", "init": i, "format": f, "needs": []}
            for i in ("gptq", "rtn") for f in ("int3-g128", "nvfp4")]
    jobs.insert(2, {"name": "gen", "needs": []})
    for s in SOURCES[1:]:
        jobs.append({"name": f"src-{s}", "source": s, "needs": [student] + ([] if s == "random" else [f"seqs-{s}.pt"])})
    jobs.append({"name": "cal-int3", "needs": [student]})  # last: QAD keeping GPTQ's grid, an extra row
    return jobs


def make_dataset(out: Path, s: dict) -> str:
    from quarl.config import load_config
    from quarl.data import DataPrepConfig, run_data_prep

    n = s["train_rows"] + max(s["heldout"], s["acc"]) + 64
    cfg = load_config(DataPrepConfig, None, [
        f"sources=[{{name: synthetic, num_samples: {n}, max_difficulty: 2}}]", "template=chat", "tokenizer=default",
        f"split.eval_size={max(s['heldout'], s['acc'])}", f"split.max_train_samples={s['train_rows']}",
        "validation.min_train_rows=4"])
    run_data_prep(cfg, output_uri=str(out))
    return str(out)


def distill_cfg(s: dict, device: str, objective: str, source: str, scales: str = "recompute", lr: float = 0.0):
    from quarl.config import load_config
    from quarl.distill import DistillConfig

    return load_config(DistillConfig, None, [f"student.scales={scales}", f"optim.lr={lr or s['lr']}",
        f"loss.objective={objective}", f"data.source={source}", f"data.seq_len={s['seq_len']}",
        f"data.max_new_tokens={s['gen_new']}", "data.gen_batch_size=128", f"data.num_sequences={s['train_rows']}",
        f"optim.batch_size={s['batch']}", f"optim.micro_batch_size={s['micro']}",
        "optim.warmup_ratio=0.05", f"eval.num_sequences={s['heldout']}", f"eval.seq_len={s['seq_len']}",
        "eval.every=0", f"train.steps={s['steps']}", "train.checkpoint_every=0", "train.resume=false",
        f"train.device={device}", "student.dtype=float32", "loss.chunk=1024"])


def cache_weights(model) -> None:
    """A frozen quantized model dequantizes each layer once, not in every forward (it never changes)."""
    from quarl.quant import QuantLinear

    for m in model.modules():
        if isinstance(m, QuantLinear) and m.mode == "frozen":
            m.cache_dequantized = True


class Worker:
    """One job's process: the teacher, the held-out text and the row runner."""

    def __init__(self, a, s: dict, job: dict):
        from quarl.data import read_dataset
        from quarl.distill.data import sft_sequences
        from quarl.models import load_model

        self.a, self.s, self.job = a, s, job
        self.out, self.work = Path(a.out), Path(a.out) / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.rows_file = self.out / f"rows-{job['name']}.jsonl"
        self.deadline = a.deadline or math.inf
        self.teacher, self.tok = load_model(a.model, dtype=torch.float32, device=a.device)
        self.teacher.eval().requires_grad_(False)
        frames = read_dataset(a.data)
        self.train_df, ev = frames["train"], frames["eval"]
        self.held = sft_sequences(ev, self.tok, COLUMNS, s["seq_len"], s["heldout"])
        self.acc_p = ev["prompt"].astype(str).tolist()[:s["acc"]]
        self.acc_a = ev["answer"].astype(str).tolist()[:s["acc"]]
        self.last_row_s = 0.0

    def emit(self, row: dict) -> None:
        row = {"job": self.job["name"], **row}
        with open(self.rows_file, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(json.dumps(row, default=str), flush=True)

    def accuracy(self, model) -> float:
        from quarl.distill.stage import heldout_accuracy

        return heldout_accuracy(model, self.tok, self.acc_p, self.acc_a, self.s["new_tokens"], batch_size=64)

    # ------------------------------------------------------------------- students
    def rtn(self, fmt: str):
        from quarl.models import load_model
        from quarl.quant import quantize_model

        m, _ = load_model(self.a.model, dtype=torch.float32, device=self.a.device)
        quantize_model(m, FORMATS[fmt])
        return m.eval()

    def gptq(self, fmt: str) -> tuple:
        """GPTQ in this process (the calibrate stage's algorithm and defaults, no checkpoint written)."""
        from quarl.calibrate.config import GPTQConfig
        from quarl.calibrate.data import batches, make_windows, read_artifact_split, shuffled
        from quarl.calibrate.sequential import calibrate_model
        from quarl.models import load_model
        from quarl.quant import QuantRecipe
        from quarl.quant.model import plan_formats

        t = time.time()
        m, _ = load_model(self.a.model, dtype=torch.float32, device=self.a.device)
        m.eval()
        n, L = self.s["calib"]
        docs = shuffled(read_artifact_split(self.a.data, "train", COLUMNS), 0)
        win = make_windows(docs, self.tok, n, L).to(self.a.device)
        gcfg = {**GPTQConfig().__dict__, "device": self.a.gptq_device or None}
        res = calibrate_model(m, plan_formats(m, QuantRecipe.load(FORMATS[fmt])), batches(win, 4), method="gptq",
                              gptq=gcfg, progress=False)
        errs = [x.rel_error for x in res.layers if x.method != "none"]
        info = {"seconds": time.time() - t, "calibrate_s": res.seconds, "loop_s": sum(x.seconds for x in res.layers),
                "windows": list(win.shape), "rel_error_mean": sum(errs) / len(errs), "gptq_device": gcfg["device"]}
        return m, info

    # ------------------------------------------------------------------- rows
    def ptq_row(self, base, fmt: str, init: str, extra: dict) -> None:
        from quarl.distill.trainer import DistillTrainer

        t = time.time()
        tr = DistillTrainer(distill_cfg(self.s, self.a.device, "forward_kl", "sft"), copy.deepcopy(base),
                            self.teacher, self.tok, self.held, self.held, self.work / f"ptq-{fmt}-{init}")
        cache_weights(base)
        ev = tr.evaluate(base)  # the quantized model as calibrated: its own codes
        self.emit({"format": fmt, "init": init, "source": "-", "method": "PTQ", "kl": ev["kl"], "ce": ev["ce"],
                   "accuracy": self.accuracy(base), "teacher_ce": tr.teacher_ce, "seconds": time.time() - t,
                   **extra})

    def train_row(self, base, fmt: str, init: str, objective: str, source: str, seqs, scales: str = "recompute",
                  lr: float = 0.0) -> None:
        from quarl.distill.student import finalize_student
        from quarl.distill.trainer import DistillTrainer

        row = {"format": fmt, "init": init, "source": source, "method": "QAD" if objective != "ce" else "QAT",
               "objective": objective, "scales": scales, "lr": lr or self.s["lr"]}
        left = self.deadline - time.time()
        if left < self.last_row_s:
            self.emit({**row, "error": f"skipped: {left:.0f}s left before the deadline, a row takes "
                                       f"~{self.last_row_s:.0f}s"})
            return
        t = time.time()
        cfg = distill_cfg(self.s, self.a.device, objective, source, scales, lr)
        tr = summ = None
        try:
            tr = DistillTrainer(cfg, copy.deepcopy(base), self.teacher, self.tok, seqs, self.held,
                                self.work / f"{fmt}-{init}-{objective}-{source}-{scales}")
            tr._save = lambda done: None  # a row never resumes: no 1.3 GB final checkpoint per row
            summ = tr.train()
        except torch.OutOfMemoryError:  # processes share the GPU: the same step in two micro-batches
            pass  # (retried below, once this frame's traceback no longer holds the tensors)
        if summ is None:
            tr = None
            gc.collect()
            torch.cuda.empty_cache()
            cfg.optim.micro_batch_size = max(1, cfg.optim.micro_batch_size // 2)
            row["micro_batch"] = cfg.optim.micro_batch_size
            print(f"out of memory: retrying {row} with micro-batch {cfg.optim.micro_batch_size}", flush=True)
            tr = DistillTrainer(cfg, copy.deepcopy(base), self.teacher, self.tok, seqs, self.held,
                                self.work / f"{fmt}-{init}-{objective}-{source}-{scales}-mb")
            tr._save = lambda done: None
            summ = tr.train()
        finalize_student(tr.model)
        cache_weights(tr.model)
        after = tr.evaluate(tr.model)
        acc = self.accuracy(tr.model)
        self.last_row_s = time.time() - t
        self.emit({**row, "kl": after["kl"], "ce": after["ce"], "accuracy": acc, "kl_step0": summ["eval_before"]["kl"],
                   "train_sequences": len(seqs), "seconds": self.last_row_s, "train_s": summ["timing"]["train_s"],
                   "step_s": summ["timing"]["train_s"] / max(summ["total_steps"], 1)})
        del tr
        if self.a.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def sft(self):
        from quarl.distill.data import sft_sequences

        return sft_sequences(self.train_df, self.tok, COLUMNS, self.s["seq_len"], self.s["train_rows"])

    # ------------------------------------------------------------------- jobs
    def run(self) -> None:
        j = self.job
        if j["name"] == "gen":
            return self.generate()
        if j["name"].startswith("src-"):
            return self.source(j["source"])
        if j["name"] == "cal-int3":  # QAD keeping GPTQ's grid (student.scales=calibrated) at its own lr
            return self.train_row(self.saved_student(), SRC_FORMAT, SRC_INIT, "forward_kl", "sft", self.sft(),
                                  "calibrated", self.a.cal_lr)
        fmt, init = j["format"], j["init"]
        extra = {}
        if init == "gptq":
            base, info = self.gptq(fmt)
            extra = {"calibration": info}
            print(f"gptq {fmt}: {json.dumps(info)}", flush=True)
            if fmt == SRC_FORMAT:  # the data-source jobs start from this student
                path = self.work / f"student-{init}-{fmt}.pt"
                torch.save(base.state_dict(), str(path) + ".tmp")
                os.replace(str(path) + ".tmp", path)
        else:
            base = self.rtn(fmt)
        self.ptq_row(base, fmt, init, extra)
        sft = self.sft()
        self.train_row(base, fmt, init, "forward_kl", "sft", sft)  # QAD first: the method under test
        self.train_row(base, fmt, init, "ce", "sft", sft)

    def generate(self) -> None:
        from quarl.distill.data import generate_sequences

        t = time.time()
        self.emit({"method": "teacher", "accuracy": self.accuracy(self.teacher), "seconds": time.time() - t})
        cfg = distill_cfg(self.s, self.a.device, "forward_kl", "teacher").data
        prompts = self.train_df["prompt"].astype(str).tolist()[:self.s["train_rows"]]
        answers = self.train_df["answer"].astype(str).tolist()[:self.s["train_rows"]]
        for source in ("teacher", "teacher_correct", "bos"):
            t = time.time()
            try:
                if source == "bos":
                    seqs = generate_sequences(self.teacher, self.tok, cfg, 0)
                else:
                    seqs = generate_sequences(self.teacher, self.tok, cfg, 0, prompts, answers,
                                              keep_correct=source == "teacher_correct")
            except ValueError as e:  # teacher_correct when the teacher solves nothing
                self.emit({"method": "generate", "source": source, "error": str(e), "seconds": time.time() - t})
                continue
            path = self.work / f"seqs-{source}.pt"
            torch.save({"ids": seqs.ids, "prompt_len": seqs.prompt_len, "source": seqs.source}, str(path) + ".tmp")
            os.replace(str(path) + ".tmp", path)
            self.emit({"method": "generate", "source": source, **seqs.stats, "seconds": time.time() - t})

    def saved_student(self):
        base = self.rtn(SRC_FORMAT)  # the structure; the GPTQ codes are loaded into it
        base.load_state_dict(torch.load(self.work / f"student-{SRC_INIT}-{SRC_FORMAT}.pt", map_location=self.a.device))
        return base

    def source(self, source: str) -> None:
        from quarl.distill.data import Sequences, random_sequences

        base = self.saved_student()
        if source == "random":
            seqs = random_sequences(int(self.teacher.get_output_embeddings().weight.shape[0]), self.s["train_rows"],
                                    self.s["seq_len"], 0)
        else:
            d = torch.load(self.work / f"seqs-{source}.pt")
            seqs = Sequences(ids=d["ids"], prompt_len=d["prompt_len"], source=d["source"])
        self.train_row(base, SRC_FORMAT, SRC_INIT, "forward_kl", source, seqs)


# ----------------------------------------------------------------------------------------- orchestration
def orchestrate(a, s: dict) -> dict:
    """Run the jobs as processes, --parallel at a time, each once its input files exist; stop at --budget."""
    out = Path(a.out)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    deadline = t0 + a.budget
    jobs = [j for j in job_list() if not a.jobs or j["name"] in a.jobs.split(",")]
    pending, running, done = list(jobs), {}, {}
    # QUARL_KERNELS=reference: a frozen model is measured with the same F.linear as the QAT forward (a fused
    # low-bit kernel would compute in another precision and blur PTQ vs QAT/QAD)
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "PYTHONUNBUFFERED": "1", "QUARL_KERNELS": "reference",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "kernels"), os.environ.get("PYTHONPATH", "")])}
    base = [sys.executable, str(Path(__file__).resolve()), "--device", a.device, "--data", a.data, "--out", a.out,
            "--model", a.model, "--threads", str(a.threads), "--deadline", str(deadline),
            "--gptq-device", a.gptq_device, "--cal-lr", str(a.cal_lr)] + (["--quick"] if a.quick else [])
    while (pending or running) and time.time() < deadline:
        for name, (p, f, ts) in list(running.items()):
            if p.poll() is not None:
                f.close()
                done[name] = {"rc": p.returncode, "seconds": round(time.time() - ts, 1),
                              "ended_s": round(time.time() - t0, 1)}
                print(f"[{time.time() - t0:6.1f}s] {name} rc={p.returncode} in {done[name]['seconds']}s", flush=True)
                del running[name]
        for j in list(pending):
            if len(running) >= a.parallel:
                break
            if all((work / n).exists() for n in j["needs"]):
                f = open(out / f"log-{j['name']}.txt", "w")  # noqa: SIM115 - closed when the job ends
                p = subprocess.Popen([*base, "--job", j["name"]], stdout=f, stderr=subprocess.STDOUT, env=env,
                                     cwd=str(ROOT), start_new_session=True)
                running[j["name"]] = (p, f, time.time())
                pending.remove(j)
                print(f"[{time.time() - t0:6.1f}s] start {j['name']}", flush=True)
            elif not running and not any(all((work / n).exists() for n in k["needs"]) for k in pending):
                for k in pending:  # nothing runs and nothing can start: the inputs will never come
                    done[k["name"]] = {"rc": None, "error": f"inputs never appeared: {k['needs']}"}
                pending.clear()
                break
        time.sleep(0.5)
    for name, (p, f, ts) in running.items():  # the budget is spent
        os.killpg(p.pid, signal.SIGTERM)
        done[name] = {"rc": "killed at the deadline", "seconds": round(time.time() - ts, 1)}
    for name, (p, f, _) in running.items():
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
        f.close()
    for j in pending:
        done[j["name"]] = {"rc": None, "error": "not started before the deadline"}
    return {"jobs": done, "wall_s": time.time() - t0}


def collect(out: Path) -> dict:
    rows = []
    for f in sorted(out.glob("rows-*.jsonl")):
        rows += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    return {"rows": rows}


# ----------------------------------------------------------------------------------------- rendering
def _g(r: dict, key: str, fmt: str = "g") -> str:
    """A row's number formatted, or '?' (rows from older runs lack some fields)."""
    v = r.get(key)
    return "?" if v is None else format(v, fmt)


def _find(rows, scales: str = "recompute", **kw):
    return next((r for r in rows if all(r.get(k) == v for k, v in kw.items()) and "error" not in r
                 and r.get("scales", "recompute") in (scales, None)), None)


def render(res: dict) -> str:
    """The RESULTS.md table and the seeds' claims, checked against the rows (whichever way they go)."""
    rows = [{**r, "source": "-"} if r.get("method") == "PTQ" else r for r in res["rows"]]
    fmt_name = {"nvfp4": "NVFP4", "int3-g128": "INT3 (g128/g64)"}
    src_name = {"sft": "sft text", "teacher": "teacher completions (all)",
                "teacher_correct": "teacher completions (correct only)", "bos": "BOS-sampled", "random": "random tokens"}
    out = ["| format | init | method | training data | KL(teacher ‖ student) | CE | accuracy | KL at step 0 |",
           "|---|---|---|---|---:|---:|---:|---:|"]
    order = {"PTQ": 0, "QAT": 1, "QAD": 2}
    table = [r for r in rows if r.get("method") in order]
    table.sort(key=lambda r: (list(fmt_name).index(r["format"]), r["init"] != "rtn", order[r["method"]],
                              SOURCES.index(r["source"]) if r["source"] in SOURCES else -1,
                              r.get("scales") == "calibrated"))
    for r in table:
        name = "QAT (CE on labels)" if r["method"] == "QAT" else "QAD (forward KL)" if r["method"] == "QAD" else "PTQ"
        if r.get("scales") == "calibrated":
            name = name[:-1] + f", GPTQ's grid kept, lr {_g(r, 'lr')})"
        src = src_name.get(r["source"], "-")
        if r["source"] not in ("-", "sft") and r.get("train_sequences") is not None:
            src += f" ({r['train_sequences']})"
        if "error" in r:
            out.append(f"| {fmt_name[r['format']]} | {r['init'].upper()} | {name} | {src} | {r['error'][:70]} | | | |")
            continue
        k0 = f"{r['kl_step0']:.3f}" if r.get("kl_step0") is not None else "-"
        out.append(f"| {fmt_name[r['format']]} | {r['init'].upper()} | {name} | {src} | {r['kl']:.3f} | "
                   f"{r['ce']:.3f} | {r['accuracy']:.3f} | {k0} |")
    teacher = _find(rows, method="teacher")
    notes = []
    if teacher:
        tce = next((r["teacher_ce"] for r in table if r.get("teacher_ce") is not None), None)
        notes.append(f"Teacher: held-out accuracy {teacher['accuracy']:.3f}"
                     + (f", CE {tce:.3f}" if tce is not None else "") + ".")
    gens = [r for r in rows if r.get("method") == "generate"]
    if gens:
        notes.append("Generated sets: " + "; ".join(
            f"{g['source']} {g.get('kept', '?')} of {g.get('generated', '?')} kept" +
            (f" (teacher accuracy {g['teacher_accuracy']:.3f})" if "teacher_accuracy" in g else "") +
            f", {g['seconds']:.0f} s" if "error" not in g else f"{g['source']}: {g['error'][:80]}" for g in gens) + ".")
    claims = ["", "Claims (one seed each; held-out KL):", ""]
    for fmt, fname in fmt_name.items():
        for init in ("rtn", "gptq"):
            p, q, d = (_find(rows, format=fmt, init=init, method=m, source=src)
                       for m, src in (("PTQ", "-"), ("QAT", "sft"), ("QAD", "sft")))
            if p and q and d:
                ok = d["kl"] < q["kl"] < p["kl"]
                claims.append(f"- {fname} {init.upper()}: KL(QAD) {d['kl']:.3f} < KL(QAT) {q['kl']:.3f} < "
                              f"KL(PTQ) {p['kl']:.3f}: **{'holds' if ok else 'does not hold'}**")
            else:
                claims.append(f"- {fname} {init.upper()}: KL(QAD) < KL(QAT) < KL(PTQ): not measured "
                              f"(missing rows)")
    sft = _find(rows, format=SRC_FORMAT, init=SRC_INIT, method="QAD", source="sft")
    for src in SOURCES[1:]:
        r = _find(rows, format=SRC_FORMAT, init=SRC_INIT, method="QAD", source=src)
        if sft and r:
            rel = r["kl"] / sft["kl"] - 1
            claims.append(f"- QAD on {src_name[src]} vs sft text ({fmt_name[SRC_FORMAT]}, {SRC_INIT.upper()}): KL "
                          f"{r['kl']:.3f} vs {sft['kl']:.3f} ({rel:+.0%})")
        else:
            claims.append(f"- QAD on {src_name[src]}: not measured")
    cal = _find(rows, scales="calibrated", format=SRC_FORMAT, init=SRC_INIT, method="QAD", source="sft")
    if cal and sft:
        claims.append(f"- QAD from GPTQ {fmt_name[SRC_FORMAT]} keeping GPTQ's grid (lr {_g(cal, 'lr')}) vs "
                      f"recomputing the scales (lr {_g(sft, 'lr')}): KL {cal['kl']:.3f} vs {sft['kl']:.3f}; at "
                      f"step 0 {_g(cal, 'kl_step0', '.3f')} vs {_g(sft, 'kl_step0', '.3f')}")
    for fmt, fname in fmt_name.items():
        for m, src in (("PTQ", "-"), ("QAT", "sft"), ("QAD", "sft")):
            a, b = _find(rows, format=fmt, init="gptq", method=m, source=src), _find(rows, format=fmt, init="rtn",
                                                                                    method=m, source=src)
            if a and b:
                claims.append(f"- GPTQ vs RTN init, {fname} {m}: KL {a['kl']:.3f} vs {b['kl']:.3f}: GPTQ "
                              f"**{'better' if a['kl'] < b['kl'] else 'not better'}**")
    cal = [(r["format"], r["calibration"]) for r in rows if r.get("method") == "PTQ" and r.get("calibration")]
    if cal:
        notes.append("GPTQ: " + "; ".join(f"{fmt_name[f]} {c['seconds']:.0f} s ({c['loop_s']:.0f} s column loop on "
                                          f"{c['gptq_device'] or 'the GPU'}), {c['windows'][0]} x {c['windows'][1]} "
                                          f"tokens, mean rel. error {c['rel_error_mean']:.4f}" for f, c in cal) + ".")
    steps = [r["step_s"] for r in rows if r.get("step_s")]
    if steps:
        notes.append(f"Training step {min(steps):.2f}-{max(steps):.2f} s (jobs sharing the device).")
    meta = res.get("meta", {})
    if meta:
        jobs = meta.get("jobs", {})
        notes.append(f"Wall {meta.get('wall_s', math.nan):.0f} s for {len(jobs)} jobs, {meta.get('parallel')} at a "
                     f"time, on {meta.get('gpu') or meta.get('device')}.")
        bad = {k: v for k, v in jobs.items() if v.get("rc") != 0}
        if bad:
            why = {k: v.get("error") or f"rc {v.get('rc')}" for k, v in bad.items()}
            notes.append("Jobs that did not finish: " + "; ".join(f"{k} ({w})" for k, w in why.items()) + ".")
    return "\n".join(out + [""] + notes + claims) + "\n"


# ----------------------------------------------------------------------------------------- 7B memory
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


# ----------------------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default", help="teacher / model to quantize (tiny-llama: a CPU dry run)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny settings: a dry run of every job")
    ap.add_argument("--data", default="", help="a data_prep dataset built beforehand (--make-data writes one)")
    ap.add_argument("--make-data", default="", help="only build the dataset at this path and exit")
    ap.add_argument("--out", default="", help="results directory (rows, logs, distill_table.json)")
    ap.add_argument("--budget", type=float, default=200, help="seconds; then unfinished jobs are stopped")
    ap.add_argument("--parallel", type=int, default=6, help="jobs running at once (one process each)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per job")
    ap.add_argument("--jobs", default="", help="only these jobs (comma list; see job_list)")
    ap.add_argument("--gptq-device", default="cpu", help="where GPTQ's column loop runs ('' = the model's device)")
    ap.add_argument("--cal-lr", type=float, default=1e-3, help="lr of the cal-int3 row (student.scales=calibrated)")
    ap.add_argument("--render", default="", help="print the markdown table of this distill_table.json (or dir)")
    ap.add_argument("--peak-7b", action="store_true", help="only measure a Qwen2.5-7B-shaped QAD step's memory")
    ap.add_argument("--peak-shape", default="7b", help="shape of the memory step (tiny: a CPU check)")
    ap.add_argument("--job", default="", help=argparse.SUPPRESS)  # worker mode (the orchestrator's processes)
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    s = settings(a.quick)
    if a.render:
        p = Path(a.render)
        res = json.loads((p / "distill_table.json" if p.is_dir() else p).read_text()) if (
            p.is_file() or (p / "distill_table.json").exists()) else collect(p)
        print(render(res), end="")
        return res
    if a.make_data:  # data_prep needs great_expectations, which GPU images may lack: build it here, carry it there
        print(make_dataset(Path(a.make_data), s))
        return {}
    torch.set_num_threads(a.threads)
    if a.peak_7b:
        res = {"peak_7b": peak_memory_7b(a.device, a.peak_shape)}
        print(json.dumps(res), flush=True)
        if a.out:
            Path(a.out).mkdir(parents=True, exist_ok=True)
            (Path(a.out) / "peak_7b.json").write_text(json.dumps(res, indent=2))
        return res
    if not a.data or not Path(a.data).is_dir():
        ap.error(f"--data {a.data!r} is not a directory: build the dataset on a host with great_expectations first "
                 f"(python benchmarks/distill_table.py --make-data .dev/distill-data{' --quick' if a.quick else ''})")
    if not a.out:
        ap.error("--out is required (the results directory)")
    if a.job:  # a worker process
        job = next(j for j in job_list() if j["name"] == a.job)
        Worker(a, s, job).run()
        return {}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = a.device.startswith("cuda")
    meta = {"model": a.model, "settings": s, "device": a.device, "date": time.strftime("%Y-%m-%d"),
            "host": platform.node(), "gpu": torch.cuda.get_device_name() if cuda else None,
            "torch": torch.__version__, "parallel": a.parallel, "threads": a.threads, "budget_s": a.budget,
            "gptq_device": a.gptq_device, "cpus": os.cpu_count()}
    meta.update(orchestrate(a, s))
    res = {"meta": meta, **collect(out)}
    (out / "distill_table.json").write_text(json.dumps(res, indent=2, default=str))
    print(render(res), end="")
    return res


if __name__ == "__main__":
    main()
