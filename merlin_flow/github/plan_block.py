"""A plan that travels with the thread: signed, in a hidden block of merlin's own comment.

Each GitHub event runs on a fresh runner, so nothing in ``MERLIN_HOME`` survives from the
run that posted a plan to the run that sees ``/merlin approve``. The plan goes into the
plan comment itself, as an HTML comment GitHub does not show:

    <!-- merlin-plan v1 <base64 of the JSON> <HMAC-SHA256, hex> -->

The HMAC is keyed by the ``MERLIN_PLAN_KEY`` secret and covers the repository and the
thread's number as well as the plan, so a block copied into another thread, or edited
by anyone with write access to the comment, is refused. The caller also checks that the
comment's author is merlin's own identity (``read_plan`` takes it as ``trusted_author``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import asdict, dataclass

from merlin_flow.errors import InputError, PlanRefused

VERSION = "v1"
BLOCK = re.compile(r"<!-- merlin-plan (\S+) ([A-Za-z0-9+/=]+) ([0-9a-f]{64}) -->")
MIN_KEY_LENGTH = 16


@dataclass(frozen=True)
class SignedPlan:
    """What an approval needs, none of it taken from anyone but merlin."""

    repository: str
    number: int
    request: str
    tasklist: str
    """The TaskList as YAML, as ``merlin plan`` wrote it."""
    base: str
    """The commit the plan was made at; the job starts there."""


def write_block(plan: SignedPlan, key: str) -> str:
    """The hidden block for ``plan``, signed with ``key``."""
    body = base64.b64encode(json.dumps(asdict(plan), sort_keys=True).encode()).decode()
    return f"<!-- merlin-plan {VERSION} {body} {_sign(body, _checked(key))} -->"


def read_plan(
    comment: str, author: str, trusted_author: str, repository: str, number: int, key: str
) -> SignedPlan:
    """The plan in merlin's comment ``comment``; PlanRefused saying what is wrong."""
    if author != trusted_author:
        raise PlanRefused(f"the plan comment is by {author}, not by merlin ({trusted_author})")
    found = BLOCK.findall(comment)
    if len(found) != 1:
        raise PlanRefused(f"the plan comment holds {len(found)} plan blocks, not one")
    version, body, signature = found[0]
    if version != VERSION:
        raise PlanRefused(f"the plan block is of version {version}, not {VERSION}")
    if not hmac.compare_digest(signature, _sign(body, _checked(key))):
        raise PlanRefused(
            "the plan block's signature does not hold: it was altered, or signed with "
            "another MERLIN_PLAN_KEY; ask for a new plan with /merlin plan"
        )
    try:
        plan = SignedPlan(**json.loads(base64.b64decode(body, validate=True)))
    except (binascii.Error, ValueError, TypeError) as exc:
        raise PlanRefused(f"the plan block cannot be read: {exc}") from None
    if (plan.repository, plan.number) != (repository, number):
        raise PlanRefused(
            f"the plan was made for {plan.repository}#{plan.number}, not {repository}#{number}"
        )
    return plan


def _sign(body: str, key: str) -> str:
    return hmac.new(key.encode(), body.encode(), hashlib.sha256).hexdigest()


def _checked(key: str) -> str:
    if len(key) < MIN_KEY_LENGTH:
        raise InputError(
            f"MERLIN_PLAN_KEY must hold at least {MIN_KEY_LENGTH} characters "
            "(a random secret: `openssl rand -hex 32`); set it as a repository secret"
        )
    return key
