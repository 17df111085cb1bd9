"""Prompt templates: qerl (suffix / chat), chat, plain; token counting."""

from __future__ import annotations

import json

import pytest

from quarl.data import QERL_INSTRUCTION, PromptTemplate, TemplateError

PROBLEM = "What is 7 + 5?"


def test_qerl_without_tokenizer_is_a_plain_text_suffix():
    prompt, messages = PromptTemplate("qerl").render(PROBLEM)
    assert prompt == f"{PROBLEM}\n\n{QERL_INSTRUCTION}"
    assert json.loads(messages) == [
        {"role": "system", "content": QERL_INSTRUCTION},
        {"role": "user", "content": PROBLEM},
    ]
    assert "<think>" in QERL_INSTRUCTION and "<answer>" in QERL_INSTRUCTION


def test_qerl_and_chat_with_tokenizer_render_the_chat_template(toy_tokenizer):
    tok = toy_tokenizer()
    expected = (
        f"<|im_start|>system\n{QERL_INSTRUCTION}<|im_end|>\n"
        f"<|im_start|>user\n{PROBLEM}<|im_end|>\n<|im_start|>assistant\n"
    )
    for name in ("qerl", "chat"):
        prompt, messages = PromptTemplate(name, tokenizer=tok).render(PROBLEM)
        assert prompt == expected
        assert json.loads(messages)[1]["content"] == PROBLEM


def test_plain_and_custom_instruction(toy_tokenizer):
    assert PromptTemplate("plain").render(PROBLEM)[0] == PROBLEM
    # plain ignores the tokenizer's chat template
    assert PromptTemplate("plain", tokenizer=toy_tokenizer()).render(PROBLEM)[0] == PROBLEM
    prompt, messages = PromptTemplate("qerl", instruction="Answer in \\boxed{}.").render(PROBLEM)
    assert prompt == f"{PROBLEM}\n\nAnswer in \\boxed{{}}."
    prompt, messages = PromptTemplate("qerl", instruction="").render(PROBLEM)
    assert prompt == PROBLEM and json.loads(messages) == [{"role": "user", "content": PROBLEM}]


def test_template_errors(toy_tokenizer):
    with pytest.raises(TemplateError, match="unknown template"):
        PromptTemplate("r2")
    with pytest.raises(TemplateError, match="set tokenizer"):
        PromptTemplate("chat")
    with pytest.raises(TemplateError, match="no chat template"):
        PromptTemplate("chat", tokenizer=toy_tokenizer(chat_template=None))
    with pytest.raises(TemplateError, match="need a tokenizer"):
        PromptTemplate("qerl").count_tokens(["a b"])


def test_count_tokens_counts_the_rendered_prompt(toy_tokenizer):
    t = PromptTemplate("plain", tokenizer=toy_tokenizer())
    assert t.count_tokens(["a b c", "one", ""]) == [3, 1, 0]


@pytest.mark.slow
def test_real_smollm2_chat_template():
    """The embedded default model's tokenizer (ChatML) through load_tokenizer."""
    t = PromptTemplate("chat", tokenizer="default")
    prompt, _ = t.render(PROBLEM)
    assert prompt.startswith("<|im_start|>system\n" + QERL_INSTRUCTION)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert t.count_tokens([prompt])[0] > 20
