"""One errors module, one base class: the tree its docstring draws is the tree there is."""

from __future__ import annotations

import inspect
import re

from merlin_flow import errors


def _classes() -> dict[str, type[BaseException]]:
    return {
        name: value
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, BaseException)
    }


def test_the_docstring_draws_every_error_under_its_parent() -> None:
    drawn: dict[str, str] = {}
    parents: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        found = re.match(r"^\s*([│ ]*)(?:[├└]── )?([A-Z]\w+)\s", line)
        if not found or found.group(2) not in _classes():
            continue
        depth = len(found.group(1)) // 4 + (1 if "──" in line else 0)
        parents = [p for p in parents if p[0] < depth]
        drawn[found.group(2)] = parents[-1][1] if parents else ""
        parents.append((depth, found.group(2)))
    classes = _classes()
    assert set(drawn) == set(classes)
    for name, parent in drawn.items():
        actual = classes[name].__bases__[0].__name__
        assert actual == (parent or "Exception"), name


def test_every_error_has_one_base_and_says_when_it_is_raised() -> None:
    for name, cls in _classes().items():
        assert issubclass(cls, errors.MerlinError), name
        assert (cls.__doc__ or "").strip(), name
    assert errors.InputError.exit_code == 2  # a usage or input error
    assert errors.TaskListError.exit_code == 2
    assert errors.StepFailure.exit_code == 1
