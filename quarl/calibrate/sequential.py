"""The layer-by-layer calibration loop (the GPTQ repository's ``llama_sequential``).

    cache = capture_block_inputs(model, batches)     # run the model up to block 0, then stop
    for each decoder block:
        AWQ: capture the linears' inputs, search + fold scales            (awq, awq+gptq)
        one pass: accumulate H = 2 X X^T for every linear of the block     (all methods)
        quantize every linear of the block (RTN or GPTQ), swap in QuantLinear
        run the *quantized* block on the cache -> inputs of the next block

Why block by block: the whole model stays where it is (CPU or one GPU) while
only one block's activations exist at a time -- ``num_samples x seq_len x
hidden`` for the cache, plus the block's Hessians ``[K, K]`` and, for AWQ, the
inputs of its four linear groups. Feeding each block the outputs of the
already-quantized blocks before it lets later layers compensate for earlier
quantization error (``propagate_quantized``; turn it off to calibrate every
block on full-precision inputs, as AutoAWQ does).

Inputs of block 0 are captured with a forward pre-hook that records the
hidden states and the keyword arguments the model passes (rotary
``position_embeddings``, ``attention_mask``, ``position_ids`` ...) and then
raises to stop the forward: nothing after the embeddings is computed. The
captured kwargs are replayed verbatim when each block runs on the cache, so the
blocks see exactly what they would inside the model.

All linears of a block are calibrated from one pass of the block with its
current weights (not "true sequential" within the block): one forward per
block instead of four, at a small cost in accuracy for the later sublayers.
Linear layers in the plan that are not inside a decoder block (e.g. an
explicitly included ``lm_head``) are quantized with RTN after the loop.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from quarl.calibrate.awq import ChannelMeanAbs, fold_scales, scaling_groups, search_group
from quarl.calibrate.gptq import HessianAccumulator, gptq_quantize, relative_error, weight_error
from quarl.calibrate.gptq_columns import clear_graphs
from quarl.calibrate.metrics import BlockwiseComparison
from quarl.calibrate.onload import Onloader, head_modules, stem_modules
from quarl.quant.base import FormatConfig, QuantError, get_format
from quarl.quant.linear import QuantLinear
from quarl.quant.model import _shared_states
from quarl.quant.spec import spec_string

log = logging.getLogger(__name__)
METHODS = ("rtn", "gptq", "awq", "awq+gptq")


class _StopForward(Exception):
    pass


def _stay(*_mods: nn.Module) -> None:
    """No onloading: every part computes where it is."""


@dataclass
class LayerStats:
    name: str
    format: str
    method: str
    rel_error: float  # ||WX - W_hat X||^2 / ||WX||^2 on the calibration inputs
    seconds: float
    awq_alpha: float | None = None


@dataclass
class CalibrationResult:
    layers: list[LayerStats] = field(default_factory=list)
    awq: dict[str, dict] = field(default_factory=dict)  # "<block>.<prev>" -> {alpha, layers}
    seconds: float = 0.0
    quality: dict = field(default_factory=dict)  # held-out metrics measured block by block (held_out=)
    peak_device_bytes: int | None = None  # with onload on CUDA: max over the loop of max_memory_allocated
    block_peaks: list[int] = field(default_factory=list)  # ... per block


def decoder_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """``("model.layers", ModuleList)`` of a Llama/Qwen-style causal LM."""
    for name in ("model.layers", "model.model.layers", "transformer.h"):
        try:
            mod = model.get_submodule(name)
        except AttributeError:
            continue
        if isinstance(mod, nn.ModuleList) and len(mod):
            return name, mod
    raise QuantError(
        f"calibration: cannot find the decoder layers of {type(model).__name__} (looked for "
        f"model.layers); quarl calibrates Llama/Qwen2/Qwen3-style causal LMs"
    )


@torch.no_grad()
def capture_block_inputs(model: nn.Module, batches: list[torch.Tensor],
                         device: torch.device | None = None) -> list[tuple[torch.Tensor, dict]]:
    """Hidden states entering block 0 and the kwargs the model passes it, per batch. ``device``:
    where the token ids go (the embeddings' device; default: the model's first parameter's)."""
    _, blocks = decoder_blocks(model)
    cache: list[tuple[torch.Tensor, dict]] = []

    def hook(_mod, args, kwargs):
        hs = args[0] if args else kwargs.pop("hidden_states")
        kw = {k: v for k, v in kwargs.items() if k not in ("past_key_values", "past_key_value", "use_cache")}
        cache.append((hs.detach(), kw))
        raise _StopForward

    h = blocks[0].register_forward_pre_hook(hook, with_kwargs=True)
    dev = device if device is not None else next(model.parameters()).device
    try:
        for ids in batches:
            try:
                model(input_ids=ids.to(dev), use_cache=False)
            except _StopForward:
                pass
    finally:
        h.remove()
    if len(cache) != len(batches):
        raise QuantError("calibration: block 0 was not reached for every batch; the model's forward is unusual")
    return cache


def _block_out(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


@torch.no_grad()
def run_block(block: nn.Module, cache: list[tuple[torch.Tensor, dict]]) -> list[torch.Tensor]:
    return [_block_out(block(hs, **kw)) for hs, kw in cache]


def _linear_names(block: nn.Module, prefix: str, plan: dict[str, Any]) -> dict[str, str]:
    """relative name -> full name for the block's plain nn.Linear layers that the plan covers."""
    return {
        n: f"{prefix}.{n}"
        for n, m in block.named_modules()
        if isinstance(m, nn.Linear) and not isinstance(m, QuantLinear) and f"{prefix}.{n}" in plan
    }


@torch.no_grad()
def _capture_awq_inputs(
    block: nn.Module, cache, names: list[str], keep: int | None
) -> tuple[dict[str, list[torch.Tensor]], dict[str, torch.Tensor]]:
    """Inputs of ``names`` for the first ``keep`` batches (what the AWQ search evaluates on) and
    their per-channel mean |x| over all batches (what AWQ's scales are built from)."""
    feats: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    means = {n: ChannelMeanAbs() for n in names}

    def hook(_m, args, n):
        means[n].add(args[0])
        if keep is None or len(feats[n]) < keep:
            feats[n].append(args[0].detach())

    hooks = [block.get_submodule(n).register_forward_pre_hook(lambda m, a, n=n: hook(m, a, n)) for n in names]
    try:
        run_block(block, cache)
    finally:
        for h in hooks:
            h.remove()
    return feats, {n: m.mean() for n, m in means.items()}


@torch.no_grad()
def _hessians(block: nn.Module, cache, names: list[str],
              matmul: str = "fp32") -> tuple[dict[str, HessianAccumulator], list[torch.Tensor]]:
    """Accumulate every linear's Hessian in one pass; also returns the (full-precision) block outputs.

    Layers called one after another on the very same input tensor (q/k/v on the normed hidden
    states, gate/up on the MLP input) share one accumulator: the same GEMMs on the same inputs
    give the same bits, so this only skips repeated work (9% of a 7B block's Hessian FLOPs). The
    first batch decides who shares; every later batch must agree, else it is an error."""
    dev = cache[0][0].device
    acc = {n: HessianAccumulator(block.get_submodule(n).in_features, device=dev, matmul=matmul) for n in names}
    source: dict[str, str] = {}  # layer -> the layer whose accumulator it uses (itself, or an earlier one)
    last: list = [None, None]  # the previous hooked call's (input tensor, source layer) in this forward

    def hook(n: str, x: torch.Tensor) -> None:
        src = last[1] if x is last[0] else n
        if source.setdefault(n, src) != src:
            raise QuantError(
                f"calibrate: layer {n} shared its input with {source[n]} in the first batch but not later "
                f"(now {src}); the block's forward is not the same per batch"
            )
        if src == n:
            acc[n].add(x)
        last[0], last[1] = x, src

    hooks = [block.get_submodule(n).register_forward_pre_hook(lambda _m, args, n=n: hook(n, args[0]))
             for n in names]
    try:
        outs = run_block(block, cache)
    finally:
        for h in hooks:
            h.remove()
        last[0] = None
    return {n: acc[source.get(n, n)] for n in names}, outs


def _calib_states(block: nn.Module, rel_plan: dict[str, FormatConfig | None]) -> dict[str, dict]:
    """Shared per-tensor states of fused shards (NVFP4 global scale, FP8 per-tensor scale).

    States with a cursor (NF4 double quantization) are per layer: bitsandbytes has
    no shared statistics, and a cursor cannot be shared between layers."""
    return {n: st for n, st in _shared_states(block, rel_plan).items() if "next_group" not in st}


def _install(parent_mod: nn.Module, leaf: str, lin: nn.Linear, qt) -> QuantLinear:
    w = lin.weight
    q = QuantLinear(
        lin.in_features, lin.out_features, qt.config, bias=lin.bias is not None, device=w.device, dtype=w.dtype
    )
    if lin.bias is not None:
        q.bias.data.copy_(lin.bias.detach())
    q.set_qtensor(qt.to(w.device))
    setattr(parent_mod, leaf, q)
    return q


def _replace(root: nn.Module, name: str, lin: nn.Linear, cfg: FormatConfig | None, qt) -> None:
    if cfg is None:  # high precision: the plain nn.Linear stays (a dense tensor in the checkpoint)
        return
    parent_name, _, leaf = name.rpartition(".")
    _install(root.get_submodule(parent_name) if parent_name else root, leaf, lin, qt)


# Formats whose GPTQ scales are per row (block_scales -> [N, 1] tensors, or tuples of them): rows of
# several layers can go through one column loop and be split afterwards.
_ROW_SCALED = ("nvfp4", "mxfp4", "int")


def _rows(x: Any, a: int, b: int) -> Any:
    """Rows a:b of a per-row scale (a tensor, or a tuple of tensors / None)."""
    if isinstance(x, tuple):
        return tuple(_rows(y, a, b) for y in x)
    return x[a:b] if torch.is_tensor(x) else x


@torch.no_grad()
def _gptq_fused(block: nn.Module, names: dict[str, str], rel_plan: dict, states: dict, acc: dict,
                gptq: dict) -> dict[str, tuple[tuple[Any, torch.Tensor], float]]:
    """GPTQ once per set of layers that read the same input (q/k/v; gate/up): rel -> ((QTensor, Q), s).

    GPTQ treats every row of W alone given H (error feedback runs along a row; a row's scales are its
    own), so the rows of layers with one Hessian, one format and one per-tensor state can share a
    column loop: the same numbers for every row (up to the summation order of the block update's
    matmul), in one loop over K columns instead of one per layer -- the loop's cost is per column,
    not per row. Layers qualify when their Hessians are equal (they saw the same activations), their
    formats and shared state are the same, and the format's scales are per row."""
    from quarl.quant.pack import pack_qtensor

    groups: list[list[str]] = []
    for rel in names:
        cfg = rel_plan[rel]
        if cfg is None or cfg.name not in _ROW_SCALED:
            continue
        st = states.get(rel)  # a state shared by fused shards, else None (then the layer's own is used)
        if st is None and get_format(cfg.name).tensor_state(block.get_submodule(rel).weight[:1], cfg):
            continue  # a per-layer tensor state (e.g. NVFP4's global scale of a lone layer): alone
        for grp in groups:
            r0 = grp[0]
            if rel_plan[r0] == cfg and states.get(r0) is st and torch.equal(acc[r0].H, acc[rel].H):
                grp.append(rel)
                break
        else:
            groups.append([rel])
    out = {}
    for grp in (g for g in groups if len(g) > 1):
        t0 = time.perf_counter()
        ws = [block.get_submodule(r).weight.detach().float() for r in grp]
        cfg = rel_plan[grp[0]]
        try:
            r = gptq_quantize(torch.cat(ws), acc[grp[0]].H, cfg, state=states.get(grp[0]), pack=False, **gptq)
        except QuantError as e:
            raise QuantError(f"layers {', '.join(names[x] for x in grp)}: {e}") from None
        a = 0
        n_all = sum(w.shape[0] for w in ws)
        for rel, w in zip(grp, ws):
            b = a + w.shape[0]
            q = r.q[a:b]
            qt = pack_qtensor(cfg, q, [_rows(sc, a, b) for sc in r.scales], r.state)
            out[rel] = ((qt, q), (time.perf_counter() - t0) * w.shape[0] / n_all)
            a = b
    return out


@torch.no_grad()
def calibrate_model(
    model: nn.Module,
    plan: dict[str, FormatConfig | None],
    batches: list[torch.Tensor],
    *,
    method: str = "gptq",
    gptq: dict | None = None,
    awq: dict | None = None,
    propagate_quantized: bool = True,
    progress: bool = True,
    onload: Onloader | None = None,
    held_out: torch.Tensor | None = None,
    held_out_batch_size: int = 1,
    fill: Callable[[nn.Module, str], None] | None = None,
) -> CalibrationResult:
    """Quantize ``model`` in place, block by block, following ``plan`` (full name -> format or None).

    RTN needs no activations: with ``batches`` empty it quantizes the weights alone (fused shards
    still share their per-tensor states) and reports the weight-space error, not the output error.

    ``onload`` (sequential onloading, :mod:`quarl.calibrate.onload`): ``model`` is on the host and
    only the stem, then one decoder block at a time, then the head are moved to ``onload.device``;
    every quantized block goes back to the host. ``None``: everything computes where the model is.
    ``held_out`` [n, L] token windows: the held-out metrics of
    :func:`quarl.calibrate.metrics.compare_models` (quantized vs. the original model) are measured
    on the way, block by block, into ``result.quality`` -- no reference copy of the model needed.
    ``fill(block, name)``: the decoder blocks are still on the meta device and each is materialized
    (read from the checkpoint, :mod:`quarl.calibrate.streaming`) just before its turn, so the host
    holds one dense block at a time."""
    if method not in METHODS:
        raise QuantError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
    gptq = {"block_size": 128, "percdamp": 0.01, "act_order": True, **(gptq or {})}
    hessian = gptq.pop("hessian", "fp32")  # how the Hessians are accumulated (HessianAccumulator's matmul)
    awq = {"n_grid": 20, "duo_scaling": False, "search_batches": None, **(awq or {})}
    t_start = time.perf_counter()
    result = CalibrationResult()
    prefix, blocks = decoder_blocks(model)
    data_free = not batches
    if data_free and method != "rtn":
        raise QuantError(f"method {method!r} needs calibration batches (only rtn runs without data)")
    dev = onload.device if onload is not None else next(model.parameters()).device
    move, back = (onload.onload, onload.offload) if onload is not None else (_stay, _stay)
    stem = stem_modules(model, blocks)
    move(*stem)  # embeddings + rotary: what runs before block 0
    cache = None if data_free else capture_block_inputs(model, batches, dev)
    compare = None if held_out is None else BlockwiseComparison(held_out, held_out_batch_size)
    if compare is not None:
        compare.capture(model, dev)
    back(*stem)
    if onload is not None:
        log.info("calibrate: offload=cpu (sequential onloading): model on %s, one decoder block at a time on %s",
                 onload.host, onload.device)
        result.peak_device_bytes = onload.peak(reset=True)  # capture: stem + both token caches
    use_awq, use_gptq = method.startswith("awq"), method.endswith("gptq")
    done: set[str] = set()

    bar = tqdm(blocks, desc=f"calibrate ({method})", disable=not progress, unit="block")
    for bi, block in enumerate(bar):
        if fill is not None:
            fill(block, f"{prefix}.{bi}")  # streamed: block i's dense weights exist from here to its packing
        move(block)
        if compare is not None:
            compare.reference(block)  # the dense block, before AWQ folds its scales or any layer is packed
        bprefix = f"{prefix}.{bi}"
        names = _linear_names(block, bprefix, plan)  # rel -> full
        rel_plan = {r: plan[f] for r, f in names.items()}
        alphas: dict[str, float] = {}
        if use_awq and any(c is not None for c in rel_plan.values()):
            groups = scaling_groups(block)
            feats, means = _capture_awq_inputs(block, cache, sorted({g.inp for g in groups}), awq["search_batches"])
            for g in groups:
                if g.inspect == "self_attn":
                    attn = block.get_submodule("self_attn")

                    def run(i, x, attn=attn, cache=cache):
                        return _block_out(attn(hidden_states=x, **cache[i][1]))
                else:
                    mod = block.get_submodule(g.inspect or g.layers[0])

                    def run(i, x, mod=mod):
                        return mod(x)

                search_group(block, g, feats[g.inp], run, rel_plan, x_mean=means[g.inp], **awq)
            del feats
            for g in groups:  # fold after every search (AutoAWQ's order)
                if g.scales is not None:
                    fold_scales(block, g, g.scales)
                    result.awq[f"{bprefix}.{g.prev}"] = {"alpha": g.alpha, "layers": g.layers}
                    for n in g.layers:
                        alphas[n] = g.alpha
        acc, fp_outs = ({}, None) if data_free else _hessians(block, cache, list(names), hessian)
        states = _calib_states(block, rel_plan)
        fused = _gptq_fused(block, names, rel_plan, states, acc, gptq) if use_gptq else {}
        for rel, full in names.items():
            t0 = time.perf_counter()
            lin = block.get_submodule(rel)
            cfg = rel_plan[rel]
            w = lin.weight.detach().float()
            H = None if data_free else acc[rel].H
            if cfg is None:
                qt, err, how = None, 0.0, "none"
            elif rel in fused:
                (qt, q), secs = fused[rel]
                how, err, t0 = method, relative_error(w, q, H), t0 - secs
            elif use_gptq:
                try:
                    r = gptq_quantize(w, H, cfg, state=states.get(rel), **gptq)
                except QuantError as e:
                    raise QuantError(f"layer {full}: {e}") from None
                qt, how = r.qtensor, method
                err = relative_error(w, r.q, H)
            else:
                try:
                    qt = get_format(cfg.name).quantize(w, cfg, state=states.get(rel))
                except QuantError as e:
                    raise QuantError(f"layer {full}: {e}") from None
                how = method
                w_hat = qt.dequantize(torch.float32)
                err = weight_error(w, w_hat) if H is None else relative_error(w, w_hat, H)
            _replace(block, rel, lin, cfg, qt)
            done.add(full)
            result.layers.append(
                LayerStats(full, spec_string(cfg), how, err, time.perf_counter() - t0, alphas.get(rel))
            )
        del acc
        if propagate_quantized:
            del fp_outs  # at most two activation sets alive: the cache and the next block's inputs
            fp_outs = None
        if bi + 1 < len(blocks) and not data_free:
            outs = run_block(block, cache) if propagate_quantized else fp_outs
            cache = [(o, kw) for o, (_, kw) in zip(outs, cache)]
            del outs
        fp_outs = None
        if compare is not None:
            compare.quantized(block)
        back(block)  # the packed block: to the host
        if onload is not None:
            peak = onload.peak(reset=True)
            if peak is not None:
                result.peak_device_bytes = max(result.peak_device_bytes or 0, peak)
                result.block_peaks.append(peak)
                bar.set_postfix(peak=f"{peak / 2**30:.1f}GiB")
            log.info("calibrate: block %d/%d done (offload=cpu), peak device memory %s", bi + 1, len(blocks),
                     "n/a" if peak is None else f"{peak / 2**30:.2f} GiB")

    # Linears outside the decoder blocks (rare: e.g. an explicitly included lm_head): RTN.
    rest = [f for f, c in plan.items() if f not in done and isinstance(model.get_submodule(f), nn.Linear)
            and not isinstance(model.get_submodule(f), QuantLinear)]
    head = head_modules(model, blocks)[1] if compare is not None else None
    ref_head = None
    if compare is not None and any(plan[f] is not None and model.get_submodule(f) is head for f in rest):
        ref_head = copy.deepcopy(head)  # the reference's logits need the dense lm_head
    for full in rest:
        cfg = plan[full]
        lin = model.get_submodule(full)
        move(lin)
        t0 = time.perf_counter()
        qt = None if cfg is None else get_format(cfg.name).quantize(lin.weight.detach().float(), cfg)
        _replace(model, full, lin, cfg, qt)
        back(lin, model.get_submodule(full))  # the old one too: a tied lm_head shares the embeddings' weight
        result.layers.append(
            LayerStats(full, spec_string(cfg), "rtn" if cfg else "none", float("nan"), time.perf_counter() - t0)
        )
    if compare is not None:
        norm, head = head_modules(model, blocks)  # lm_head may be a QuantLinear now
        heads = [norm, head] + ([ref_head] if ref_head is not None else [])
        move(*heads)
        result.quality = compare.finish(norm, head, ref_head=ref_head)
        back(*heads)
        del ref_head
    if onload is not None and (peak := onload.peak()) is not None:
        result.peak_device_bytes = max(result.peak_device_bytes or 0, peak)
    clear_graphs()  # the column loop's cached buffers and CUDA graphs
    result.seconds = time.perf_counter() - t_start
    return result
