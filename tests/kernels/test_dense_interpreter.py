"""The dense path's decode (``quarl_kernels.dense.dequantize``) on CPU through ``TRITON_INTERPRET=1``: into a
caller's buffer (``out=``: a row block of a weight decoded into a reused scratch, as
``benchmarks/kernels/bench_dense_chunks.py`` does) equal to a fresh decode, and a wrong ``out`` refused by name.

Skipped unless Triton is importable and NumPy < 2.3 (see test_wo_gemm_interpreter.py).
"""

from __future__ import annotations

import textwrap

from tests.kernels.interpreter import needs_interpreter, run_interpreted

SCRIPT = textwrap.dedent("""
    import torch
    from quarl.quant import get_format, make_config
    from quarl_kernels import dense, wo_gemm
    from quarl_kernels.ops import _packed_weight

    c = make_config("nvfp4")
    n, k = 96, 256
    torch.manual_seed(0)
    t = get_format(c.name).quantize(torch.randn(n, k) * 0.03, c).tensors
    pw = _packed_weight(t["weight_packed"], t["weight_scale"], None, t.get("weight_global_scale"), c.name,
                        c.block_size, n, k)
    whole = dense.dequantize(pw)
    scratch = torch.full((48, k), float("nan"), dtype=torch.bfloat16)
    for n0 in range(0, n, 40):  # blocks of 40 rows (the last one 16) into the same buffer
        n1 = min(n0 + 40, n)
        sub = wo_gemm.PackedWeight(pw.fmt, pw.group, n1 - n0, k, pw.words[n0:n1], pw.scale[n0:n1], None, pw.gscale,
                                   pw.bytes32)
        got = dense.dequantize(sub, out=scratch[: n1 - n0])
        assert got.data_ptr() == scratch.data_ptr() and torch.equal(got, whole[n0:n1]), n0
    for bad in (torch.empty(n, k + 8, dtype=torch.bfloat16), torch.empty(n, k, dtype=torch.float16),
                torch.empty(k, n, dtype=torch.bfloat16).T):
        try:
            dense.dequantize(pw, out=bad)
        except ValueError as e:
            assert "bf16 [96, 256] with unit column stride" in str(e), e
        else:
            raise AssertionError("a wrong out was accepted")
    print("OK")
""")


@needs_interpreter
def test_dequantize_into_a_reused_buffer():
    run_interpreted(SCRIPT)
