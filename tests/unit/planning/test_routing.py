"""The complexity classifier on a table of cases, and the starting tier it leads to."""

from __future__ import annotations

from pathlib import Path

import pytest

from merlin_flow.config import MerlinConfig, Routing, Tier, load_config
from merlin_flow.errors import ConfigError
from merlin_flow.planning.routing import Complexity, complexity_of, start_tier
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
    assert complexity_of(step) is expected


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


def _typed_config() -> MerlinConfig:
    """A coder tier for coding steps; Debug (reasoning) starts on a stronger tier."""
    coding = [StepType.FEATURE, StepType.REFACTOR, StepType.TEST, StepType.VERIFY]
    return MerlinConfig(
        tiers=[
            Tier(name="coder", model="openai/coder", step_types=coding),
            Tier(name="fast", model="openai/fast"),
            Tier(name="tests-only", model="openai/t", step_types=[StepType.TEST]),
            Tier(name="premium", model="openai/premium"),
        ],
        routing=Routing(complex="tests-only"),
    )


def test_step_type_preferences_move_the_start_up_to_a_tier_that_takes_the_type() -> None:
    config = _typed_config()
    debug = TaskStep(id="a", step_type=StepType.DEBUG, description="Fix the typo in the README")
    feature = TaskStep(id="b", step_type=StepType.FEATURE, description="Add a flag")
    hard_refactor = TaskStep(id="c", step_type=StepType.REFACTOR, description=ALL_HANDLERS)
    pinned = TaskStep(id="d", step_type=StepType.DEBUG, description="Fix it", tier="coder")
    assert start_tier(debug, config) == (1, S)  # coder does not take Debug
    assert start_tier(feature, config) == (0, S)
    assert start_tier(hard_refactor, config) == (3, C)  # routed to tests-only: not for Refactor
    assert start_tier(pinned, config) == (0, S)  # the step's own tier is taken as written


def test_escalation_passes_over_tiers_that_do_not_take_the_type() -> None:
    config = _typed_config()
    assert config.next_tier(0, StepType.DEBUG) == 1
    assert config.next_tier(1, StepType.DEBUG) == 3
    assert config.next_tier(1, StepType.TEST) == 2
    assert config.next_tier(3, StepType.TEST) is None


def test_a_step_type_no_tier_takes_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "merlin.toml").write_text(
        '[[tiers]]\nname = "coder"\nmodel = "openai/c"\nstep_types = ["Feature"]\n'
    )
    with pytest.raises(ConfigError, match=r"no tier takes step type.*Debug"):
        load_config(tmp_path)
    (tmp_path / "merlin.toml").write_text(
        '[[tiers]]\nname = "coder"\nmodel = "openai/c"\nstep_types = ["Chat"]\n'
    )
    with pytest.raises(ConfigError, match=r"tiers\.0\.step_types"):
        load_config(tmp_path)
