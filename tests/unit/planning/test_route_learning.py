"""Routing that learns: the journal of a repository moves a step's first tier."""

from __future__ import annotations

import pytest

from merlin_flow.config import MerlinConfig, Routing, Tier
from merlin_flow.planning.route_learning import (
    MIN_PASS,
    PastStep,
    RouteBook,
    describe,
    kind_of,
    route_book,
)
from merlin_flow.store import Database
from merlin_flow.tasklist import StepType, TaskStep
from tests.unit.journal_rows import add_finished_step

HARD = (
    "answer() returns the wrong value under concurrent load across all callers; "
    "find the race and fix it without breaking check.py"
)
EASY = "Fix the off-by-one in answer()."


def config(**routing: object) -> MerlinConfig:
    tiers = [
        Tier(name="local", model="scripted/l.yaml", price_in=0.10, price_out=0.30),
        Tier(name="fast", model="scripted/f.yaml", price_in=0.15, price_out=0.60),
        Tier(name="premium", model="scripted/p.yaml", price_in=3.00, price_out=15.00),
    ]
    return MerlinConfig(tiers=tiers, routing=Routing(complex="fast", **routing))


def step(description: str = HARD, **fields: object) -> TaskStep:
    return TaskStep(id="fix", step_type=StepType.DEBUG, description=description, **fields)


def past(description: str, outcomes: dict[str, bool], cost: float = 0.001) -> PastStep:
    kind = kind_of(StepType.DEBUG, description)
    return PastStep(kind, dict(outcomes), dict.fromkeys(outcomes, cost))


def test_without_evidence_the_rules_decide() -> None:
    route = RouteBook([]).route(step(), config())
    assert (route.by, route.tier, route.rule_tier) == ("rules", 1, 1)  # complex -> fast
    record = route.to_record(config())
    assert describe(record) == (
        "fast: by the rules (0 similar steps in the journal, 3 needed to learn)"
    )


def test_a_cheap_tier_that_solves_this_kind_of_step_is_learned() -> None:
    book = RouteBook([past(HARD, {"local": True}) for _ in range(4)])
    route = book.route(step(), config())
    assert (route.by, route.tier, route.rule_tier) == ("journal", 0, 1)
    local = route.tiers[0]
    assert (local.name, local.passed, local.tried) == ("local", 4.0, 4.0)
    assert local.p == pytest.approx((0.3 + 4) / 5)
    line = describe(route.to_record(config()))
    assert line.startswith("local: from the journal (4 similar steps in the journal:")
    assert "local passed 4 of 4" in line
    assert line.endswith("; the rules say fast")


def test_tiers_that_never_pass_this_kind_of_step_are_skipped() -> None:
    book = RouteBook([past(HARD, {"local": False, "fast": False, "premium": True})] * 6)
    route = book.route(step(), config())
    assert route.by == "journal"
    assert route.tier == 2
    assert all(estimate.p < MIN_PASS for estimate in route.tiers[:2])


def test_evidence_below_learn_after_keeps_the_rules() -> None:
    book = RouteBook([past(HARD, {"local": True})] * 2)
    assert book.route(step(), config()).by == "rules"
    assert book.route(step(), config(learn_after=2)).by == "journal"
    assert book.route(step(), config(learn=False)).by == "rules"


def test_only_steps_of_the_same_type_count_and_unlike_ones_count_less() -> None:
    other_type = PastStep(kind_of(StepType.TEST, HARD), {"local": True}, {"local": 0.001})
    assert RouteBook([other_type] * 10).route(step(), config()).similar == 0
    unlike = past(EASY, {"local": True})
    assert 0 < RouteBook([unlike]).route(step(), config()).similar < 1


def test_an_unpriced_tier_or_a_named_tier_keeps_the_rules() -> None:
    book = RouteBook([past(HARD, {"local": True})] * 5)
    unpriced = config()
    unpriced.tiers[0].price_in = None
    assert book.route(step(), unpriced).by == "rules"
    named = book.route(step(tier="premium"), config())
    assert (named.by, named.tier) == ("step", 2)
    assert describe(named.to_record(config())) == "premium: the step names it"


def test_a_pass_on_a_weaker_tier_counts_half_for_a_stronger_one() -> None:
    book = RouteBook([past(HARD, {"local": True})] * 4)
    fast = book.route(step(), config()).tiers[1]
    assert (fast.passed, fast.tried) == (2.0, 2.0)


def test_the_book_reads_a_repositorys_finished_steps_from_the_store(db: Database) -> None:
    for _ in range(3):
        add_finished_step(db, "/r", HARD, [("local", "failed", 0.01), ("local", "failed", 0.02),
                                           ("fast", "passed", 0.05)])  # fmt: skip
    add_finished_step(db, "/elsewhere", HARD, [("premium", "passed", 1.0)])
    add_finished_step(db, "/r", HARD, [("local", "error", 0.5)])  # an error teaches nothing
    with db.reader() as session:
        book = route_book(session, "/r")
    assert len(book.past) == 3
    first = book.past[0]
    assert first.passed == {"local": False, "fast": True}
    assert first.cost == pytest.approx({"local": 0.03, "fast": 0.05})
    route = book.route(step(), config())
    assert (route.by, route.tier) == ("journal", 1)
    assert route.tiers[1].cost == pytest.approx(0.05)
