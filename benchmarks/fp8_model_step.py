"""The actor update of full-parameter Jet-RL on a Qwen-shaped model, BF16 vs FP8: a whole training step, not one
layer's projections.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/fp8_model_step.py --out $OUT                 # 7B shape, 8k tokens
    python benchmarks/fp8_model_step.py --device cpu --shape tiny --layers 2 --tokens 64 --out /tmp/ms   # dry run

Why. Jet-RL's 1.41x ("training phase") and 1.54x ("actor update") are whole-model figures; ``fp8_layer.py`` times
one decoder layer's seven projections, which leaves out attention, norms, activations, the embedding, the LM head
and the optimizer -- the parts FP8 does not speed up. This times what a full-parameter RL update runs: a
``transformers`` Qwen2 model of the shape's width (random BF16 weights, SDPA attention), forward on ``[B, T]`` token
ids, the token log-probabilities' loss, backward, and one AdamW step, launched back to back between CUDA events.
The loss (``--loss rl``, default) is the rl stage's own: ``quarl.rl.logprobs.completion_logprobs`` (the completion's
positions projected to the vocabulary 1024 at a time, each chunk recomputed in backward) under a policy-gradient
loss ``-(logp * advantage).mean()``, a 256-token prompt per sequence; ``--loss ce`` is a plain cross-entropy over
the full ``[B, T, V]`` fp32 logits (what session 9's first run timed).

Arms (each on a fresh model from the same seed):

* ``bf16``: the model as built;
* ``jetrl``: ``quantize_model`` with the rl stage's own full-parameter Jet-RL recipe (``quarl.rl.precision``:
  every projection a ``QuantLinear`` ``qat`` with a BF16 master weight and FP8 GEMMs forward and backward);
* ``jetrl-xtiles``: the same with ``precision.fp8_wgrad=tiles`` (X^T in 128x128 tiles in WGrad);
* ``+deepgemm`` on either FP8 arm (``jetrl+deepgemm``): ``QUARL_FP8_GEMM=deepgemm``;
* ``+glue`` on any arm (``bf16+glue``, ``jetrl-xtiles+glue``): the rl stage's ``policy.compile_glue``
  (``quarl.train.fused_glue``: transformers' RMSNorm / RoPE / SwiGLU as ``torch.compile``d kernels; inductor on
  CUDA, ``aot_eager`` in a CPU dry run); such arms get a ``bf16+glue`` stem of their own (the final norm is glue).
  On an FP8 arm the glue also runs each MLP as one ``quarl.quant.fp8_swiglu`` function (SwiGLU's backward inside the
  FP8 quantizers, session 27) and each attention's q / k / v as one ``quarl.quant.fp8_stack`` stacked GEMM (session
  28); ``+nostack`` keeps q / k / v three FP8 linears (``QUARL_FP8_STACK=0``), ``+unfused``
  (``jetrl-xtiles+deepgemm+glue+unfused``) both MLP and attention as separate FP8 linears (``QUARL_FP8_SWIGLU=0``
  too), what every ``+glue`` FP8 figure before session 27 ran.

(Session 10 also timed ``+liger`` arms -- Liger-Kernel's RMSNorm, RoPE and SwiGLU patched in, commit 327c7e1 --
and measured no gain; its profile did not change either, so its kernels most likely never ran. Session 24's
``+glue`` arms: the glue was a quarter of a 7B layer's step; RESULTS.md, "The glue between the projections".)

``--accumulate N``: N forward + backward micro-batches per optimizer step (gradient accumulation, as an RL actor
update runs a mini-batch: verl's ``ppo_mini_batch_size`` over ``ppo_micro_batch_size``), times per micro-batch --
the optimizer's share divided by N instead of paid every ``--tokens`` tokens (the default, N = 1, what sessions
9-10 timed).

The optimizer is torch's fused AdamW. Until session 26 the FP8 arms' master weights were *not* re-quantized after
its step -- fused AdamW moves no version counter and the FP8 linear keyed its weight tiles on it -- so every FP8
figure this script gave before then (sessions 9-25, RESULTS.md) left out the weight quantization of each step
(at ``--accumulate 8``: one eighth of it). Fixed in ``quarl.quant.fp8_linear`` (an optimizer post-step hook); the
figures from session 26 on include it.

Each FP8 arm's row also keeps the fused quantizers' launch-setting choices (``tuned``: per operand class, the time
and HBM rate of every candidate setting; ``quarl_kernels.fp8_quant.pick_setting``).

``--repeat R``: the decoder-layer arms timed R times, in order, round after round (fresh models each time; the stems
once): the table then gives each arm's median step, and a second table each round's per-layer ratio of every arm to
``bf16`` and to ``bf16+glue`` -- arms timed minutes apart, on one GPU, as far as they move between rounds (session 27:
~2 % between calls, as large as the margin to Jet-RL's 1.54x).

``--profile``: one more step of each arm (and of the stems) under ``torch.profiler``, its GPU time by kernel class
(GEMMs, FP8 quantizers, attention, norm/RoPE/SwiGLU, the optimizer, the rest) and its 40 longest kernels; the report
gives each class per decoder layer too, (step - stem) / layers -- where a layer's time goes.

A 7B model with AdamW does not fit one GPU in full-parameter training, so the model has ``--layers`` decoder layers
(default 4), and the model is also timed with no decoder layer at all (embedding, final norm, LM head, loss and their
optimizer step: the "stem", BF16 and the same in every arm). Per decoder layer = (step - stem) / layers; the **28-layer estimate** = stem + 28 x per
layer, the step of the whole 7B shape by that arithmetic (the stem is BF16 in every arm, as the rl stage keeps the
embedding and the LM head). The memory that estimate would need is not claimed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import unittest.mock
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "kernels"), str(ROOT / "benchmarks")]

from fp8_linear import stream_time, sync  # the FP8 benchmarks' timers
from gpu_energy import EnergyMeter  # joules and SM clock beside the ms (sessions 34-35: every arm at the power cap)

# hidden, intermediate, heads, kv heads, vocab, layers of the real model (for the estimate)
SHAPES = {"Qwen2.5-7B": (3584, 18944, 28, 4, 152064, 28), "Qwen3-8B": (4096, 12288, 32, 8, 151936, 36),
          "Qwen2.5-32B": (5120, 27648, 40, 8, 152064, 64), "tiny": (256, 640, 4, 2, 1000, 4)}
BASES = ("bf16", "jetrl", "jetrl-xtiles")
MODS = ("deepgemm", "glue", "unfused", "nostack")
GLUE_BACKEND = "inductor"
PROMPT = 256  # prompt tokens per sequence under --loss rl (the rest is the completion)


def parse_arm(arm: str) -> tuple[str, bool, bool]:
    """``jetrl-xtiles+deepgemm+glue`` -> ("jetrl-xtiles", True, True); unknown names refused."""
    base, *mods = arm.split("+")
    if base not in BASES or any(m not in MODS for m in mods) or len(set(mods)) != len(mods) or (
            base == "bf16" and ({"deepgemm", "unfused", "nostack"} & set(mods))) or (
            {"unfused", "nostack"} & set(mods) and "glue" not in mods) or {"unfused", "nostack"} <= set(mods):
        raise SystemExit(f"unknown arm {arm!r}: a base ({', '.join(BASES)}) with +deepgemm (FP8 bases), +glue, "
                         f"+unfused or +nostack (FP8 bases with +glue)")
    return base, "deepgemm" in mods, "glue" in mods


def arm_env(arm: str) -> dict:
    """The environment an arm's modifiers set: +deepgemm -> QUARL_FP8_GEMM=deepgemm (else cublas: the library's
    default takes DeepGEMM wherever it imports), +unfused -> QUARL_FP8_SWIGLU=0 and QUARL_FP8_STACK=0, +nostack ->
    QUARL_FP8_STACK=0."""
    mods = arm.split("+")[1:]
    return {"QUARL_FP8_GEMM": "deepgemm" if "deepgemm" in mods else "cublas",
            **({"QUARL_FP8_SWIGLU": "0"} if "unfused" in mods else {}),
            **({"QUARL_FP8_STACK": "0"} if {"unfused", "nostack"} & set(mods) else {})}


def build(shape: str, layers: int, device: str, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    h, inter, heads, kv, vocab, _ = SHAPES[shape]
    cfg = Qwen2Config(hidden_size=h, intermediate_size=inter, num_attention_heads=heads, num_key_value_heads=kv,
                      vocab_size=vocab, num_hidden_layers=layers, max_position_embeddings=32768,
                      tie_word_embeddings=False, attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    return model


def prepare(model, arm: str) -> None:
    """Turn the BF16 model into the arm's: the rl stage's full-parameter Jet-RL recipe for the FP8 arms."""
    if arm.startswith("jetrl"):
        from quarl.quant import quantize_model
        from quarl.rl.precision import _jetrl_recipe

        quantize_model(model, _jetrl_recipe("full", "tiles" if "xtiles" in arm else "1x128"))


def step_fn(model, opt, ids: torch.Tensor, loss: str = "ce", accumulate: int = 1):
    """One optimizer step after ``accumulate`` forward + backward passes on ``ids`` (gradient accumulation over
    micro-batches, as an RL actor update runs: verl's ``ppo_mini_batch_size`` / ``ppo_micro_batch_size``)."""
    if accumulate < 1:
        raise ValueError(f"accumulate={accumulate}: needs >= 1 micro-batch per optimizer step")
    if loss == "rl":
        from quarl.rl.logprobs import completion_logprobs

        n_completion = ids.shape[1] - min(PROMPT, ids.shape[1] // 2)
        mask = torch.ones_like(ids)
        adv = torch.randn(ids.shape[0], 1, device=ids.device, generator=torch.Generator(ids.device).manual_seed(0))

    def step():
        if loss == "rl":  # the rl stage's token log-probs, chunked over the vocabulary
            logp, _ = completion_logprobs(model, ids, mask, n_completion, chunk=1024)  # [B, T] fp32
            out = -(logp * adv).mean()
        else:
            logits = model(input_ids=ids).logits[:, :-1]  # [B, T-1, V] bf16
            out = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        out.backward()

    def update():
        for _ in range(accumulate):
            step()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return update


# kernel classes of --profile: the first pattern a lower-cased kernel name contains
# (attention before gemm: flash / cuDNN / CUTLASS attention kernels' names can contain "cutlass" or "sm90"; session
# 10's tables had that order reversed and counted attention with the GEMMs)
# (session 32: the Gluon kernels of quarl_kernels.fp8_quant_regs were counted as glue / other in its first profile)
KERNEL_CLASSES = [
    ("fp8 swiglu quantize", ("_swiglu_rows_kernel", "_swiglu_cols_kernel", "_swiglu_bwd_kernel",
                             "_staged_kernel")),  # fp8_swiglu, regs, staged
    # fp8_quant, regs (with the forward's h from g, u: regs' SWIGLU form or, session 34, the staged forward form)
    ("fp8 quantize", ("_act_kernel", "_act_t_kernel", "_tile_kernel", "_regs_kernel", "_staged_fwd_kernel", "quant")),
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa", "efficient")),
    ("gemm", ("gemm", "nvjet", "xmma", "cutlass", "wgmma", "sm90_", "splitk", "deep_gemm", "fp8_gemm")),
    # inductor's kernels (triton_poi_fused_..., triton_red_..., triton_per_...): the +glue arms' compiled glue
    ("norm/rope/swiglu", ("rms", "norm", "rope", "rotary", "silu", "swiglu", "liger", "triton_")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("softmax/loss", ("logsumexp", "softmax", "cross_entropy", "nll", "log_softmax", "gather", "scatter")),
]


TOP_KERNELS = 40  # the longest kernels --profile keeps per arm
# The memory-bound ATen ops --profile also keeps by input shape (session 34: copies 0.56 and adds 1.6 ms a 7B layer in
# both arms' profiles, their call sites unknown from kernel names alone)
LAYOUT_OPS = ("aten::copy_", "aten::clone", "aten::contiguous", "aten::cat", "aten::add", "aten::add_", "aten::fill_",
              "aten::zero_")
TOP_OPS = 16


def kernel_class(name: str, classes=KERNEL_CLASSES) -> str:
    n = name.lower()
    return next((c for c, pats in classes if any(p in n for p in pats)), "other")


def profile_step(fn, device: str, kinds=KERNEL_CLASSES) -> dict:
    """One step under torch.profiler: GPU ms per kernel class, the longest kernels (ms per step) and the
    :data:`LAYOUT_OPS` by input shape (their self GPU ms; CPU ms on a CPU)."""
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    sync(device)
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        fn()
        sync(device)
    by_kernel: dict[str, float] = {}
    for e in prof.events():
        if device == "cuda" and e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if device != "cuda" and e.cpu_parent is not None:  # CPU: top-level ops only (a dry run of the wiring)
            continue
        by_kernel[e.name] = by_kernel.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3
    classes: dict[str, float] = {}
    for k, ms in by_kernel.items():
        c = kernel_class(k, kinds)
        classes[c] = classes.get(c, 0.0) + ms
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:TOP_KERNELS]
    ops = []
    for a in prof.key_averages(group_by_input_shape=True):
        if a.key in LAYOUT_OPS:
            us = getattr(a, "self_device_time_total", 0) if device == "cuda" else a.self_cpu_time_total
            ops.append([a.key, str(a.input_shapes)[:100], a.count, us / 1e3])
    ops = sorted(ops, key=lambda o: -o[3])[:TOP_OPS]
    return {"classes": classes, "total_ms": sum(by_kernel.values()), "top": [[k[:120], ms] for k, ms in top],
            "ops": ops, "copy_sites": copy_sites(prof.events())}


def copy_sites(events) -> list:
    """Where the 4-D copies come from (session 35: one [B, H, T, D] and one [B, T, H, D] copy a layer in every arm,
    0.2 ms each at 7B width): ``[shape, the ATen ops (or autograd nodes) above it, calls]`` for each ``aten::copy_``
    of a 4-D tensor, by its chain of CPU parents (backward copies sit under the autograd node that made them)."""
    sites: dict[tuple, int] = {}
    for e in events:
        shapes = getattr(e, "input_shapes", None) or []
        if e.name != "aten::copy_" or e.device_type == torch.autograd.DeviceType.CUDA or not shapes \
                or len(shapes[0]) != 4:
            continue
        chain, p = [], e.cpu_parent
        while p is not None and len(chain) < 6:
            chain.append(p.name)
            p = p.cpu_parent
        key = (str(shapes[0]), " < ".join(chain))
        sites[key] = sites.get(key, 0) + 1
    return [[shape, chain, n] for (shape, chain), n in sorted(sites.items(), key=lambda kv: -kv[1])][:TOP_OPS]


def measure(model, ids: torch.Tensor, loss: str, iters: int, device: str, profile: bool = False,
            kinds=KERNEL_CLASSES, fused_adam: bool = True, accumulate: int = 1) -> dict:
    """Time ``model``'s training step on ``ids`` (:func:`step_fn`, AdamW on the trainable parameters), its peak
    memory and, with ``profile``, one profiled step by kernel class; the model is freed after. With ``accumulate``
    micro-batches per optimizer step, ``ms`` (and the profile) are per micro-batch: the optimizer's share divided."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6,
                            fused=fused_adam and device == "cuda")
    fn = step_fn(model, opt, ids, loss, accumulate)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    meter = EnergyMeter(torch.cuda.current_device()) if device == "cuda" else None
    out = {"ms": stream_time(fn, iters, device, warmup=2, meter=meter) / accumulate, "tokens": ids.numel()}
    if device == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if meter is not None and meter.joules is not None:  # per micro-batch, as ms
        out.update(joules=meter.joules / (iters * accumulate), watts=meter.joules / meter.seconds, sm_mhz=meter.sm_mhz)
    elif meter is not None:
        out["energy"] = meter.why or "no reading"
    if profile:
        out["profile"] = prof = profile_step(fn, device, kinds)
        prof["classes"] = {c: ms / accumulate for c, ms in prof["classes"].items()}
        prof["total_ms"] /= accumulate
        prof["top"] = [[k, ms / accumulate] for k, ms in prof["top"]]
        prof["ops"] = [[k, shapes, n / accumulate, ms / accumulate] for k, shapes, n, ms in prof["ops"]]
    del model, opt, fn
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def tuned_table() -> list[dict]:
    """The fused FP8 quantizers' launch-setting choices so far (``fp8_layer.tuned_entry``: each candidate's ms and
    GB/s per operand class); [] without them."""
    try:
        from quarl_kernels import fp8_quant as fq
    except ImportError:
        return []
    from fp8_layer import tuned_entry

    return [tuned_entry(k, v) for k, v in fq.TUNED.items()]


def time_arm(shape: str, layers: int, arm: str, tokens: int, seq: int, iters: int, device: str,
             loss: str = "ce", profile: bool = False, accumulate: int = 1) -> dict:
    base, _, glue = parse_arm(arm)
    from transformers.models.qwen2 import modeling_qwen2

    rope = modeling_qwen2.apply_rotary_pos_emb  # +glue patches it process-wide: the next arm gets it back
    # The previous arm's model is garbage in reference cycles (a +glue module's forward is a method bound to itself; a
    # stacked q / k / v group refers to its projections), which refcounting never frees: collected here, before this
    # arm's peak is measured. Until session 28 it was not, and each arm's peak could include the arm before it (its
    # master weights, gradients and FP8 tiles: ~3 GiB at 7B width, 4 layers).
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    try:
        with unittest.mock.patch.dict(os.environ, arm_env(arm)):
            model = build(shape, layers, device)
            prepare(model, base)
            if glue:  # what policy.compile_glue does in the rl stage
                from quarl.train.fused_glue import compile_glue

                compile_glue(model, backend=GLUE_BACKEND if device == "cuda" else "aot_eager")
            model.train()
            ids = torch.randint(0, SHAPES[shape][4], (max(tokens // seq, 1), seq), device=device)
            out = measure(model, ids, loss, iters, device, profile, accumulate=accumulate)
            if base != "bf16" and device == "cuda":
                out["tuned"] = tuned_table()
            return out
    finally:
        modeling_qwen2.apply_rotary_pos_emb = rope


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="Qwen2.5-7B", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per step (B x seq)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--arms", default="bf16,jetrl,jetrl-xtiles")
    ap.add_argument("--loss", default="rl", choices=("rl", "ce"), help="rl: the rl stage's chunked log-probs")
    ap.add_argument("--profile", action="store_true", help="also one profiled step per arm (kernel classes)")
    ap.add_argument("--accumulate", type=int, default=1,
                    help="micro-batches (of --tokens each) per optimizer step; times are per micro-batch")
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the decoder-layer arms (each round's ratios reported)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--out", default="/tmp/fp8_model_step")
    ap.add_argument("--render", default="")
    a = ap.parse_args()
    if a.render:
        print(render(json.loads(Path(a.render).read_text())))
        return
    if a.accumulate < 1:
        raise SystemExit(f"--accumulate {a.accumulate}: needs >= 1 micro-batch per optimizer step")
    if a.repeat < 1:
        raise SystemExit(f"--repeat {a.repeat}: needs >= 1 round")
    arms = a.arms.split(",")
    for x in arms:
        parse_arm(x)
    if "bf16" not in arms:
        raise SystemExit("the bf16 arm is required (every x is BF16 time / arm time)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    seq = min(a.seq, a.tokens)
    res = {"command": " ".join(sys.argv), "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name() if a.device == "cuda" else "cpu", "torch": torch.__version__,
           "shape": a.shape, "layers": a.layers, "tokens": a.tokens, "seq": seq, "loss": a.loss,
           "accumulate": a.accumulate, "repeat": a.repeat, "rows": []}
    t0 = time.time()
    # the stem (no decoder layer) has no projection to quantize: the same BF16 model in every arm, timed once (and
    # once with the compiled glue when an arm has it: its final norm)
    stems = ["bf16"] + (["bf16+glue"] if any(parse_arm(x)[2] for x in arms) else [])
    runs = [*((x, 0, 0) for x in stems), *((arm, a.layers, r) for r in range(a.repeat) for arm in arms)]
    for arm, layers, rep in runs:
        if time.time() - t0 > a.budget_s:
            res.setdefault("skipped", []).append(f"{arm} layers={layers} round={rep}")
            continue
        try:
            row = {"arm": arm, "layers": layers, "round": rep,
                   **time_arm(a.shape, layers, arm, a.tokens, seq, a.iters, a.device, a.loss,
                              a.profile and rep == 0, a.accumulate)}
        except Exception as e:  # noqa: BLE001 - e.g. out of memory or DeepGEMM missing: keep the other arms
            row = {"arm": arm, "layers": layers, "round": rep, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        record_row(res, row, out / "fp8_model_step.json", a.device, t0)
    write_report(render(res), out / "fp8_model_step.md")


def record_row(res: dict, row: dict, path: Path, device: str, t0: float) -> None:
    """One arm's result: printed (without its profile), appended, and the JSON rewritten (a later failure keeps
    it)."""
    sync(device)
    res["rows"].append(row)
    print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
    res["wall_s"] = time.time() - t0
    path.write_text(json.dumps(res, indent=1))


def write_report(text: str, path: Path) -> None:
    path.write_text(text + "\n")
    print(text)


def stem_arm(arm: str) -> str:
    """The stem an arm's per-layer time subtracts: ``bf16+glue`` for a +glue arm (its final norm is compiled too),
    ``bf16+liger`` for session 10's +liger arms, else ``bf16``. (Until session 27 a ``+glue`` arm with a modifier after
    ``+glue`` got the ``bf16`` stem.)"""
    mods = arm.split("+")[1:]
    return "bf16+glue" if "glue" in mods else "bf16+liger" if "liger" in mods else "bf16"


def median_rows(rows: list[dict]) -> dict:
    """(arm, layers) -> the row with the median ``ms`` of its rounds (the lower middle of an even count); a pair with
    no timed round keeps its last row (its error)."""
    out: dict = {}
    for key in dict.fromkeys((r["arm"], r["layers"]) for r in rows):
        same = [r for r in rows if (r["arm"], r["layers"]) == key]
        timed = sorted((r for r in same if "ms" in r), key=lambda r: r["ms"])
        out[key] = timed[(len(timed) - 1) // 2] if timed else same[-1]
    return out


def round_ratios(res: dict) -> list[str]:
    """With several rounds: each round's per-layer ratio of every arm to ``bf16`` and ``bf16+glue`` (the stems'
    one timing subtracted), as markdown lines; none for one round."""
    layer_rows = [r for r in res["rows"] if r["layers"] and "ms" in r]
    rounds = sorted({r.get("round", 0) for r in layer_rows})
    if len(rounds) < 2:
        return []
    stems = {r["arm"]: r["ms"] for r in res["rows"] if not r["layers"] and "ms" in r}
    per = {(r["arm"], r.get("round", 0)): (r["ms"] - stems[stem_arm(r["arm"])]) / res["layers"]
           for r in layer_rows if stem_arm(r["arm"]) in stems}
    bases = [b for b in ("bf16", "bf16+glue") if any(k[0] == b for k in per)]
    L = ["", "Per decoder layer, each round (ms, and x = base / arm within the round):", "",
         "| arm | " + " | ".join(f"round {r} ms" for r in rounds) + " | " +
         " | ".join(f"x {b} (rounds)" for b in bases) + " |", "|---|" + "---:|" * (len(rounds) + len(bases))]
    for arm in dict.fromkeys(r["arm"] for r in layer_rows):
        ms = [per.get((arm, r)) for r in rounds]
        xs = []
        for b in bases:
            got = [per[(b, r)] / per[(arm, r)] for r in rounds if per.get((b, r)) and per.get((arm, r))]
            xs.append(", ".join(f"{x:.3f}" for x in got) or "-")
        L.append(f"| {arm} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in ms) + " | " + " | ".join(xs) + " |")
    return L


def energy_lines(res: dict, by: dict) -> list[str]:
    """Joules per micro-batch per decoder layer (the stem's subtracted, as the ms), mean watts and SM clock of each
    arm's median-ms round, from NVML (:class:`gpu_energy.EnergyMeter`); none without them. Every arm of the 7B / 8B
    updates ran at the H100's 700 W cap (session 34), so the J ratio stays near the ms ratio, not equal to it."""
    stems = {a: r for (a, n), r in by.items() if not n and "joules" in r}
    rows = [(a, r) for (a, n), r in by.items() if n and "joules" in r and stem_arm(a) in stems]
    if not rows:
        return []
    per = {a: (r["joules"] - stems[stem_arm(a)]["joules"]) / res["layers"] for a, r in rows}
    bases = [b for b in ("bf16", "bf16+glue") if b in per]
    L = ["", "Energy (NVML, the median-ms round; J per micro-batch; per layer = (step - stem) / layers):", "",
         "| arm | J per layer | " + " | ".join(f"x {b} (J)" for b in bases) + " | mean W | mean SM MHz |",
         "|---|---:|" + "---:|" * len(bases) + "---:|---:|"]
    for a, r in rows:
        mhz = f"{r['sm_mhz']:.0f}" if r.get("sm_mhz") else "-"
        L.append(f"| {a} | {per[a]:.3f} | " + " | ".join(f"{per[b] / per[a]:.3f}x" for b in bases)
                 + f" | {r['watts']:.0f} | {mhz} |")
    return L


def render(res: dict) -> str:
    """Per arm: step with the decoder layers, the stem, per layer, the whole-model estimate; x = BF16 / arm."""
    full_layers = SHAPES[res["shape"]][5]
    by = median_rows(res["rows"])
    acc = res.get("accumulate", 1)
    title = (f"# actor update, {res['shape']} width, {res['layers']} decoder layers, {res['tokens']} tokens "
             f"({res['seq']} per sequence), loss {res.get('loss', 'ce')}, {res['gpu']}, torch {res['torch']}"
             + (f"; {acc} micro-batches per optimizer step, ms per micro-batch" if acc > 1 else "")
             + (f"; each arm's median of {res['repeat']} rounds" if res.get("repeat", 1) > 1 else ""))
    head = (f"| arm | step ms ({res['layers']} layers) | x | stem ms | per layer ms | x | {full_layers}-layer estimate ms "
            f"| x | peak GiB |")
    L = [title, "", head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    vals: dict[str, dict] = {}
    for arm in dict.fromkeys(r["arm"] for r in res["rows"] if r["layers"]):
        # the stem is BF16 in every arm (embedding, final norm, LM head, loss); +glue arms have their own (the final
        # norm is compiled too); session 10's +liger arms had theirs
        stem = by.get((stem_arm(arm), 0), {})
        step = by.get((arm, res["layers"]), {})
        if "ms" not in step or "ms" not in stem:
            err = step.get("error") or stem.get("error") or "not run"
            L.append(f"| {arm} | {err[:80]} | | | | | | | |")
            continue
        per = (step["ms"] - stem["ms"]) / max(res["layers"], 1)
        vals[arm] = {"step": step["ms"], "per": per, "est": stem["ms"] + full_layers * per}
        v, b = vals[arm], vals.get("bf16", {})
        x = {k: f"{b[k] / v[k]:.2f}x" if b.get(k) and v[k] > 0 else "-" for k in v}
        L.append(f"| {arm} | {v['step']:.1f} | {x['step']} | {stem['ms']:.1f} | {per:.2f} | {x['per']} | {v['est']:.1f} | "
                 f"{x['est']} | {step.get('peak_gib', float('nan')):.1f} |")
    L += round_ratios(res)
    L += energy_lines(res, by)
    prof = {(r["arm"], r["layers"]): r["profile"] for r in res["rows"] if r.get("profile")}
    if prof:
        cls = [c for c, _ in KERNEL_CLASSES] + ["other"]
        L += ["", (f"GPU ms of one step by kernel class (torch.profiler; the stem has no decoder layer), and per "
                   f"decoder layer = (step - stem) / {res['layers']}:"), "",
              "| arm | " + " | ".join(cls) + " | sum |", "|---|" + "---:|" * (len(cls) + 1)]
        for (arm, layers), p in prof.items():
            L.append(f"| {arm}{' (stem)' if not layers else ''} | " +
                     " | ".join(f"{p['classes'].get(c, 0.0):.1f}" for c in cls) + f" | {p['total_ms']:.1f} |")
        for (arm, layers), p in prof.items():
            stem = prof.get((stem_arm(arm), 0))
            if layers and stem:
                per = {c: (p["classes"].get(c, 0.0) - stem["classes"].get(c, 0.0)) / layers for c in cls}
                L.append(f"| {arm}, per layer | " + " | ".join(f"{per[c]:.2f}" for c in cls) +
                         f" | {(p['total_ms'] - stem['total_ms']) / layers:.2f} |")
        ops = [(arm, o) for (arm, layers), p in prof.items() if layers for o in p.get("ops", [])]
        if ops:
            L += ["", ("Copies, adds and fills by input shape (self GPU ms and calls per micro-batch, the whole "
                       "profiled step with its stem):"), "", "| arm | op | input shapes | calls | ms |",
                  "|---|---|---|---:|---:|"]
            L += [f"| {arm} | {k} | {shapes} | {n:g} | {ms:.3f} |" for arm, (k, shapes, n, ms) in ops]
        sites = [(arm, s) for (arm, layers), p in prof.items() if layers for s in p.get("copy_sites", [])]
        if sites:
            L += ["", ("4-D copies by caller (the ATen ops / autograd nodes above each, innermost first; calls in the "
                       "profiled step):"), "", "| arm | shape | callers | calls |", "|---|---|---|---:|"]
            L += [f"| {arm} | {shape} | {chain} | {n} |" for arm, (shape, chain, n) in sites]
    return "\n".join(L)


if __name__ == "__main__":
    main()
