"""The down projection's DGrad with SwiGLU's backward in its epilogue (``quarl_kernels.fp8_dgrad_swiglu``) on CPU:
through ``TRITON_INTERPRET=1`` against the GEMM then ``fp8_swiglu``'s quantizer pass on the same dh -- operands built
so that every FP32 sum is exact (small-integer codes, power-of-two scales), whatever the summation order, so the two
must agree bit for bit: padded rows and columns, both groupings, the row groups alone, the transposed ones alone, out=
into a stacked operand, every setting, no tokens; the fused MLP with QUARL_FP8_SWIGLU_DGRAD=1 against 0 (the same
forward, gradients within dh's summation order); then every launch setting compiled for sm_90 on this CPU: wgmma, no
spills, no FP8 code stored from a register the loop has not written. Skipped without Triton / NumPy < 2.3."""

from __future__ import annotations

import pytest

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

SCRIPT = """
import torch
from quarl_kernels import fp8_dgrad_swiglu as fd
from quarl_kernels import fp8_quant as fq
from quarl_kernels import fp8_swiglu as fs
from tests.kernels.helpers import ndiff, operands_same as all_same

def same(a, b):
    return ndiff(a, b) == 0

torch.manual_seed(0)
m, k, n = 200, 256, 320  # tokens, H (the DGrad's K), I (its N): I padded to 384, tokens to 204 / 256
mp, cols, t_rows = 204, 384, 256
a = torch.randint(-8, 9, (mp, k)).float().to(torch.float8_e4m3fn)
a[m:] = 0  # the quantizer's padded rows
sa = (2.0 ** torch.randint(-8, -6, (k // 128, mp)).float()).t()  # [Mp, K/128], M-major as the quantizer's
b = torch.randint(-8, 9, (cols, k)).float().to(torch.float8_e4m3fn)  # Wd^T's tiles [Ip, K]
b[n:] = 0  # the tile quantizer's padded rows
sb = 2.0 ** torch.randint(-6, -4, (cols // 128, k // 128)).float()
gu = (torch.randn(m, 2 * n) * 3).to(torch.bfloat16)
g, u = gu[:, :n], gu[:, n:]  # column blocks of one stacked GEMM output, as the fused MLP's
# the exact dh: block sums <= 2**13 times scales 2**-14..-12, so every partial sum within 2**24 ulps
deq_a = (a.float().view(mp, k // 128, 128) * sa[:, :, None]).view(mp, k)
deq_b = (b.float().view(cols // 128, 128, k // 128, 128) * sb[:, None, :, None]).view(cols, k)
dh = (deq_a @ deq_b.t())[:m, :n].to(torch.bfloat16)
assert torch.equal(fd.dgrad_only(a, sa, b, sb, m, n), dh)  # the GEMM part alone: the exact dh, rounded once
for kw in ({}, {"row_groups": False}):
    want = fs.swiglu_grad_operands(dh, g, u, mp, cols, t_rows, **kw)
    for st in fd.SETTINGS:
        got = fd.dgrad_swiglu_operands(a, sa, b, sb, g, u, mp, cols, t_rows, setting=st, **kw)
        assert all_same(got[0], want[0]) and all_same(got[1], want[1]), (kw, st)
want = fs.swiglu_grad_operands(dh, g, u, mp, cols, None)
got = fd.dgrad_swiglu_operands(a, sa, b, sb, g, u, mp, cols, None)
assert all_same(got[0], want[0]) and all_same(got[1], want[1]), "row groups alone"
# into the column blocks of one stacked DGrad operand
ref = fs.swiglu_grad_operands(dh, g, u, mp, cols, t_rows)
q = torch.empty(mp, 2 * cols, dtype=torch.float8_e4m3fn)
sc = torch.empty(2 * cols // 128, mp).t()
t1, t2 = (fq._act_outputs(g, mp, cols, t_rows, False) for _ in range(2))
c = cols // 128
out = ((q[:, :cols], sc[:, :c], *t1[2:]), (q[:, cols:], sc[:, c:], *t2[2:]))
got = fd.dgrad_swiglu_operands(a, sa, b, sb, g, u, mp, cols, t_rows, out=out)
assert all_same(got[0], ref[0]) and all_same(got[1], ref[1])
assert same(q[:, :cols], ref[0][0]) and same(q[:, cols:], ref[1][0])
try:
    fd.dgrad_swiglu_operands(a, sa, b[:, :128], sb, g, u, mp, cols, t_rows)
    raise AssertionError("mismatched K accepted")
except ValueError as e:
    assert "multiple of 128" in str(e)
empty = torch.zeros(0, n, dtype=torch.bfloat16)
(q0, s0, qt0, st0), _ = fd.dgrad_swiglu_operands(a[:0], sa[:0], b, sb, empty, empty, 0, cols, 128)
assert q0.shape == (0, cols) and not qt0.view(torch.uint8).any() and torch.all(st0 == torch.finfo(torch.float32).eps)

# the fused MLP (quarl.quant.fp8_swiglu) with the Triton quantizers, QUARL_FP8_SWIGLU_DGRAD=1 against 0: the same
# forward and down-weight gradient (untouched), the other gradients within dh's summation order
import os
from quarl.quant.fp8_swiglu import fp8_swiglu

def grads(fused, inter):
    os.environ["QUARL_FP8_QUANT"] = "triton"
    os.environ["QUARL_FP8_SWIGLU_DGRAD"] = fused
    torch.manual_seed(1)
    x = torch.randn(2, 37, 192).to(torch.bfloat16).requires_grad_()
    ws = [(torch.randn(*s) * 0.05).to(torch.bfloat16).requires_grad_()
          for s in ((inter, 192), (inter, 192), (192, inter))]
    y = fp8_swiglu(x, *ws, wgrad="tiles")
    y.backward(torch.randn_like(y))
    return [y, x.grad, *(w.grad for w in ws)]

for inter in (256, 320):  # gate / up stacked, and two GEMMs with I padded
    for name, a_, b_ in zip(("y", "dx", "dWg", "dWu", "dWd"), grads("1", inter), grads("0", inter)):
        rel = ((a_.float() - b_.float()).norm() / b_.float().norm()).item()
        print(inter, name, "relative difference", rel)
        assert rel < 1e-2 and (name not in ("y", "dWd") or torch.equal(a_, b_)), (inter, name, rel)
print("OK")
"""


@needs_interpreter
def test_dgrad_swiglu_under_triton_interpreter():
    run_interpreted(SCRIPT, timeout=600)


def _launches():
    """Every setting at the 7B width (16k tokens, H 3584, I 18944), both groupings."""
    import torch
    from quarl_kernels import fp8_dgrad_swiglu as fd
    from quarl_kernels import fp8_quant as fq

    m, k, n = 16384, 3584, 18944
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn)
    sa = torch.empty(k // 128, m).t()
    b = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    sb = torch.empty(n // 128, k // 128)
    gu = torch.empty(m, 2 * n, dtype=torch.bfloat16)
    g, u = gu[:, :n], gu[:, n:]
    one, two = fq._act_outputs(g, m, n, m, True), fq._act_outputs(g, m, n, m, True)
    for st in fd.SETTINGS:
        yield f"{st}", fd.launch_spec(a, sa, b, sb, g, u, one, two, m, n, m, st)
    yield "the GEMM alone", fd.dgrad_only_spec(a, sa, b, sb, torch.empty(m, n, dtype=torch.bfloat16))


@needs_triton
def test_dgrad_swiglu_compiles_for_sm90():
    from tests.kernels.sm90_sass import compile_launch, cuobjdump, registers, stack_bytes, stale_code_stores

    if cuobjdump() is None:
        pytest.skip("the Triton wheel ships no cuobjdump")
    for name, launch in _launches():
        k, sass = compile_launch(launch, SCALE_RECIP=True, INTERPRET=False)
        print(name, "registers", registers(k), "stack", stack_bytes(k))
        assert "wgmma" in k.asm["ptx"], f"{name}: no Hopper tensor-core MMA"
        assert name == "the GEMM alone" or "cvt.rn.satfinite.e4m3x2.f32" in k.asm["ptx"], name
        assert stack_bytes(k) == 0, f"{name}: ptxas spilled registers"
        assert not stale_code_stores(sass), f"{name}: FP8 codes stored before they were written"
