"""Optimizer state memory and step time: torch AdamW against bitsandbytes' 8-bit AdamW (``optim.optimizer``).

    PYTHONPATH=.:kernels python benchmarks/optim_8bit_gpu.py --out DIR [--shape Qwen2.5-7B] [--layers 4]

QeRL trains with 8-bit AdamW; quarl's trainers take it from ``quarl.train.optim.make_optimizer`` (bitsandbytes on
CUDA, torch's AdamW otherwise). What it saves depends on what trains: a LoRA adapter's states are small beside the
base, a full-parameter run's (Jet-RL, QAD) are two fp32 moments per weight. This builds, for each optimizer, the
parameters of two real cases at one width -- a ``--layers``-layer decoder stack trained full-parameter (bf16
weights, as the Jet-RL / QAD stages hold them) and the LoRA r32 adapters of all seven projections of those layers
(fp32, as the RL stage holds them) -- fills their gradients with seeded noise, and measures the bytes the
optimizer's state adds on the GPU (allocated after its first step minus before) and the time of one
``optimizer.step()`` (median of ``--iters``, CUDA events). Writes ``optim_8bit.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import types

import torch

SHAPES = {"Qwen2.5-7B": (3584, 18944, 512), "Qwen2.5-14B": (5120, 13824, 1024), "Qwen2.5-32B": (5120, 27648, 1024)}


def _params(kind: str, hidden: int, inter: int, kv: int, layers: int) -> list[torch.nn.Parameter]:
    """The trainable tensors of ``layers`` decoder layers: every projection (full, bf16) or its LoRA r32 A / B
    pair (lora, fp32)."""
    shapes = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (inter, hidden), (inter, hidden),
              (hidden, inter)]  # q, k, v, o, gate, up, down: [out, in]
    g = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for _ in range(layers):
        for n, k in shapes:
            if kind == "full":
                out.append(torch.nn.Parameter(torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16)))
            else:
                out.append(torch.nn.Parameter(torch.randn(32, k, device="cuda", generator=g) / 64))
                out.append(torch.nn.Parameter(torch.zeros(n, 32, device="cuda")))
    for p in out:
        p.grad = torch.randn(p.shape, device="cuda", generator=g, dtype=p.dtype) * 1e-3
    return out


def measure(kind: str, opt_name: str, dims, layers: int, iters: int) -> dict:
    from quarl.train.optim import make_optimizer

    torch.cuda.empty_cache()
    params = _params(kind, *dims, layers)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    cfg = types.SimpleNamespace(optimizer=opt_name, lr=1e-5, betas=[0.9, 0.99], weight_decay=0.1)
    opt, used = make_optimizer(params, cfg, torch.device("cuda"))
    opt.step()  # allocates the state
    torch.cuda.synchronize()
    state = torch.cuda.memory_allocated() - before
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        opt.step()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    n = sum(p.numel() for p in params)
    row = {"kind": kind, "optimizer": used, "params": n, "state_gib": state / 2**30,
           "state_bytes_per_param": state / n, "step_ms": statistics.median(times), "all_ms": times}
    del opt, params
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shape", default="Qwen2.5-7B", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    dims = SHAPES[args.shape]
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": args.shape,
            "layers": args.layers, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    try:
        import bitsandbytes

        info["bitsandbytes"] = bitsandbytes.__version__
    except ImportError:
        info["bitsandbytes"] = None
    rows = [measure(kind, o, dims, args.layers, args.iters) for kind in ("full", "lora") for o in ("adamw", "adamw8bit")]
    lines = [(f"{info['gpu']}, torch {info['torch']}, bitsandbytes {info['bitsandbytes']}, {info['date']}; "
             f"{args.shape} width, {args.layers} decoder layers"), "",
             "| trains | optimizer | parameters | state GiB | bytes / parameter | step ms |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['kind']} | {r['optimizer']} | {r['params'] / 1e6:.1f} M | {r['state_gib']:.3f} | "
                     f"{r['state_bytes_per_param']:.2f} | {r['step_ms']:.2f} |")
    md = "\n".join(lines) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "optim_8bit.json"), "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "optim_8bit.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
