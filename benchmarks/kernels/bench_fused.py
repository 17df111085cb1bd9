"""Micro-benchmark: the engine's fused kernels against the unfused PyTorch sequences they replace.

    PYTHONPATH=kernels python benchmarks/kernels/bench_fused.py [--hidden 3584 5120] [--batch 1 8 64]
        [--dtype bf16] [--reps 50] [--iters 30] [--out results.json]

Ops, at the shapes of the model a hidden size stands for (3584: Qwen2.5-7B, 28 / 4 heads of 128,
intermediate 18944; 5120: Qwen2.5-14B, 40 / 8 heads, 13824; anything else: heads of 128, GQA 7:1,
intermediate 5.3x), ``batch`` tokens (one decode step of ``batch`` rows):

    rms_norm        HF Qwen2RMSNorm(x)                          vs fused rms_norm
    add_rms_norm    h = h + o; norm(h)                           vs one kernel (the engine's pattern)
    rms_norm_fp8    norm(x); quantize_act_1x128(.)               vs rms_norm(fp8_out=True)
    rope_qk         apply_rope(q), apply_rope(k)                 vs rope_qk
    qk_head_norm    Qwen3 q_norm(q), k_norm(k) on [B, 1, H, D]   vs two fused rms_norm calls
    silu_mul        F.silu(gate) * up                            vs silu_mul
    layer_glue      one decode layer's glue: add+norm, RoPE, add+norm, silu*up (no GEMMs, no attention)

Timing is what the engine sees: ``--reps`` calls captured in one CUDA graph, replayed ``--iters``
times; the per-call median is reported (``graph_us``), next to plain eager launches (``eager_us``,
Python dispatch included). ``kernels`` is the number of GPU kernels one call launches (profiler).
Before timing, each fused op is checked against its reference (RoPE and the residual add exactly,
the norm and SiLU within 2 bf16 ulps), so a broken kernel cannot produce a number.

Prints one JSON object: device, versions, and one row per (op, hidden, batch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

SHAPES = {3584: (28, 4, 128, 18944), 5120: (40, 8, 128, 13824)}  # H, H_kv, D, intermediate
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def model_shape(hidden: int) -> tuple[int, int, int, int]:
    if hidden in SHAPES:
        return SHAPES[hidden]
    h = max(1, hidden // 128)
    return h, max(1, h // 7), 128, int(hidden * 5.3) // 64 * 64


def time_graph(fn, reps: int, iters: int) -> float:
    """Median microseconds per call of ``fn`` replayed from a CUDA graph of ``reps`` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def time_eager(fn, reps: int, iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def count_kernels(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return sum(1 for e in prof.events() if e.device_type == cuda and "memcpy" not in e.name.lower()
               and "memset" not in e.name.lower())


def ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    mant = 7 if b.dtype == torch.bfloat16 else 10
    bf = b.float()
    ulp = torch.exp2(torch.floor(torch.log2(bf.abs().clamp_min(1e-30))) - mant)
    return float(((a.float() - bf).abs() / ulp).nan_to_num(0.0).max())


def cases(hidden: int, batch: int, dtype: torch.dtype):
    """(name, fused fn, unfused fn, check) for one shape; the check raises on a wrong result."""
    from quarl_kernels import fused_ops
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from quarl.engine.fused import apply_rope
    from quarl.quant.formats.fp8 import quantize_act_1x128

    H, HK, D, inter = model_shape(hidden)
    dev = "cuda"
    torch.manual_seed(0)
    norm = Qwen2RMSNorm(hidden, eps=1e-6).to(dev, dtype)
    post = Qwen2RMSNorm(hidden, eps=1e-6).to(dev, dtype)
    qn, kn = Qwen3RMSNorm(D, eps=1e-6).to(dev, dtype), Qwen3RMSNorm(D, eps=1e-6).to(dev, dtype)
    with torch.no_grad():
        for m in (norm, post, qn, kn):
            m.weight.copy_(1 + 0.2 * torch.randn_like(m.weight))
    x = torch.randn(batch, 1, hidden, device=dev).to(dtype)
    o = torch.randn(batch, 1, hidden, device=dev).to(dtype)
    q = torch.randn(batch, 1, H, D, device=dev).to(dtype)  # the projections' outputs, viewed as heads
    k = torch.randn(batch, 1, HK, D, device=dev).to(dtype)
    table = torch.randn(4096, D, device=dev).to(dtype)
    pos = torch.randint(0, 4096, (batch, 1), device=dev)
    cos, sin = table[pos], table.flip(0)[pos]  # [B, 1, D]
    gate = torch.randn(batch, 1, inter, device=dev).to(dtype)
    up = torch.randn(batch, 1, inter, device=dev).to(dtype)
    w, pw, eps = norm.weight, post.weight, norm.variance_epsilon
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)

    def check_norm():
        assert ulps(fused_ops.rms_norm(x, w, eps), norm(x)) <= 2
        y, h = fused_ops.rms_norm(o, w, eps, residual=x)
        assert torch.equal(h, x + o) and ulps(y, norm(x + o)) <= 2

    def check_fp8():
        y, qq, s = fused_ops.rms_norm(x, w, eps, fp8_out=True)
        rq, rs = quantize_act_1x128(y)
        assert torch.equal(s, rs) and torch.equal(qq.view(torch.uint8), rq.view(torch.uint8))

    def check_rope():
        a, b = fused_ops.rope_qk(qt, kt, cos, sin)
        assert torch.equal(a, apply_rope(qt, cos, sin)) and torch.equal(b, apply_rope(kt, cos, sin))

    def check_silu():
        assert ulps(fused_ops.silu_mul(gate, up), F.silu(gate) * up) <= 2

    def glue_unfused():
        h = x + o
        y = norm(h)
        a, b = apply_rope(qt, cos, sin), apply_rope(kt, cos, sin)
        h2 = h + o
        y2 = post(h2)
        return y, a, b, y2, F.silu(gate) * up

    def glue_fused():
        y, h = fused_ops.rms_norm(o, w, eps, residual=x)
        a, b = fused_ops.rope_qk(qt, kt, cos, sin)
        y2, _ = fused_ops.rms_norm(o, pw, eps, residual=h)
        return y, a, b, y2, fused_ops.silu_mul(gate, up)

    def nothing():
        pass

    fp8 = [("rms_norm_fp8", lambda: fused_ops.rms_norm(x, w, eps, fp8_out=True),
            lambda: quantize_act_1x128(norm(x)), check_fp8)] if hidden % 128 == 0 else []  # 1x128 blocks
    return [
        ("rms_norm", lambda: fused_ops.rms_norm(x, w, eps), lambda: norm(x), check_norm),
        ("add_rms_norm", lambda: fused_ops.rms_norm(o, w, eps, residual=x), lambda: norm(x + o), check_norm),
        *fp8,
        ("rope_qk", lambda: fused_ops.rope_qk(qt, kt, cos, sin),
         lambda: (apply_rope(qt, cos, sin), apply_rope(kt, cos, sin)), check_rope),
        ("qk_head_norm", lambda: (fused_ops.rms_norm(q, qn.weight, eps), fused_ops.rms_norm(k, kn.weight, eps)),
         lambda: (qn(q), kn(k)), nothing),
        ("silu_mul", lambda: fused_ops.silu_mul(gate, up), lambda: F.silu(gate) * up, check_silu),
        ("layer_glue", glue_fused, glue_unfused, nothing),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, nargs="+", default=[3584, 5120])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--reps", type=int, default=50, help="calls per captured graph")
    ap.add_argument("--iters", type=int, default=30, help="timed replays (median)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_fused.py needs a CUDA device (the unfused side is PyTorch on CUDA, the fused side Triton)")
    import triton

    dtype = DTYPES[args.dtype]
    rows = []
    with torch.no_grad():
        for hidden in args.hidden:
            for batch in args.batch:
                for name, fused, unfused, check in cases(hidden, batch, dtype):
                    check()
                    row = {"op": name, "hidden": hidden, "batch": batch}
                    for tag, fn in (("fused", fused), ("unfused", unfused)):
                        row[f"{tag}_graph_us"] = round(time_graph(fn, args.reps, args.iters), 2)
                        row[f"{tag}_eager_us"] = round(time_eager(fn, args.reps, args.iters), 2)
                        row[f"{tag}_kernels"] = count_kernels(fn)
                    row["graph_speedup"] = round(row["unfused_graph_us"] / row["fused_graph_us"], 2)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    out = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": args.dtype,
        "reps": args.reps,
        "iters": args.iters,
        "rows": rows,
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
