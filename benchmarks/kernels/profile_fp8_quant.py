"""The fused FP8 quantizers under Nsight Compute: what bounds them (run under ``ncu``; issue 15).

    ncu --kernel-name regex:"_act_kernel|_tile_kernel" --section SpeedOfLight ... \
        python3 benchmarks/kernels/profile_fp8_quant.py

Launches, at the Qwen2.5-7B gate/up sizes (8192 tokens): the dual activation quantizer (1x128 row groups and
X^T along the tokens) of dY [8192, 18944] at the (32, 8) and (64, 8) settings, the row-groups-only one, and the
weight tiles + W^T of [18944, 3584]; each twice (ncu profiles every launch it is told to).
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))
from quarl_kernels import fp8_quant as fq

torch.manual_seed(0)
m, n, k = 8192, 18944, 3584
dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
for sub, warps in ((32, 8), (64, 8)):
    for _ in range(2):
        fq.quantize_act(dy, m, n, m, sub=sub, warps=warps)
for _ in range(2):
    fq.quantize_act(dy, m, n, None, sub=64, warps=8)
    fq.quantize_tiles(w, True, sub=64, warps=8)
torch.cuda.synchronize()
print("done")
