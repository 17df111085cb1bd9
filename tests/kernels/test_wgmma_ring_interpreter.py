"""The TMA-ring kernel's x permutation (``ring_x._permute_x_kernel``) on CPU through ``TRITON_INTERPRET=1``:
bit-equal to ``permute_x_reference`` (the A fragment's logical k order per 64-wide K step) at odd M, K of one and of
several 1024-wide blocks, and a row stride wider than K (a column slice, as a packed projection output would be).

Skipped unless Triton is importable and NumPy < 2.3 (``tests/kernels/interpreter.py``)."""

from __future__ import annotations

import textwrap

from tests.kernels.interpreter import needs_interpreter, run_interpreted

pytestmark = needs_interpreter

SCRIPT = textwrap.dedent("""
    import torch, triton
    from quarl_kernels import ring_x, wgmma_ring

    torch.manual_seed(0)
    for m, k, extra in [(5, 64, 0), (17, 448, 0), (3, 3584, 64)]:
        base = torch.randn(m, k + extra).to(torch.bfloat16)
        x = base[:, :k]  # row stride k + extra
        out = torch.empty(m, k, dtype=torch.bfloat16)
        ring_x._permute_x_kernel[(m, triton.cdiv(k, 1024))](x, out, k, x.stride(0), BLOCK=1024, J=2)
        assert torch.equal(out, wgmma_ring.permute_x_reference(x, 8)), (m, k)
    print("OK")
""")


def test_permute_kernel_matches_the_reference():
    run_interpreted(SCRIPT)
