"""The adapters of a decoder layer computed together: one A GEMM per input, a bf16 copy per rollout.

A rank-r LoRA on every projection costs a decode step two small GEMMs per projection --
``a = x @ A^T`` and ``y += scaling * a @ B^T`` -- 14 per layer, and with the trainer's fp32
adapter (``quarl.train.policy``) two casts more per projection, each a kernel launch of a few
microseconds at decode batch sizes (RESULTS "Rollout engine": 2.3-2.9 ms of a 7B step). The
projections that read the same activation can share their A GEMM: q/k/v read the normed hidden
state, gate/up the post-attention one, so ``x @ [A_q; A_k; A_v]^T`` is one GEMM whose output
columns are the three ``a``'s (o and down keep their own). :class:`LoraPack` holds, per layer and
group, the concatenated ``A`` and each projection's ``B`` in the activation dtype, refreshed
from the live adapter at the start of every ``generate`` (so the optimizer's updates between
rollouts are seen, and the cast happens once per rollout instead of once per token); the
decode graphs read the pack's buffers, whose addresses never change.

What a packed group computes is, per projection, ``lora_add(m.base_forward(x), a_j, B_j,
scaling)`` -- the same ops as ``QuantLinear.forward`` (same cast of A and B to the activation
dtype, same addmm epilogue), only A's rows stacked. A group is packed only when that is the
module call: every projection is a ``QuantLinear`` with a LoRA branch of one rank, with no
forward hooks (on it or its ``lora_dropout``) and no instance-level ``forward``, and its
``lora_dropout`` is an identity or a ``Dropout`` in eval mode (generation runs in eval mode).
Anything else is called as a module, as before. ``lora_pack=False`` on ``FastGenerator`` (or
``QUARL_ENGINE_LORA_PACK=0``) turns it off.

The B GEMM in the base kernel's last pass. Where the projection's base runs quarl's weight-only
kernels (a frozen NVFP4 / MXFP4 / INT4 ``QuantLinear``, CUDA, no autograd), its split-K reduction
(or one in-place pass when unsplit) adds the bias and ``scaling * a_j @ B_j^T`` too
(``quarl_kernels.launch.Epilogue``): per layer the adapters then cost the four A GEMMs and
nothing else, instead of seven ``addmm``'s and three bias adds more (RESULTS "Issue 17: where a 7B
decode step's time goes": 616 LoRA kernels per 7B step). The sum is rounded once instead of
three times (<= ~1 bf16 ulp from the unfused path). ``QUARL_ENGINE_LORA_EPILOGUE=0`` keeps the
``addmm`` (for A/B runs); a BF16 base always does. In a SiLU MLP the up projection's last pass also applies the
activation (:meth:`Group.gate_act`: ``silu(gate) * up`` written where ``up`` was, ``act.silu_mul``'s arithmetic),
so the MLP's middle costs no kernel of its own.

The A GEMM inside the first projection's launch. When every projection of a group takes that fused last pass
and the step has at most 16 rows (``quarl_kernels.lora_a.MAX_M``: decode, where the GEMV and the mma.sync kernel
run), the group's ``x @ A^T`` is not a cuBLAS
call (two kernels at these sizes: 224 of a 7B step's kernels, 0.73 ms of 4.64 at batch 1 on an H100) but extra
programs of the first projection's GEMV / mma.sync launch (``QuantLinear.epilogue_a_kernel``), writing fp32 split partials
that each projection's last pass sums and rounds to the activation dtype before its ``a_j @ B_j^T`` -- the value
``F.linear`` returns, up to the order of the fp32 sum. ``QUARL_ENGINE_LORA_A=0`` keeps cuBLAS (docs/engine.md).
At decode sizes the group's weights go further: q/k/v (gate/up) and the A programs are one launch -- the GEMV at
one row, the mma.sync kernel at 2..16 (``QuantLinear.epilogue_group_kernel``,
``quarl_kernels.wo_gemm.wo_matmul_group``) -- then the projections' last passes, one launch for the group
(``quarl_kernels.group_pass.finish_group``). ``QUARL_GEMV_GROUP=0`` launches the weights one by one,
``QUARL_MMA_GROUP=0`` only at 2..16 rows, ``QUARL_GROUP_PASS=0`` the last passes. At a decode step the q/k/v
group's last pass also applies RoPE and writes k / v into the KV cache at one row (:meth:`Group.qkv_rope_cache`: no
RoPE kernel of its own; bit-equal to the pass then ``rope.rope_qk_cache``, GPU test); ``QUARL_ENGINE_GROUP_ROPE=0``
keeps the RoPE kernel (``quarl_kernels.group_pass``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from quarl.engine.fused import _switch
from quarl.quant.linear import QuantLinear, lora_add

ENV = "QUARL_ENGINE_LORA_PACK"
EPILOGUE_ENV = "QUARL_ENGINE_LORA_EPILOGUE"
A_ENV = "QUARL_ENGINE_LORA_A"
ROPE_ENV = "QUARL_ENGINE_GROUP_ROPE"
# rows of a decode step whose RoPE + K/V write ride in the q/k/v group's last pass (QUARL_ENGINE_GROUP_ROPE, on):
# H100 step at batch 1 3.234 -> 3.197 ms (7B), 5.885 -> 5.839 (14B); at batch 8 the first version was slower
ROPE_MAX_M = 1
A_MAX_M = 16  # rows of a step whose A GEMM rides in the first launch: quarl_kernels.lora_a.MAX_M (a test checks)
GROUP_MAX_M = 16  # rows of a step whose group runs as one weight launch: quarl_kernels.wo_gemm.GROUP_MAX_M (tested)
GROUPS = {"qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")), "o": ("self_attn", ("o_proj",)),
          "gate_up": ("mlp", ("gate_proj", "up_proj")), "down": ("mlp", ("down_proj",))}


def resolve(flag: bool | None) -> bool:
    """Packed adapters: ``flag`` if given, else ``$QUARL_ENGINE_LORA_PACK`` (default on)."""
    return _switch(flag, ENV, "packed adapters", "module by module")


def resolve_epilogue(flag: bool | None) -> bool:
    """Fold each projection's B GEMM and bias into its base kernel's last pass: ``flag`` if given, else
    ``$QUARL_ENGINE_LORA_EPILOGUE`` (default on)."""
    return _switch(flag, EPILOGUE_ENV, "the B GEMM in the base kernel's last pass", "addmm")


def resolve_a_kernel(flag: bool | None) -> bool:
    """The group's A GEMM inside its first projection's GEMV launch (``quarl_kernels.lora_a``) where every
    projection takes the fused last pass: ``flag`` if given, else ``$QUARL_ENGINE_LORA_A`` (default on)."""
    return _switch(flag, A_ENV, "the A GEMM inside the first projection's launch", "cuBLAS A GEMM")


def resolve_rope(flag: bool | None) -> bool:
    """A decode step's RoPE and K/V write in the q/k/v group's last pass (:meth:`Group.qkv_rope_cache`): ``flag``
    if given, else ``$QUARL_ENGINE_GROUP_ROPE`` (default on, at ``ROPE_MAX_M`` rows: ~1% of a batch-1 step; bit-equal
    to the RoPE kernel after the pass on the H100 since its products are rounded in software -- session 12 found a
    contracted bf16 FMA there -- GPU test ``test_group_pass_with_rope_and_kv_write_equals_rope_after``)."""
    return _switch(flag, ROPE_ENV, "the RoPE in the q/k/v group's last pass", "a RoPE kernel after it")


def _hooked(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks)


def packable(m: nn.Module) -> bool:
    """``m``'s call is exactly ``lora_add(m.base_forward(x), x @ A^T, B, scaling)`` in eval mode."""
    if not isinstance(m, QuantLinear) or m.lora_cfg is None or _hooked(m) or "forward" in vars(m):
        return False
    drop = m.lora_dropout
    return not _hooked(drop) and (isinstance(drop, nn.Identity) or (isinstance(drop, nn.Dropout) and not drop.training))


class Group:
    """The adapters of projections that share an input: ``A [G*r, K]`` stacked, ``B_j [N_j, r]``."""

    def __init__(self, mods: list[QuantLinear], dtype: torch.dtype, epilogue: bool = True, a_kernel: bool = False,
                 rope: bool = False):
        self.mods = mods
        self.rope = rope  # with it, a decode step's RoPE + K/V write in the q/k/v group's last pass
        self.epilogue = epilogue  # B GEMM and bias in the base kernel's last pass, where a kernel offers it
        self.a_kernel = a_kernel  # with it, x @ A^T inside the first projection's launch (decode-sized steps)
        self.r = mods[0].lora_cfg.r
        a0 = mods[0].lora_A
        self.A = torch.empty(len(mods) * self.r, a0.shape[1], device=a0.device, dtype=dtype)
        self.B = [torch.empty(m.lora_B.shape, device=m.lora_B.device, dtype=dtype) for m in mods]

    def refresh(self) -> None:
        with torch.no_grad():
            for j, m in enumerate(self.mods):
                self.A[j * self.r:(j + 1) * self.r].copy_(m.lora_A)  # the cast QuantLinear does per call
                self.B[j].copy_(m.lora_B)

    def buffers(self) -> list[torch.Tensor]:
        return [self.A, *self.B]

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``x [..., K]`` -> each projection's output ``[..., N_j]`` (base + bias + adapter)."""
        return self._run(x, [m.epilogue_kernel(x) if self.epilogue else None for m in self.mods])

    def gate_act(self, x: torch.Tensor) -> torch.Tensor | None:
        """For the gate/up group of a SiLU MLP (the caller checks it is one): ``silu(gate) * up`` with the product
        written by the up projection's last pass (``launch.Epilogue.gate``: the activation costs no kernel of its
        own), or None where the last pass is not fused (then call the group and the activation as before)."""
        fused = [m.epilogue_kernel(x) if self.epilogue else None for m in self.mods]
        if len(self.mods) != 2 or any(f is None for f in fused):
            return None
        return self._run(x, fused, gate_act=True)[1]

    def qkv_rope_cache(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slot: torch.Tensor) -> torch.Tensor | None:
        """For the q/k/v group at a decode step (the caller checks it is one, without q/k norms): rotated ``q``
        ``[..., H * D]`` with rotated k and v written into the caches at ``slot`` (``fused.rope_qk_cache``'s work)
        by the group's last pass -- no RoPE kernel of its own -- or None where the group does not run as one
        launch (then call the group and the RoPE as before)."""
        fused = [m.epilogue_kernel(x) if self.epilogue else None for m in self.mods]
        if (not self.rope or x.numel() // x.shape[-1] > ROPE_MAX_M or len(self.mods) != 3
                or any(f is None for f in fused) or self._first_with_a(x) is None):
            return None
        group = self._group_fn(x)
        if group is None:
            return None
        out = group(x, self.mods, self.A, self.B, [m.lora_cfg.scaling for m in self.mods],
                    rope=(cos, sin, k_cache, v_cache, slot))
        return None if out is None else out[0]

    def _run(self, x: torch.Tensor, fused: list, gate_act: bool = False) -> list[torch.Tensor]:
        r = self.r
        first = self._first_with_a(x) if all(f is not None for f in fused) else None
        group = self._group_fn(x) if first is not None else None
        if group is not None:  # the group's weights and its A GEMM in one launch, then each one's last pass
            return group(x, self.mods, self.A, self.B, [m.lora_cfg.scaling for m in self.mods], gate_act=gate_act)
        if first is not None:  # the first launch computes x @ A^T too, as fp32 split partials [S, ..., G*r]
            m0 = self.mods[0]
            y0, parts = first(x, m0, self.A, 0, self.B[0], m0.lora_cfg.scaling)
            out = [y0]
            for j, (f, m) in enumerate(zip(fused, self.mods, strict=True)):
                if j > 0:
                    gate = out[0] if gate_act else None  # the up projection writes silu(gate) * up
                    out.append(f(x, m, parts[..., j * r:(j + 1) * r], self.B[j], m.lora_cfg.scaling, gate=gate))
            return out
        a = F.linear(x, self.A)  # [..., G*r]: every projection's x @ A_j^T in one GEMM
        out = []
        for j, m in enumerate(self.mods):
            aj = a[..., j * r:(j + 1) * r]  # [..., r], a column slice (row stride G*r)
            if fused[j] is not None:  # base GEMM + bias + scaling * a_j @ B_j^T, one launch's last pass
                gate = out[0] if gate_act and j > 0 else None
                out.append(fused[j](x, m, aj, self.B[j], m.lora_cfg.scaling, gate=gate))
            else:
                out.append(lora_add(m.base_forward(x), aj, self.B[j], m.lora_cfg.scaling))
        return out

    def _group_fn(self, x: torch.Tensor):
        """The ``dispatch.GroupFn`` that runs the whole group in one weight launch (q/k/v, gate/up at decode sizes:
        ``GROUP_MAX_M``), or None: one projection, more rows, under ``torch.compile`` (it is no custom op), or no
        such kernel here."""
        if len(self.mods) < 2 or x.numel() // x.shape[-1] > GROUP_MAX_M or torch.compiler.is_compiling():
            return None
        return self.mods[0].epilogue_group_kernel(x)

    def _first_with_a(self, x: torch.Tensor):
        """The first projection's ``dispatch.EpilogueAFn`` when its launch should compute the group's A GEMM, else
        None: switched off, more than ``A_MAX_M`` rows, or no such kernel here."""
        if not self.a_kernel or x.dtype != self.A.dtype or x.numel() // x.shape[-1] > A_MAX_M:
            return None
        return self.mods[0].epilogue_a_kernel(x)


class LoraPack:
    """Per layer, the packable groups of :data:`GROUPS` (a group missing here is called as modules)."""

    def __init__(self, layers: list[nn.Module], dtype: torch.dtype, epilogue: bool | None = None,
                 a_kernel: bool | None = None, rope: bool | None = None):
        self.layers: list[dict[str, Group]] = []
        epilogue = resolve_epilogue(epilogue)
        a_kernel = resolve_a_kernel(a_kernel)
        rope = resolve_rope(rope)
        self._key = self._structure(layers)
        for layer in layers:
            groups = {}
            for name, (parent, leaves) in GROUPS.items():
                mods = [getattr(getattr(layer, parent, None), leaf, None) for leaf in leaves]
                if all(packable(m) for m in mods) and len({m.lora_cfg.r for m in mods}) == 1 and \
                        len({m.in_features for m in mods}) == 1:
                    groups[name] = Group(mods, dtype, epilogue, a_kernel, rope)
            self.layers.append(groups)

    @staticmethod
    def _structure(layers) -> tuple:
        """What a pack was built for: which modules, adapter tensors (identity and shape), hooks, modes."""
        out = []
        for layer in layers:
            for parent, leaves in GROUPS.values():
                for leaf in leaves:
                    m = getattr(getattr(layer, parent, None), leaf, None)
                    ok = packable(m) if m is not None else False
                    out.append((id(m), ok) + ((m.lora_A.data_ptr(), tuple(m.lora_A.shape), m.lora_A.device,
                                               m.lora_B.data_ptr(), tuple(m.lora_B.shape)) if ok else ()))
        return tuple(out)

    def matches(self, layers, dtype: torch.dtype) -> bool:
        g = next((g for groups in self.layers for g in groups.values()), None)
        return (g is None or g.A.dtype == dtype) and self._structure(layers) == self._key

    def refresh(self) -> None:
        for groups in self.layers:
            for g in groups.values():
                g.refresh()

    def buffers(self) -> list[torch.Tensor]:
        return [t for groups in self.layers for g in groups.values() for t in g.buffers()]

    def __bool__(self) -> bool:
        return any(self.layers)


__all__ = [
    "A_ENV",
    "A_MAX_M",
    "ENV",
    "EPILOGUE_ENV",
    "GROUPS",
    "GROUP_MAX_M",
    "Group",
    "LoraPack",
    "packable",
    "resolve",
    "resolve_a_kernel",
    "resolve_epilogue",
]
