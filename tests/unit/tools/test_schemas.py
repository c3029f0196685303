"""The tools as the model is told of them: every tool described, with an example call."""

from __future__ import annotations

import json

from merlin_flow.tools.toolbox import TOOL_SCHEMAS
from tests.unit.tools.conftest import World


def test_schemas_cover_every_tool(world: World) -> None:
    names = [schema["function"]["name"] for schema in TOOL_SCHEMAS]
    assert names == world.box.names
    required = {
        s["function"]["name"]: s["function"]["parameters"]["required"] for s in TOOL_SCHEMAS
    }
    assert required["edit_file"] == ["path", "old", "new"]
    assert required["list_files"] == []
    assert required["grep"] == ["pattern"]
    assert required["run_command"] == ["command"]


# --- the schemas --------------------------------------------------------------------------


def test_every_description_teaches_with_an_example() -> None:
    for schema in TOOL_SCHEMAS:
        function = schema["function"]
        description = function["description"]
        example = json.loads(description.split("Example: ", 1)[1])
        assert set(example) <= set(function["parameters"]["properties"]), function["name"]
        assert set(function["parameters"]["required"]) <= set(example), function["name"]
    size = len(json.dumps(TOOL_SCHEMAS))
    assert size < 4500  # sent with every request: keep them short
