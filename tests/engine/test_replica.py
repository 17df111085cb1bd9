"""quarl.engine.replica on one process: sizes, the fit rule, in-place sync, and a clear error on a foreign policy.
The FSDP2 case (2 gloo ranks, AQN noise, greedy tokens vs the reference engine) is in tests/train/test_distributed.py."""

import pytest
import torch
from torch import nn

from quarl.engine.replica import RolloutReplica, fits, nbytes


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    m.register_buffer("scale", torch.ones(3))
    return m


def test_nbytes_counts_parameters_and_buffers():
    m = _mlp().to(torch.bfloat16)
    assert nbytes(m) == 2 * (8 * 16 + 16 + 16 * 4 + 4 + 3)


def test_cpu_replica_always_fits():
    ok, why = fits(_mlp(), torch.device("cpu"))
    assert ok and "replica of" in why


def test_sync_copies_in_place_and_the_replica_is_frozen():
    policy = _mlp(0)
    rep = RolloutReplica(policy, torch.device("cpu"))
    assert rep.model is not policy and not any(p.requires_grad for p in rep.model.parameters())
    ptrs = [p.data_ptr() for p in rep.model.parameters()]
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)  # an optimizer step
    rep.sync(policy)
    for (n, a), b in zip(rep.model.named_parameters(), policy.parameters()):
        assert torch.equal(a, b), n
    assert ptrs == [p.data_ptr() for p in rep.model.parameters()]  # graphs captured on the replica stay valid


def test_sync_from_another_model_names_the_parameter():
    rep = RolloutReplica(_mlp(), torch.device("cpu"))
    other = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))
    with pytest.raises(RuntimeError, match=r"2\.weight is \(4, 16\) here and \(5, 16\)"):
        rep.sync(other)
    with pytest.raises(RuntimeError, match="no module"):
        rep.sync(nn.Linear(8, 16))
