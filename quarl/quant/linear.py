"""QuantLinear: the one linear layer that training, rollout, eval and export share.

Because the trainer and the rollout call the *same* module, the precision flow
is identical by construction (Jet-RL's on-policy point), and AQN noise merged
into the RMSNorm weights reaches the rollout unchanged (QeRL's point).

Two modes:

* ``frozen`` (QeRL, QLoRA, eval): the base weight is stored packed as
  non-trainable buffers named as compressed-tensors names them (``weight_packed``,
  ``weight_scale`` ...), so ``state_dict()`` is already an export. With a format
  of ``None`` the base is a frozen high-precision ``weight`` buffer: the "BF16
  LoRA" baseline uses the same code path.
* ``qat`` (QAD, Reasoning-QAT, Jet-RL full-parameter): a high-precision master
  ``weight`` Parameter, fake-quantized in every forward with a straight-through
  estimator. ``freeze()`` packs it for export or rollout.

Optional parts: a LoRA branch (A: [r, K], B: [N, r]; B starts at zero so the
adapter is a no-op until trained), and an activation quantizer (``fp8-1x128``:
per-token groups of 128, the Jet-RL / DeepSeek-V3 activation format). An
``fp8-block`` (128x128) weight with ``fp8-1x128`` activations is the Jet-RL flow:
the base GEMM then runs through :func:`quarl.quant.fp8_linear.fp8_linear` -- real
FP8 GEMMs in the forward pass and in both gradients (DGrad, and WGrad for a QAT
master weight) -- in training and in rollout alike.

The compute path is chosen per call by ``quarl.quant.dispatch``: a registered
GPU kernel when one applies, else the reference path below (dequantize, then
``F.linear``), which is also the oracle the kernels are tested against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from quarl.quant import dispatch, packed_layout
from quarl.quant.base import FormatConfig, QTensor, QuantError, get_format
from quarl.quant.fp8_linear import WGRAD_MODES
from quarl.quant.spec import make_config, spec_string

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ACT_QUANTIZERS = ("fp8-1x128",)


@dataclass
class LoRAConfig:
    """LoRA hyper-parameters; names follow peft.LoraConfig so adapters round-trip."""

    r: int = 32
    alpha: float = 64.0
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))

    @property
    def scaling(self) -> float:
        return self.alpha / self.r


def _act_quant(name: str | None):
    if name is None:
        return None
    if name not in ACT_QUANTIZERS:
        raise QuantError(f"unknown activation quantizer {name!r}; known: {', '.join(ACT_QUANTIZERS)} (or null)")
    from quarl.quant.formats.fp8 import fake_quant_act_1x128

    return fake_quant_act_1x128


def lora_add(y: torch.Tensor, a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
    """``y + scaling * a @ lora_b^T`` as one addmm: ``y [..., N]``, ``a [..., r]`` (may be a column
    slice of a wider tensor), ``lora_b [N, r]`` in ``y``'s dtype."""
    n, r = y.shape[-1], a.shape[-1]
    return torch.addmm(y.reshape(-1, n), a.reshape(-1, r), lora_b.t(), alpha=scaling).view(y.shape)  # [..., N]


class QuantLinear(nn.Module):
    """Drop-in replacement for ``nn.Linear`` with a quantized (or frozen) base."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        config: FormatConfig | None,
        *,
        bias: bool = False,
        mode: str = "frozen",
        lora: LoRAConfig | None = None,
        act_quant: str | None = None,
        device=None,
        dtype: torch.dtype = torch.float32,
        fp8_wgrad: str = "1x128",
    ):
        super().__init__()
        if fp8_wgrad not in WGRAD_MODES:
            raise QuantError(f"QuantLinear fp8_wgrad must be one of {WGRAD_MODES}, got {fp8_wgrad!r}")
        self.fp8_wgrad = fp8_wgrad  # the FP8 flow's X^T grouping in WGrad (quarl.quant.fp8_linear)
        if mode not in ("frozen", "qat"):
            raise QuantError(f"QuantLinear mode must be 'frozen' or 'qat', got {mode!r}")
        if mode == "qat" and config is None:
            raise QuantError("mode='qat' needs a weight format to fake-quantize to")
        self.in_features, self.out_features = in_features, out_features
        self.config, self.mode, self.act_quant = config, mode, act_quant
        self.compute_dtype = dtype
        self._act_fn = _act_quant(act_quant)
        self.cache_dequantized = False  # rollout on CPU: trade memory for speed
        self._wcache: torch.Tensor | None = None
        self._held: dispatch.HeldWeight | None = None  # BF16 [N, K] while a trainer holds the base (dequant_cache)
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype), requires_grad=False) if bias else None
        self.lora_cfg = lora
        if lora is not None:
            self.lora_A = nn.Parameter(torch.empty(lora.r, in_features, device=device, dtype=dtype))  # [r, K]
            self.lora_B = nn.Parameter(torch.zeros(out_features, lora.r, device=device, dtype=dtype))  # [N, r]
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as peft does
            self.lora_dropout = nn.Dropout(lora.dropout) if lora.dropout > 0 else nn.Identity()

    # --- construction ---------------------------------------------------------
    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        config: FormatConfig | str | dict | None,
        *,
        mode: str = "frozen",
        lora: LoRAConfig | None = None,
        act_quant: str | None = None,
        state: dict | None = None,
        fp8_wgrad: str = "1x128",
    ) -> QuantLinear:
        cfg = make_config(config)
        w = linear.weight.detach()
        m = cls(linear.in_features, linear.out_features, cfg, bias=linear.bias is not None, mode=mode,
                lora=lora, act_quant=act_quant, device=w.device, dtype=w.dtype, fp8_wgrad=fp8_wgrad)
        if linear.bias is not None:
            m.bias.data.copy_(linear.bias.detach())
        if mode == "qat":
            m.weight = nn.Parameter(w.clone())
            m._qat_state = state
        elif cfg is None:
            m.register_buffer("weight", w.clone())
        else:
            m.set_qtensor(get_format(cfg.name).quantize(w, cfg, state=state))
        return m

    def _apply(self, fn, recurse: bool = True):
        """``Module.to / cuda / half / to_empty`` without casting the packed tensors.

        ``Module.to(dtype)`` casts every floating tensor, and FP8 counts as floating: it
        would turn NVFP4's E4M3 block scales and FP32 global scale into the new dtype
        (the global scale loses bits in bf16 so every weight moves, the scales double in
        size, and the GPU kernels, which take E4M3 scales only, stop applying). So the
        packed tensors of a frozen layer get ``fn`` only where it keeps their dtype
        (device moves, ``to_empty``, sharing); where it would cast them they follow its
        device only, and the new floating dtype becomes the layer's compute dtype."""
        names = getattr(self, "_tensor_names", ()) if self.mode == "frozen" and self.config is not None else ()
        held = {n: self._buffers.pop(n) for n in names if self._buffers.get(n) is not None}
        try:
            super()._apply(fn, recurse)
        except BaseException:
            self._buffers.update(held)
            raise
        for n, t in held.items():
            probe = fn(torch.empty(0, dtype=t.dtype, device=t.device))
            if probe.dtype == t.dtype:
                self._buffers[n] = fn(t)
            elif t.is_meta:
                self._buffers[n] = torch.empty_like(t, device=probe.device)
            else:
                self._buffers[n] = t.to(probe.device)
        probe = fn(torch.empty(0, dtype=self.compute_dtype))
        if probe.is_floating_point():
            self.compute_dtype = probe.dtype
        return self

    def set_qtensor(self, q: QTensor) -> None:
        """Install a packed weight (from quantization, calibration or a checkpoint)."""
        if tuple(q.shape) != (self.out_features, self.in_features):
            raise QuantError(f"packed weight shape {q.shape} != layer shape {(self.out_features, self.in_features)}")
        self.config = q.config
        for name, t in q.tensors.items():
            self.register_buffer(name, t)
        self._tensor_names = tuple(q.tensors)
        self._wcache = None

    def qtensor(self) -> QTensor:
        """The packed weight in compressed-tensors' layout (a row-major copy of ``weight_packed`` where the GPU
        kernels' blocked layout holds it: ``quarl.quant.packed_layout``)."""
        if self.mode != "frozen" or self.config is None:
            raise QuantError("qtensor() needs a frozen quantized layer; call freeze() on a QAT layer first")
        return QTensor(self.config, (self.out_features, self.in_features),
                       {n: packed_layout.row_major(getattr(self, n)) if n == "weight_packed" else getattr(self, n)
                        for n in self._tensor_names})

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """Saved artifacts are compressed-tensors': a blocked ``weight_packed`` is written row-major."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        key = prefix + "weight_packed"
        if key in destination and packed_layout.is_blocked(destination[key]):
            destination[key] = packed_layout.row_major(destination[key])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """A row-major ``weight_packed`` loads into a blocked layer blocked (``load_state_dict`` copies in place)."""
        key = prefix + "weight_packed"
        own = self._buffers.get("weight_packed")
        new = state_dict.get(key)
        if own is not None and packed_layout.is_blocked(own) and isinstance(new, torch.Tensor) \
                and new.dim() == 2 and new.numel() == own.numel() and new.dtype == own.dtype:
            state_dict[key] = packed_layout.block(new)  # (any other shape: the base class names the mismatch)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def format_name(self) -> str:
        return "bf16" if self.config is None else self.config.name

    # --- weights ------------------------------------------------------------------
    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The effective base weight [N, K] (no LoRA). Differentiable in QAT mode."""
        dtype = dtype or self.compute_dtype
        if self.mode == "qat":
            fmt = get_format(self.config.name)
            return fmt.fake_quant(self.weight, self.config, state=getattr(self, "_qat_state", None)).to(dtype)
        if self.config is None:
            return self.weight.to(dtype)
        if self._wcache is not None and self._wcache.dtype == dtype:
            return self._wcache
        w = self.qtensor().dequantize(dtype)
        if self.cache_dequantized:
            self._wcache = w
        return w

    def freeze(self) -> None:
        """QAT -> frozen: pack the master weight (what a QAT stage exports)."""
        if self.mode != "qat":
            return
        w = self.weight.detach()
        del self.weight
        self.mode = "frozen"
        self.set_qtensor(get_format(self.config.name).quantize(w, self.config, state=getattr(self, "_qat_state", None)))

    def lora_delta(self) -> torch.Tensor | None:
        """B @ A * scaling, [N, K]: what merging the adapter adds to the base."""
        if self.lora_cfg is None:
            return None
        return (self.lora_B @ self.lora_A) * self.lora_cfg.scaling

    def to_linear(self, merge_lora: bool = True, dtype: torch.dtype | None = None) -> nn.Linear:
        """A plain nn.Linear holding the dequantized (optionally LoRA-merged) weight."""
        dtype = dtype or self.compute_dtype
        w = self.dequantized_weight(torch.float32).detach()
        if merge_lora and self.lora_cfg is not None:
            w = w + self.lora_delta().detach().float()
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device=w.device, dtype=dtype)
        lin.weight.data.copy_(w)
        if self.bias is not None:
            lin.bias.data.copy_(self.bias.detach())
        return lin

    # --- forward ------------------------------------------------------------------
    @property
    def fp8_flow(self) -> bool:
        """FP8 weights in 128x128 tiles and FP8 1x128 activations: every GEMM in FP8 (Jet-RL)."""
        c = self.config
        return (self.act_quant == "fp8-1x128" and c is not None and c.name == "fp8"
                and getattr(c, "granularity", None) == "block" and getattr(c, "block_size", None) == 128)

    _stack = None  # a quarl.quant.fp8_stack.StackGroup: q / k / v of one attention in one FP8 GEMM forward, one DGrad

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        if self._stack is not None and (y := self._stack.output(self, x)) is not None:
            return y
        y = self.base_forward(x)
        if self.lora_cfg is not None:
            # LoRA sees the unquantized activation, as in QLoRA/QeRL: the adapter is BF16.
            # y + scaling * a @ B^T as one addmm (scale and add in the GEMM epilogue, fp32):
            # two kernels per layer fewer than mul + add, which a decode step pays 7x per block.
            a = F.linear(self.lora_dropout(x), self.lora_A.to(x.dtype))  # [..., r]
            y = lora_add(y, a, self.lora_B.to(x.dtype), self.lora_cfg.scaling)
        return y

    def epilogue_kernel(self, x: torch.Tensor):
        """The GPU kernel that computes ``base_forward(x) + scaling * a @ B^T`` with the bias and the
        LoRA branch in the GEMM's last pass (``dispatch.EpilogueFn``), or None. Only without autograd
        (the rollout engine): the fused call has no backward. None means: call ``base_forward``."""
        if self.fp8_flow or self._act_fn is not None or self.mode != "frozen" or torch.is_grad_enabled():
            return None
        kernel = dispatch.select(x, self)
        return None if kernel is None else kernel.epilogue

    def epilogue_a_kernel(self, x: torch.Tensor):
        """:meth:`epilogue_kernel`'s variant for the first projection of a LoRA group that also computes the group's
        ``x @ A^T`` in its launch (``dispatch.EpilogueAFn``), or None."""
        if self.epilogue_kernel(x) is None:
            return None
        kernel = dispatch.select(x, self)
        return None if kernel is None else kernel.epilogue_a

    def epilogue_group_kernel(self, x: torch.Tensor):
        """:meth:`epilogue_a_kernel`'s variant for a whole LoRA group led by this projection (``dispatch.GroupFn``:
        the group's weights in one launch where the kernels can), or None."""
        if self.epilogue_kernel(x) is None:
            return None
        kernel = dispatch.select(x, self)
        return None if kernel is None else kernel.group

    def base_forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        """The frozen (or QAT) base and its bias, without the LoRA branch: what the rollout engine
        calls when it computes the adapters of several projections together (quarl.engine.lora).
        The same arithmetic with and without autograd: the trainer's no-grad old-log-prob pass must
        equal its training forward bit for bit (ratio 1 before an update), so the fused last pass
        (:meth:`epilogue_kernel`) is the rollout engine's choice, never taken here."""
        if self.fp8_flow:
            from quarl.quant.fp8_linear import fp8_linear

            # the bias inside: on CUDA added in place by an epilogue pass (fp8_linear.add_bias), not a broadcast add
            if self.mode == "qat":
                return fp8_linear(x, self.weight, self.bias, wgrad=self.fp8_wgrad)
            return fp8_linear(x, self.qtensor(), self.bias)
        else:
            xq = self._act_fn(x) if self._act_fn is not None else x
            held = self._held
            if held is not None and held.serves(xq, self):
                # held for a trainer's phase (quarl.train.dequant_cache): the kernels' dense-path GEMM on the weight
                # they would decode, decoded once -- and autograd's own matmul, without the kernel path's host cost
                y = (xq.reshape(-1, self.in_features) @ held.weight.T).reshape(*xq.shape[:-1], self.out_features)
            elif (kernel := dispatch.select(xq, self) if self.mode == "frozen" else None) is not None:
                y = kernel.fn(xq, self)
            else:  # reference path: the numerics oracle
                y = F.linear(xq, self.dequantized_weight(x.dtype))
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y

    def extra_repr(self) -> str:
        s = f"in={self.in_features}, out={self.out_features}, format={spec_string(self.config)}, mode={self.mode}"
        if self.lora_cfg is not None:
            s += f", lora_r={self.lora_cfg.r}"
        if self.act_quant:
            s += f", act={self.act_quant}"
        if self.fp8_wgrad != "1x128":
            s += f", fp8_wgrad={self.fp8_wgrad}"
        return s
