"""Each data source of QAD Table 5 on a tiny model; a generated set round-trips; collate's masks."""

import pandas as pd
import pytest
import torch

from quarl.distill.config import DataConfig
from quarl.distill.data import (
    collate,
    generate_sequences,
    load_sequences,
    random_sequences,
    save_sequences,
    sft_sequences,
)
from tests.distill.conftest import SMALL_VOCAB, small_tiny_model

PROMPTS = [f"{i} + {i} =" for i in range(4)]  # SmolLM2 ids < 2048 (see tests/rl/conftest.py)
ANSWERS = [str(2 * i) for i in range(4)]


@pytest.fixture(scope="module")
def teacher():
    return small_tiny_model()


def test_sft_joins_prompt_and_solution_and_falls_back_to_the_answer(teacher):
    _, tok = teacher
    df = pd.DataFrame({"prompt": ["Q: 1+1?", "Q: 2+2?"], "solution": ["1+1=2", None], "answer": ["2", "4"]})
    s = sft_sequences(df, tok, ["prompt", "solution"], seq_len=64)
    assert tok.decode(s.ids[0]) == "Q: 1+1?1+1=2"
    assert tok.decode(s.ids[1]) == "Q: 2+2?The answer is 4."
    assert s.prompt_len[0] == len(tok("Q: 1+1?", add_special_tokens=False)["input_ids"])
    assert len(sft_sequences(df, tok, ["prompt", "solution"], seq_len=3).ids[0]) == 3  # cut, not dropped
    with pytest.raises(ValueError, match="not columns"):
        sft_sequences(df, tok, ["prompt", "reasoning"], seq_len=8)


def test_teacher_completions_are_prompt_plus_sample_and_seeded(teacher):
    model, tok = teacher
    cfg = DataConfig(source="teacher", max_new_tokens=6, seq_len=64, gen_batch_size=3)
    a = generate_sequences(model, tok, cfg, seed=0, prompts=PROMPTS, answers=ANSWERS)
    b = generate_sequences(model, tok, cfg, seed=0, prompts=PROMPTS, answers=ANSWERS)
    assert a.ids == b.ids and a.source == "teacher" and len(a) == 4
    for ids, plen, p in zip(a.ids, a.prompt_len, PROMPTS):
        p_ids = tok(p, add_special_tokens=False)["input_ids"]
        assert ids[:plen] == p_ids and 0 < len(ids) - plen <= 6
    # a sequence budget smaller than prompt + completion keeps the completion, cuts the prompt's start
    short = generate_sequences(model, tok, DataConfig(source="teacher", max_new_tokens=6, seq_len=8, gen_batch_size=3),
                               seed=0,
                               prompts=PROMPTS, answers=ANSWERS)
    assert all(len(x) <= 8 for x in short.ids) and short.ids[0][-1] == a.ids[0][-1]


def test_teacher_correct_keeps_only_right_answers(teacher, monkeypatch):
    import quarl.rewards

    class EveryOther:
        def __init__(self, *a, **k):
            self.i = -1

        def components(self, texts, answers):
            self.i += 1
            return {"accuracy": [float(self.i % 2 == 0)]}

    model, tok = teacher
    monkeypatch.setattr(quarl.rewards, "RewardFn", EveryOther)
    cfg = DataConfig(source="teacher_correct", max_new_tokens=4, seq_len=64)
    s = generate_sequences(model, tok, cfg, seed=0, prompts=PROMPTS, answers=ANSWERS, keep_correct=True)
    assert len(s) == 2 and s.stats == {"generated": 4, "kept": 2, "teacher_accuracy": 0.5}

    class Never(EveryOther):
        def components(self, texts, answers):
            return {"accuracy": [0.0]}

    monkeypatch.setattr(quarl.rewards, "RewardFn", Never)
    with pytest.raises(ValueError, match="none of 4 prompts correctly"):
        generate_sequences(model, tok, cfg, seed=0, prompts=PROMPTS, answers=ANSWERS, keep_correct=True)


def test_bos_sequences_start_at_bos(teacher):
    model, tok = teacher
    s = generate_sequences(model, tok, DataConfig(source="bos", num_sequences=3, seq_len=9), seed=1)
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    assert len(s) == 3 and all(x[0] == bos and 2 <= len(x) <= 9 for x in s.ids) and s.prompt_len == [0, 0, 0]


def test_random_tokens_in_vocab_and_saved_sets_round_trip(tmp_path):
    s = random_sequences(SMALL_VOCAB, 5, 7, seed=3)
    assert len(s) == 5 and all(len(x) == 7 and max(x) < SMALL_VOCAB for x in s.ids)
    assert s.ids == random_sequences(SMALL_VOCAB, 5, 7, seed=3).ids != random_sequences(SMALL_VOCAB, 5, 7, seed=4).ids
    save_sequences(s, tmp_path / "s.parquet")
    back = load_sequences(tmp_path / "s.parquet")
    assert back.ids == s.ids and back.prompt_len == s.prompt_len and back.source == "random"


def test_collate_masks_next_token_positions():
    from quarl.distill.data import Sequences

    s = Sequences(ids=[[5, 6, 7, 8], [9, 10]], prompt_len=[2, 0])
    ids, attn, labels, mask = collate(s, [0, 1], pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]] and attn.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert labels[0, :3].tolist() == [6, 7, 8]
    assert mask.tolist() == [[True, True, True, False], [True, False, False, False]]
    _, _, _, cm = collate(s, [0, 1], pad_id=0, completion_only=True)
    assert cm.tolist() == [[False, True, True, False], [True, False, False, False]]  # predicts tokens 2.. of row 0
    assert torch.equal(mask & cm, cm)
