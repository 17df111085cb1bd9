"""SwiGLU's backward inside the FP8 quantizers (``quarl_kernels.fp8_swiglu``) on CPU: through ``TRITON_INTERPRET=1``,
against the eager reference (``F.silu(g) * u``'s autograd, then the FP8 linear's PyTorch quantizers) -- every output,
rows and columns not multiples of 128, bf16 and fp16, no tokens: scales equal, codes equal but for a counted few one
step apart (the kernel's arithmetic is approximate by design, and NumPy's ``exp`` here is not torch's) -- every launch
setting the same bits as the default, and the fused MLP (``quarl.quant.fp8_swiglu``) with the Triton quantizers: the
same forward as with the eager ones, gradients close; then every launch compiled
for sm_90 on this CPU: correctly rounded divisions, no spills, no FP8 code stored from a register the loop has not
written (``tests/kernels/sm90_sass.py``, the W^T bug's check). Skipped without Triton / NumPy < 2.3 (CPU CI)."""

from __future__ import annotations

import pytest

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

SCRIPT = """
import os
import torch
import torch.nn.functional as F
from quarl_kernels import fp8_swiglu as fs
from quarl.quant.fp8_linear import quantize_act_gemm
from quarl.quant.fp8_swiglu import fp8_swiglu, silu_mul_grads
from tests.kernels.helpers import fp8_operands_near  # codes one step off at most: NumPy's exp here is not torch's,
# and the kernel's arithmetic is approximate by design
from tests.kernels.helpers import ndiff, operands_same as all_same

def same(a, b):
    return ndiff(a, b) == 0

torch.manual_seed(0)
for m, i, dt in ((37, 320, torch.bfloat16), (130, 256, torch.bfloat16), (64, 384, torch.float16)):
    g = (torch.randn(m, i) * 3).to(dt)
    u, dh = torch.randn(m, i).to(dt), torch.randn(m, i).to(dt)
    g[3, :128] = 0  # an all-zero group in dg and du
    rows, cols, t_rows = m + (-m % 4), -(-i // 128) * 128, -(-m // 128) * 128
    dg, du = silu_mul_grads(g, u, dh)
    got = fs.swiglu_grad_operands(dh, g, u, rows, cols, t_rows)
    fp8_operands_near(got[0], quantize_act_gemm(dg, rows, cols, t_rows), f"dg {m}x{i} {dt}", 2e-3)
    fp8_operands_near(got[1], quantize_act_gemm(du, rows, cols, t_rows), f"du {m}x{i} {dt}", 2e-3)
    for st, t_st in zip(fs.ROW_SETTINGS[1:], fs.COL_SETTINGS[1:]):  # every setting: the default's bits
        other = fs.swiglu_grad_operands(dh, g, u, rows, cols, t_rows, setting=st, t_setting=t_st)
        assert all_same(other[0], got[0]) and all_same(other[1], got[1]), (st, t_st)
    for st in fs.ROW_SETTINGS[len(fs.COL_SETTINGS):]:
        other = fs.swiglu_grad_operands(dh, g, u, rows, cols, t_rows, setting=st)
        assert all_same(other[0], got[0]) and all_same(other[1], got[1]), st
    for mg in fs.MERGED_SETTINGS:  # one launch for both passes (the tile re-read for its transposed codes)
        other = fs.swiglu_grad_operands(dh, g, u, rows, cols, t_rows, merged=mg)
        assert all_same(other[0], got[0]) and all_same(other[1], got[1]), mg
    other = fs.swiglu_grad_operands(dh, g, u, rows, cols, t_rows, row_groups=False, merged=fs.MERGED_SETTINGS[0])
    assert all_same(other[0], (None, None) + got[0][2:]) and all_same(other[1], (None, None) + got[1][2:])
    for t_st in fs.COL_SETTINGS[3:]:  # the transposed operands alone (no DGrad wanted) / the row groups alone
        other = fs.swiglu_grad_operands(dh, g, u, rows, cols, t_rows, row_groups=False, t_setting=t_st)
        assert all_same(other[0], (None, None) + got[0][2:]) and all_same(other[1], (None, None) + got[1][2:])
    other = fs.swiglu_grad_operands(dh, g, u, rows, cols, None)
    assert all_same(other[0], got[0][:2] + (None, None)) and all_same(other[1], got[1][:2] + (None, None))
print("operands ok")

# g and u as the column blocks of one stacked GEMM output (row stride 2I), dh of its own layout, dg's and du's row
# groups into the column blocks of one stacked DGrad operand (out=): the bits of the separate contiguous tensors
from quarl_kernels import fp8_quant as fq
m, i = 130, 256
gu = torch.randn(m, 2 * i).to(torch.bfloat16)
g2, u2 = gu[:, :i], gu[:, i:]
dh2 = torch.randn(m, i).to(torch.bfloat16)
rows, cols, t_rows = 132, 256, 256
ref = fs.swiglu_grad_operands(dh2, g2.contiguous(), u2.contiguous(), rows, cols, t_rows)
for kw in ({}, {"merged": fs.MERGED_SETTINGS[0]}, {"setting": fs.ROW_SETTINGS[1], "t_setting": fs.COL_SETTINGS[3]}):
    q = torch.empty(rows, 2 * cols, dtype=torch.float8_e4m3fn)
    sc = torch.empty(2 * cols // 128, rows).t()
    t1, t2 = (fq._act_outputs(g2, rows, cols, t_rows, False) for _ in range(2))
    out = ((q[:, :cols], sc[:, :2], *t1[2:]), (q[:, cols:], sc[:, 2:], *t2[2:]))
    got = fs.swiglu_grad_operands(dh2, g2, u2, rows, cols, t_rows, out=out, **kw)
    assert all_same(got[0], ref[0]) and all_same(got[1], ref[1]), kw
    assert same(q[:, :cols], ref[0][0]) and same(q[:, cols:], ref[1][0])
    assert torch.equal(sc, torch.cat([ref[0][1], ref[1][1]], 1))
try:
    fs.swiglu_grad_operands(dh2, g2, u2.contiguous(), rows, cols, t_rows)
    raise AssertionError("g and u of two layouts accepted")
except ValueError as e:
    assert "one layout" in str(e)
print("stacked ok")

empty = torch.zeros(0, 256, dtype=torch.bfloat16)
(q, s, qt, st), _ = fs.swiglu_grad_operands(empty, empty, empty, 0, 256, 128)
assert q.shape == (0, 256) and qt.shape == (256, 128) and not qt.view(torch.uint8).any()
assert torch.all(st == torch.finfo(torch.float32).eps)

# the fused MLP with the Triton quantizers against the eager ones: the same forward, the gradients within the
# backward's fast arithmetic
def grads(backend, wgrad, inter):
    os.environ["QUARL_FP8_QUANT"] = backend
    torch.manual_seed(1)
    x = torch.randn(2, 37, 192).to(torch.bfloat16).requires_grad_()
    ws = [(torch.randn(*s) * 0.05).to(torch.bfloat16).requires_grad_()
          for s in ((inter, 192), (inter, 192), (192, inter))]
    y = fp8_swiglu(x, *ws, wgrad=wgrad)
    y.backward(torch.randn_like(y))
    return [y, x.grad, *(w.grad for w in ws)]

for wgrad, inter in (("1x128", 320), ("tiles", 320), ("tiles", 256)):  # 256: gate / up stacked
    got, want = grads("triton", wgrad, inter), grads("eager", wgrad, inter)
    for name, a, b in zip(("y", "dx", "dWg", "dWu", "dWd"), got, want):
        rel = ((a.float() - b.float()).norm() / b.float().norm()).item()
        print(wgrad, inter, name, "relative difference", rel)
        assert rel < 1e-2 and (name != "y" or torch.equal(a, b)), (wgrad, name, rel)
print("mlp ok")
print("OK")
"""


@needs_interpreter
def test_fp8_swiglu_under_triton_interpreter():
    run_interpreted(SCRIPT, timeout=600)


def _launches():
    """Every launch setting of both passes at a 7B-width shape: the row pass with the transposed operands' scales,
    the transposed pass."""
    import torch
    from quarl_kernels import fp8_quant as fq
    from quarl_kernels import fp8_swiglu as fs

    g = torch.empty(8192, 18944, dtype=torch.bfloat16)
    m, i = g.shape
    one, two = fq._act_outputs(g, m, i, m, True), fq._act_outputs(g, m, i, m, True)
    for st in fs.ROW_SETTINGS:
        yield f"rows {st}", fs._row_launch(g, g, g, ((one[0], one[1], one[3]), (two[0], two[1], two[3])), m, i, m, *st)
    for st in fs.COL_SETTINGS:
        yield f"cols {st}", fs._col_launch(g, g, g, ((one[2], one[3]), (two[2], two[3])), i, m, *st)
    for st in fs.MERGED_SETTINGS:
        yield f"merged {st}", fs._row_launch(g, g, g, ((one[0], one[1], one[3]), (two[0], two[1], two[3])), m, i, m,
                                             *st[:2], qts=(one[2], two[2]), t_chunk=st[2])


@needs_triton
def test_fp8_swiglu_kernels_compile_for_sm90():
    from tests.kernels.sm90_sass import compile_launch, cuobjdump, stack_bytes, stale_code_stores

    if cuobjdump() is None:
        pytest.skip("the Triton wheel ships no cuobjdump")
    for name, launch in _launches():
        device = {k: v for k, v in (("SCALE_RECIP", True), ("INTERPRET", False)) if k in launch.kernel.arg_names}
        k, sass = compile_launch(launch, **device)
        ptx = k.asm["ptx"]
        assert "div.full" in ptx and "ex2.approx" in ptx, name  # the fast reciprocal and exp (approximate by design)
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx, name  # RNE E4M3 with saturation
        assert name.startswith("cols") or "0f3B124925" in ptx, name  # the scales: amax * fp32(1/448), as CUDA torch
        assert stack_bytes(k) == 0, f"{name}: ptxas spilled registers"
        assert not stale_code_stores(sass), f"{name}: FP8 codes stored before they were written"
