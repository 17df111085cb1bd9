"""Small stacks of frozen quantized projections with LoRA, for the tests of the paths a LoRA update takes (the
kernels' dense path, the held base of ``optim.dequant_cache``), and the stand-ins that run the held base on CPU."""

from __future__ import annotations

import torch
from torch import nn


def lora_quant_stack(spec: str, layers: int = 2, dim: int = 512, seed: int = 5, device: str = "cuda",
                     dtype: torch.dtype = torch.bfloat16) -> nn.Sequential:
    """``layers`` ``[dim, dim]`` QuantLinear projections in ``spec`` with bias and LoRA (r 8, alpha 16), the adapters
    drawn N(0, 0.05) so that both LoRA factors carry signal; seeded, so two calls build the same stack."""
    from quarl.quant import LoRAConfig, QuantLinear, attach_lora

    torch.manual_seed(seed)
    stack = nn.Sequential(*[QuantLinear.from_linear(nn.Linear(dim, dim, bias=True), spec) for _ in range(layers)])
    attach_lora(stack, LoRAConfig(r=8, alpha=16, targets=[str(i) for i in range(layers)]))
    stack = stack.to(device).to(dtype)
    for p in stack.parameters():
        if p.requires_grad:
            p.data.normal_(0, 0.05)
    return stack


class FakeDeviceMemory:
    """The device's memory counters of a ``quarl.train.dequant_cache.DequantCache``, for a CPU run of its phases
    (``auto`` sizes its budget by them); the attributes may change between phases."""

    def __init__(self, avail: int, total: int, peak: int):
        self.avail, self.total, self.peak = avail, total, peak

    def install(self, cache) -> None:
        cache._avail_total = lambda: (self.avail, self.total)
        cache._allocated = lambda: 0
        cache._take_peak = lambda: self.peak


def stand_in_kernels(monkeypatch, served: list | None = None) -> None:
    """The GPU kernels' part in holding a frozen base, stood in for on CPU: every format has a kernel, a layer's
    dense-path weight is its reference decode (fp32), and a held weight serves every call of its dtype (the row
    counts it served appended to ``served``)."""
    from quarl.quant import dispatch

    def serves(self, x, layer):
        if served is not None:
            served.append(x.shape[0])
        return x.dtype == self.weight.dtype

    monkeypatch.setattr(dispatch, "has_kernel", lambda fmt: True)
    monkeypatch.setattr(dispatch, "dense_weight", lambda m: m.dequantized_weight(torch.float32).clone())
    monkeypatch.setattr(dispatch.HeldWeight, "serves", serves)


def cpu_cache(model: nn.Module, setting: str, memory: FakeDeviceMemory):
    """A ``DequantCache`` on CPU that holds what it would on CUDA (under :func:`stand_in_kernels`), its device's
    memory counters ``memory``'s."""
    from quarl.train.dequant_cache import DequantCache, base_bf16_bytes

    cache = DequantCache(model, setting, torch.device("cpu"))
    cache.need = base_bf16_bytes(model)  # what __init__ computes on CUDA
    memory.install(cache)
    return cache
