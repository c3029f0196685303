"""A tier's context window, and how many tokens a request to it holds.

**The window.** A tier's ``context_window`` (tokens, `[[tiers]]`) when it sets one; else
litellm's ``max_input_tokens`` for its model (from the price map shipped with litellm,
read offline: ``LITELLM_LOCAL_MODEL_COST_MAP``; not ``get_max_tokens``, which is the
output limit); else ``FLOOR_TOKENS``, for local and unmapped models (llama.cpp and
Ollama servers often run with 8k). The scripted model counts as unmapped.

**The count.** ``PromptCounter`` counts a request's messages and tool schemas with the
tokenizer litellm ships for the model (``litellm.token_counter``: tiktoken for OpenAI
models, cl100k as the fallback, both bundled, no network), and for the scripted model
with its own rule (4 characters a token: ``merlin_flow.models.tokens``). Each message is
counted once and remembered by its text, so a long conversation costs only its new
messages per turn.

**Calibration.** An estimate is compared with the prompt tokens the provider reports
for the same request (``observe``). When the provider counted more, later estimates are
scaled up by that ratio (never down), so a tokenizer that undercounts a model (cl100k for
a Llama, say) cannot let a request overflow twice. A provider's context-length refusal
raises the scale by ``OVERFLOW_STEP``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

from merlin_flow.config import Tier
from merlin_flow.models.tokens import conversation_text, count_tokens

FLOOR_TOKENS = 8192
"""The window of a model litellm does not know (and of the scripted model)."""
MESSAGE_OVERHEAD = 4
"""Tokens each message costs beyond its text (role and separators, OpenAI's rule)."""
OVERFLOW_STEP = 1.25
"""How much a provider's context-length refusal raises the estimate's scale."""


def context_window(tier: Tier) -> int:
    """Tokens ``tier``'s model accepts in one request (see the module doc)."""
    if tier.context_window is not None:
        return tier.context_window
    if tier.is_scripted:
        return FLOOR_TOKENS
    from merlin_flow.models.llm import litellm_module

    try:
        info = litellm_module().get_model_info(tier.model)
    except Exception:  # unmapped (litellm raises its own kinds): the floor
        return FLOOR_TOKENS
    window = info.get("max_input_tokens") if isinstance(info, dict) else None
    return int(window) if isinstance(window, int) and window > 0 else FLOOR_TOKENS


class PromptCounter:
    """Counts the tokens of requests to one tier, calibrated by what it reports."""

    def __init__(self, tier: Tier) -> None:
        self.tier = tier
        self.scale = 1.0
        """Estimates are multiplied by this: 1 until the provider counted more."""
        self.last_estimate = 0
        """The raw estimate of the last request counted (before ``scale``)."""
        self._seen: dict[str, int] = {}

    def raw(self, messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> int:
        """The tokenizer's count of ``messages`` and ``tools``, unscaled."""
        total = sum(self._message(m) for m in messages)
        if tools:
            total += self._text(json.dumps(list(tools), sort_keys=True))
        self.last_estimate = total
        return total

    def __call__(self, messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> int:
        """The estimate of a request: the raw count times the calibration's scale."""
        return math.ceil(self.raw(messages, tools) * self.scale)

    def text(self, text: str) -> int:
        """Tokens of a bare text, scaled (what an observation or a summary costs)."""
        return math.ceil(self._text(text) * self.scale)

    def observe(self, estimate: int, reported: int) -> None:
        """A request estimated at ``estimate`` (raw) was reported as ``reported`` tokens."""
        if estimate > 0 and reported > estimate * self.scale:
            self.scale = reported / estimate

    def overflowed(self) -> None:
        """The provider refused a request as too long: estimate higher from now on."""
        self.scale *= OVERFLOW_STEP

    def _message(self, message: dict[str, Any]) -> int:
        text = conversation_text([message])
        key = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()
        if key not in self._seen:
            self._seen[key] = self._text(text) + MESSAGE_OVERHEAD
        return self._seen[key]

    def _text(self, text: str) -> int:
        if self.tier.is_scripted or not text:
            return count_tokens(text)
        from merlin_flow.models.llm import litellm_module

        try:
            return int(litellm_module().token_counter(model=self.tier.model, text=text))
        except Exception:  # a tokenizer that fails on this text: the plain estimate
            return count_tokens(text)
