"""The fused sampler's kernels (its two for top-p 1 and greedy, the nucleus's lse, round and draw kernels) build for sm_90 on a CPU (Triton's compiler and ptxas from its wheel, no GPU), as
a launch at Qwen2.5's vocabulary builds them (without FP contraction: ``x + g`` must round the product first, as
``sample`` does): a jit function may read only constexpr globals -- which the interpreter does not check (the noise's
clamp first read a plain float) --, and no kernel spills."""

from __future__ import annotations

import types

import pytest
import torch

triton = pytest.importorskip("triton", reason="needs Triton (CPU CI has none)")
from quarl_kernels import sampler

from tests.kernels.sm90_sass import compile_launch, stack_bytes


def _partial(noise: bool):
    B, V = 8, 152064
    S, split = sampler.splits(B, V, 132)
    x, u = torch.empty(B, V), torch.empty(B, V)
    part, idx, rows = torch.empty(B * S * 3), torch.empty(B * S, dtype=torch.int32), torch.empty(B, dtype=torch.long)
    return types.SimpleNamespace(
        kernel=sampler._partial_kernel, num_warps=4,
        args=[x, V, u, V, rows, part, idx, V, split, 1.0],
        constexprs={"BLOCK": sampler.BLOCK, "NOISE": noise, "HAS_ROWS": False, "INTERPRET": False})


@pytest.mark.parametrize("noise", [True, False])
def test_partial_kernel_builds(noise):
    k, _ = compile_launch(_partial(noise), fp_fusion=False)
    assert stack_bytes(k) in (0, None)


def test_combine_kernel_builds():
    B, S = 8, 9
    launch = types.SimpleNamespace(
        kernel=sampler._combine_kernel, num_warps=1,
        args=[torch.empty(B, 152064), 152064, torch.empty(B * S * 3), torch.empty(B * S, dtype=torch.int32),
              torch.empty(B, dtype=torch.long), torch.empty(B), S, 1.0],
        constexprs={"BLOCK_S": 16, "INTERPRET": False})
    k, _ = compile_launch(launch, fp_fusion=False)
    assert stack_bytes(k) in (0, None)


@pytest.mark.parametrize("which", ["lse", "round0", "round2", "round7", "draw"])
def test_nucleus_kernels_build(which):
    from quarl_kernels import nucleus

    B, V = 64, 152064
    S, split = sampler.splits(B, V, 132, nucleus.BLOCK, nucleus.PROGRAMS_PER_SM)
    x, part, mass = torch.empty(B, V), torch.empty(B * S * 3), torch.empty(B * nucleus.ROUNDS * S * 16)
    st, pre = torch.empty(B * (nucleus.ROUNDS + 1) * 3), torch.empty(B * (nucleus.ROUNDS + 1), dtype=torch.int32)
    block_s = max(triton.next_power_of_2(S), 2)
    if which == "lse":
        kernel, args, constexprs = nucleus._lse_kernel, [x, V, part, V, split, 1.0], {"BLOCK": nucleus.BLOCK}
    elif which == "draw":
        kernel = nucleus._draw_kernel
        args = [x, V, torch.empty(B, V), V, torch.empty(B, dtype=torch.long), part, torch.empty(B * S, dtype=torch.int32),
                mass, st, pre, V, split, 1.0, 0.95]
        constexprs = {"BLOCK": nucleus.BLOCK, "BLOCK_S": block_s, "HAS_ROWS": False, "INTERPRET": False}
    else:
        kernel, args = nucleus._round_kernel, [x, V, part, mass, st, pre, V, split, 1.0, 0.95]
        constexprs = {"R": int(which[-1]), "BLOCK": nucleus.BLOCK, "BLOCK_S": block_s}
    k, _ = compile_launch(types.SimpleNamespace(kernel=kernel, num_warps=8, args=args, constexprs=constexprs),
                          fp_fusion=False)
    assert stack_bytes(k) in (0, None)  # no spills
