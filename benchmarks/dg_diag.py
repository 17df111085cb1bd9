"""One DeepGEMM FP8 GEMM on unit scales, step by step (the session-7 diagnosis of a crash)."""
import os
import sys

import torch

print("torch", torch.__version__, torch.version.cuda, "CUDA_HOME", os.environ.get("CUDA_HOME"), flush=True)
import deep_gemm

print("deep_gemm", deep_gemm.__file__, flush=True)
m, n, k = 256, 512, 1024
a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
sa = torch.ones(m, k // 128, device="cuda")
sb = torch.ones(n // 128, k // 128, device="cuda")
d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
for name, args in (("1d2d", {"recipe": (1, 128, 128)}), ("default", {})):
    print("calling", name, flush=True)
    try:
        deep_gemm.fp8_gemm_nt((a, sa), (b, sb), d, **args)
        torch.cuda.synchronize()
        ref = a.float() @ b.float().t()
        print(name, "ok, rel", float((d.float() - ref).norm() / ref.norm()), flush=True)
    except Exception as e:  # noqa: BLE001
        print(name, "raised", type(e).__name__, str(e)[:2000], flush=True)
sys.stdout.flush()
