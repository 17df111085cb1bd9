"""quarl.quant.fp8_stack on an SM90 GPU: q / k / v as one FP8 GEMM forward and one DGrad, with the Triton quantizers
and each GEMM backend, against the three FP8 linears on the same GPU -- the outputs, the weights' and biases'
gradients bit for bit (the same operands and reductions), the input's gradient within the DGrad's BF16 rounding of
the FP32 reference -- at Qwen2.5-7B's attention widths (3584 / 512 / 512) and a SmolLM2-sized odd token count."""

import importlib.util

import pytest
import torch

from quarl.quant import fp8_stack
from quarl.quant.fp8_linear import fp8_linear

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="needs an SM90 GPU")]


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("backend", ["cublas", "deepgemm"])
@pytest.mark.parametrize("m,k,widths", [(4096, 3584, (3584, 512, 512)), (77, 640, (256, 128, 128))])
def test_gpu_stack_is_the_separate_linears(monkeypatch, backend, m, k, widths):
    if backend == "deepgemm" and importlib.util.find_spec("deep_gemm") is None:
        pytest.skip("deep_gemm not built")
    monkeypatch.setenv("QUARL_FP8_GEMM", backend)
    torch.manual_seed(0)
    dev = "cuda"
    ws = [(torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16).requires_grad_() for n in widths]
    bs = [(torch.randn(n, device=dev) * 0.1).to(torch.bfloat16).requires_grad_() for n in widths]
    x = torch.randn(2, m // 2 if m % 2 == 0 else m, k, device=dev).to(torch.bfloat16).requires_grad_()
    dys = [torch.randn(*x.shape[:-1], n, device=dev).to(torch.bfloat16) for n in widths]
    runs = {}
    for name in ("stack", "separate"):
        for t in (x, *ws, *bs):
            t.grad = None
        if name == "stack":
            outs = fp8_stack.fp8_stack(x, ws, bs, "tiles")
        else:
            outs = [fp8_linear(x, w, b, wgrad="tiles") for w, b in zip(ws, bs, strict=True)]
        torch.autograd.backward(outs, dys)
        runs[name] = ([o.detach() for o in outs], x.grad.clone(), [w.grad.clone() for w in ws],
                      [b.grad.clone() for b in bs])
    (ys, dx, dws, dbs), (ys0, dx0, dws0, dbs0) = runs["stack"], runs["separate"]
    diff = [(i, (a.float() - b.float()).abs().max().item()) for i, (a, b) in enumerate(zip(ys, ys0, strict=True))
            if not torch.equal(a, b)]
    assert not diff, f"outputs differ: {diff}"
    assert all(torch.equal(a, b) for a, b in zip(dws, dws0, strict=True)), [_rel(a, b) for a, b in zip(dws, dws0)]
    assert all(torch.equal(a, b) for a, b in zip(dbs, dbs0, strict=True))
    assert _rel(dx, dx0) < 1e-2, _rel(dx, dx0)  # one BF16 rounding against three plus two BF16 adds
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(fp8_stack.fp8_stack(x, ws, bs, "tiles"), ys, strict=True))
