"""Compile the weight-only kernels for sm_90a WITHOUT a GPU and report resources.

Triton lowers to PTX and runs its bundled ptxas on any machine, so register
counts, spills, shared memory, whether the MMAs are wgmma (HGMMA) or mma.sync
(HMMA), whether the weight loads were pipelined (cp.async / TMA) and the
instruction mix of the kernel can all be read here at no device time:

    PYTHONPATH=kernels python benchmarks/kernels/compile_report.py [--dump DIR] [--gemv]

Needs ``triton`` importable (the CUDA images have it; on a CPU box
``pip install --target /tmp/t triton`` and add it to PYTHONPATH).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import triton
from quarl_kernels import wo_gemm, wo_tensorcore
from quarl_kernels.dequant import FMT_INT4, FMT_MXFP4, FMT_NVFP4
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

SCALE_T = {FMT_NVFP4: "*i32", FMT_MXFP4: "*i32", FMT_INT4: "*fp32"}  # byte scales as int32 views
GROUP = {FMT_NVFP4: 16, FMT_MXFP4: 32, FMT_INT4: 128}
NAMES = {FMT_NVFP4: "nvfp4", FMT_MXFP4: "mxfp4", FMT_INT4: "int4"}


def _bin(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _div16(sig: dict, except_: tuple[str, ...]) -> dict:
    """Mark what a real launch at the Qwen2.5 shapes specializes as divisible by 16:
    every pointer and every int but ``except_`` (M is odd in decode). Unit strides
    are passed as constexpr 1 instead (Triton specializes ==1 the same way)."""
    return {(i,): [["tt.divisibility", 16]] for i, (k, t) in enumerate(sig.items())
            if t != "constexpr" and k not in except_}


def compile_fwd(fmt: int, cfg: wo_gemm.Config, split: int, use_asm: bool, pair: bool = False, swap: bool = False,
                out_t: str = "*bf16"):
    sig = {
        "x_ptr": "*bf16", "wp_ptr": "*i32", "s_ptr": SCALE_T[fmt], "z_ptr": "*i32" if fmt == FMT_INT4 else SCALE_T[fmt],
        "gs_ptr": "*fp32" if fmt == FMT_NVFP4 else SCALE_T[fmt], "out_ptr": out_t if split == 1 else "*fp32",
    }
    ints = ["M", "N", "KW", "KW_PER_SPLIT", "stride_xm", "stride_xk", "stride_wn", "stride_sn",
            "stride_zn", "stride_os", "stride_om", "stride_on"]
    sig.update({k: "i32" for k in ints})
    const = {"FMT": fmt, "GROUP": GROUP[fmt], "HAS_ZP": fmt == FMT_INT4, "USE_ASM": use_asm, "PAIR_ORDER": pair,
             "BM": cfg.bm, "BN": cfg.bn, "BKW": cfg.bkw, "GROUP_M": cfg.group_m, "INTERPRET": False, "BYTES32": True,
             "SWAP_AB": swap}
    sig.update({k: "constexpr" for k in const})
    # unit strides are specialized on a real launch too (stride_xk = stride_on = 1)
    const.update(stride_xk=1, stride_on=1)
    sig.update({k: "constexpr" for k in ("stride_xk", "stride_on")})
    odd = ("M", "stride_sn", "stride_zn")  # K/64, K/128, K/512 words per row: 56, 28, 7 at K = 3584
    src = ASTSource(fn=wo_tensorcore._fwd_kernel, signature=sig, constexprs=const, attrs=_div16(sig, odd))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg.warps, "num_stages": cfg.stages})


def compile_bwd(fmt: int, cfg: wo_gemm.Config, use_asm: bool, pair: bool = True):
    sig = {
        "dy_ptr": "*bf16", "wp_ptr": "*i32", "s_ptr": SCALE_T[fmt], "z_ptr": "*i32" if fmt == FMT_INT4 else SCALE_T[fmt],
        "gs_ptr": "*fp32" if fmt == FMT_NVFP4 else SCALE_T[fmt], "dx_ptr": "*bf16",
    }
    ints = ["M", "N", "KW", "stride_dym", "stride_wn", "stride_sn", "stride_zn", "stride_dxm"]
    sig.update({k: "i32" for k in ints})
    const = {"FMT": fmt, "GROUP": GROUP[fmt], "HAS_ZP": fmt == FMT_INT4, "USE_ASM": use_asm, "PAIR_ORDER": pair,
             "BM": cfg.bm, "BN": cfg.bn, "BKW": cfg.bkw, "GROUP_M": cfg.group_m, "INTERPRET": False,
             "BYTES32": True, "stride_dyn": 1, "stride_dxk": 1}
    sig.update({k: "constexpr" for k in const})
    odd = ("M", "stride_sn", "stride_zn")
    src = ASTSource(fn=wo_tensorcore._bwd_kernel, signature=sig, constexprs=const, attrs=_div16(sig, odd))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg.warps, "num_stages": cfg.stages})


def compile_gemv(fmt: int, cfg, m: int, use_asm: bool = True, split: bool = True):
    """The decode GEMV (``gemv._gemv_kernel``) as ``launch_gemv`` specializes it at the
    Qwen2.5 shapes (K a multiple of the K step; INT4 zero points as int32 words when
    pipelined)."""
    from quarl_kernels import gemv

    bn, bkw, vec = gemv.effective_tile(cfg, GROUP[fmt])
    zw = fmt == FMT_INT4 and cfg.stages > 1
    sig = {
        "x_ptr": "*i32", "wp_ptr": "*i32", "s_ptr": "*fp32" if fmt == FMT_INT4 else "*u8",
        "z_ptr": ("*i32" if zw else "*i8") if fmt == FMT_INT4 else "*u8",
        "gs_ptr": "*fp32", "out_ptr": "*fp32" if split else "*bf16",
    }
    ints = ["N", "KW", "KW_PER_SPLIT", "stride_xm", "stride_wn", "stride_sn", "stride_zn", "stride_sn_u",
            "stride_zn_u", "stride_os", "stride_om"]
    sig.update({k: "i32" for k in ints})
    const = {"M": m, "FMT": fmt, "GROUP": GROUP[fmt], "HAS_ZP": fmt == FMT_INT4, "USE_ASM": use_asm, "BN": bn,
             "BKW": bkw, "VEC": vec, "PREFETCH": cfg.prefetch and cfg.stages <= 1, "STAGES": cfg.stages,
             "EVEN_K": True, "ZW": zw}
    sig.update({k: "constexpr" for k in const})
    src = ASTSource(fn=gemv._gemv_kernel, signature=sig, constexprs=const,
                    attrs=_div16(sig, ("stride_sn_u", "stride_zn_u")))  # those two are never specialized
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg.warps, "num_stages": cfg.stages})


INT_OPS = ("LOP3", "SHF", "IADD3", "IMAD", "PRMT", "SEL", "ISETP", "LEA", "IMNMX", "VIMNMX")
FMA_OPS = ("HFMA2", "HMUL2", "FFMA", "FMUL", "FADD", "F2FP", "F2F", "HADD2")


def _main_loop(sass: str) -> list[str]:
    """Opcodes of the largest loop body: the span of the longest backward branch."""
    pat = r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)([^;]*);"
    instrs = [(int(a, 16), op.split(".")[0], rest) for a, op, rest in re.findall(pat, sass)]
    best: list[str] = []
    for addr, op, rest in instrs:
        t = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if t and int(t.group(1), 16) < addr:
            body = [o for a, o, _ in instrs if int(t.group(1), 16) <= a <= addr]
            best = max(best, body, key=len)
    return best


def report(kernel, label: str, dump: str | None) -> dict:
    ttgir, ptx, cubin = kernel.asm["ttgir"], kernel.asm["ptx"], kernel.asm["cubin"]
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        sass = subprocess.run([_bin("cuobjdump"), "--dump-sass", path], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([_bin("cuobjdump"), "--dump-resource-usage", path], capture_output=True, text=True,
                             check=True).stdout
    finally:
        os.unlink(path)
    loop = _main_loop(sass)
    lops = collections.Counter(loop)
    lbar = lops["BAR"]
    ops = collections.Counter(m.group(1).split(".")[0] for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass))
    regs = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    row = {
        "kernel": label, "regs": int(regs.group(1)) if regs else -1, "stack": int(stack.group(1)) if stack else -1,
        "smem": kernel.metadata.shared, "cvt_layout": ttgir.count("ttg.convert_layout"),
        "async_cp": ttgir.count("async_copy_global_to_local") + ttgir.count("async_tma_copy"),
        "wgmma": ops["HGMMA"], "hmma": ops["HMMA"], "ftz": ptx.count(".ftz"), "sass_len": sum(ops.values()),
        "int_ops": sum(ops[o] for o in INT_OPS), "fma_ops": sum(ops[o] for o in FMA_OPS),
        "ld_st": sum(ops[o] for o in ("LDG", "LDS", "LDSM", "STS", "LDGSTS", "UTMALDG")),
        "loop_len": len(loop), "loop_int": sum(lops[o] for o in INT_OPS), "loop_fma": sum(lops[o] for o in FMA_OPS),
        "loop_sts": lops["STS"], "loop_lds": lops["LDS"] + lops["LDSM"], "loop_ldg": lops["LDG"] + lops["LDGSTS"],
        "loop_bar": lbar, "loop_mma": lops["HGMMA"] + lops["HMMA"], "loop_sync_ldg": lops["LDG"],
    }
    if dump:
        os.makedirs(dump, exist_ok=True)
        for ext, text in (("ttgir", ttgir), ("ptx", ptx), ("sass", sass)):
            with open(os.path.join(dump, f"{label}.{ext}"), "w") as f:
                f.write(text)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", default=None, help="write ttgir/ptx/sass of every variant here")
    ap.add_argument("--fmt", default="all", choices=["all", "nvfp4", "mxfp4", "int4"])
    ap.add_argument("--all-configs", action="store_true", help="every candidate config (fast path only)")
    ap.add_argument("--gemv", action="store_true", help="the decode GEMV: every candidate config, M = 1..4")
    args = ap.parse_args()
    fmts = [f for f in NAMES if args.fmt in ("all", NAMES[f])]
    rows = []

    def add(fn, label):
        try:
            rows.append(report(fn(), label, args.dump))
        except Exception as e:  # noqa: BLE001  (keep going: one bad variant must not hide the others)
            print(f"FAILED {label}: {str(e).splitlines()[0][:200]}")

    if args.gemv:
        from quarl_kernels import gemv

        for fmt in fmts:
            for i, c in enumerate(gemv.GEMV_CONFIGS):
                for m in (1, 2, 4):
                    add(lambda fmt=fmt, c=c, m=m: compile_gemv(fmt, c, m), f"{NAMES[fmt]}_gemv{i}_M{m}_{c}")
        fmts = []
    if args.all_configs:
        for fmt in fmts:
            for cfg in wo_gemm.DECODE_CONFIGS:
                for bm in (16, 32, 64):
                    c = wo_gemm.Config(bm, cfg.bn, cfg.bkw, cfg.warps, cfg.stages, 1, cfg.swap, cfg.pair)
                    add(lambda fmt=fmt, c=c: compile_fwd(fmt, c, 2, True, c.pair, c.swap), f"{NAMES[fmt]}_dec_{c}")
            for cfg in wo_gemm.PREFILL_CONFIGS:
                add(lambda fmt=fmt, cfg=cfg: compile_fwd(fmt, cfg, 1, True, cfg.pair, cfg.swap),
                    f"{NAMES[fmt]}_pre_{cfg}")
            for cfg in wo_gemm.BWD_CONFIGS:
                add(lambda fmt=fmt, cfg=cfg: compile_bwd(fmt, cfg, True), f"{NAMES[fmt]}_bwd_{cfg}")
        fmts = []
    for fmt in fmts:
        for asm, pair, swap in ((True, False, False), (True, True, False), (True, False, True), (False, False, False)):
            tag = f"asm{int(asm)}_pair{int(pair)}_swap{int(swap)}"
            for cfg in wo_gemm.DECODE_CONFIGS[:2]:
                add(lambda fmt=fmt, cfg=cfg, asm=asm, pair=pair, swap=swap: compile_fwd(fmt, cfg, 4, asm, pair, swap),
                    f"{NAMES[fmt]}_dec_{cfg}_{tag}")
            for cfg in wo_gemm.PREFILL_CONFIGS[:2]:
                add(lambda fmt=fmt, cfg=cfg, asm=asm, pair=pair, swap=swap: compile_fwd(fmt, cfg, 1, asm, pair, swap),
                    f"{NAMES[fmt]}_pre_{cfg}_{tag}")
        for cfg in wo_gemm.BWD_CONFIGS[:1]:
            add(lambda fmt=fmt, cfg=cfg: compile_bwd(fmt, cfg, True), f"{NAMES[fmt]}_bwd_{cfg}_asm1")
    if not rows:
        return
    keys = list(rows[0])
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(str(r[k]) for k in keys))


if __name__ == "__main__":
    main()
