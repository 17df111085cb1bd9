"""The real Triton kernels on CPU through ``TRITON_INTERPRET=1`` (portable decode path).

Checks indexing, masking (odd M, N and K tails), split-K and the pair-order
permutations of the forward and backward kernels against the format's own
dequantize. The interpreter rounds float -> bf16 by truncation, so the bound is
looser than on the GPU (``test_wo_gemm_gpu.py`` checks the fast path at 5e-3).

Skipped unless Triton is importable (CPU CI has no Triton) and NumPy < 2.3
(Triton 3.6's interpreter calls ``int()`` on 1-element arrays, which NumPy 2.3
turned into an error).
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
    from quarl_kernels import wo_gemm
    from quarl_kernels.ops import _packed_weight, _reference_weight

    C = wo_gemm.Config
    CASES = [  # spec, M, N, K, config, forward?, pair order?
        ("nvfp4", 3, 48, 256, C(16, 32, 16, 4, 1, swap=True), True, True),
        ("mxfp4", 5, 40, 384, C(16, 32, 32, 4, 1), True, True),       # K tail inside a tile
        ("int4-g128", 2, 40, 512, C(16, 32, 16, 4, 1), True, False),  # zero points as int32 words
        ("int4-g128-sym", 70, 40, 384, C(64, 32, 8, 4, 1, swap=True), True, False),  # M > 64, split-K
        ("nvfp4", 7, 72, 2048, C(16, 32, 16, 4, 1), True, False),     # split-K 4, N tail
        ("nvfp4", 33, 40, 384, C(64, 32, 8, 4, 1), False, True),
        ("int4-g128", 40, 72, 384, C(64, 32, 32, 4, 1), False, True),
        ("mxfp4", 9, 40, 384, C(16, 32, 32, 4, 1), False, False),
    ]
    for spec, m, n, k, cfg, fwd, pair in CASES:
        torch.manual_seed(0)
        c = make_config(spec)
        q = get_format(c.name).quantize(torch.randn(n, k) * 0.05, c)
        t = q.tensors
        args = (t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), t.get("weight_global_scale"),
                c.name, c.block_size, n, k)
        pw = _packed_weight(*args)
        w = _reference_weight(*args, dtype=torch.float32)
        if fwd:
            x = torch.randn(m, k).to(torch.bfloat16)
            y = wo_gemm.launch_fwd(x, pw, cfg, use_asm=False, pair_order=pair).float()
            ref = x.float() @ w.T
        else:
            x = torch.randn(m, n).to(torch.bfloat16)
            y = wo_gemm.launch_bwd(x, pw, cfg, use_asm=False, pair_order=pair).float()
            ref = x.float() @ w
        err = ((y - ref).norm() / ref.norm()).item()
        print(spec, m, n, k, fwd, pair, err)
        assert err < 1.5e-2 and not torch.isnan(y).any(), (spec, m, n, k, fwd, pair, err)
    from quarl_kernels import dense  # the large-M path's dequantize: equal to the reference
    for spec, n, k in (("nvfp4", 40, 400), ("mxfp4", 33, 384), ("int4-g128", 24, 384)):
        torch.manual_seed(1)
        c = make_config(spec)
        q = get_format(c.name).quantize(torch.randn(n, k) * 0.05, c)
        t = q.tensors
        pw = _packed_weight(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"),
                            t.get("weight_global_scale"), c.name, c.block_size, n, k)
        w = dense.dequantize(pw, use_asm=False).float()
        ref = q.dequantize(torch.float32)
        err = ((w - ref).norm() / ref.norm()).item()
        print("dequantize", spec, n, k, err)
        assert w.shape == (n, k) and err < 1e-2, (spec, err)
    print("OK")
""")


def test_kernels_under_triton_interpreter():
    run_interpreted(SCRIPT)
