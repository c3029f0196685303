"""examine and classify: what a failed model call means."""

from __future__ import annotations

from typing import Any

from merlin_flow.failures import FailureKind
from merlin_flow.models.diagnosis import classify


def _response(status: int) -> Any:
    import httpx

    return httpx.Response(status, request=httpx.Request("POST", "http://127.0.0.1/v1"))


def _litellm_errors() -> Any:
    import litellm

    kw = {"message": "m", "model": "scripted/x", "llm_provider": "scripted"}
    return [
        (litellm.RateLimitError(**kw), FailureKind.TRANSIENT),
        (litellm.Timeout(**kw), FailureKind.TRANSIENT),
        (litellm.APIConnectionError(**kw), FailureKind.TRANSIENT),
        (litellm.InternalServerError(**kw), FailureKind.TRANSIENT),
        (litellm.ServiceUnavailableError(**kw), FailureKind.TRANSIENT),
        (litellm.BadGatewayError(**kw), FailureKind.TRANSIENT),
        (litellm.BadRequestError(**kw), FailureKind.CAPABILITY),
        (litellm.AuthenticationError(**kw), FailureKind.ACCESS),
        (litellm.PermissionDeniedError(**kw, response=_response(403)), FailureKind.ACCESS),
        (litellm.NotFoundError(**kw), FailureKind.ACCESS),
        (litellm.ContextWindowExceededError(**kw), FailureKind.CAPABILITY),
        (litellm.BudgetExceededError(current_cost=2.0, max_budget=1.0), FailureKind.BUDGET),
        (ValueError("unparseable"), FailureKind.CAPABILITY),
    ]


def test_classify_uses_litellm_exception_types() -> None:
    for exc, kind in _litellm_errors():
        assert classify(exc) is kind, type(exc).__name__
