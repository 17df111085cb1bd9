"""The down projection's DGrad with SwiGLU's backward in its epilogue (``quarl_kernels.fp8_dgrad_swiglu``) on CUDA.

Bit for bit against the DGrad GEMM then ``fp8_swiglu``'s quantizer pass where every FP32 sum is exact (small-integer
codes, power-of-two scales: any summation order gives the same dh), every launch setting, padded rows and columns,
g and u as the column blocks of a stacked output, into a stacked operand (``out=``); then the fused MLP at 7B width with
``QUARL_FP8_SWIGLU_DGRAD=1`` against ``0``: the forward and the down weight's gradient equal (untouched), the other
gradients within 1e-3 relative (dh summed in this kernel's order, not DeepGEMM's / cuBLAS's; printed).

Run on a CUDA machine: ``pytest -q -m gpu tests/kernels/test_fp8_dgrad_swiglu_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the kernels need Triton (CPU CI has none)")
from quarl_kernels import fp8_dgrad_swiglu as fd
from quarl_kernels import fp8_quant as fq
from quarl_kernels import fp8_swiglu as fs

from quarl.quant.fp8_swiglu import fp8_swiglu
from tests.kernels.helpers import mlp_grads, mlp_inputs, ndiff

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("m,k,n", [(4099, 3584, 1600), (8192, 3584, 18944)])
def test_exact_operands_give_the_quantizer_pass_bits(m, k, n):
    torch.manual_seed(0)
    mp, cols, t_rows = -(-m // 4) * 4, -(-n // 128) * 128, -(-m // 128) * 128
    dev = "cuda"
    a = torch.randint(-8, 9, (mp, k), device=dev).float().to(torch.float8_e4m3fn)
    a[m:] = 0
    sa = (2.0 ** torch.randint(-8, -6, (k // 128, mp), device=dev).float()).t()
    b = torch.randint(-8, 9, (cols, k), device=dev).float().to(torch.float8_e4m3fn)
    b[n:] = 0
    sb = 2.0 ** torch.randint(-6, -4, (cols // 128, k // 128), device=dev).float()
    gu = (torch.randn(m, 2 * n, device=dev) * 3).to(torch.bfloat16)
    g, u = gu[:, :n], gu[:, n:]
    deq_a = (a.float().view(mp, k // 128, 128) * sa[:, :, None]).view(mp, k)
    deq_b = (b.float().view(cols // 128, 128, k // 128, 128) * sb[:, None, :, None]).view(cols, k)
    # exact: block sums <= 2^13 at scales 2^-14..2^-12, 28 blocks: within 2^24 ulps
    dh = (deq_a.double() @ deq_b.double().t()).float()[:m, :n].to(torch.bfloat16)
    for rg in (True, False):
        want = fs.swiglu_grad_operands(dh, g, u, mp, cols, t_rows, row_groups=rg)
        for st in fd.SETTINGS:
            got = fd.dgrad_swiglu_operands(a, sa, b, sb, g, u, mp, cols, t_rows, row_groups=rg, setting=st)
            assert all(ndiff(x, y) == 0 for o, w in zip(got, want, strict=True) for x, y in zip(o, w, strict=True)), \
                (rg, st)
    # into the column blocks of one stacked DGrad operand
    q = torch.empty(mp, 2 * cols, device=dev, dtype=torch.float8_e4m3fn)
    sc = fq._outer_major(mp, 2 * cols // 128, g.device)
    t1, t2 = (fq._act_outputs(g, mp, cols, t_rows, False) for _ in range(2))
    c = cols // 128
    fd.dgrad_swiglu_operands(a, sa, b, sb, g, u, mp, cols, t_rows,
                             out=((q[:, :cols], sc[:, :c], *t1[2:]), (q[:, cols:], sc[:, c:], *t2[2:])))
    want = fs.swiglu_grad_operands(dh, g, u, mp, cols, t_rows)
    assert ndiff(q[:, :cols], want[0][0]) == 0 and ndiff(q[:, cols:], want[1][0]) == 0
    assert ndiff(t1[2], want[0][2]) == 0 and ndiff(t2[2], want[1][2]) == 0


@pytest.mark.parametrize("wgrad", ["1x128", "tiles"])
def test_fused_mlp_with_the_fused_dgrad(wgrad, monkeypatch):
    ws, x, dy = mlp_inputs()

    def run(switch):
        monkeypatch.setenv("QUARL_FP8_SWIGLU_DGRAD", switch)
        return mlp_grads(lambda: fp8_swiglu(x, *ws, wgrad=wgrad), x, ws, dy)

    got, want = run("1"), run("0")
    for name, a, b in zip(("y", "dx", "dWg", "dWu", "dWd"), got, want, strict=True):
        rel = ((a.float() - b.float()).norm() / b.float().norm()).item()
        print(f"{name} ({wgrad}): relative difference {rel:.2e}, equal {torch.equal(a, b)}")
        assert rel < 1e-3 and (name not in ("y", "dWd") or torch.equal(a, b)), (name, rel)
