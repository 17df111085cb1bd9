"""The Triton block kernel of GPTQ's column loop (``quarl_kernels.gptq_block``).

On CPU through ``TRITON_INTERPRET=1``: bit for bit the reference loop (act-order, static groups)
for NVFP4, MXFP4, INT4-g128, INT3-g128 (asymmetric) and INT4-g128-sym, including a short last
lazy block. And it lowers for sm_90 without a GPU, with no fused multiply-add in its PTX (what
the bit-exactness on the GPU rests on: PyTorch rounds the product and the difference apart).
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (CPU CI has none)")

SCRIPT = r"""
import torch
from quarl.calibrate.gptq import gptq_quantize
from quarl.quant import make_config
from tests.calibrate.test_gptq import correlated_hessian

g = torch.Generator().manual_seed(3)
for spec, n, k in (("nvfp4", 20, 160), ("mxfp4", 16, 128), ("int4-g128", 20, 256), ("int3-g128", 16, 128),
                   ("int4-g128-sym", 16, 128)):  # nvfp4: a short last lazy block (32 columns)
    w = torch.randn(n, k, generator=g)
    H = correlated_hessian(k, tokens=1024, seed=4)
    H[7, :] = 0  # a dead input channel
    H[:, 7] = 0
    cfg = make_config(spec)
    ref = gptq_quantize(w, H, cfg, act_order=True, column_loop="reference")
    tri = gptq_quantize(w, H, cfg, act_order=True, column_loop="triton")
    assert torch.equal(ref.q, tri.q), (spec, (ref.q == tri.q).float().mean())
    assert ref.loss == tri.loss, spec
    assert torch.equal(torch.signbit(ref.q), torch.signbit(tri.q)), spec  # -0.0 where PyTorch gives it
    assert all(torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                           b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
               for a, b in zip(ref.qtensor.tensors.values(), tri.qtensor.tensors.values())), spec
    print(spec, "ok")
print("OK")
"""


@needs_triton
def test_triton_block_kernel_equals_reference_under_interpreter():
    path = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), *sys.path])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300, check=False, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("OK"), r.stdout + r.stderr[-3000:]


@needs_triton
@pytest.mark.parametrize("fmt", [0, 1])  # FP4; INT asymmetric (symmetric is the same code less the zero point)
def test_triton_block_kernel_lowers_for_sm90_without_fma(fmt):
    import torch
    from quarl_kernels import gptq_block as gb

    from tests.kernels.sm90_sass import compile_launch

    n = 37888  # the 7B gate/up rows
    launch = SimpleNamespace(  # what compile_launch reads
        kernel=gb._gptq_block_kernel, num_warps=4,
        args=[torch.empty(n, 3584), torch.empty(n, 3584), torch.empty(n, 128), torch.empty(128, 128),
              torch.empty(128, n), torch.empty(128, n), n, 3584, 3584, 128, 128, -8.0, 7.0],
        constexprs={"cnt": 128, "B": 128, "BN": gb.BN, "FMT": fmt, "INTERPRET": False},
    )
    k, _ = compile_launch(launch)
    ptx = k.asm["ptx"]
    assert not re.search(r"\bfma\.", ptx)  # products rounded before the subtraction, as in PyTorch
    assert re.search(r"\bdiv\.rn\.f32", ptx) and re.search(r"\bcvt\.rni\.f32\.f32", ptx)  # IEEE division, rint
