"""Measuring a per-layer format assignment on a real model, fast enough to search.

    units = build_units(model, exclude, "block")            # what one decision covers
    ev = ModelEvaluator(model, units, formats, ids)          # caches every (linear, format) weight once
    ev.measure((2, 1, None, ...))                            # -> Measurement (loss, KL, entropy, bits)

Speed is everything here: a search measures hundreds of recipes on CPU. So

* every (linear, format) weight is quantized **once** (RTN, or a quick GPTQ with
  Hessians of the search batch, inputs from the unquantized model), and stored
  dequantized; applying a recipe is swapping ``weight.data`` pointers, no
  arithmetic (memory: one float copy of the searched weights per format);
* the search batch is fixed (``[B, L]`` token ids), and the decoder blocks are
  run one by one with the keyword arguments the model itself passed to its
  first block (rotary embeddings, causal mask), captured once by a hook. The
  hidden state entering block ``b`` depends only on the formats of the units
  in blocks ``< b``, so it is cached under that prefix (LRU): an episode that
  shares its first ``k`` blocks with an earlier one starts at block ``k``. The
  single-unit sensitivity sweep and a converging policy both hit this often;
* recipes already measured are memoised whole.

A unit whose format is ``None`` keeps its original weight (the source
precision; its storage is counted as BF16, 16 bits). With ``recovery_steps``
> 0 each measurement first runs that many Adam steps on the RMSNorm gains to
pull the quantized model's next-token distribution back to the reference (a
short recovery fine-tune on the search batch); the gains are restored after,
and the prefix cache is not used (the gains change every block).
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from quarl.calibrate.gptq import HessianAccumulator, gptq_quantize
from quarl.quant.base import QuantError, get_format
from quarl.quant.model import FUSED_GROUPS, QuantRecipe, _shared_states, plan_formats
from quarl.quant.spec import make_config, spec_string
from quarl.search.reward import BF16_BITS, Measurement, average_bits

log = logging.getLogger(__name__)
VLLM_FUSED = {("q_proj", "k_proj", "v_proj"): "qkv_proj", ("gate_proj", "up_proj"): "gate_up_proj"}


@dataclass(frozen=True)
class Unit:
    """One decision of an episode: a set of linear layers that get the same format."""

    name: str  # e.g. "model.layers.3" or "model.layers.3.mlp"
    pattern: str  # recipe glob selecting exactly these linears
    linears: tuple[str, ...]
    block: int  # decoder block index
    kind: str  # block | self_attn | mlp | <projection name>
    params: int


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The decoder blocks: the first ModuleList whose entries hold linear layers (``model.layers``)."""
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) and any(isinstance(m, nn.Linear) for m in mod[0].modules()):
            return name, mod
    raise QuantError("precision_search: the model has no list of decoder blocks (an nn.ModuleList of layers)")


def build_units(model: nn.Module, exclude: list[str], granularity: str) -> list[Unit]:
    """Partition the searchable linears (all not excluded) into decision units, in forward order."""
    prefix, blocks = find_blocks(model)
    names = list(plan_formats(model, QuantRecipe(default="bf16", exclude=list(exclude))))
    mods = dict(model.named_modules())
    groups: dict[tuple, list[str]] = {}
    for n in names:
        head = f"{prefix}."
        if not n.startswith(head) or not n[len(head):].split(".", 1)[0].isdigit():
            raise QuantError(f"precision_search: linear {n} is outside the decoder blocks; add it to `exclude`")
        b_str, rest = n[len(head):].split(".", 1)
        b = int(b_str)
        if granularity == "block":
            key = (b, "block", f"{prefix}.{b}")
        elif granularity == "group":
            sub = rest.split(".", 1)[0]
            key = (b, sub, f"{prefix}.{b}.{sub}")
        elif granularity == "fused":  # the shards an inference engine fuses (q/k/v, gate/up) decide together
            parent, _, leaf = rest.rpartition(".")
            group = next((g for g in FUSED_GROUPS if leaf in g), (leaf,))
            kind = VLLM_FUSED.get(group, leaf)  # vLLM's names: qkv_proj, gate_up_proj
            key = (b, kind, f"{prefix}.{b}.{parent}.{kind}" if parent else f"{prefix}.{b}.{kind}")
        else:
            key = (b, rest.rsplit(".", 1)[-1], n)
        groups.setdefault(key, []).append(n)
    units = []
    for key, lins in groups.items():  # dict order = named_modules order = forward order
        b, kind, uname = key[:3]
        if granularity == "fused" and len(lins) > 1:  # re:model\.layers\.3\.self_attn\.(q_proj|k_proj|v_proj)
            head = lins[0].rpartition(".")[0]
            pattern = f"re:{re.escape(head)}\\.({'|'.join(n.rpartition('.')[2] for n in lins)})"
        elif granularity in ("linear", "fused"):
            pattern = uname
        else:
            pattern = f"{uname}.*"
        params = sum(mods[n].weight.numel() for n in lins)
        units.append(Unit(uname, pattern, tuple(lins), b, kind, params))
    if not units:
        raise QuantError("precision_search: no linear layer to search over; check `exclude`")
    assert len(blocks) > max(u.block for u in units)
    return units


def to_recipe(units: list[Unit], formats: list[str], assignment, exclude: list[str], model=None) -> dict:
    """A quarl.quant recipe dict for ``assignment`` (format index per unit): default = the most used format.

    With ``model``, the recipe is planned on it and checked to give every linear its chosen format.
    """
    specs = [spec_string(make_config(formats[a])) for a in assignment]
    default = max(dict.fromkeys(specs), key=specs.count)  # most common; ties -> first used
    overrides = [{"pattern": u.pattern, "format": s} for u, s in zip(units, specs, strict=True) if s != default]
    recipe = {"default": default, "overrides": overrides, "exclude": list(exclude)}
    if model is not None:
        plan = plan_formats(model, QuantRecipe.load(recipe))
        for u, s in zip(units, specs, strict=True):
            for n in u.linears:
                if spec_string(plan[n]) != s:
                    raise QuantError(f"recipe round trip: {n} plans as {spec_string(plan[n])}, chosen {s}")
    return recipe


def _logits_metrics(logits: torch.Tensor, ids: torch.Tensor, ref_logp: torch.Tensor | None):
    lq = logits.float().log_softmax(-1)  # [B, L, V]
    loss = float(-lq[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).mean())
    if ref_logp is None:
        return loss, 0.0, 0.0
    kl_qr = float((lq.exp() * (lq - ref_logp)).sum(-1).mean())  # KL(p_q || p_ref), per position
    kl_rq = float((ref_logp.exp() * (ref_logp - lq)).sum(-1).mean())
    return loss, kl_qr, kl_rq


class ModelEvaluator:
    """Loss, KL to the unquantized model, attention entropy and bits of a format assignment on a fixed batch."""

    def __init__(self, model: nn.Module, units: list[Unit], formats: list[str], ids: torch.Tensor, *,
                 method: str = "rtn", measure_entropy: bool = True, recovery_steps: int = 0,
                 recovery_lr: float = 1e-3, max_cached: int = 1024, progress: bool = True):
        self.model, self.units, self.formats = model.eval(), units, list(formats)
        self.configs = [make_config(f) for f in formats]
        self.ids = ids  # [B, L]
        self.measure_entropy, self.recovery_steps, self.recovery_lr = measure_entropy, recovery_steps, recovery_lr
        if measure_entropy:
            model.set_attn_implementation("eager")  # sdpa never materialises the attention probabilities
        _, self.blocks = find_blocks(model)
        self.mods = dict(model.named_modules())
        self.original = {n: self.mods[n].weight.data for u in units for n in u.linears}
        self.first_unit = [next((i for i, u in enumerate(units) if u.block >= b), len(units))
                           for b in range(len(self.blocks) + 1)]
        self._ent: list[float] = []
        for blk in self.blocks:
            attn = next((m for n, m in blk.named_modules() if n.endswith("attn")), None)
            if measure_entropy and attn is not None:
                attn.register_forward_hook(self._entropy_hook)
        self.params = [u.params for u in units]
        self.weights, self.bits = self._quantize_all(method, progress)  # weights[u][f][linear], bits[u][f]
        self._prefix: OrderedDict[tuple, tuple[torch.Tensor, float]] = OrderedDict()
        self.max_cached = max_cached
        self._memo: dict[tuple, Measurement] = {}
        self._other_refs: dict[tuple, tuple[torch.Tensor, Measurement]] = {}  # measure_on's references
        self.block_runs = 0  # decoder blocks run: block_runs / len(blocks) = forward-pass equivalents
        self.evaluations = 0  # measure() calls that were not memoised
        self.ref = self._reference()

    # ---------------------------------------------------------------- setup
    def _entropy_hook(self, mod, args, out) -> None:
        p = out[1] if isinstance(out, tuple) and len(out) > 1 else None
        if p is not None:  # [B, H, L, L], rows sum to 1 (causal: zeros above the diagonal)
            p = p.detach()
            self._ent.append(float(-(p * p.clamp_min(1e-12).log()).sum(-1).mean()))

    @torch.no_grad()
    def _quantize_all(self, method: str, progress: bool):
        hess = self._hessians() if method == "gptq" else {}
        weights = [[{} for _ in self.formats] for _ in self.units]
        bits = [[0.0] * len(self.formats) for _ in self.units]
        work = [(fi, cfg) for fi, cfg in enumerate(self.configs)]
        bar = tqdm(total=len(work) * len(self.units), desc="precision_search: quantize", disable=not progress)
        for fi, cfg in work:
            states = {}
            if cfg is not None:  # what calibrate shares: fused shards' per-tensor state, never a cursor (NF4-DQ)
                states = {n: st for n, st in _shared_states(self.model, {n: cfg for n in self.original}).items()
                          if "next_group" not in st}
            for ui, u in enumerate(self.units):
                nbits = 0.0
                for n in u.linears:
                    w = self.original[n]
                    if cfg is None:
                        weights[ui][fi][n], b = w, BF16_BITS
                    else:
                        try:
                            if method == "gptq":
                                r = gptq_quantize(w.float(), hess[n].H, cfg, state=states.get(n))
                                q, nbytes = r.q, r.qtensor.nbytes
                            else:
                                qt = get_format(cfg.name).quantize(w.float(), cfg, state=states.get(n))
                                q, nbytes = qt.dequantize(torch.float32), qt.nbytes
                        except QuantError as e:
                            raise QuantError(f"format {self.formats[fi]} cannot quantize {n}: {e}") from None
                        weights[ui][fi][n], b = q.to(w.dtype), 8.0 * nbytes / w.numel()
                    nbits += b * w.numel()
                bits[ui][fi] = nbits / u.params
                bar.update()
        bar.close()
        return weights, bits

    def _hessians(self) -> dict[str, HessianAccumulator]:
        hess, hooks = {}, []
        for n in self.original:
            acc = hess[n] = HessianAccumulator(self.mods[n].in_features)
            hooks.append(self.mods[n].register_forward_hook(lambda m, a, o, acc=acc: acc.add(a[0])))
        self.model(input_ids=self.ids, use_cache=False)
        for h in hooks:
            h.remove()
        return hess

    @torch.no_grad()
    def _reference(self) -> Measurement:
        captured = {}

        def grab(mod, args, kwargs):
            captured["hidden"], captured["kwargs"] = args[0] if args else kwargs.pop("hidden_states"), kwargs

        h = self.blocks[0].register_forward_pre_hook(grab, with_kwargs=True)
        self._ent.clear()
        out = self.model(input_ids=self.ids, use_cache=False)
        h.remove()
        self.layer_kwargs = dict(captured["kwargs"])
        self._embeddings = captured["hidden"]  # [B, L, D]: the input of block 0, for every recipe
        self.ref_logp = out.logits.float().log_softmax(-1)  # [B, L, V]
        loss, _, _ = _logits_metrics(out.logits, self.ids, None)
        ent = sum(self._ent) / len(self._ent) if self._ent else 0.0
        return Measurement(loss=loss, kl=0.0, entropy=ent, avg_bits=BF16_BITS)

    # -------------------------------------------------------------- measure
    def avg_bits(self, assignment) -> float:
        bits = [BF16_BITS if a is None else self.bits[i][a] for i, a in enumerate(assignment)]  # None: original
        return average_bits(bits, self.params)

    def _set_unit(self, i: int, a: int | None) -> None:
        src = self.original if a is None else self.weights[i][a]
        for n in self.units[i].linears:
            self.mods[n].weight.data = src[n]

    def measure(self, assignment) -> Measurement:
        """Measure a full or partial assignment (format index per unit, None = unchanged)."""
        assignment = tuple(assignment) + (None,) * (len(self.units) - len(assignment))
        # a high-precision format is the original weight: one key, so bf16 and "unchanged" share caches
        assignment = tuple(None if a is None or self.configs[a] is None else a for a in assignment)
        if assignment in self._memo:
            return self._memo[assignment]
        self.evaluations += 1
        m = self._measure_recovered(assignment) if self.recovery_steps else self._measure_cached(assignment)
        self._memo[assignment] = m
        return m

    @torch.no_grad()
    def _measure_cached(self, a: tuple) -> Measurement:
        nb = len(self.blocks)
        start = next((b for b in range(nb, 0, -1) if a[: self.first_unit[b]] in self._prefix), 0)
        if start:
            hidden, ent = self._prefix[a[: self.first_unit[start]]]
            self._prefix.move_to_end(a[: self.first_unit[start]])
        else:
            hidden, ent = self._embeddings, 0.0  # never evicted
        for b in range(start, nb):
            for i in range(self.first_unit[b], self.first_unit[b + 1]):
                self._set_unit(i, a[i])
            self._ent.clear()
            out = self.blocks[b](hidden, **self.layer_kwargs)
            hidden = out[0] if isinstance(out, tuple) else out  # [B, L, D]
            ent += sum(self._ent)
            self.block_runs += 1
            self._prefix[a[: self.first_unit[b + 1]]] = (hidden, ent)
            while len(self._prefix) > self.max_cached:
                self._prefix.popitem(last=False)
        base = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
        logits = self.model.get_output_embeddings()(base.norm(hidden))
        loss, kl, kl_rq = _logits_metrics(logits, self.ids, self.ref_logp)
        return Measurement(loss, kl, ent / nb if self.measure_entropy else 0.0, self.avg_bits(a), kl_rq)

    def _measure_recovered(self, a: tuple) -> Measurement:
        for i, ai in enumerate(a):
            self._set_unit(i, ai)
        gains = [p for n, p in self.model.named_parameters() if "norm" in n and p.dim() == 1]
        saved = [g.detach().clone() for g in gains]
        req = {n: p.requires_grad for n, p in self.model.named_parameters()}
        for p in self.model.parameters():
            p.requires_grad_(False)
        for g in gains:
            g.requires_grad_(True)
        opt = torch.optim.Adam(gains, lr=self.recovery_lr)
        with torch.enable_grad():  # measure() may be called under no_grad (the agent's rollout)
            for _ in range(self.recovery_steps):
                lq = self.model(input_ids=self.ids, use_cache=False).logits.float().log_softmax(-1)  # [B, L, V]
                loss = F.kl_div(lq, self.ref_logp, log_target=True, reduction="batchmean")  # KL(ref || quant)
                opt.zero_grad()
                loss.backward()
                opt.step()
        with torch.no_grad():
            self._ent.clear()
            out = self.model(input_ids=self.ids, use_cache=False)
            ent = sum(self._ent) / len(self._ent) if self._ent else 0.0
            for g, s in zip(gains, saved, strict=True):
                g.copy_(s)
        for n, p in self.model.named_parameters():
            p.requires_grad_(req[n])
        self.block_runs += (self.recovery_steps + 1) * len(self.blocks)
        loss, kl, kl_rq = _logits_metrics(out.logits, self.ids, self.ref_logp)
        return Measurement(loss, kl, ent, self.avg_bits(a), kl_rq)

    @torch.no_grad()
    def measure_on(self, ids: torch.Tensor, assignment) -> Measurement:
        """Measure on another batch (selection, held-out), full forward passes; its reference computed once."""
        key = (ids.data_ptr(), tuple(ids.shape))
        if key not in self._other_refs:
            self.restore()
            self._ent.clear()
            out = self.model(input_ids=ids, use_cache=False)
            ent = sum(self._ent) / len(self._ent) if self._ent else 0.0
            loss, _, _ = _logits_metrics(out.logits, ids, None)
            self._other_refs[key] = (out.logits.float().log_softmax(-1), Measurement(loss, 0.0, ent, BF16_BITS))
        ref_logp = self._other_refs[key][0]  # [B, L, V]
        for i, a in enumerate(assignment):
            self._set_unit(i, a)
        self._ent.clear()
        logits = self.model(input_ids=ids, use_cache=False).logits
        ent = sum(self._ent) / len(self._ent) if self._ent else 0.0
        loss, kl, kl_rq = _logits_metrics(logits, ids, ref_logp)
        return Measurement(loss, kl, ent, self.avg_bits(assignment), kl_rq)

    def reference_on(self, ids: torch.Tensor) -> Measurement:
        """The unquantized model's measurement on another batch (what R there is relative to)."""
        self.measure_on(ids, (None,) * len(self.units))
        return self._other_refs[(ids.data_ptr(), tuple(ids.shape))][1]

    def restore(self) -> None:
        """Put every original weight back."""
        for i in range(len(self.units)):
            self._set_unit(i, None)
