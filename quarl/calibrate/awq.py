"""AWQ (Lin et al., 2024): activation-aware per-input-channel scaling, folded into the model.

Idea. Multiplying input channel ``j`` of a linear's weight by ``s_j`` and
dividing its input by ``s_j`` leaves the layer unchanged in full precision, but
after quantization the weight's large-activation ("salient") channels keep
relatively more precision. AWQ picks ``s = mean|x|^alpha`` (per input channel,
over the calibration tokens), normalised by ``sqrt(max(s) * min(s))``, with
``alpha`` from a grid ``{0, 1/n_grid, ..., (n_grid-1)/n_grid}`` (n_grid = 20),
choosing the alpha that minimises the mean squared error of the *block's*
output when the layers are quantized: ``||f(x; W) - f(x; Q(W s) / s)||^2``.
``alpha = 0`` is plain round-to-nearest, so the search never makes the block
objective worse than RTN.

Where the ``1/s`` goes (AutoAWQ's ``get_layers_for_scaling`` for Llama/Qwen2/Qwen3):

    input_layernorm          -> q_proj, k_proj, v_proj   (loss: the attention module)
    self_attn.v_proj (rows)  -> o_proj                   (loss: o_proj)   only when
                                v_proj.weight.shape == o_proj.weight.shape
    post_attention_layernorm -> gate_proj, up_proj       (loss: the MLP)
    mlp.up_proj (rows)       -> down_proj                (loss: down_proj)

The v -> o pair needs a 1:1 map from v_proj's output channels to o_proj's input
channels. With grouped-query attention (num_kv_heads < num_heads) each KV head's
channels feed several query heads' slots of o_proj's input, so a per-channel
scale on v cannot be undone on o; AutoAWQ (and llm-awq, PR #67) then skip the
pair, and so do we -- the shape test is exactly ``num_kv_heads == num_heads``
for these architectures. Qwen3's q/k RMSNorms act on q_proj/k_proj *outputs*,
so they do not interfere with input-channel scales.

As in AutoAWQ, the input features of all four groups are captured in one pass
over the block with its current weights, every group's alpha is searched
against those (the searches are independent: folding never changes the
full-precision function), and all scales are folded at the end. Fused shards
(q/k/v, gate/up) are fake-quantized during the search with their shared
per-tensor state, exactly as they will be quantized. Weight clipping search
(AutoAWQ's ``auto_clip``) is not done: the formats' scales are amax-derived and
GPTQ (``awq+gptq``) already handles per-weight rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from quarl.quant.base import FormatConfig, QuantError, get_format


@dataclass
class ScalingGroup:
    """One AWQ group: the op that absorbs ``1/s`` and the linears that absorb ``s``."""

    prev: str  # name (relative to the block) of a norm or linear
    layers: list[str]  # linears sharing the group's input
    inspect: str  # module whose output measures the error ("" = the single linear in ``layers``)
    inp: str  # the linear whose captured input is the group's input
    scales: torch.Tensor | None = None
    alpha: float | None = None
    losses: list[float] = field(default_factory=list)


def scaling_groups(block: nn.Module) -> list[ScalingGroup]:
    """AutoAWQ's Llama/Qwen2/Qwen3 scaling groups for one decoder layer."""
    need = [
        "input_layernorm",
        "post_attention_layernorm",
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ]
    names = dict(block.named_modules())
    missing = [n for n in need if n not in names]
    if missing:
        raise QuantError(
            f"awq: decoder layer {type(block).__name__} lacks {missing}; AWQ supports Llama/Qwen2/Qwen3 "
            f"blocks -- use method gptq or rtn for this architecture"
        )
    groups = [
        ScalingGroup(
            "input_layernorm",
            ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            "self_attn",
            "self_attn.q_proj",
        )
    ]
    if names["self_attn.v_proj"].weight.shape == names["self_attn.o_proj"].weight.shape:
        groups.append(ScalingGroup("self_attn.v_proj", ["self_attn.o_proj"], "", "self_attn.o_proj"))
    groups.append(ScalingGroup("post_attention_layernorm", ["mlp.gate_proj", "mlp.up_proj"], "mlp", "mlp.gate_proj"))
    groups.append(ScalingGroup("mlp.up_proj", ["mlp.down_proj"], "", "mlp.down_proj"))
    return groups


@torch.no_grad()
def fold_scales(block: nn.Module, group: ScalingGroup, s: torch.Tensor) -> None:
    """Divide ``prev``'s output channels by ``s`` and multiply the layers' input channels by ``s``."""
    prev = block.get_submodule(group.prev)
    s = s.detach()
    if isinstance(prev, nn.Linear):
        w = prev.weight  # [N_prev, K_prev]; its last len(s) output rows feed the layers
        w[-s.numel() :].div_(s.view(-1, 1).to(w.dtype))
        if prev.bias is not None:
            prev.bias[-s.numel() :].div_(s.to(prev.bias.dtype))
    else:  # an RMSNorm / LayerNorm: y = norm(x) * weight (+ bias)
        if getattr(prev, "weight", None) is None:
            raise QuantError(f"awq: {group.prev} has no weight to fold the scales into")
        prev.weight.div_(s.to(prev.weight.dtype))
        if getattr(prev, "bias", None) is not None:
            prev.bias.div_(s.to(prev.bias.dtype))
    for name in group.layers:
        lin = block.get_submodule(name)
        lin.weight.mul_(s.view(1, -1).to(lin.weight.dtype))


def _fake_quant_layers(
    block: nn.Module, names: list[str], plan: dict[str, FormatConfig | None], s: torch.Tensor, shared: bool
) -> dict[str, torch.Tensor]:
    """``Q(W s) / s`` for each layer of the group (the layer's fp weight where plan says None)."""
    ws = {n: block.get_submodule(n).weight.detach().float() * s.view(1, -1) for n in names}  # [N, K] each
    out = {}
    state_by_cfg: dict[Any, dict] = {}
    if shared:  # fused shards: one per-tensor state over the concatenated shards, as they will be quantized
        by_cfg: dict[Any, list[str]] = {}
        for n in names:
            if plan.get(n) is not None:
                by_cfg.setdefault(plan[n], []).append(n)
        for cfg, members in by_cfg.items():
            if len(members) > 1:
                st = get_format(cfg.name).tensor_state(torch.cat([ws[m] for m in members]), cfg)
                if st and "next_group" not in st:
                    state_by_cfg[cfg] = st
    for n in names:
        cfg = plan.get(n)
        if cfg is None:
            out[n] = ws[n] / s.view(1, -1)
            continue
        fmt = get_format(cfg.name)
        out[n] = fmt.fake_quant(ws[n], cfg, state=state_by_cfg.get(cfg)) / s.view(1, -1)
    return out


class ChannelMeanAbs:
    """Running per-input-channel mean of |x| (float64 sums), fed batch by batch."""

    def __init__(self) -> None:
        self.sum: torch.Tensor | None = None
        self.count = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1])  # [T, K]
        s = x.abs().double().sum(0)
        self.sum = s if self.sum is None else self.sum + s
        self.count += x.shape[0]

    def mean(self) -> torch.Tensor:
        return (self.sum / max(self.count, 1)).float()


def channel_mean_abs(x: list[torch.Tensor]) -> torch.Tensor:
    acc = ChannelMeanAbs()
    for xi in x:
        acc.add(xi)
    return acc.mean()


@torch.no_grad()
def search_group(
    block: nn.Module,
    group: ScalingGroup,
    x: list[torch.Tensor],
    run_inspect: Callable[[int, torch.Tensor], torch.Tensor],
    plan: dict[str, FormatConfig | None],
    *,
    n_grid: int = 20,
    duo_scaling: bool = False,
    search_batches: int | None = None,
    x_mean: torch.Tensor | None = None,
) -> ScalingGroup:
    """Grid-search alpha for one group; sets ``group.scales``/``alpha``/``losses`` (weights restored).

    ``x``: the group's input per calibration batch (``[b, L, K]``);
    ``run_inspect(i, x_i)`` runs the inspected module on batch ``i``'s input.
    ``search_batches``: evaluate the loss on the first this-many batches only (the
    activation statistics always use all of them); the search costs ``n_grid``
    forward passes of the inspected module, so this bounds AWQ's time on CPU.
    ``x_mean``: the per-channel mean |x| over *all* calibration tokens when ``x`` holds
    only the searched batches (the block loop accumulates it while capturing, so it
    never stores more activations than the search needs); default: from ``x``.
    """
    if all(plan.get(n) is None for n in group.layers):
        return group  # nothing in this group is quantized: no scaling
    if x_mean is None:
        x_mean = channel_mean_abs(x)  # [K] mean |x| per input channel
    x_mean = x_mean.float()
    if duo_scaling:  # AutoAWQ's option: also divide by the normalised weight magnitude
        w_all = torch.cat([block.get_submodule(n).weight.detach().float() for n in group.layers])
        w_mean = (w_all.abs() / w_all.abs().amax(dim=1, keepdim=True).clamp(min=1e-8)).mean(0)  # [K]

    if search_batches is not None:
        x = x[: max(1, search_batches)]
    fp_out = [run_inspect(i, xi).float() for i, xi in enumerate(x)]
    originals = {n: block.get_submodule(n).weight.detach().clone() for n in group.layers}
    shared = len(group.layers) > 1
    best = (float("inf"), None, None)
    try:
        for r in range(n_grid):
            alpha = r / n_grid
            if duo_scaling:
                s = (x_mean.pow(alpha) / (w_mean.pow(1 - alpha) + 1e-4)).clamp(min=1e-4)
            else:
                s = x_mean.pow(alpha).clamp(min=1e-4)
            s = s / (s.max() * s.min()).sqrt()
            qw = _fake_quant_layers(block, group.layers, plan, s, shared)
            for n, w in qw.items():
                block.get_submodule(n).weight.copy_(w.to(originals[n].dtype))
            loss = sum(
                float((run_inspect(i, xi).float() - fo).pow(2).sum()) for i, (xi, fo) in enumerate(zip(x, fp_out))
            )
            loss /= sum(fo.numel() for fo in fp_out)
            group.losses.append(loss)
            if loss < best[0]:
                best = (loss, alpha, s.clone())
            for n in group.layers:
                block.get_submodule(n).weight.copy_(originals[n])
    finally:
        for n in group.layers:
            block.get_submodule(n).weight.copy_(originals[n])
    if best[2] is None:
        raise QuantError(f"awq: every grid point gave a non-finite loss for {group.layers}; check the activations")
    group.alpha, group.scales = best[1], best[2]
    return group
