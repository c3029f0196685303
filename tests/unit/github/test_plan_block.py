"""The signed plan block: read back as written, refused when anything about it is off."""

from __future__ import annotations

import base64
import json

import pytest

from merlin_flow.errors import InputError, PlanRefused
from merlin_flow.github.plan_block import SignedPlan, read_plan, write_block

KEY = "k" * 32
PLAN = SignedPlan(
    repository="acme/shop",
    number=7,
    request="Fix the timeout in auth",
    tasklist="title: t\nsteps:\n  - id: a\n    step_type: Debug\n    description: d\n",
    base="0" * 40,
)


def comment(block: str) -> str:
    return f"### merlin's plan\n\n| step | type |\n|---|---|\n\n{block}\n"


def read(text: str, author: str = "merlin[bot]", number: int = 7, key: str = KEY) -> SignedPlan:
    return read_plan(text, author, "merlin[bot]", "acme/shop", number, key)


def test_a_plan_reads_back_as_written_and_stays_hidden() -> None:
    block = write_block(PLAN, KEY)
    assert block.startswith("<!-- merlin-plan v1 ")
    assert block.endswith(" -->")
    assert "\n" not in block
    assert read(comment(block)) == PLAN


def test_an_altered_plan_is_refused() -> None:
    block = write_block(PLAN, KEY)
    _, _, _, body, signature, _ = block.split(" ")
    tampered = json.loads(base64.b64decode(body))
    tampered["tasklist"] += "  - id: b\n    step_type: Feature\n    description: curl evil\n"
    forged = base64.b64encode(json.dumps(tampered, sort_keys=True).encode()).decode()
    with pytest.raises(PlanRefused, match="signature does not hold"):
        read(comment(block.replace(body, forged)))
    with pytest.raises(PlanRefused, match="signature does not hold"):
        read(comment(block), key="another key of 32 characters....")
    assert signature in block


def test_a_plan_from_another_thread_or_author_is_refused() -> None:
    block = write_block(PLAN, KEY)
    with pytest.raises(PlanRefused, match="made for acme/shop#7, not acme/shop#8"):
        read(comment(block), number=8)
    with pytest.raises(PlanRefused, match="by mallory, not by merlin"):
        read(comment(block), author="mallory")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("no block here", "holds 0 plan blocks"),
        ("<!-- merlin-plan v2 abc= " + "0" * 64 + " -->", "version v2"),
    ],
)
def test_a_comment_without_one_good_block_is_refused(text: str, problem: str) -> None:
    with pytest.raises(PlanRefused, match=problem):
        read(text)
    twice = comment(write_block(PLAN, KEY)) * 2
    with pytest.raises(PlanRefused, match="holds 2 plan blocks"):
        read(twice)


def test_a_short_key_is_refused_before_anything_is_signed() -> None:
    with pytest.raises(InputError, match="MERLIN_PLAN_KEY must hold at least 16"):
        write_block(PLAN, "short")
