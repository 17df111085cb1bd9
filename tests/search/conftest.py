"""A table-driven stand-in for ModelEvaluator (env, reward and baseline tests need no model)."""

import pytest

from quarl.search.measure import Unit
from quarl.search.reward import BF16_BITS, Measurement
from tests.threads import one_thread_fixture

_one_thread = one_thread_fixture(scope="session")


class TableEvaluator:
    """Unit u in format f adds kl[u][f] to the KL (both directions) and dloss[u][f] to the loss; bits[u][f]."""

    def __init__(self, bits, kl, dloss=None, params=None, ref=None):
        n = len(bits)
        self.units = [Unit(f"b{i}", f"b{i}.*", (f"b{i}.x",), i, "block", (params or [100] * n)[i]) for i in range(n)]
        self.params = [u.params for u in self.units]
        self.bits, self.kl = bits, kl
        self.dloss = dloss or [[0.0] * len(r) for r in kl]
        self.ref = ref or Measurement(loss=2.0, kl=0.0, entropy=1.0, avg_bits=BF16_BITS)
        self.calls = []

    def measure(self, assignment):
        a = tuple(assignment) + (None,) * (len(self.units) - len(assignment))
        self.calls.append(a)
        kl = sum(self.kl[u][f] for u, f in enumerate(a) if f is not None)
        dl = sum(self.dloss[u][f] for u, f in enumerate(a) if f is not None)
        bits = [BF16_BITS if f is None else self.bits[u][f] for u, f in enumerate(a)]
        avg = sum(b * p for b, p in zip(bits, self.params)) / sum(self.params)
        return Measurement(loss=self.ref.loss + dl, kl=kl, entropy=self.ref.entropy - kl, avg_bits=avg,
                           kl_ref_quant=kl)


@pytest.fixture
def table_ev():
    """4 units, formats (4-bit, 8-bit, 16-bit); unit 2 is very sensitive to 4 bits."""
    bits = [[4.0, 8.0, 16.0]] * 4
    kl = [[0.10, 0.01, 0.0], [0.12, 0.01, 0.0], [2.00, 0.02, 0.0], [0.08, 0.01, 0.0]]
    return TableEvaluator(bits, kl, dloss=[[x / 2 for x in r] for r in kl])
