"""A tier's window and the calibrated prompt counter (merlin_flow.models.window)."""

from __future__ import annotations

from pathlib import Path

import pytest

from merlin_flow.config import Tier
from merlin_flow.models.tokens import conversation_text, count_tokens
from merlin_flow.models.window import (
    FLOOR_TOKENS,
    MESSAGE_OVERHEAD,
    OVERFLOW_STEP,
    PromptCounter,
    context_window,
)

MESSAGES = [
    {"role": "system", "content": "You are merlin."},
    {"role": "user", "content": "Fix the parser: " + "tokens and words " * 40},
]


@pytest.mark.parametrize(
    ("tier", "window"),
    [
        (Tier(name="t", model="openai/gpt-4o-mini"), 128_000),
        (Tier(name="t", model="anthropic/claude-sonnet-4-5"), 200_000),
        (Tier(name="t", model="openai/gpt-4o-mini", context_window=16_000), 16_000),
        (Tier(name="t", model="openai/my-local-llama"), FLOOR_TOKENS),
        (Tier(name="t", model="scripted/x.yaml"), FLOOR_TOKENS),
        (Tier(name="t", model="scripted/x.yaml", context_window=2048), 2048),
    ],
    ids=["litellm-openai", "litellm-anthropic", "override", "unmapped", "scripted", "scripted-set"],
)
def test_the_window_is_the_tiers_then_litellms_input_limit_then_the_floor(
    tier: Tier, window: int
) -> None:
    assert context_window(tier) == window


def test_the_window_is_the_input_limit_not_the_output_limit() -> None:
    from merlin_flow.models.llm import litellm_module

    tier = Tier(name="t", model="anthropic/claude-sonnet-4-5")
    assert context_window(tier) != litellm_module().get_max_tokens(tier.model)


def test_a_scripted_tier_counts_as_the_scripted_model_reports(tmp_path: Path) -> None:
    counter = PromptCounter(Tier(name="t", model=f"scripted/{tmp_path}/s.yaml"))
    expected = sum(count_tokens(conversation_text([m])) + MESSAGE_OVERHEAD for m in MESSAGES)
    assert counter(MESSAGES) == expected
    assert counter(MESSAGES) >= count_tokens(conversation_text(MESSAGES))  # never under it


def test_a_litellm_tier_counts_with_its_bundled_tokenizer_offline() -> None:
    counter = PromptCounter(Tier(name="t", model="openai/gpt-4o-mini"))
    words = MESSAGES[1]["content"]
    tokens = counter.text(words)
    assert 0 < tokens < len(words) / 3  # a tokenizer, not a character count
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
    assert counter(MESSAGES, tools) > counter(MESSAGES)


def test_calibration_follows_a_provider_that_counts_more_and_never_less() -> None:
    counter = PromptCounter(Tier(name="t", model="scripted/x.yaml"))
    raw = counter.raw(MESSAGES)
    counter.observe(raw, raw * 2)
    assert counter(MESSAGES) == raw * 2
    counter.observe(raw, raw // 2)  # a provider counting less leaves the scale
    assert counter(MESSAGES) == raw * 2
    counter.overflowed()
    assert counter.scale == pytest.approx(2 * OVERFLOW_STEP)


def test_each_message_is_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = PromptCounter(Tier(name="t", model="scripted/x.yaml"))
    texts: list[str] = []
    original = counter._text
    monkeypatch.setattr(counter, "_text", lambda text: texts.append(text) or original(text))
    counter(MESSAGES)
    counter([*MESSAGES, {"role": "assistant", "content": "ok"}])
    assert len(texts) == 3
