"""What went wrong with a model call, read from what happened rather than a class name.

litellm reports a refused connection, a missing credential and a server error that
always recurs all as ``InternalServerError`` (HTTP 500). ``examine`` looks at the whole
chain of causes, the HTTP status and the provider's message, and says what happened:

============================================  ===========  ==========================
what happened                                 kind         what follows
============================================  ===========  ==========================
budget refused (litellm's BudgetExceeded)     budget       the job stops
no server (connection refused, unknown host)  access       next tier, no retry
401, 403, 402, 404 (key, permission, model)   access       next tier, no retry
context window exceeded                       capability   the attempt ends
the model refused (errors.ModelRefused)       capability   the attempt ends
other 4xx (the request was refused)           capability   the attempt ends
429, 408, timeouts, dropped connections       transient    retried (``decide``)
5xx                                           transient    retried, unless the same
                                                           answer recurs (the agent)
anything else                                 capability   the attempt ends
============================================  ===========  ==========================
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from merlin_flow.failures import FailureKind

DETAIL_CHARS = 500

BUDGET_ERRORS = frozenset({"BudgetExceededError", "BudgetExceeded"})
UNREACHABLE_ERRORS = frozenset({"ConnectionRefusedError", "gaierror", "ModelUnreachable"})
TIMEOUT_ERRORS = frozenset(
    {"Timeout", "APITimeoutError", "TimeoutException", "ReadTimeout", "TimeoutError"}
)
CONNECTION_ERRORS = frozenset(
    {"APIConnectionError", "ConnectError", "RemoteProtocolError", "ConnectionResetError"}
)
ACCESS_STATUS = {401: "authentication failed", 402: "payment required", 403: "permission denied"}
ACCESS_ERRORS = {
    "AuthenticationError": 401,
    "PermissionDeniedError": 403,
    "NotFoundError": 404,
}
REFUSAL_ERRORS = frozenset({"ModelRefused"})
CONTEXT_EXCEEDED = "context window exceeded"
"""What a request too long for the model's window is called (``ModelFailure.what``)."""
CONTEXT_WORDS = re.compile(r"context (length|window)|maximum context|too many tokens", re.I)


@dataclass(frozen=True)
class ModelFailure:
    """A failed model call: its kind, what happened in words, and the provider's detail."""

    kind: FailureKind
    what: str
    status: int | None
    detail: str

    @property
    def reason(self) -> str:
        """One line for errors and feedback: what happened, then the provider's words."""
        return f"{self.what}: {self.detail}" if self.detail else self.what

    def same_as(self, other: ModelFailure | None) -> bool:
        """True when ``other`` is the same answer (status and detail) to a request."""
        return other is not None and (self.status, self.detail) == (other.status, other.detail)


def classify(exc: BaseException) -> FailureKind:
    """The kind of a model-call error (see ``examine``)."""
    return examine(exc).kind


def examine(exc: BaseException) -> ModelFailure:
    """What happened in the failed call that raised ``exc``."""
    chain = _chain(exc)
    names = {cls.__name__ for error in chain for cls in type(error).__mro__}
    status = _status(exc)
    detail = _detail(exc)
    # Budget first: litellm's BudgetExceededError carries 429 and would pass for a rate limit.
    if names & BUDGET_ERRORS:
        return ModelFailure(FailureKind.BUDGET, "budget exceeded", status, detail)
    if names & UNREACHABLE_ERRORS:
        root = chain[-1]
        if "ModelUnreachable" in names:
            return ModelFailure(FailureKind.ACCESS, "unusable here", None, detail)
        what = "unknown host" if "gaierror" in names else "no server answers"
        return ModelFailure(FailureKind.ACCESS, what, None, _detail(root))
    if names & REFUSAL_ERRORS:
        return ModelFailure(FailureKind.CAPABILITY, "the model refused", None, detail)
    if "ContextWindowExceededError" in names or (status == 400 and CONTEXT_WORDS.search(detail)):
        return ModelFailure(FailureKind.CAPABILITY, CONTEXT_EXCEEDED, status, detail)
    for name, code in ACCESS_ERRORS.items():
        if name in names:
            status = code
    if status in ACCESS_STATUS:
        return ModelFailure(
            FailureKind.ACCESS, f"HTTP {status}: {ACCESS_STATUS[status]}", status, detail
        )
    if status == 404:
        return ModelFailure(
            FailureKind.ACCESS, "HTTP 404: no such model or endpoint", status, detail
        )
    if names & TIMEOUT_ERRORS or status == 408:
        return ModelFailure(FailureKind.TRANSIENT, "timed out", status, detail)
    if status == 429 or "RateLimitError" in names:
        return ModelFailure(FailureKind.TRANSIENT, "HTTP 429: rate limited", 429, detail)
    if names & CONNECTION_ERRORS:
        return ModelFailure(FailureKind.TRANSIENT, "connection failed", None, detail)
    if status is not None and status >= 500:
        return ModelFailure(FailureKind.TRANSIENT, f"HTTP {status}: server error", status, detail)
    if status is not None and 400 <= status < 500:
        return ModelFailure(
            FailureKind.CAPABILITY, f"HTTP {status}: request refused", status, detail
        )
    return ModelFailure(FailureKind.CAPABILITY, type(exc).__name__, status, detail)


def retry_after(exc: BaseException) -> float | None:
    """Seconds the provider asked us to wait (its Retry-After header), if it said."""
    response: Any = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    value = headers.get("retry-after") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from model providers, and not worth parsing


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes, each once."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 20:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


def _detail(exc: BaseException) -> str:
    """The provider's message, without litellm's repeated class-name prefixes."""
    text = str(getattr(exc, "message", None) or exc or type(exc).__name__)
    text = re.sub(r"^(litellm\.\w+: )?(\w+Error: )?(\w+Exception - )?", "", text).strip()
    text = " ".join(text.split())
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + "..."
