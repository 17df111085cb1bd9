"""Warm Triton's cache with quarl's weight-only GEMMs for Hopper (sm_90a), at image build time, without a GPU.

    TRITON_CACHE_DIR=/opt/quarl/triton-cache python images/precompile_kernels.py [--all-configs]

Triton compiles a kernel the first time it is launched with a new specialization
(constexprs, dtypes, divisibility-by-16 of pointers and ints, num_warps/stages)
and caches the cubin under ``TRITON_CACHE_DIR``, keyed by all of those plus the
Triton version and target. Triton lowers to PTX and runs its bundled ``ptxas`` on
any machine, so the build (which has no GPU) can produce the cubins a launch on an
H100/H200 will look up: every format (NVFP4, MXFP4, INT4) x the default configs
(first entries of ``DECODE_CONFIGS`` / ``PREFILL_CONFIGS`` / ``BWD_CONFIGS``; all
of them with ``--all-configs``) x decode tile heights 16/32/64 x split-K on/off, and
the Gluon ``mma_decode`` kernel's default configs per token tile.

The signatures come from ``benchmarks/kernels/compile_report.py`` (the kernels'
own compile harness, kept next to the kernels by their authors), so this script
does not restate them. The specializations assume model shapes whose dimensions
are multiples of 16 (every Qwen/Llama size); a launch outside what was warmed
simply compiles on first use -- the cache is writable by the image's user. Any
variant that fails to compile fails the image build: a kernel that cannot be
built for sm_90 is a bug to catch in CI, not in a training pod.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def variants(all_configs: bool):
    """(label, thunk) for every kernel variant to compile."""
    sys.path.insert(0, str(ROOT))
    from quarl_kernels import wo_gemm

    from benchmarks.kernels.compile_report import NAMES, compile_bwd, compile_fwd

    pick = (lambda t: t) if all_configs else (lambda t: t[:1])
    for fmt, name in NAMES.items():
        for cfg in pick(wo_gemm.DECODE_CONFIGS):
            for bm in (16, 32, 64):
                c = wo_gemm.Config(bm, cfg.bn, cfg.bkw, cfg.warps, cfg.stages, 1, cfg.swap, cfg.pair)
                for split in (1, 2):  # bf16 output vs split-K fp32 workspace
                    yield (f"{name}/fwd/decode/{c}/split{split}",
                           lambda fmt=fmt, c=c, split=split: compile_fwd(fmt, c, split, True, c.pair, c.swap))
        for cfg in pick(wo_gemm.PREFILL_CONFIGS):
            for split in (1, 2):
                yield (f"{name}/fwd/prefill/{cfg}/split{split}",
                       lambda fmt=fmt, cfg=cfg, split=split: compile_fwd(fmt, cfg, split, True, cfg.pair, cfg.swap))
        for cfg in pick(wo_gemm.BWD_CONFIGS):
            yield f"{name}/bwd/{cfg}", lambda fmt=fmt, cfg=cfg: compile_bwd(fmt, cfg, True)
    yield from _mma_decode_variants(all_configs)


def _mma_decode_variants(all_configs: bool):
    """The Gluon decode kernel (M = 2..64): its defaults per token tile, split-K on/off. Gluon is
    Triton's experimental dialect; compiling it here is what catches API drift of a newer Triton
    at image build time (at run time ``wo_gemm`` would fall back to the Triton TC kernel)."""
    from quarl_kernels import mma_decode

    from benchmarks.kernels.bench_mma_decode import NAMES, compile_mma_decode

    for fmt, name in NAMES.items():
        for nt in (8, 16, 32, 64):  # M = nt tokens lands on token tile nt
            cfgs = mma_decode.candidate_configs(nt) if all_configs else {
                mma_decode.default_config(nt, 512), mma_decode.default_config(nt, 18944)}
            for cfg in cfgs:
                for split in (True, False):
                    yield (f"{name}/mma_decode/{cfg}/NT{nt}/split{int(split)}",
                           lambda fmt=fmt, cfg=cfg, nt=nt, split=split: compile_mma_decode(fmt, cfg, nt, split))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all-configs", action="store_true", help="every candidate config, not just the defaults")
    ap.add_argument("--report", default=None, help="write a JSON list of compiled variants here")
    args = ap.parse_args()
    cache = os.environ.get("TRITON_CACHE_DIR")
    if not cache:
        print("set TRITON_CACHE_DIR to the cache the image will use (e.g. /opt/quarl/triton-cache)", file=sys.stderr)
        return 2
    done, failed = [], []
    t0 = time.monotonic()
    for label, build in variants(args.all_configs):
        t = time.monotonic()
        try:
            k = build()
        except Exception as e:  # noqa: BLE001 - collect every failure, then fail the build once
            failed.append((label, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"))
            continue
        done.append({"kernel": label, "regs": getattr(k, "n_regs", None), "smem": k.metadata.shared,
                     "seconds": round(time.monotonic() - t, 2)})
        print(f"compiled {label} ({done[-1]['seconds']} s)", flush=True)
    print(f"{len(done)} variants for sm_90a in {time.monotonic() - t0:.0f} s -> {cache}")
    if args.report:
        Path(args.report).write_text(json.dumps(done, indent=2) + "\n")
    for label, err in failed:
        print(f"FAILED {label}: {err}", file=sys.stderr)
    return 1 if failed or not done else 0


if __name__ == "__main__":
    sys.exit(main())
