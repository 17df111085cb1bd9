"""The last pass of the weight-only GEMMs (``launch.finish`` / ``Epilogue``) on CPU through ``TRITON_INTERPRET=1``.

``y = sum_s ws[s] + bias + scaling * a @ b^T``: split partials (fp32) and the in-place
unsplit pass over a bf16 ``y``; with and without a bias; LoRA ranks 0, 4 (padded to tl.dot's
16), 12 (not a power of two) and 32; ``a`` as a column slice of a packed A output (row stride
> r), as the engine passes it; M across both row tiles (16 and 32) and N tails. Then the whole
GEMV launch with an epilogue against the format's own dequantize. The reference is fp32; the
interpreter rounds fp32 -> bf16 by truncation, so bf16 outputs are held to 1e-2 relative
(the GPU test, ``test_epilogue_gpu.py``, holds the real kernels tighter).

Skipped unless Triton is importable and NumPy < 2.3 (see test_wo_gemm_interpreter.py).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

ROOT = Path(__file__).resolve().parents[2]

pytestmark = needs_interpreter

SCRIPT = textwrap.dedent("""
    import torch
    from quarl.quant import get_format, make_config
    from quarl_kernels import gemv
    from quarl_kernels.launch import Epilogue, finish
    from quarl_kernels.ops import _packed_weight, _reference_weight

    def rel(y, ref):
        return ((y.float() - ref).norm() / ref.norm()).item()

    CASES = [  # M, N, split, bias, r, packed columns of a (G * r)
        (1, 200, 1, True, 32, 96),  # decode rows: the register broadcast (no tl.dot)
        (1, 200, 4, True, 32, 96),
        (5, 130, 3, False, 12, 12),
        (16, 256, 1, True, 0, 0),  # bias only
        (20, 96, 2, True, 4, 8),  # tl.dot tiles from 9 rows up
        (40, 160, 5, False, 32, 64),
        (8, 300, 6, True, 64, 192),  # the broadcast's widest rows, rank 64: BN shrinks to 16
        (3, 70, 1, False, 7, 21),  # odd rows and rank
    ]
    for m, n, split, has_bias, r, gr in CASES:
        torch.manual_seed(m * 7 + n)
        full = torch.randn(split, m, n)  # the K-split partials of x @ W^T
        bias = torch.randn(n).to(torch.bfloat16) if has_bias else None
        a_all = torch.randn(m, max(gr, 1)).to(torch.bfloat16)
        a = a_all[:, gr - r:] if r else None  # the last projection's columns: a strided slice
        b = (torch.randn(n, r) * 0.2).to(torch.bfloat16) if r else None
        ref = full.sum(0)
        if has_bias:
            ref = ref + bias.float()
        if r:
            ref = ref + 0.75 * a.float() @ b.float().T
        if split > 1:
            y = torch.empty(m, n, dtype=torch.bfloat16)
            finish(full.contiguous(), y, split, Epilogue(bias, a, b, 0.75))
        else:
            y = full[0].to(torch.bfloat16)
            ref = y.float() + (ref - full[0])  # the unsplit pass starts from y's own bf16 values
            finish(None, y, 1, Epilogue(bias, a, b, 0.75))
        err = rel(y, ref)
        print("finish", m, n, split, has_bias, r, err)
        assert y.dtype == torch.bfloat16 and err < 1e-2, (m, n, split, has_bias, r, err)

    # a as the A GEMM's fp32 split partials (quarl_kernels.lora_a): the same bits as a given as their sum in
    # split order, rounded to bf16 (RNE) -- what the last pass computes from them
    from quarl_kernels.ops import _sum_parts
    for m, n, split, sa, gr, r in ((1, 200, 4, 1, 96, 32), (5, 130, 1, 5, 64, 32), (20, 96, 3, 2, 24, 8)):
        torch.manual_seed(m + n)
        parts = torch.randn(sa, m, gr)[..., gr - r:]  # [S, M, r]: the last projection's columns
        b = (torch.randn(n, r) * 0.2).to(torch.bfloat16)
        bias = torch.randn(n).to(torch.bfloat16)
        full = torch.randn(split, m, n)
        outs = []
        for a in (parts, _sum_parts(parts).to(torch.bfloat16)):
            if split > 1:
                y = torch.empty(m, n, dtype=torch.bfloat16)
                finish(full.contiguous(), y, split, Epilogue(bias, a, b, 0.75))
            else:
                y = full[0].to(torch.bfloat16)
                finish(None, y, 1, Epilogue(bias, a, b, 0.75))
            outs.append(y)
        assert torch.equal(outs[0], outs[1]), (m, n, split, (outs[0].float() - outs[1].float()).abs().max())
        print("finish with A partials", m, n, split, sa, "ok")

    # the up projection's last pass with the MLP's activation: silu(gate) * y, bit for bit act.silu_mul of the y
    # the same pass writes without the gate (split and in place)
    from quarl_kernels.act import silu_mul
    for m, n, split, r in ((1, 200, 4, 32), (5, 130, 1, 0), (20, 96, 3, 8)):
        torch.manual_seed(m * 3 + n)
        full = torch.randn(split, m, n)
        gate = (torch.randn(m, n) * 3).to(torch.bfloat16)
        a = torch.randn(m, max(r, 1)).to(torch.bfloat16) if r else None
        b = (torch.randn(n, r) * 0.2).to(torch.bfloat16) if r else None
        outs = []
        for g in (None, gate):
            if split > 1:
                y = torch.empty(m, n, dtype=torch.bfloat16)
                finish(full.contiguous(), y, split, Epilogue(None, a, b, 0.5, gate=g))
            else:
                y = full[0].to(torch.bfloat16)
                finish(None, y, 1, Epilogue(None, a, b, 0.5, gate=g))
            outs.append(y)
        assert torch.equal(outs[1], silu_mul(gate, outs[0])), (m, n, split, r)
        print("finish with the gate", m, n, split, r, "ok")

    # no epilogue, split: the plain reduction (what every launcher did before)
    full = torch.randn(3, 4, 50)
    y = torch.empty(4, 50)
    finish(full, y, 3, None)
    assert torch.allclose(y, full.sum(0), atol=1e-5)

    # the whole GEMV launch with bias + LoRA in its last pass
    C = gemv.GemvConfig
    for spec, m, n, k, cfg in [("nvfp4", 1, 48, 256, C(16, 8, 4, 4)), ("mxfp4", 3, 40, 384, C(16, 8, 2, 4))]:
        torch.manual_seed(1)
        c = make_config(spec)
        q = get_format(c.name).quantize(torch.randn(n, k) * 0.05, c)
        t = q.tensors
        args = (t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"), t.get("weight_global_scale"),
                c.name, c.block_size, n, k)
        w = _reference_weight(*args, dtype=torch.float32)
        x = torch.randn(m, k).to(torch.bfloat16)
        bias = torch.randn(n).to(torch.bfloat16)
        a = torch.randn(m, 8).to(torch.bfloat16)
        b = (torch.randn(n, 8) * 0.1).to(torch.bfloat16)
        y = gemv.launch_gemv(x, _packed_weight(*args), cfg, use_asm=False, epi=Epilogue(bias, a, b, 2.0))
        ref = x.float() @ w.T + bias.float() + 2.0 * a.float() @ b.float().T
        err = rel(y, ref)
        print("gemv+epilogue", spec, m, n, k, err)
        assert err < 1.5e-2 and not torch.isnan(y.float()).any(), (spec, err)
    print("OK")
""")


def test_epilogue_under_triton_interpreter():
    run_interpreted(SCRIPT)


@needs_triton
def test_epilogue_builds_for_sm90_without_spills():
    """The launches ``finish`` makes, built for Hopper on a CPU: one decode row as register outer
    products, more rows with the LoRA term on the tensor cores (HMMA), no spills at 64 unrolled splits."""
    import collections

    import torch
    from quarl_kernels import launch as L

    from tests.kernels.sm90_sass import compile_launch, stack_bytes

    Launch = collections.namedtuple("Launch", "kernel grid args constexprs num_warps")
    for m, n, split, r, parts in [(1, 512, 64, 32, 0), (1, 18944, 8, 64, 0), (8, 18944, 4, 32, 0),
                                  (64, 512, 32, 32, 0), (64, 18944, 4, 64, 0), (1, 512, 64, 32, 5),
                                  (8, 18944, 4, 32, 5), (16, 512, 32, 32, 4), (8, 3584, 8, 32, 4)]:
        bm, bn, rp, dot = L._epilogue_tiles(m, n, r)
        ws, y = torch.empty(split, m, n), torch.empty(m, n, dtype=torch.bfloat16)
        if parts:  # the A GEMM's fp32 split partials (quarl_kernels.lora_a), a column slice
            a = torch.empty(parts, m, 3 * r)[..., :r]
        else:
            a = torch.empty(m, 3 * r, dtype=torch.bfloat16)[:, :r]
        b, bias = torch.empty(n, r, dtype=torch.bfloat16), torch.empty(n, dtype=torch.bfloat16)
        gate = parts == 4  # the up projection's last pass with the MLP's SiLU
        la = Launch(L.epilogue_kernel, None, (ws, y, bias, a, b, m, n, 0.5, ws.stride(0), ws.stride(1), a.stride(-2),
                                              a.stride(0) if parts else 0, y, y.stride(0)),
                    {"SPLIT_K": split, "HAS_BIAS": True, "R": r, "RP": rp, "BM": bm, "BN": bn, "DOT": dot,
                     "INTERPRET": False, "A_PARTS": bool(parts), "SA": max(parts, 1), "HAS_GATE": gate}, 4)
        k, sass = compile_launch(la, fp_fusion=True)  # as launch.finish launches it: FP contraction on
        assert ("HMMA" in sass) == dot, (m, n, r)
        assert stack_bytes(k) in (0, None), ("ptxas spilled registers", m, n, split, r)
