import pytest

from quarl.config import load_config
from quarl.rl.config import RLConfig
from tests.threads import one_thread_fixture

# Small enough for seconds on 2 CPU cores: 2 prompts x 4 answers x 8 tokens per step.
TINY_OVERRIDES = [
    "rollout.group_size=4", "rollout.max_new_tokens=8", "rollout.cache=dynamic", "train.prompts_per_step=2",
    "train.steps=3", "train.checkpoint_every=0", "train.sample_every=1", "optim.micro_batch_size=4",
    "optim.lr=1e-2", "optim.warmup_ratio=0", "aqn.num_stages=3", "train.device=cpu",
]


def tiny_cfg(*extra: str) -> RLConfig:
    return load_config(RLConfig, None, [*TINY_OVERRIDES, *extra])


class ParityReward:
    """A deterministic reward with spread on a random model's gibberish: parity of the text's code points."""

    def __init__(self):
        self.calls = 0

    def components(self, texts, answers):
        self.calls += 1
        acc = [float(sum(map(ord, t)) % 2) for t in texts]
        return {"accuracy": acc, "format": [0.0] * len(texts), "reward": acc}


# Prompts whose SmolLM2 token ids are all < 2048, so tests can use a tiny model with a 2048-word
# vocabulary: the 49152-wide LM head would otherwise be ~30x the cost of the rest of the model.
PROMPTS = [f"{i} + {i} =" for i in range(6)]
ANSWERS = [str(2 * i) for i in range(6)]
SMALL_VOCAB = 2048


def small_tiny_model(kind: str = "llama"):
    """The seeded tiny model with a 2048-token vocabulary (fresh weights on every call)."""
    import warnings

    from quarl.models import tiny_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tiny_model(kind, vocab_size=SMALL_VOCAB)


_one_thread = one_thread_fixture()


@pytest.fixture
def parity_reward():
    return ParityReward()
