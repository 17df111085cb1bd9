"""The decode GEMV's Triton kernel on CPU through ``TRITON_INTERPRET=1`` (portable decode).

Checks indexing, row clamping (N tails), the masked K tail (K not a multiple of the
K step), split-K and its reduction, every scale path (several groups per thread,
one group per thread, a tile inside one group, INT4 zero points as bytes and as
int32 words) and odd M against the format's own dequantize. The interpreter rounds
float -> bf16 by truncation, so the bound is looser than on the GPU
(``test_gemv_gpu.py`` checks the PTX path at 5e-3). It ignores ``num_stages``: the
cp.async pipelining itself is only exercised on the GPU.

Skipped unless Triton is importable and NumPy < 2.3 (see test_wo_gemm_interpreter.py).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.kernels.interpreter import needs_interpreter, run_interpreted

ROOT = Path(__file__).resolve().parents[2]

pytestmark = needs_interpreter

SCRIPT = textwrap.dedent("""
    import torch
    from quarl.quant import get_format, make_config
    from quarl_kernels import gemv
    from quarl_kernels.ops import _packed_weight, _reference_weight

    C = gemv.GemvConfig
    CASES = [  # spec, M, N, K, config
        ("nvfp4", 1, 48, 256, C(16, 8, 4, 4)),  # 2 groups / thread, register prefetch, split-K
        ("nvfp4", 3, 40, 384, C(16, 8, 2, 4)),  # 1 group / thread (VEC 2), N tail
        ("mxfp4", 5, 24, 320, C(16, 16, 4, 4)),  # KW = 40: masked K tail
        ("int4-g128", 2, 40, 512, C(16, 32, 4, 4)),  # tile inside one group (BKW cut to 16 words)
        ("int4-g128-sym", 4, 40, 384, C(16, 32, 4, 4, prefetch=False)),
        ("int4-g128", 3, 40, 1024, C(16, 32, 4, 4, stages=3)),  # zero points as int32 words
        ("int4-g32", 2, 40, 640, C(16, 32, 4, 4, stages=3)),  # 8 groups / tile, words shared by 4 groups
        ("mxfp4", 2, 40, 640, C(16, 32, 2, 4, stages=3)),
        ("nvfp4", 7, 72, 2048, C(16, 16, 4, 4)),
    ]
    for spec, m, n, k, cfg in CASES:
        torch.manual_seed(0)
        c = make_config(spec)
        q = get_format(c.name).quantize(torch.randn(n, k) * 0.05, c)
        t = q.tensors
        args = (t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), t.get("weight_global_scale"),
                c.name, c.block_size, n, k)
        pw = _packed_weight(*args)
        w = _reference_weight(*args, dtype=torch.float32)
        x = torch.randn(m, k).to(torch.bfloat16)
        y = gemv.launch_gemv(x, pw, cfg, use_asm=False).float()
        ref = x.float() @ w.T
        err = ((y - ref).norm() / ref.norm()).item()
        print(spec, m, n, k, cfg, err)
        assert err < 1.5e-2 and not torch.isnan(y).any(), (spec, m, n, k, str(cfg), err)
    print("OK")
""")


def test_gemv_under_triton_interpreter():
    run_interpreted(SCRIPT)
