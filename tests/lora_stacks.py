"""Small stacks of frozen quantized projections with LoRA, for the GPU tests of the paths a LoRA update takes (the
kernels' dense path, the held base of ``optim.dequant_cache``)."""

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
