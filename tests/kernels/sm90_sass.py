"""Compile a Triton launch for sm_90 on a CPU and check its SASS for stale FP8 code reads.

Why this exists: the fused FP8 weight quantizer (``quarl_kernels.fp8_quant._tile_kernel``) was
correct Triton -- bit for bit the eager quantizer under ``TRITON_INTERPRET=1``, including at the
shape that failed -- yet on the H100 its transposed output W^T was wrong for fp32 input. The bug
was in the machine code: Triton 3.6 lowers "store the codes, and store ``tl.trans`` of the same
codes" to an F2FP conversion per pair of values, a 16-byte global store, and a byte-wise staging
of the transposed tile through shared memory; ptxas (CUDA 12.8, bundled with Triton 3.6 for sm_90)
scheduled four of the sixteen byte extractions (``LOP3 R0 = R5 & 0xffff``) *before* the ``PRMT``
that writes R5 in the same loop iteration, so those bytes were the previous iteration's codes.
The interpreter executes the Triton program, not the SASS, so it cannot see this; only the SASS can.

:func:`compile_launch` builds the kernel exactly as a launch on a GPU would (Triton's own
argument specialization: 16-divisible ints and pointers, ints equal to 1 as constants) and
returns its SASS (``cuobjdump`` from the Triton wheel, no GPU). :func:`stale_code_stores` is a
small dataflow check over each loop of that SASS: a store whose data derives from a register read
before the iteration defines it, where the register's last definition in the loop is an FP8
conversion (``F2FP``) or derived from one. Loop-carried values are normal (counters, pointers,
the amax accumulators), loop-carried *codes* never are in these kernels: no quantizer carries a
code from one chunk to the next.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?)\s*;")
_REG = re.compile(r"^[-|!~]*R(\d+)\b")
_PRED = re.compile(r"^!?U?P[T0-9]$")
_NO_DATA = ("BRA", "BAR", "BSSY", "BSYNC", "EXIT", "CALL", "RET", "DEPBAR", "NOP", "WARPSYNC")
_STORES = ("STS", "STG", "ST.", "STL")


def cuobjdump() -> Path | None:
    import triton

    p = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    return p if p.exists() else None


def _res_usage(kernel, key: str) -> int | None:
    """``key`` (``STACK`` or ``REG``) of a compiled kernel's ``cuobjdump -res-usage``; None without ``cuobjdump``."""
    tool = cuobjdump()
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=False).stdout
    return int(out.split(f"{key}:")[1].split()[0])


def stack_bytes(kernel) -> int | None:
    """Per-thread stack of a compiled kernel (``cuobjdump -res-usage``): > 0 means ptxas spilled
    registers. None when the Triton wheel ships no ``cuobjdump``."""
    return _res_usage(kernel, "STACK")


def registers(kernel) -> int | None:
    """Registers per thread of a compiled kernel (``cuobjdump -res-usage``), or None without ``cuobjdump``."""
    return _res_usage(kernel, "REG")


def sass_of(kernel) -> str:
    """The SASS of a compiled kernel (``cuobjdump -sass`` on its cubin; needs :func:`cuobjdump`)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([str(cuobjdump()), "-sass", f.name], capture_output=True, text=True, check=True).stdout


def bench_module(name: str):
    """``benchmarks/kernels/<name>.py`` imported (its sm_90 compile helpers: ``compile_mma_decode``, ...)."""
    import importlib
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def compile_launch(launch, num_warps: int | None = None, fp_fusion: bool | None = None, **overrides):
    """``launch`` (``quarl_kernels.fp8_quant.Launch``, ``gemv.GemvLaunch``, ...) -> (compiled kernel, SASS text) for
    sm_90. ``overrides`` replace constexprs that follow the device (``SCALE_RECIP=True`` as on CUDA,
    ``INTERPRET=False``); the runtime arguments are specialized as Triton does at launch. ``fp_fusion``: Triton's
    ``enable_fp_fusion``; None: the launch's own (``launch.fp_fusion``, e.g. a GEMV launch's, on as at a default
    launch), else off (the FP8 quantizers launch with it off). It matters: the one-row GEMV has 96 registers with it
    and 119 without (session 37 found the early-weights check had compared the builds without it)."""
    import triton
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.compiler import ASTSource

    if fp_fusion is None:
        fp_fusion = getattr(launch, "fp_fusion", False)
    fn = launch.kernel
    names = list(fn.arg_names)
    const = dict(launch.constexprs, **overrides)
    sig, attrs = {}, {}
    for name, val in zip(names, launch.args, strict=False):
        ty, key = native_specialize_impl(BaseBackend, val, False, True, True)[:2]
        if ty == "constexpr":  # an int equal to 1 (a unit stride): compiled in as a constant
            const[name] = key
            continue
        sig[name] = ty
        if isinstance(key, str) and "D" in key:
            attrs[(names.index(name),)] = [["tt.divisibility", 16]]
    sig.update({k: "constexpr" for k in const})
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps or launch.num_warps, "enable_fp_fusion": fp_fusion})
    return k, sass_of(k)


def parse(sass: str) -> list[tuple[int, str, list[str]]]:
    """SASS text -> [(address, opcode, operands)] (predicate guards dropped)."""
    out = []
    for line in sass.splitlines():
        m = _INS.search(line)
        if m:
            ops = [o.strip() for o in m.group(3).split(",")] if m.group(3) else []
            out.append((int(m.group(1), 16), m.group(2), ops))
    return out


def _regs(op: str, n: int = 1) -> list[int]:
    m = _REG.match(op)
    return list(range(int(m.group(1)), int(m.group(1)) + n)) if m else []


def _width(opc: str) -> int:
    if opc.startswith("LDSM"):  # ldmatrix .x1/.x2/.x4
        tail = opc.rsplit(".", 1)[-1]
        return int(tail) if tail.isdigit() else 1
    return 4 if ".128" in opc else 2 if ".64" in opc or ".WIDE" in opc else 1


def _dataflow(body):
    """Yield (address, opcode, dsts, srcs, stored) per instruction of a loop body."""
    for a, opc, ops in body:
        if not ops or opc.startswith(_NO_DATA):
            continue
        if opc.startswith(_STORES):
            yield a, opc, None, [], _regs(ops[-1], _width(opc))
            continue
        lead = 1 if _PRED.match(ops[0]) and len(ops) > 1 and _regs(ops[1]) else 0  # SHFL PT, Rd, ...
        dst = _regs(ops[lead], _width(opc))
        srcs = [r for op in ops[lead + 1:] for r in _regs(op)]
        if opc.startswith(("PRMT", "F2FP")) and dst and dst[0] in srcs[-1:]:
            srcs = srcs[:-1]  # merge operand == destination: the bytes kept, not read as data
        yield a, opc, dst, srcs, None


def loops(ins) -> list[tuple[int, int]]:
    """(first, last) address of every loop: a branch back to an earlier address."""
    out = []
    for a, opc, ops in ins:
        tgt = ops[0].split()[-1] if opc == "BRA" and ops else ""
        if tgt.startswith("0x") and int(tgt, 16) < a:
            out.append((int(tgt, 16), a))
    return out


def stale_code_stores(sass: str) -> list[tuple[str, str]]:
    """[(address, opcode)] of stores inside a loop whose data is an FP8 code of an earlier iteration."""
    ins = parse(sass)
    bad = []
    for first, last in loops(ins):
        body = [x for x in ins if first <= x[0] <= last]
        code, code_at_end = set(), set()  # registers holding codes now / at the back edge
        for _, opc, dst, srcs, stored in _dataflow(body):
            if stored is not None:
                continue
            is_code = opc.startswith("F2FP") or (not opc.startswith("LD") and any(r in code for r in srcs))
            for r in dst:
                (code.add if is_code else code.discard)(r)
                (code_at_end.add if is_code else code_at_end.discard)(r)
        defined, stale = set(), set()
        for a, opc, dst, srcs, stored in _dataflow(body):
            if stored is not None:
                if any(r in stale for r in stored):
                    bad.append((hex(a), opc))
                continue
            s = not opc.startswith("LD") and any(r in stale or (r not in defined and r in code_at_end) for r in srcs)
            for r in dst:
                (stale.add if s else stale.discard)(r)
                defined.add(r)
    return bad


_PTX_LINE = re.compile(r"^\s*(@%p\d+\s+)?([a-z][\w.]*)\s+(.*?);")


def loads_before_wait(ptx: str) -> tuple[list[str], list[str]]:
    """(the global loads before a kernel's first PDL wait -- the whole kernel when it has none --, those of them
    whose address derives from the kernel's first parameter, x's pointer), by a forward walk over that PTX: a
    register is x's if an instruction writes it from x's parameter or from a register that is. For the kernels that
    load some weights before their wait (``QUARL_KERNELS_*_W_EARLY``): none of those loads may read x."""
    head = ptx[:ptx.index("griddepcontrol.wait")] if "griddepcontrol.wait" in ptx else ptx
    tainted: set[str] = set()
    loads, from_x = [], []
    for line in head.splitlines():
        m = _PTX_LINE.match(line)
        if not m:
            continue
        op, rest = m.group(2), m.group(3)
        regs = re.findall(r"%[a-z]+\d+", rest)
        if op.startswith("ld.param") and re.search(r"_param_0\]", rest):
            tainted.add(regs[0])
        elif op.startswith("ld.global"):
            loads.append(line.strip())
            addr = re.search(r"\[\s*(%[a-z]+\d+)", rest)
            if addr and addr.group(1) in tainted:
                from_x.append(line.strip())
        elif regs and any(r in tainted for r in regs[1:]):
            tainted.add(regs[0])
    return loads, from_x


def tma_copies_before_wait(ptx: str) -> tuple[int, int]:
    """(TMA copies before the first PDL wait, those of them through x's descriptor -- the first parameter, taken by
    address and converted with ``mov`` / ``cvta``)."""
    head = ptx[:ptx.index("griddepcontrol.wait")] if "griddepcontrol.wait" in ptx else ptx
    xregs: set[str] = set()
    copies = from_x = 0
    for line in head.splitlines():
        t = line.strip()
        regs = re.findall(r"%rd\d+", t)
        if re.match(r"mov\.b64\s+%rd\d+, _\w+_param_0;", t) or (
                t.startswith(("cvta", "mov")) and len(regs) >= 2 and regs[1] in xregs):
            xregs.add(regs[0])
        elif "cp.async.bulk.tensor" in t:
            copies += 1
            desc = re.search(r"\], \[(%rd\d+),", t)
            from_x += bool(desc and desc.group(1) in xregs)
    return copies, from_x


def loop_spills(sass: str) -> int:
    """Local-memory stores and loads (``STL`` / ``LDL``: ptxas's spills) inside a loop of ``sass`` -- the ones that
    cost every K step; a few outside the loops (a value kept across them) cost a program once."""
    ins = parse(sass)
    spans = loops(ins)
    return sum(1 for i, op, _ in ins if op.startswith(("STL", "LDL")) and any(a <= i <= b for a, b in spans))


def ctas_per_sm(regs: int | None, warps: int) -> int | None:
    """CTAs of ``warps`` warps an SM holds by registers (65536 a SM, allocated per warp in units of 256, i.e. a
    thread's count rounded up to 8); None when the count is unknown."""
    return None if regs is None else 65536 // (-(-regs // 8) * 8 * 32 * warps)
