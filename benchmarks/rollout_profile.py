"""Where a decode step's time goes: a per-step profile of FastGenerator on the 7B shape (issue 17).

    PYTHONPATH=$PWD:$PWD/kernels python benchmarks/rollout_profile.py [--models 7b] [--batches 1,8,64]
        [--variants bf16,nvfp4,nvfp4+lora32:nopack,nvfp4+lora32,nvfp4+lora:nopack,nvfp4+lora]
        [--prompt 1024] [--steps 64] [--prof-steps 8] [--budget-s 150] [--out DIR]
    python benchmarks/rollout_profile.py --device cpu --models tiny --prompt 16 --steps 4   # dry run
    python benchmarks/rollout_profile.py --report DIR/profile.json                           # tables again

Variants: the recipes of ``benchmarks/rollout.py`` (random weights, the same ``quantize_model``
calls; LoRA r32 on all 7 projections with a non-zero B); ``+lora32`` keeps the adapter in fp32
as the RL trainer does (``quarl.train.policy``), ``+lora`` in the model's bf16 as
``rollout.py``'s table did; ``:nopack`` runs ``FastGenerator(lora_pack=False)``, each projection's
LoRA inside its module (the engine before issue 17's packed adapters, ``quarl.engine.lora``) --
the before/after of that change, same model and weights. ``:noepi`` sets
``QUARL_ENGINE_LORA_EPILOGUE=0`` (LoRA B and bias as separate kernels, not in the base GEMM's last
pass) and ``:sdpa`` ``QUARL_ENGINE_DECODE_ATTN=0`` (SDPA for decode attention); ``:noloraa`` sets
``QUARL_ENGINE_LORA_A=0`` (the packed A GEMM on cuBLAS, not inside the first projection's GEMV launch,
``quarl_kernels.lora_a``); ``:nogroup`` sets ``QUARL_GEMV_GROUP=0`` (a one-row q/k/v or gate/up group as one
GEMV launch per weight, not one for the group); ``:nommagroup`` sets ``QUARL_MMA_GROUP=0`` (a 2..16-row group's
weights as one mma.sync launch each); ``:nogrouppass`` sets ``QUARL_GROUP_PASS=0`` (a group launch's last passes as one
launch per weight, not one for the group, ``group_pass.finish_group``); ``:rope`` sets ``QUARL_ENGINE_GROUP_ROPE=1``
(the decode step's RoPE + K/V write in the q/k/v group's pass at one row, not its own kernel: the default since
session 13) and ``:norope`` ``=0``; ``:h200gemv`` sets
``QUARL_KERNELS_GEMV_DEFAULTS=h200`` (the one-row GEMV's config 0 everywhere, as before session 12); ``:ring`` sets
``QUARL_KERNELS_WGMMA_RING=1`` (17..64 rows on large FP4 weights through ``wgmma_ring.py``, the default since
session 14) and ``:noring`` ``=0``; ``:nowide`` sets ``QUARL_KERNELS_RING_WIDE_MAX_M=0`` (more than 64 rows: no
wide ring token tiles, the Triton tensor-core kernel or the dense path as before session 15); ``:nopdl`` sets
``QUARL_KERNELS_PDL=0`` (no programmatic dependent launch: each kernel starts after the one before has ended, as
before session 16; ``quarl_kernels/pdl.py``) and ``:earlypdl`` ``=early`` (every kernel signals first thing, not
after its K loop); ``:rowmajor`` sets ``QUARL_KERNELS_BLOCKED=0`` (the engine keeps the packed words row-major, as
before session 21, not in ``quarl.quant.packed_layout``'s [64, 8] blocks from two rows a step); ``:nowgrules`` turns off
``wgmma_decode``'s two NVFP4 rules for 14B-sized k / v and q / o (:func:`wgmma_rules_off`: before session 19);
``:fusedsample`` sets ``QUARL_ENGINE_FUSED_SAMPLE=1`` (the sampler as Triton kernels, ``quarl_kernels.sampler`` /
``nucleus``: the default since session 39; the ``sampling`` row is those kernels and the noise draw) and
``:torchsample`` ``=0`` (PyTorch's ops, the sort below top-p 1: before session 39);
modifiers combine (``nvfp4+lora32:noepi:sdpa``). With the epilogue on, a projection's ``gemm:*`` row includes its
bias and LoRA B (they run in its kernels); ``lora`` is then the A GEMMs alone.

Per (variant, batch) cell, one prefill of ``prompt`` random tokens fills the cache, and
then three views of the *same* decode loop run from there (context ``prompt`` .. ``prompt +
steps``; the default 1024 is about the mean context of the issue's 2048-token rollouts):

1. **step ms** -- ``steps`` decode tokens through the engine exactly as ``generate`` runs them
   (graph replay of the step, on-device sampling, the token bookkeeping), wall clock with a
   sync at both ends, no profiler. Also the real ``generate`` is timed (``n`` and ``n // 4`` new
   tokens, the fastest of three calls each, the difference) as a check that the loop below is the engine's loop.
2. **graphed kernels** -- the same loop under ``torch.profiler`` (CUPTI records the kernels
   inside the CUDA graphs): GPU time per step summed over every kernel/memcpy/memset, and the
   kernel count. ``step ms - kernel ms`` is time the GPU sat idle: launch gaps between graph
   replays and the eager sampling kernels, host work, syncs. The step's kernels are listed by name too
   (the top 16 by time, launches a step): what the categories below are made of.
3. **attributed kernels** -- the loop once more *without* graphs, every projection, the LM
   head and the embedding wrapped in ``record_function`` by forward hooks (and LoRA's branch
   from its ``lora_dropout`` call on), the step and the sampler too; each kernel is charged to
   the innermost range that launched it: ``gemm:qkv / gemm:o / gemm:gate_up / gemm:down``,
   ``bias`` (q/k/v bias add), ``lora``, ``lm_head``, ``embed``, ``attention`` (SDPA),
   ``norm`` (fused add+RMSNorm), ``rope``, ``silu_mul``, ``kv_write`` (cache index_copy /
   mask index_fill), ``other_glue`` (the rest of the step: cos/sin gather, reshapes that copy,
   the final logits cast; its top kernel names are listed), ``sampling``, ``loop`` (the token
   bookkeeping between steps), ``unattributed`` (GPU activity no CPU op claimed: the check
   that the attribution is complete; the names of those kernels are listed with other_glue's --
   a LoRA group's one-row launches are, as Python-launched Triton kernels outside a custom op).
   Kernel durations do not depend on how they were launched, so these are the graphed step's
   kernels, split by what launched them; the eager sum is printed beside the graphed sum as the check.

Device time is scarce: ``--budget-s`` bounds the run (cells that would not fit are skipped and
listed), and ``DIR/profile.json`` is rewritten after every cell. The summary tables come last.
With ``--device cpu`` (tiny model) the profiler has no CUDA kernels, so leaf CPU ops' self
times stand in for kernel times: that exercises every line but measures nothing.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import sys
import time
import traceback
import unittest.mock
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rollout as R

PROJ_GROUP = {"q_proj": "gemm:qkv", "k_proj": "gemm:qkv", "v_proj": "gemm:qkv", "o_proj": "gemm:o",
              "gate_proj": "gemm:gate_up", "up_proj": "gemm:gate_up", "down_proj": "gemm:down"}
CATEGORIES = ["gemm:qkv", "gemm:o", "gemm:gate_up", "gemm:down", "bias", "lora", "lm_head", "embed", "attention",
              "norm", "rope", "silu_mul", "kv_write", "other_glue", "sampling", "loop", "unattributed"]
# innermost CPU op name (substring) -> glue category, first match wins
GLUE_RULES = [("scaled_dot_product", "attention"), ("attention", "attention"), ("rms_norm", "norm"),
              ("rope", "rope"), ("silu", "silu_mul"), ("index_copy", "kv_write"), ("index_fill", "kv_write")]


# --- the engine's decode loop, from a filled cache ---------------------------------------------
@torch.no_grad()  # as generate: with grad on, a LoRA output would require grad and turn the fused glue off
def decode_loop(eng, st, n_rows: int, batch: int, steps: int, gen, graphs: bool, out: dict) -> None:
    """``steps`` tokens of ``FastGenerator._generate_batch``'s loop body (t >= 1), continuing from the
    state a ``generate`` call left behind (``keep_cache``): step, sample, bookkeeping. ``out`` carries
    the loop's tensors (tokens, done, ...) between calls so nothing is allocated per step."""
    from quarl.engine import generator as G

    N, B, S = n_rows, batch, st.length
    for _ in range(steps):
        t = out["t"]
        P = out["P"]
        L = min(S, G._round_up(P + t, eng.kv_block)) if graphs else P + t
        eng._step(st, B, L, graphs)
        logits = st.logits[:N]
        st.slot.add_(1)
        st.pos.add_(1)
        fused = eng.runner.fused_on() and G.fused_sampler() is not None  # as generate decides it
        tok, lp = G.sample(logits, 1.0, 1.0, gen, fused=fused)  # T 1, top-p 1: benchmarks/rollout.py
        live = ~out["done"]
        col = t % out["tokens"].shape[1]
        out["tokens"][:, col] = torch.where(live, tok, out["pad"])
        out["logps"][:, col] = torch.where(live, lp, 0.0)
        out["cmask"][:, col] = live.long()
        out["done"] = out["done"] | (live & torch.isin(tok, out["stop"]))
        st.tok[:N, 0] = tok
        out["t"] = t + 1


def start_loop(eng, rows, steps_total: int, gen) -> tuple:
    """Prefill ``rows`` and take the first token through the real ``generate`` (graphs captured for
    every bucket first); returns (state, loop carry) ready for :func:`decode_loop`."""
    from quarl.engine import generator as G
    from quarl.engine.rollout import SamplingParams

    N, P = len(rows), len(rows[0])
    graphs = eng._graphs_on()
    eng.warmup(N, P, steps_total + 2)  # graphs: every bucket the steps will replay
    eng._ensure_state(G._pow2(N) if graphs else N, G._round_up(P + steps_total + 2, eng.kv_block))
    eng.generate(rows, SamplingParams(1.0, 1.0, 2, []), 1, gen)  # prefill + 1 step; the cache is kept
    st = eng._state
    dev = st.tok.device
    carry = {
        "t": 2, "P": P,  # generate ran t = 0, 1: the next step writes column P + 1
        "tokens": torch.zeros((N, 64), dtype=torch.long, device=dev),
        "logps": torch.zeros((N, 64), dtype=torch.float32, device=dev),
        "cmask": torch.zeros((N, 64), dtype=torch.long, device=dev),
        "done": torch.zeros(N, dtype=torch.bool, device=dev),
        "pad": torch.full((N,), R.PAD, dtype=torch.long, device=dev),
        "stop": torch.tensor([-1], device=dev),
    }
    return st, carry


# --- attribution -----------------------------------------------------------------------------------
class Tagger:
    """``record_function`` ranges that name what launched each kernel, without changing what runs:

    * a QuantLinear projection: its instance's ``base_forward`` wrapped (``mod:<name>``) -- not a
      hook, which would make the engine call the module instead of its packed adapters;
    * an ``nn.Linear`` projection (BF16 model), the LM head, the embedding: forward hooks;
    * LoRA, packed (``quarl.engine.lora.Group.__call__``, patched on the class while tagging):
      ``lora`` around the group (its base projections keep their inner ``mod:`` range, and the group's
      A GEMM, where it runs inside the first projection's launch, is in that projection's range);
    * LoRA, unpacked (``QuantLinear.forward``): ``lora`` from the ``lora_dropout`` call (a pre-hook,
      only on modules no pack covers) to the end of ``quarl.quant.linear.lora_add``."""

    def __init__(self, model, packed: set[int]):
        from quarl.engine import lora as lp
        from quarl.quant import linear as ql

        self.handles, self.open, self.patched = [], {}, []
        base = model.model
        hooked = [("mod:embed", base.embed_tokens), ("mod:lm_head", model.get_output_embeddings())]
        for layer in base.layers:
            for name, mod in list(layer.self_attn.named_children()) + list(layer.mlp.named_children()):
                if name not in PROJ_GROUP:
                    continue
                if isinstance(mod, ql.QuantLinear):
                    mod.base_forward = self._ranged(f"mod:{name}", mod.base_forward)  # instance attribute
                    self.patched.append((mod, "base_forward", None))
                    # the fused route (base GEMM + bias + LoRA B in its last pass) is the projection's too
                    mod.epilogue_kernel = self._ranged_kernel(f"mod:{name}", mod.epilogue_kernel)
                    self.patched.append((mod, "epilogue_kernel", None))
                    # ... and so is the group's A GEMM when it rides in this projection's launch (lora_a)
                    mod.epilogue_a_kernel = self._ranged_kernel(f"mod:{name}", mod.epilogue_a_kernel)
                    self.patched.append((mod, "epilogue_a_kernel", None))
                    # ... and the whole group's launch when it leads one (q/k/v or gate/up in one GEMV launch)
                    mod.epilogue_group_kernel = self._ranged_kernel(f"mod:{name}", mod.epilogue_group_kernel)
                    self.patched.append((mod, "epilogue_group_kernel", None))
                    if mod.lora_cfg is not None and id(mod) not in packed:
                        self.handles.append(mod.lora_dropout.register_forward_pre_hook(self._open_lora))
                else:
                    hooked.append((f"mod:{name}", mod))
        for tag, mod in hooked:
            self.handles.append(mod.register_forward_pre_hook(self._enter(tag, mod)))
            self.handles.append(mod.register_forward_hook(self._exit(mod)))
        self.patched.append((lp.Group, "__call__", lp.Group.__call__))
        lp.Group.__call__ = self._ranged("lora", lp.Group.__call__)
        orig_add = ql.lora_add
        self.patched.append((ql, "lora_add", orig_add))

        def lora_add(*a, **k):
            out = orig_add(*a, **k)
            rf = self.open.pop("lora", None)
            if rf is not None:
                rf.__exit__(None, None, None)
            return out

        ql.lora_add = lora_add

    @staticmethod
    def _ranged(tag, fn):
        def wrapped(*a, **k):
            with record_function(tag):
                return fn(*a, **k)
        return wrapped

    @classmethod
    def _ranged_kernel(cls, tag, get):
        def wrapped(x):
            fn = get(x)
            return None if fn is None else cls._ranged(tag, fn)
        return wrapped

    def _open_lora(self, *_):
        rf = record_function("lora")
        rf.__enter__()
        self.open["lora"] = rf

    def _enter(self, tag, mod):
        def hook(*_):
            rf = record_function(tag)
            rf.__enter__()
            self.open[id(mod)] = rf
        return hook

    def _exit(self, mod):
        def hook(*_):
            rf = self.open.pop(id(mod), None)
            if rf is not None:
                rf.__exit__(None, None, None)
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()
        for obj, attr, orig in reversed(self.patched):
            if orig is None:
                delattr(obj, attr)  # the instance attribute goes; the class method shows again
            else:
                setattr(obj, attr, orig)


@contextlib.contextmanager
def tagged(eng):
    """Ranges on the model (:class:`Tagger`), around the decode step and around the sampler."""
    from quarl.engine import generator as G

    pack = eng.runner._lora
    packed = {id(m) for groups in (pack.layers if pack is not None else []) for g in groups.values() for m in g.mods}
    tg = Tagger(eng.model, packed)
    orig_decode, orig_sample = eng._decode, G.sample

    def decode(*a, **k):
        with record_function("decode_step"):
            return orig_decode(*a, **k)

    def sample(*a, **k):
        with record_function("sampling"):
            return orig_sample(*a, **k)

    eng._decode, G.sample = decode, sample
    try:
        yield
    finally:
        eng._decode, G.sample = orig_decode, orig_sample
        tg.remove()


def _chain(e) -> list[str]:
    out = []
    while e is not None:
        out.append(e.name)
        e = e.cpu_parent
    return out


def classify(chain: list[str]) -> str:
    """Category of a kernel launched under the CPU ranges ``chain`` (innermost first)."""
    if "sampling" in chain:
        return "sampling"
    if "decode_step" not in chain:
        return "loop"
    tag = next((c for c in chain if c.startswith("mod:") or c == "lora"), None)  # the innermost tag
    if tag == "lora":
        return "lora"
    if tag == "mod:lm_head":
        return "lm_head"
    if tag == "mod:embed":
        return "embed"
    if tag is not None:
        inner = chain[: chain.index(tag)]
        if inner and inner[-1] == "aten::add":  # QuantLinear's `y + bias` (nn.Linear fuses it into addmm)
            return "bias"
        return PROJ_GROUP[tag[4:]]
    for c in chain:
        for pat, cat in GLUE_RULES:
            if pat in c:
                return cat
    return "other_glue"


TAGS = ("decode_step", "sampling", "lora", "mod:")


def _device_events(prof):
    """GPU kernels, memcpys and memsets -- not the GPU-side mirrors of our ``record_function`` ranges
    (Kineto's gpu_user_annotation events, also DeviceType.CUDA, which span whole ranges)."""
    return [e for e in prof.events() if e.device_type == DeviceType.CUDA and not e.name.startswith(TAGS)]


def by_name(events, steps: int, top: int = 16, minus: dict | None = None) -> dict:
    """``{kernel name: {"us": us per step, "n": launches per step}}`` of device ``events`` (objects with ``.name`` and
    ``.time_range.elapsed_us()``), the ``top`` by time; ``minus`` (the same form, totals over the run): the kernels
    some CPU op already claimed, taken off name by name first -- what is left is the GPU work nobody claimed."""
    us, n = collections.Counter(), collections.Counter()
    for e in events:
        name = e.name[:90]
        us[name] += e.time_range.elapsed_us()
        n[name] += 1
    for name, v in (minus or {}).items():
        us[name] -= v["us"]
        n[name] -= v["n"]
    keep = [k for k, v in us.most_common() if n[k] > 0 and v > 0][:top]
    return {k: {"us": us[k] / steps, "n": n[k] / steps} for k in keep}


def attribute(prof, cuda: bool) -> tuple[dict, dict, dict]:
    """(us per category, kernel count per category, top kernel names of other_glue)."""
    us, count = collections.Counter(), collections.Counter()
    other = collections.Counter()
    claimed: dict = collections.defaultdict(lambda: {"us": 0.0, "n": 0})  # kernel name -> what CPU ops claimed
    for e in prof.events():
        if e.device_type != DeviceType.CPU:
            continue
        if cuda:
            items = [(k.name, k.duration) for k in e.kernels]
            for name, dur in items:
                claimed[name[:90]]["us"] += dur
                claimed[name[:90]]["n"] += 1
        elif not e.cpu_children and not e.name.startswith(TAGS):
            items = [(e.name, e.self_cpu_time_total)]  # CPU dry run: leaf ops stand in for kernels
        else:
            items = []
        if not items:
            continue
        cat = classify(_chain(e))
        for name, dur in items:
            us[cat] += dur
            count[cat] += 1
            if cat == "other_glue":
                other[f"{e.name} | {name[:80]}"] += dur
    if cuda:  # GPU work no CPU op claimed (should be ~0; the check that the attribution is complete)
        dev = _device_events(prof)
        us["unattributed"] = max(0.0, sum(e.time_range.elapsed_us() for e in dev) - sum(us.values()))
        count["unattributed"] = max(0, len(dev) - sum(count.values()))
        unclaimed = by_name(dev, 1, 8, minus=claimed)  # totals over the run; the caller divides by the steps
        other.update({f"(unattributed) | {k}": v["us"] for k, v in unclaimed.items()})
    return dict(us), dict(count), dict(other.most_common(12))


def _sync():
    if R.DEVICE == "cuda":
        torch.cuda.synchronize()


def _activities():
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if R.DEVICE == "cuda" else [])


def generate_check(eng, rows, n: int, gen, calls: int = 3) -> dict:
    """The real ``generate``'s step: ``(t(n) - t(n0)) / (n - n0)`` with ``n0 = n // 4`` (at least 2) new tokens, each
    length the fastest of ``calls`` timed calls after a warm-up. Both lengths include the prefill, whose time swings
    by tens of ms a call on the 14B model (0.21-0.36 s over one session's calls), so the difference wants many tokens
    and the fastest calls: session 40's first form, ``(t(33) - t(1)) / 32`` from one call each, read 2.33 and 3.06 ms
    against a 4.97-ms loop, and ``t(33) - t(8)`` from the faster of two read -2.1 ms."""
    from quarl.engine.rollout import SamplingParams

    def timed(k: int) -> float:
        return R.fastest_s(lambda: eng.generate(rows, SamplingParams(1.0, 1.0, k, []), 1, gen), calls)

    n0 = max(2, n // 4)
    if n <= n0:
        raise ValueError(f"--check-tokens {n}: needs at least {n0 + 1} (two lengths to difference)")
    eng.generate(rows, SamplingParams(1.0, 1.0, n0, []), 1, gen)
    t0, tn = timed(n0), timed(n)
    return {"generate_step_ms": (tn - t0) / (n - n0) * 1e3, "generate_tokens": [n0, n], "generate_s": [t0, tn]}


def profile_cell(model, batch: int, prompt: int, steps: int, prof_steps: int, check_tokens: int,
                 lora_pack: bool, out: dict) -> dict:
    """Fills ``out`` view by view (a failure in a later view keeps the earlier ones)."""
    from quarl.engine import FastGenerator
    from quarl.engine import generator as G

    rows = R._prompts(batch, prompt, model.config.vocab_size)
    gen = torch.Generator(R.DEVICE).manual_seed(0)
    graphs = R.DEVICE == "cuda"
    out["lora_pack"] = lora_pack
    total = 2 + steps + 2 * prof_steps + 4  # decode steps the loop takes after generate's first two (+ margin)
    eng = FastGenerator(model, R.PAD, kv_block=256, sync_every=64, lora_pack=lora_pack)
    eng.warmup(batch, prompt, max(total, check_tokens) + 2)  # one cache and graph set for every call below
    if check_tokens:  # the real generate (its prefill subtracted): the loop must match it
        out.update(generate_check(eng, rows, check_tokens, gen))

    # 1. step ms, graphed, no profiler
    st, carry = start_loop(eng, rows, total, gen)
    B = G._pow2(batch) if graphs else batch  # the graph batch (rows [batch, B) inert), as generate pads
    decode_loop(eng, st, batch, B, 2, gen, graphs, carry)
    _sync()
    t = time.perf_counter()
    decode_loop(eng, st, batch, B, steps, gen, graphs, carry)
    _sync()
    out["step_ms"] = (time.perf_counter() - t) / steps * 1e3
    out["graphs"] = len(eng._graphs)
    out["graph_error"] = eng.graph_error

    # 2. graphed kernels under CUPTI
    with profile(activities=_activities()) as prof:
        decode_loop(eng, st, batch, B, prof_steps, gen, graphs, carry)
        _sync()
    dev = _device_events(prof)
    out["graphed_kernel_ms"] = sum(e.time_range.elapsed_us() for e in dev) / prof_steps / 1e3
    out["graphed_kernels_per_step"] = len(dev) / prof_steps
    out["graphed_by_name"] = by_name(dev, prof_steps)  # what the step's kernels are, by time
    out["idle_ms"] = out["step_ms"] - out["graphed_kernel_ms"]
    del prof, dev

    # 3. attributed kernels: the same engine, cache and loop without graphs, every range tagged
    eng.cuda_graphs = False  # _step now runs the step eagerly over the exact length
    decode_loop(eng, st, batch, B, 1, gen, False, carry)  # eager warm-up of this path
    _sync()
    with tagged(eng):
        with profile(activities=_activities()) as prof:
            decode_loop(eng, st, batch, B, prof_steps, gen, False, carry)
            _sync()
        us, count, other = attribute(prof, cuda=R.DEVICE == "cuda")
    out["attributed_ms"] = {c: us.get(c, 0.0) / prof_steps / 1e3 for c in CATEGORIES}
    out["attributed_kernels_per_step"] = {c: count.get(c, 0) / prof_steps for c in CATEGORIES}
    out["attributed_kernel_ms"] = sum(out["attributed_ms"].values())
    out["other_glue_top_us"] = {k: v / prof_steps for k, v in other.items()}  # with the unattributed kernels' names
    out["prof_steps"] = prof_steps
    out["context"] = [prompt + 2, carry["t"] + prompt]
    eng.release()
    return out


@torch.no_grad()
def logprob_check(model, lora_pack: bool, prompt: int = 256, rows: int = 8, tokens: int = 64) -> dict:
    """Rollout log-probs vs the trainer's full forward on the same sampled rollout (the mismatch RL
    sees; ``benchmarks/rollout.py``'s check), with the packed adapters on or off."""
    from quarl.engine import FastGenerator
    from quarl.engine.rollout import SamplingParams

    ids = R._prompts(rows, prompt, model.config.vocab_size, seed=1)
    eng = FastGenerator(model, R.PAD, lora_pack=lora_pack)
    roll = eng.generate(ids, SamplingParams(1.0, 1.0, tokens, []), 1, torch.Generator(R.DEVICE).manual_seed(1))
    eng.release()
    logits = model(input_ids=roll.input_ids).logits[:, prompt - 1 : -1].float()  # [rows, tokens, V]
    ref = torch.log_softmax(logits, -1).gather(-1, roll.completion_ids[..., None]).squeeze(-1)
    d = (roll.logprobs - ref).abs()
    return {"lora_pack": lora_pack, "mean_abs": float(d.mean()), "max_abs": float(d.max()), "rows": rows,
            "tokens": tokens, "prompt": prompt}


MODIFIERS = {  # ':name' -> the engine switch (env, value) it sets for the cell: the before (or after) of a change
    "nopack": None,  # FastGenerator(lora_pack=False)
    "noepi": ("QUARL_ENGINE_LORA_EPILOGUE", "0"),  # LoRA B + bias as addmm / add, not in the base kernel's last pass
    "sdpa": ("QUARL_ENGINE_DECODE_ATTN", "0"),  # decode attention through SDPA, not the split-KV kernel
    "noloraa": ("QUARL_ENGINE_LORA_A", "0"),  # the packed A GEMM on cuBLAS, not inside the first projection's launch
    "nogroup": ("QUARL_GEMV_GROUP", "0"),  # a group's weights as one launch each, not one launch
    "nommagroup": ("QUARL_MMA_GROUP", "0"),  # a 2..16-row group's weights as one mma.sync launch each, not one
    "nogrouppass": ("QUARL_GROUP_PASS", "0"),  # a group launch's last passes one launch each, not one for the group
    "rope": ("QUARL_ENGINE_GROUP_ROPE", "1"),  # the decode RoPE + K/V write in the q/k/v pass (the default since s13)
    "norope": ("QUARL_ENGINE_GROUP_ROPE", "0"),  # ... in a RoPE kernel of its own after the pass (before s13)
    "h200gemv": ("QUARL_KERNELS_GEMV_DEFAULTS", "h200"),  # the one-row GEMV's config 0 everywhere (before session 12)
    "ring": ("QUARL_KERNELS_WGMMA_RING", "1"),  # 17..64 rows on large FP4 weights: the TMA-ring kernel (session 14)
    "noring": ("QUARL_KERNELS_WGMMA_RING", "0"),  # ... through wgmma_decode / mma_decode (before session 14)
    "nopdl": ("QUARL_KERNELS_PDL", "0"),  # no programmatic dependent launch (before s16: pdl.py)
    "earlypdl": ("QUARL_KERNELS_PDL", "early"),  # PDL with every kernel signalling first thing (not kept, s16)
    "nowide": ("QUARL_KERNELS_RING_WIDE_MAX_M", "0"),  # 65+ rows: no wide ring tiles (Triton / dense, before s15)
    "rowmajor": ("QUARL_KERNELS_BLOCKED", "0"),  # packed words row-major, not in [64, 8] blocks (before s21)
    "nowgrules": None,  # wgmma_decode's NVFP4 rules for 14B-sized k / v and q / o off (before s19): wgmma_rules_off()
    "fusedsample": ("QUARL_ENGINE_FUSED_SAMPLE", "1"),  # the Triton sampler (the default since session 39)
    "torchsample": ("QUARL_ENGINE_FUSED_SAMPLE", "0"),  # ... PyTorch's ops instead (before session 39)
}


@contextlib.contextmanager
def wgmma_rules_off():
    """``:nowgrules``: ``wgmma_decode``'s two NVFP4 rules for the 14B-sized weights off (session 19, phase i: measured
    as the ``:wgrules`` experiment of commit d2fc76c and adopted) -- k / v at 33..64 rows on the Triton tensor-core
    kernel again, q / o at 17..32 rows on config 2."""
    from quarl_kernels import wgmma_decode as wd

    with unittest.mock.patch.object(wd, "MID_MIN_WEIGHTS", wd.LARGE_MIN_WEIGHTS), \
            unittest.mock.patch.object(wd, "WIDE_N_NT32", 1 << 30):
        yield


def parse_variant(v: str) -> tuple[str, bool, bool, tuple[tuple[str, str], ...]]:
    """``nvfp4+lora32:nopack`` -> (recipe ``nvfp4+lora``, fp32 adapter, packed adapters on?, engine switches
    ``(env, value)`` for the cell)."""
    name, *mods = v.split(":")
    bad = [m for m in mods if m not in MODIFIERS]
    if bad:
        raise SystemExit(f"variant {v!r}: unknown modifier(s) {bad}; known: {', '.join(MODIFIERS)}")
    fp32 = name.endswith("+lora32")
    recipe = name[:-2] if fp32 else name
    if recipe not in R.RECIPES:
        raise SystemExit(f"variant {v!r}: unknown recipe {recipe!r}; known: {', '.join(R.RECIPES)} (+lora32 for fp32 LoRA)")
    return recipe, fp32, "nopack" not in mods, tuple(MODIFIERS[m] for m in mods if MODIFIERS[m])


def switches(pairs: tuple[tuple[str, str], ...]):
    """The engine switches set as ``pairs`` say for the block (engines built inside read them)."""
    return unittest.mock.patch.dict(os.environ, dict(pairs))


# --- the run ---------------------------------------------------------------------------------------
def build_model(mname: str, recipe: str, fp32: bool = False):
    """``benchmarks/rollout.py``'s model ``mname`` quantized by ``recipe``, its LoRA B drawn (a trained adapter is not
    zero: the GEMMs do not care, the values do) and, with ``fp32``, the adapter in fp32 (the trainer's,
    ``quarl.train.policy``). Also ``gemv_split_step.py``'s model."""
    from quarl.quant import quantize_model

    model = R.build_model(R.qwen25_config(mname))
    if R.RECIPES[recipe] is not None:
        quantize_model(model, R.RECIPES[recipe])
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for n, p in model.named_parameters():
            if n.endswith("lora_B"):
                p.normal_(0, 0.02)
            if fp32 and ("lora_A" in n or "lora_B" in n):
                p.data = p.data.float()
    return model


def run(args) -> dict:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "profile.json"
    budget = R.Budget(args.budget_s)
    res = {"env": R.environment(), "args": vars(args), "cells": [], "notes": []}
    batches = [int(b) for b in args.batches.split(",")]
    plan = [(m, v) for m in args.models.split(",") for v in args.variants.split(",")]
    for _, v in plan:
        parse_variant(v)

    def save():
        path.write_text(json.dumps(res, indent=1, default=str))

    built, model = None, None
    for mname, variant in plan:
        recipe, fp32, pack, env = parse_variant(variant)
        if budget.left() < args.min_cell_s:
            res["notes"].append(f"{mname}/{variant}: not run (time budget, {budget.left():.0f}s left)")
            save()
            continue
        if built != (mname, recipe, fp32):  # consecutive variants that differ only in modifiers share it
            model = None
            gc.collect()
            if R.DEVICE == "cuda":
                torch.cuda.empty_cache()
            t = time.perf_counter()
            model = build_model(mname, recipe, fp32)
            _sync()
            built, build_s = (mname, recipe, fp32), time.perf_counter() - t
        meta = {"model": mname, "variant": variant, "kernel": R.selected_kernel(model), "build_quantize_s": build_s,
                "adapter_dtype": "fp32" if fp32 else ("bf16" if "lora" in recipe else None)}
        print(f"== {meta}", flush=True)
        for b in batches:
            cell = {**meta, "batch": b, "prompt": args.prompt}
            if budget.left() < args.min_cell_s:
                cell["skipped"] = f"time budget ({budget.left():.0f}s left)"
            else:
                t = time.perf_counter()
                check = args.check_tokens if b <= args.check_max_batch else 0
                try:
                    with switches(env), (wgmma_rules_off() if ":nowgrules" in variant else contextlib.nullcontext()):
                        profile_cell(model, b, args.prompt, args.steps, args.prof_steps, check, pack, cell)
                except Exception as e:  # noqa: BLE001 - record and go on
                    cell["error"] = f"{type(e).__name__}: {e}"
                    traceback.print_exc()
                cell["cell_s"] = time.perf_counter() - t
                gc.collect()  # a failed cell's engine (KV cache, graphs) goes now, not at the next model
                if R.DEVICE == "cuda":
                    torch.cuda.empty_cache()
            res["cells"].append(cell)
            save()
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in cell.items()
                              if k in ("batch", "step_ms", "generate_step_ms", "graphed_kernel_ms", "idle_ms",
                                       "attributed_kernel_ms", "cell_s", "error", "skipped")}), flush=True)
        if "lora" in recipe and budget.left() > args.min_cell_s + 10:
            try:
                with switches(env):
                    res.setdefault("checks", {})[f"{mname}/{variant}"] = logprob_check(model, pack)
            except Exception as e:  # noqa: BLE001
                res.setdefault("checks", {})[f"{mname}/{variant}"] = {"error": f"{type(e).__name__}: {e}"}
                traceback.print_exc()
            print("check", variant, res["checks"][f"{mname}/{variant}"], flush=True)
            save()
    save()
    return res


def tables(res: dict) -> str:
    """Per (model, variant): a row per category, a column per batch (ms per decode step), then the totals."""
    cells = [c for c in res["cells"] if "attributed_ms" in c]
    bad = [f"{c['variant']} b{c['batch']}: {c.get('error') or c.get('skipped')}" for c in res["cells"]
           if "attributed_ms" not in c]
    out = []
    for key in dict.fromkeys((c["model"], c["variant"]) for c in cells):
        cs = [c for c in cells if (c["model"], c["variant"]) == key]
        out.append(f"{key[0]} {key[1]} (context {cs[0]['context'][0]}..{cs[0]['context'][1]}, kernel "
                   f"{cs[0]['kernel']}, adapter {cs[0].get('adapter_dtype')}, lora_pack {cs[0].get('lora_pack')})\n")
        lines = ["| ms per decode step | " + " | ".join(f"batch {c['batch']}" for c in cs) + " |",
                 "|---|" + "---:|" * len(cs)]
        for cat in CATEGORIES:
            vals = [c["attributed_ms"][cat] for c in cs]
            if any(v > 0 for v in vals):
                lines.append(f"| {cat} | " + " | ".join(
                    f"{v:.3f} ({100 * v / c['step_ms']:.0f}%)" for v, c in zip(vals, cs)) + " |")
        rows = [("kernels, attributed (eager) sum", "attributed_kernel_ms"),
                ("kernels, graphed run (CUPTI) sum", "graphed_kernel_ms"),
                ("GPU idle: step - graphed kernels", "idle_ms"),
                ("**step ms** (graphed loop, wall)", "step_ms"),
                ("step ms of `generate` (check)", "generate_step_ms")]
        for label, k in rows:
            lines.append(f"| {label} | " + " | ".join(f"{c[k]:.3f}" if k in c else "-" for c in cs) + " |")
        lines.append("| kernels per step (graphed) | " + " | ".join(f"{c['graphed_kernels_per_step']:.0f}" for c in cs)
                     + " |")
        lines.append("| LoRA kernels per step (attributed) | " + " | ".join(
            f"{c['attributed_kernels_per_step']['lora']:.0f}" for c in cs) + " |")
        out.append("\n".join(lines) + "\n")
        for c in cs:  # the graphed step's kernels by name: what the categories above are made of
            top = c.get("graphed_by_name") or {}
            if top:
                out.append(f"batch {c['batch']}, graphed kernels by time (us a step, launches a step):\n" + "\n".join(
                    f"  {v['us']:8.1f} us {v['n']:6.1f}x  {k}" for k, v in top.items()) + "\n")
            glue = c.get("other_glue_top_us") or {}
            if glue:
                out.append(f"batch {c['batch']}, other_glue / unattributed kernels (us a step):\n" + "\n".join(
                    f"  {v:8.1f} us  {k}" for k, v in glue.items()) + "\n")
    checks = res.get("checks", {})
    if checks:
        out.append("rollout log-prob vs trainer forward (|delta|, batch 8, 64 tokens):\n" + "\n".join(
            f"  {k}: " + (f"mean {v['mean_abs']:.4f}, max {v['max_abs']:.4f}" if "mean_abs" in v else v.get("error", "?"))
            for k, v in checks.items()) + "\n")
    notes = res.get("notes") or []  # e.g. variants the time budget did not reach
    return ("\n".join(out) + ("\nnot profiled: " + "; ".join(bad) + "\n" if bad else "")
            + ("\nnotes: " + "; ".join(notes) + "\n" if notes else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="7b")
    ap.add_argument("--variants", default="bf16,nvfp4,nvfp4+lora32:nopack,nvfp4+lora32,nvfp4+lora:nopack,nvfp4+lora",
                    help="recipes of benchmarks/rollout.py; +lora32: the adapter in fp32 (the trainer's); "
                         ":nopack: FastGenerator(lora_pack=False), the module-by-module LoRA (before issue 17's fix)")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--prompt", type=int, default=1024, help="context the profiled steps start from")
    ap.add_argument("--steps", type=int, default=64, help="decode steps timed (no profiler)")
    ap.add_argument("--prof-steps", type=int, default=8, help="decode steps under the profiler (each view)")
    ap.add_argument("--check-tokens", type=int, default=129,
                    help="new tokens of the longer timed real generate call (the shorter: a quarter of it)")
    ap.add_argument("--check-max-batch", type=int, default=8, help="the generate check only up to this batch "
                    "(two more prefills of the whole prompt each)")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--min-cell-s", type=float, default=15.0, help="a cell starts only with this much budget left")
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run with --models tiny")
    ap.add_argument("--report", help="print the tables of a finished run's profile.json and exit")
    args = ap.parse_args(argv)
    if args.report:
        print(tables(json.loads(Path(args.report).read_text())))
        return 0
    R.DEVICE = args.device
    if R.DEVICE == "cuda" and not torch.cuda.is_available():
        print("rollout_profile.py needs CUDA (or --device cpu --models tiny for a dry run)", file=sys.stderr)
        return 2
    res = run(args)
    print("notes:", res["notes"])
    print(tables(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
