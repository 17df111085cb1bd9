"""The fused FP8 quantizers under Nsight Compute: what bounds them (run under ``ncu``; issue 15).

    ncu --clock-control none --kernel-name regex:"_act_kernel|_act_t_kernel|_swiglu_rows_kernel" --set full \
        python3 benchmarks/kernels/profile_fp8_quant.py

``--regs`` (session 31): instead, the Gluon kernels of ``quarl_kernels.fp8_quant_regs`` at their library settings (X
with X^T tiles, dY with 1x128 X^T, the SwiGLU forward from g and u, the SwiGLU backward pass); ncu's kernel regex then
``_regs_kernel|_swiglu_bwd_kernel`` and ``--launch-skip 4 --launch-count 4``.

Launches at the Qwen2.5-7B widths, 16384 tokens (session 31; session 7's version profiled 8192 tokens at the settings
of then), one each after an unprofiled warm-up (``--launch-skip``: see ``benchmarks/gpu_session31.sh``): X [T, 18944]
(down's input) in both groupings with X^T's 128x128 tiles at the two one-read settings that win it and dY [T, 18944]
at its winner; that operand's row groups alone and X^T alone; and the merged SwiGLU backward pass.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "kernels"))
from quarl_kernels import fp8_quant as fq
from quarl_kernels import fp8_swiglu as fs

torch.manual_seed(0)
m, n = 16384, 18944
x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
g, u = torch.randn_like(x) * 3.0, torch.randn_like(x)
LAUNCHES = [  # (label, callable); printed in launch order so ncu's kernel list can be read against it
    ("X tiles (128, 16)", lambda: fq.quantize_act(x, m, n, m, t_tiles=True, sub=128, warps=16)),
    ("X tiles (64, 8, T_CHUNK 32)", lambda: fq.quantize_act(x, m, n, m, t_tiles=True, sub=64, warps=8, t_chunk=32)),
    ("dY 1x128 (64, 8, T_CHUNK 32)", lambda: fq.quantize_act(x, m, n, m, sub=64, warps=8, t_chunk=32)),
    ("rows alone (64, 8)", lambda: fq.quantize_act(x, m, n, None, sub=64, warps=8)),
    ("X^T 1x128 alone (64, 8, T_CHUNK 32)", lambda: fq.quantize_act(x, m, n, m, row_groups=False, sub=64, warps=8,
                                                                     t_chunk=32)),
    ("SwiGLU merged (32, 8, 32)", lambda: fs.swiglu_grad_operands(x * 1e-3, g, u, m, n, m, merged=(32, 8, 32))),
]
if "--regs" in sys.argv:  # session 31's Gluon kernels (quarl_kernels.fp8_quant_regs): what limits them now
    from quarl_kernels import fp8_quant_regs as fr

    outs = fq._act_outputs(x, m, n, m, True, True)
    outs1 = fq._act_outputs(x, m, n, m, True, False)
    hs = fq._act_outputs(g, m, n, m, True, True)
    LAUNCHES = [
        ("regs X tiles (16, 8)", lambda: fr.launch(x, *outs, m, n, m, True, 16, 8)),
        ("regs dY 1x128 (16, 8)", lambda: fr.launch(x, *outs1, m, n, m, False, 16, 8)),
        ("regs SwiGLU forward (16, 8)", lambda: fr.launch(g, *hs, m, n, m, True, 16, 8, u=u)),
        ("regs SwiGLU backward (16, 8)", lambda: fs.swiglu_grad_operands(x * 1e-3, g, u, m, n, m,
                                                                           merged=("regs", 16, 8))),
    ]
for _, fn in LAUNCHES:  # compile and warm (ncu skips these: --launch-skip len(LAUNCHES))
    fn()
torch.cuda.synchronize()
for label, fn in LAUNCHES:
    print("launch:", label, flush=True)
    fn()
torch.cuda.synchronize()
print("done")
