"""GPU benchmark of the rollout engine: tokens/s on Qwen2.5-7B / 14B shapes, BF16 vs NVFP4 vs MXFP4.

    PYTHONPATH=$PWD:$PWD/kernels python benchmarks/rollout.py [--models 7b,14b] [--batches 1,8,64]
        [--prompt 256] [--new-tokens 2048] [--variants bf16,nvfp4,mxfp4,nvfp4+lora] [--hf-new-tokens 256]
        [--budget-s 540] [--out DIR]
    python benchmarks/rollout.py --report DIR/rollout.json      # markdown table from a finished run

What is measured, per (model, variant, batch):

* the model is built on the GPU with random weights (meta-device init, then
  ``normal_(0, 0.02)`` on the device, norms 1; nothing is allocated on the
  CPU), and quantized in place with ``quarl.quant.quantize_model`` for the
  4-bit variants -- the same QuantLinear modules the trainer uses, with the
  Triton weight-only kernels from ``quarl_kernels`` when they are importable
  (the JSON records which kernel the dispatcher picked, or "reference");
  ``nvfp4+lora`` adds QeRL's rank-32 adapter (computed every step);
* ``FastGenerator`` (CUDA graphs pre-captured with ``warmup``) samples
  ``new_tokens`` tokens per row at temperature 1, top-p 1 (``--temperature`` / ``--top-p``: the eval
  recipes' 0.6 / 0.95, where the sampler sorts), with no stop token,
  from random prompts of ``prompt`` tokens; reported are the prefill time
  (a ``max_new_tokens=1`` call, the fastest of ``PREFILL_CALLS``; one call until session 40), **decode tokens/s** = rows x (new - 1) /
  (total - prefill) and end-to-end tokens/s including the prefill;
* HF ``generate`` (BF16, dynamic cache, SDPA, sampling with top-k off) is the
  floor, over ``hf_new_tokens`` tokens (sized to its budget share like the
  engine cells) -- fewer than the engine's, which
  flatters HF slightly (shorter attention), since its tokens/s is flat in the
  length otherwise;
* checks on the GPU, 7B only: engine greedy vs HF greedy (BF16, batch 8,
  32 tokens) token agreement, and rollout log-probs vs the trainer's full
  forward on the same rollout (``|delta logprob|`` mean / max, BF16 and
  NVFP4+LoRA), the rollout/trainer mismatch that RL cares about.

Device time is scarce, so ``--budget-s`` bounds the whole run: each cell gets
its share of what is left and lowers its ``new_tokens`` to fit (never below
64; the JSON and table say which N each cell ran, and an engine cell cut short says so in its note: its steps
average a shorter context, so they are faster than a full run's), and cells that cannot fit
are recorded as skipped. Results are written to ``DIR/rollout.json`` after
every cell, so a run cut short keeps what it finished.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

COMMON = {
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "use_sliding_window": False,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
MODELS = {
    "7b": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
    },
    "8b": {  # Qwen3-8B's shape (without its q/k norms): issue 15's FP8 rollout case
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    "14b": {
        "hidden_size": 5120,
        "intermediate_size": 13824,
        "num_hidden_layers": 48,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
    },
}
RECIPES = {
    "bf16": None,
    "nvfp4": {"default": "nvfp4"},
    "mxfp4": {"default": "mxfp4"},
    "nvfp4+lora": {"default": "nvfp4", "lora": {"r": 32, "alpha": 64.0}},
    "bf16+lora": {"default": "bf16", "lora": {"r": 32, "alpha": 64.0}},  # QeRL's baseline: BF16 base + LoRA
    "fp8": {"default": "fp8-block", "act_quant": "fp8-1x128"},  # Jet-RL's rollout: the training forward's FP8 flow
}
# "tiny": a smoke-test shape (``--models tiny --device cpu`` checks the script in seconds on a CPU)
MODELS["tiny"] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
}
PAD = 0
MIN_NEW_TOKENS = 64
DEVICE = "cuda"


def qwen25_config(name: str):
    from transformers import Qwen2Config

    return Qwen2Config(**{**COMMON, **MODELS[name]})


@torch.no_grad()
def build_model(cfg, seed: int = 0):
    """Random BF16 model on the GPU: meta init, ``to_empty`` on CUDA, random fill on the device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.to_empty(device=DEVICE)
    g = torch.Generator(DEVICE).manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 1 and not name.endswith("bias"):
            p.fill_(1.0)  # RMSNorm weights
        else:
            p.normal_(0.0, 0.02, generator=g)
    rotary = model.model.rotary_emb  # its buffers were emptied by to_empty: rebuild on the device
    with torch.device(DEVICE):
        model.model.rotary_emb = type(rotary)(config=cfg)
    for name, b in model.named_buffers():
        if b.is_floating_point() and not torch.isfinite(b).all():
            raise RuntimeError(f"buffer {name} is not initialised after to_empty; add it to build_model")
    return model.eval().requires_grad_(False)


def for_each_variant(models: list[str], variants: list[str], fn) -> None:
    """``fn(model name, variant, model)`` for each pair: the model built on the device with random weights
    (:func:`build_model`) and quantized by the variant's recipe, freed before the next is built."""
    from quarl.quant import quantize_model

    for mname in models:
        for variant in variants:
            t = time.perf_counter()
            model = build_model(qwen25_config(mname))
            if RECIPES[variant] is not None:
                quantize_model(model, RECIPES[variant])
            print(f"== {mname} {variant} built in {time.perf_counter() - t:.1f} s", flush=True)
            fn(mname, variant, model)
            del model
            gc.collect()
            if DEVICE == "cuda":
                torch.cuda.empty_cache()


def add_variant_args(ap, out: str) -> None:
    """The arguments every per-variant rollout benchmark takes (``rollout_compaction.py``,
    ``rollout_prefill_share.py``)."""
    ap.add_argument("--models", default="7b")
    ap.add_argument("--variants", default="nvfp4+lora,bf16+lora")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=out)


def run_variants(a, stem: str, cells, render) -> dict:
    """Those benchmarks' main loop: for each of ``a.models`` x ``a.variants`` (:func:`for_each_variant`), the cells
    ``cells(model)`` yields, each saved to ``OUT/<stem>.json`` as it comes; ``render(results)`` to ``<stem>.md``."""
    global DEVICE
    DEVICE = a.device
    res = {"env": environment(), "args": vars(a), "date": datetime.datetime.now(datetime.UTC).isoformat(),
           "cells": []}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    def one(mname, variant, model):
        for cell in cells(model):
            res["cells"].append({"model": mname, "variant": variant, **cell})
            (out / f"{stem}.json").write_text(json.dumps(res, indent=1, default=str))

    for_each_variant(a.models.split(","), a.variants.split(","), one)
    md = render(res)
    (out / f"{stem}.md").write_text(md)
    print(md)
    return res


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _mem(fn: str) -> float:
    return getattr(torch.cuda, fn)() / 2**30 if DEVICE == "cuda" else 0.0


def _sync_time(fn):
    _sync()
    t = time.perf_counter()
    out = fn()
    _sync()
    return out, time.perf_counter() - t


def fastest_s(fn, calls: int) -> float:
    """Seconds of the fastest of ``calls`` timed calls of ``fn`` (a slow call -- an allocator stall, a swing of the
    14B prefill -- only ever adds time)."""
    return min(_sync_time(fn)[1] for _ in range(calls))


def _prompts(batch: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (batch, length), generator=g).tolist()


class Budget:
    def __init__(self, seconds: float):
        self.deadline = time.perf_counter() + seconds

    def left(self) -> float:
        return self.deadline - time.perf_counter()


PREFILL_CALLS = 3  # one-token generate calls timed for the prefill the step's time is taken net of (the fastest)


def engine_cell(model, batch: int, prompt: int, new_tokens: int, share_s: float, temperature: float = 1.0,
                top_p: float = 1.0) -> dict:
    from quarl.engine import FastGenerator
    from quarl.engine.rollout import SamplingParams

    rows = _prompts(batch, prompt, model.config.vocab_size)
    eng = FastGenerator(model, PAD, kv_block=256, sync_every=64)
    gen = torch.Generator(DEVICE).manual_seed(0)

    def params(n):
        return SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=n, stop_token_ids=[])

    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    graphs, capture_s = _sync_time(lambda: eng.warmup(batch, prompt, new_tokens))
    eng.generate(rows, params(1), 1, gen)  # first prefill of this shape (kernel compiles, allocator)
    # the fastest of PREFILL_CALLS: one call swung by up to 0.15 s at 14B batch 1 (session 40: 0.21-0.36 s), which
    # over 2047 tokens moves the step by up to 0.07 ms; a slow prefill inside the timed call still counts against it
    prefill_s = fastest_s(lambda: eng.generate(rows, params(1), 1, gen), PREFILL_CALLS)
    probe_n = 33
    _, probe_s = _sync_time(lambda: eng.generate(rows, params(probe_n), 1, gen))
    step_s = max(probe_s - prefill_s, 1e-6) / (probe_n - 1)
    left = share_s - (time.perf_counter() - t0)
    n = min(new_tokens, int((left - prefill_s) / step_s))
    if n < MIN_NEW_TOKENS:
        return {
            "skipped": f"needs ~{prefill_s + step_s * MIN_NEW_TOKENS:.1f}s for {MIN_NEW_TOKENS} tokens, "
            f"{left:.1f}s left in its share",
            "step_ms_probe": step_s * 1e3,
        }
    roll, total_s = _sync_time(lambda: eng.generate(rows, params(n), 1, gen))
    generated = eng.last_stats["generated_tokens"]
    assert generated == batch * n, (generated, batch, n)
    out = {
        "new_tokens": n,
        "prefill_s": prefill_s,
        "total_s": total_s,
        "decode_tok_s": batch * (n - 1) / max(total_s - prefill_s, 1e-9),
        "e2e_tok_s": batch * n / total_s,
        "step_ms": (total_s - prefill_s) / (n - 1) * 1e3,
        "graphs": graphs,
        "capture_s": capture_s,
        "graph_error": eng.graph_error,
        "kv_cache_gib": eng.cache_bytes / 2**30,
        "batch_rows": eng.last_stats.get("batch_rows"),  # < batch: the rows ran in batches sized by free memory
        "peak_mem_gib": _mem("max_memory_allocated"),
    }
    del roll
    eng.release()
    return out


def hf_cell(model, batch: int, prompt: int, new_tokens: int, share_s: float) -> dict:
    ids = torch.tensor(_prompts(batch, prompt, model.config.vocab_size), device=DEVICE)
    mask = torch.ones_like(ids)

    def gen(n):
        return model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=PAD,
            eos_token_id=None,
        )

    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    gen(2)
    _, prefill_s = _sync_time(lambda: gen(1))
    _, probe_s = _sync_time(lambda: gen(9))
    step_s = max(probe_s - prefill_s, 1e-6) / 8
    left = share_s - (time.perf_counter() - t0)
    n = min(new_tokens, int((left - prefill_s) / step_s))
    if n < 16:
        return {"skipped": f"needs ~{prefill_s + 16 * step_s:.1f}s for 16 tokens, {left:.1f}s left in its share"}
    new_tokens = n
    out, total_s = _sync_time(lambda: gen(new_tokens))
    assert out.shape == (batch, prompt + new_tokens), out.shape
    return {
        "new_tokens": new_tokens,
        "prefill_s": prefill_s,
        "total_s": total_s,
        "decode_tok_s": batch * (new_tokens - 1) / max(total_s - prefill_s, 1e-9),
        "e2e_tok_s": batch * new_tokens / total_s,
        "step_ms": (total_s - prefill_s) / (new_tokens - 1) * 1e3,
        "peak_mem_gib": _mem("max_memory_allocated"),
    }


@torch.no_grad()
def checks(model, variant: str, prompt: int) -> dict:
    """Rollout log-probs vs the trainer's forward; for BF16 also greedy tokens vs HF generate."""
    from quarl.engine import GREEDY_TOP_P, FastGenerator
    from quarl.engine.rollout import SamplingParams

    B, T = 8, 32
    rows = _prompts(B, prompt, model.config.vocab_size, seed=1)
    eng = FastGenerator(model, PAD)
    out: dict = {}
    roll = eng.generate(rows, SamplingParams(1.0, 1.0, 64, []), 1, torch.Generator(DEVICE).manual_seed(1))
    logits = model(input_ids=roll.input_ids).logits[:, prompt - 1 : -1].float()  # [B, 64, V]
    ref = torch.log_softmax(logits, -1).gather(-1, roll.completion_ids[..., None]).squeeze(-1)
    d = (roll.logprobs - ref).abs()
    out["logprob_vs_trainer_mean_abs"] = float(d.mean())
    out["logprob_vs_trainer_max_abs"] = float(d.max())
    if variant == "bf16":
        g = eng.generate(rows, SamplingParams(1.0, GREEDY_TOP_P / 10, T, []), 1).completion_ids
        ids = torch.tensor(rows, device=DEVICE)
        h = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=T,
            min_new_tokens=T,
            pad_token_id=PAD,
            eos_token_id=None,
        )[:, prompt:]
        same = (g == h).long()
        first_diff = [int(r.argmin()) if not bool(r.all()) else T for r in same]
        out["greedy_vs_hf_rows_identical"] = f"{sum(f == T for f in first_diff)}/{B}"
        out["greedy_vs_hf_first_divergence"] = first_diff
    eng.release()
    return out


def environment() -> dict:
    import transformers

    gpu = torch.cuda.get_device_name(0) if DEVICE == "cuda" else platform.processor() or "cpu"
    env = {
        "date": datetime.date.today().isoformat(),
        "gpu": gpu,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        env["triton"] = None
    from quarl.quant import dispatch

    dispatch.load_kernels()
    env["kernels_registered"] = dispatch.registered()
    return env


def selected_kernel(model) -> str:
    from quarl.quant import dispatch
    from quarl.quant.linear import QuantLinear

    layer = next((m for m in model.modules() if isinstance(m, QuantLinear)), None)
    if layer is None:
        return "cuBLAS (nn.Linear)"
    if layer.config is None:  # frozen high-precision base (bf16+lora): F.linear on its weight
        return "cuBLAS (frozen BF16 QuantLinear)"
    if getattr(layer, "fp8_flow", False):  # Jet-RL: quarl.quant.fp8_linear (FP8 GEMV at decode rows, else DeepGEMM /
        # cuBLAS)
        from quarl.quant.fp8_linear import gemm_backend, gemv_rows

        return (f"FP8 flow (GEMV <= {gemv_rows()} rows, else {gemm_backend()})" if DEVICE == "cuda"
                else "FP8 flow (emulated)")
    x = torch.zeros(1, layer.in_features, device=DEVICE, dtype=torch.bfloat16)
    k = dispatch.select(x, layer)
    return k.name if k is not None else "reference (dequantize + matmul)"


def run(args) -> dict:
    from quarl.quant import quantize_model

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "rollout.json"
    budget = Budget(args.budget_s)
    res = {"env": environment(), "args": vars(args), "cells": [], "checks": {}, "notes": []}
    batches = [int(b) for b in args.batches.split(",")]
    variants = args.variants.split(",")
    models = args.models.split(",")
    plan = [(m, v) for m in models for v in variants]
    cells_left = sum(len(batches) + (len(batches) if v == "bf16" and args.hf_new_tokens else 0) for _, v in plan)

    def save():
        path.write_text(json.dumps(res, indent=1, default=str))

    for mname, variant in plan:
        cfg = qwen25_config(mname)
        if budget.left() < 20:
            res["notes"].append(f"{mname}/{variant}: not run (time budget)")
            cells_left -= len(batches) * (2 if variant == "bf16" else 1)
            continue
        t = time.perf_counter()
        model = build_model(cfg)
        build_s = time.perf_counter() - t
        recipe = RECIPES[variant]
        quant_s = 0.0
        if recipe is not None:
            t = time.perf_counter()
            quantize_model(model, recipe)
            _sync()
            quant_s = time.perf_counter() - t
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        meta = {
            "model": mname,
            "variant": variant,
            "kernel": selected_kernel(model),
            "build_s": build_s,
            "quantize_s": quant_s,
            "weights_gib": _mem("memory_allocated"),
        }
        print(f"== {mname} {variant}: {meta}", flush=True)
        work = [("engine", b) for b in batches]
        if variant == "bf16" and args.hf_new_tokens:
            work += [("hf", b) for b in batches]
        for engine, b in work:
            share = budget.left() / max(cells_left, 1)
            cells_left -= 1
            cell = {**meta, "engine": engine, "batch": b, "prompt": args.prompt}
            if (args.temperature, args.top_p) != (1.0, 1.0):  # not the table's sampling: say so in the cell
                cell |= {"temperature": args.temperature, "top_p": args.top_p}
            try:
                if engine == "engine":
                    cell.update(engine_cell(model, b, args.prompt, args.new_tokens, share, args.temperature,
                                            args.top_p))
                else:
                    cell.update(hf_cell(model, b, args.prompt, args.hf_new_tokens, share))
            except Exception as e:  # noqa: BLE001 - record and go on: one failure must not lose the run
                cell["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            print(
                json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in cell.items() if k not in meta}),
                flush=True,
            )
            res["cells"].append(cell)
            save()
        if mname == models[0] and variant in ("bf16", "nvfp4+lora") and budget.left() > 30:
            try:
                res["checks"][f"{mname}/{variant}"] = checks(model, variant, args.prompt)
            except Exception as e:  # noqa: BLE001
                res["checks"][f"{mname}/{variant}"] = {"error": f"{type(e).__name__}: {e}"}
                traceback.print_exc()
            print("check", variant, res["checks"][f"{mname}/{variant}"], flush=True)
            save()
        del model
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    save()
    return res


def short_note(cell: dict, want: int | None) -> str:
    """An engine cell cut short by its time share (its first compiles can eat it): its steps average a shorter
    context than a full run's, so they are faster -- say so beside them (session 39's first table at batch 64 read
    1.27x against 1.23x that way)."""
    n = cell.get("new_tokens")
    if cell.get("engine") != "engine" or not n or not want or n >= want:
        return ""
    return f"short: {n} of {want} new tokens (time share) -- a shorter context, steps not comparable with full rows"


def table(res: dict) -> str:
    lines = [
        (
            "| model | weights | engine | batch | new tok | prefill s | decode tok/s | step ms | e2e tok/s | "
            "graphs | kernel | note |"
        ),
        "|" + "---|" * 12,
    ]
    want = res.get("args", {}).get("new_tokens")
    for c in res["cells"]:
        note = c.get("skipped") or c.get("error") or c.get("graph_error") or short_note(c, want)

        def f(k, fmt="{:.1f}", c=c):
            return fmt.format(c[k]) if k in c and c[k] is not None else "-"

        lines.append(
            f"| {c['model']} | {c['variant']} | {'FastGenerator' if c['engine'] == 'engine' else 'HF generate'}"
            f" | {c['batch']} | {c.get('new_tokens', '-')} | {f('prefill_s', '{:.3f}')} | "
            f"{f('decode_tok_s')} | {f('step_ms', '{:.2f}')} | {f('e2e_tok_s')} | {c.get('graphs', '-')} | "
            f"{c['kernel']} | {note} |"
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="7b,14b")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=2048)
    ap.add_argument("--variants", default="bf16,nvfp4,mxfp4,nvfp4+lora")
    ap.add_argument("--hf-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=1.0, help="the engine's sampling (the table's: 1)")
    ap.add_argument("--top-p", type=float, default=1.0,
                    help="the engine's nucleus (the table's: 1; the eval recipes sample at 0.6 / 0.95)")
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test with --models tiny")
    ap.add_argument("--report", help="print the markdown table of a finished run's JSON and exit")
    args = ap.parse_args(argv)
    if args.report:
        res = json.loads(Path(args.report).read_text())
        print(table(res))
        print("\nchecks:", json.dumps(res.get("checks", {})), "\nnotes:", res.get("notes"))
        return 0
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print(
            "benchmarks/rollout.py needs a CUDA device (or --device cpu --models tiny for a smoke test)",
            file=sys.stderr,
        )
        return 2
    res = run(args)
    print(json.dumps(res["env"]))
    print("checks:", json.dumps(res["checks"]))
    print("notes:", res["notes"])
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
