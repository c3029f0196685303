"""The complexity classifier on a table of cases, and the starting tier it leads to."""

from __future__ import annotations

from pathlib import Path

import pytest

from merlin_flow.config import MerlinConfig, Routing, Tier, load_config
from merlin_flow.errors import ConfigError
from merlin_flow.routing import Complexity, classify, start_tier
from merlin_flow.tasklist import StepType, TaskStep

S, M, C = Complexity.SIMPLE, Complexity.MEDIUM, Complexity.COMPLEX
LONG = " ".join(["word"] * 70)
DIVIDE = "divide(1, 0) returns 0 instead of raising ZeroDivisionError; fix it in calc.py please"
VERBOSE = "Add a --verbose flag to the command line that prints each file it reads"
PARSER_TESTS = (
    "Add unit tests for the three parser modules src/parse.py, src/lex.py and src/ast.py now"
)
ALL_HANDLERS = "Refactor all handlers to the new request API and keep their behaviour the same"

CASES = [
    (StepType.DEBUG, "Fix the typo in the README", S),
    (StepType.TEST, "Run the test suite", S),
    (StepType.VERIFY, "Check that the package builds", S),
    (StepType.REFACTOR, "Rename helper to parse_line", S),
    (StepType.DEBUG, DIVIDE, M),
    (StepType.FEATURE, VERBOSE, M),
    (StepType.TEST, PARSER_TESTS, M),
    (StepType.REFACTOR, ALL_HANDLERS, C),
    (StepType.DEBUG, "Fix the race between the cache writer and the reader thread under load", C),
    (StepType.FEATURE, LONG, C),
    (StepType.FEATURE, "Migrate " + LONG, C),
    (StepType.DEBUG, "Fix the typo in every log message", S),  # small and broad cancel out
]  # fmt: skip


@pytest.mark.parametrize(("step_type", "description", "expected"), CASES)
def test_classifier(step_type: StepType, description: str, expected: Complexity) -> None:
    step = TaskStep(id="s", step_type=step_type, description=description)
    assert classify(step) is expected


def _config(**routing: str) -> MerlinConfig:
    tiers = [Tier(name=n, model=f"openai/{n}") for n in ("local", "fast", "premium")]
    return MerlinConfig(tiers=tiers, routing=Routing(**routing))


def test_start_tier_follows_routing_and_step_overrides() -> None:
    config = _config(medium="fast", complex="premium")
    simple = TaskStep(id="a", step_type=StepType.TEST, description="Run the tests")
    medium = TaskStep(id="b", step_type=StepType.DEBUG, description=DIVIDE)
    hard = TaskStep(id="c", step_type=StepType.REFACTOR, description=ALL_HANDLERS)
    pinned = TaskStep(id="d", step_type=StepType.TEST, description="Run it", tier="premium")
    assert start_tier(simple, config) == (0, S)
    assert start_tier(medium, config) == (1, M)
    assert start_tier(hard, config) == (2, C)
    assert start_tier(pinned, config) == (2, S)
    assert start_tier(hard, _config()) == (0, C)  # no routing: the cheapest tier


def test_routing_must_name_configured_tiers() -> None:
    with pytest.raises(ValueError, match=r"routing\.complex names unknown tier 'huge'"):
        _config(complex="huge")


def test_replacing_the_tiers_drops_the_default_routing(tmp_path: Path) -> None:
    assert load_config().routing.complex == "fast"  # the shipped default
    own = tmp_path / "merlin.toml"
    own.write_text('[[tiers]]\nname = "only"\nmodel = "openai/x"\n')
    assert load_config(config_path=own).routing == Routing()
    own.write_text(
        '[[tiers]]\nname = "a"\nmodel = "openai/a"\n[[tiers]]\nname = "b"\nmodel = "openai/b"\n'
        '[routing]\ncomplex = "nope"\n'
    )
    with pytest.raises(ConfigError, match=r"routing\.complex names unknown tier 'nope'"):
        load_config(config_path=own)
