"""benchmarks/qat_code_mobility.py: the probe counts grid jumps where a re-derived grid puts weights on midpoints."""

import torch
from torch import nn

from benchmarks.qat_code_mobility import probe
from quarl.quant import quantize_model
from quarl.quant.base import get_format


def _model(w: torch.Tensor) -> nn.Module:
    m = nn.Sequential(nn.Linear(w.shape[1], w.shape[0], bias=False))
    m[0].weight.data.copy_(w)
    quantize_model(m, {"default": "int3-g64"})  # asymmetric INT3, one group per row
    return m


def test_rtn_latents_do_not_jump_and_a_narrowed_grid_does():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 64, generator=g) * 0.02
    rtn = probe(_model(w))
    assert rtn["weights"] == 32 * 64 and rtn["rerounded"] == 0.0
    assert rtn["calibrated_jump@0.0001"] == 0.0 and rtn["recompute_jump@0.0001"] < 0.01
    # GPTQ-like: every row uses only codes 0..6 of the 0..7 grid, so the re-derived grid is 6/7 as wide
    m = _model(w)
    lin = m[0]
    fmt = get_format(lin.config.name)
    codes = torch.randint(0, 7, (32, 64), generator=g).float()
    codes[:, 0], codes[:, 1] = 0, 6  # the range the re-derived grid sees
    scale, zp = lin.weight_scale.float().unsqueeze(-1), lin.weight_zero_point.float().unsqueeze(-1)
    lin.set_qtensor(fmt.quantize(((codes.view(32, 1, 64) - zp) * scale).view(32, 64), lin.config,
                                 state={"weight_scale": lin.weight_scale, "weight_zero_point": lin.weight_zero_point}))
    narrowed = probe(m)
    assert narrowed["calibrated_jump@0.0001"] == 0.0  # its own grid kept: a 1e-4 step is far from every midpoint
    assert narrowed["rerounded"] > 0.1 and narrowed["recompute_jump@0.0001"] > 10 * rtn["recompute_jump@0.0001"]
