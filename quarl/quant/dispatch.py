"""Compute-path selection for QuantLinear: GPU kernels when they apply, else the reference.

The reference path (dequantize the whole weight, then ``F.linear``) runs on any
device and is the numerics oracle. GPU kernels register here with a predicate
saying when they apply (format, device capability, shapes); QuantLinear asks
``select`` on every call, which costs a dict lookup and a few attribute reads.

Kernels live in ``quarl_kernels`` (Triton), which lists them
(``quarl_kernels.kernel_specs()``) without importing this module; ``load_kernels()``
imports that package lazily the first time a CUDA tensor is seen and registers
them, so CPU-only installs never import Triton and the dependency points one way.

``QUARL_KERNELS=reference`` forces the reference path everywhere (for A/B runs
and for debugging a kernel).

A trainer whose base is frozen may hold a layer's large-M BF16 weight for a phase
(``dense_weight``, ``HeldWeight``: ``quarl.train.dequant_cache``); QuantLinear then runs
the calls the kernels would send through their dense path as that product itself.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

# fn(x [.., K], layer) -> y [.., N], without bias, without LoRA
KernelFn = Callable[[torch.Tensor, "torch.nn.Module"], torch.Tensor]
Predicate = Callable[[torch.Tensor, "torch.nn.Module"], bool]
# fn(x [.., K], layer, a [.., r] | None, b [N, r] | None, scaling, gate=None) -> x @ W^T + bias + scaling * a @ b^T,
# the bias and the LoRA branch added in the GEMM's last pass (with gate [.., N]: silu(gate) times that, the MLP's
# up projection and activation in one pass); no autograd (inference: the rollout engine)
EpilogueFn = Callable[..., torch.Tensor]
# fn(x [.., K], layer, a_w [R, K], a_lo, b [N, r], scaling) -> (y, parts [S, .., R] fp32): the EpilogueFn of a LoRA
# group's first projection whose launch also computes the group's x @ a_w^T (split partials; y uses columns
# [a_lo, a_lo + r)); the group's other projections pass their column slices of parts to the EpilogueFn as ``a``
EpilogueAFn = Callable[[torch.Tensor, "torch.nn.Module", torch.Tensor, int, torch.Tensor, float],
                       tuple[torch.Tensor, torch.Tensor]]
# fn(x [.., K], layers, a_w [R, K], bs [N_j, r], scalings, gate_act=False, rope=None) -> [y_j]: a packed LoRA
# group's projections reading one x (q/k/v, gate/up) as in EpilogueAFn + EpilogueFn, with their weights in one launch
# where the kernels can (gate_act: the second output is silu(y_0) * y_1; rope = (cos, sin, k_cache, v_cache, slot):
# q/k/v at a decode step -> [q_rot] with k / v written into the caches, or None where no group launch serves x)
GroupFn = Callable[..., list]


@dataclass
class Kernel:
    name: str
    format: str
    fn: KernelFn
    applies: Predicate
    priority: int = 0
    epilogue: EpilogueFn | None = None
    epilogue_a: EpilogueAFn | None = None
    group: GroupFn | None = None
    dense_weight: Callable[[torch.nn.Module], torch.Tensor] | None = None  # layer -> its large-M path's BF16 [N, K]
    dense_route: Predicate | None = None  # (x, layer) -> whether fn runs x as dense_weight's plain BF16 product


_KERNELS: dict[str, list[Kernel]] = {}
_loaded = False


def register_kernel(kernel: Kernel) -> None:
    lst = _KERNELS.setdefault(kernel.format, [])
    lst[:] = [k for k in lst if k.name != kernel.name] + [kernel]
    lst.sort(key=lambda k: -k.priority)


def load_kernels() -> None:
    """Import the Triton kernels once (they register themselves); never on CPU-only paths."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    try:
        import quarl_kernels

        for spec in quarl_kernels.kernel_specs():
            register_kernel(Kernel(**spec))
    except ImportError as e:  # no Triton / no kernels package (a CPU install): the reference path serves
        logging.getLogger(__name__).debug("quarl_kernels not importable (%s): reference path", e)
    except Exception as e:  # noqa: BLE001 -- a broken kernels build must not stop a run, but must be seen
        warnings.warn(f"quarl_kernels failed to import ({type(e).__name__}: {e}); every quantized layer runs the "
                      f"slow reference path (dequantize + matmul). Fix the Triton install, or set "
                      f"QUARL_KERNELS=reference to choose that path explicitly.", stacklevel=2)


def has_kernel(format_name: str) -> bool:
    """Whether a GPU kernel is registered for ``format_name`` and the kernels are not switched off
    (``QUARL_KERNELS=reference``)."""
    if os.environ.get("QUARL_KERNELS", "auto") == "reference":
        return False
    load_kernels()
    return bool(_KERNELS.get(format_name))


def select(x: torch.Tensor, layer: torch.nn.Module) -> Kernel | None:
    """The first registered kernel whose predicate accepts (x, layer); None = reference."""
    if not x.is_cuda or os.environ.get("QUARL_KERNELS", "auto") == "reference":
        return None
    load_kernels()
    fmt = layer.format_name
    for k in _KERNELS.get(fmt, ()):
        if k.applies(x, layer):
            return k
    return None


def release_transients() -> None:
    """Give back the BF16 weights the kernels keep between a training forward and its backward (one decoder
    layer's: ``quarl_kernels.recent_weights``). A trainer calls it when an update phase ends, so a rollout that
    follows plans its KV cache without them. Nothing to do where the kernels were never loaded."""
    if not _loaded:
        return
    try:
        from quarl_kernels import recent_weights
    except ImportError:
        return
    recent_weights.release()


def registered() -> dict[str, list[str]]:
    return {f: [k.name for k in ks] for f, ks in _KERNELS.items()}


def dense_weight(layer: torch.nn.Module) -> torch.Tensor | None:
    """The BF16 ``[N, K]`` weight the kernels' large-M path multiplies by for this frozen layer -- its own decode, bit
    for bit (``quarl_kernels.dense``) -- or None where no kernel serves the layer (CPU, the reference path, another
    format). What ``quarl.train.dequant_cache`` holds through a trainer's log-prob pass and updates."""
    packed = getattr(layer, "weight_packed", None)
    if packed is None or not packed.is_cuda:
        return None
    kernel = select(torch.empty(1, layer.in_features, device=packed.device, dtype=torch.bfloat16), layer)
    if kernel is None or kernel.dense_weight is None:
        return None
    return kernel.dense_weight(layer)


class HeldWeight:
    """A frozen layer's :func:`dense_weight`, held for a trainer's phase (``quarl.train.dequant_cache``). It serves the
    calls the kernels would run as their dense path's plain BF16 product (:meth:`serves`) -- the same GEMM on the
    same values, so the same bits -- and no others: a call the fused kernels take rounds differently, and a run must
    compute the same whether or not memory allowed holding (a resumed run decides afresh). Which calls those are
    depends on M alone for a layer; the answer is kept per M."""

    __slots__ = ("_routes", "weight")

    def __init__(self, weight: torch.Tensor):
        self.weight = weight  # [N, K]
        self._routes: dict[int, bool] = {}

    def serves(self, x: torch.Tensor, layer: torch.nn.Module) -> bool:
        if x.dtype != self.weight.dtype:
            return False
        m = x.numel() // layer.in_features
        hit = self._routes.get(m)
        if hit is None:
            kernel = select(x, layer)
            hit = self._routes[m] = bool(kernel is not None and kernel.dense_route is not None
                                         and kernel.dense_route(x, layer))
        return hit
