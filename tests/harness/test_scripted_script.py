"""The script file format: loading, validation messages, turn lookup, templating."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from agentkeel.harness.scripted import Script, ScriptError, load_script, parse_script
from agentkeel.harness.scripted.script import render


def _error(tmp_path: Path, text: str, name: str = "demo.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScriptError) as caught:
        load_script(path)
    return str(caught.value)


def test_loads_yaml_and_json_alike(tmp_path: Path) -> None:
    data = {"fallback": "bye", "agents": {"lead": [{"say": "hi", "tool_calls": [{"name": "ls", "args": {"path": "/"}}]}]}}
    (tmp_path / "s.json").write_text(json.dumps(data), encoding="utf-8")
    (tmp_path / "s.yaml").write_text(
        "fallback: bye\nagents:\n  lead:\n    - say: hi\n      tool_calls: [{name: ls, args: {path: /}}]\n",
        encoding="utf-8",
    )
    assert load_script(tmp_path / "s.json") == load_script(tmp_path / "s.yaml") == Script.model_validate(data)


def test_an_instance_key_must_end_in_an_instance_number() -> None:
    assert parse_script({"agents": {"researcher#12": [{"say": "x"}]}}).step("researcher", 1, 12) is not None
    for key in ("researcher#", "researcher#x", "#1", "researcher#01"):
        with pytest.raises(ScriptError, match="instance key is <name>#<instance number>"):
            parse_script({"agents": {key: [{"say": "x"}]}})
    assert parse_script({"agents": {"researcher@call_1": [{"say": "x"}]}}).step("researcher", 1, 0, "call_1")
    for key in ("researcher@", "@call_1", "a@b@c"):
        with pytest.raises(ScriptError, match="task key is <name>@<task id>"):
            parse_script({"agents": {key: [{"say": "x"}]}})


def test_defaults() -> None:
    script = Script.model_validate({})
    assert script.strict is True and script.fallback == "Done." and script.agents == {}
    turn = Script.model_validate({"agents": {"a": [{}]}}).agents["a"][0]
    assert (turn.provider, turn.stream_chunks, turn.delay_ms, turn.repeat) == ("openai", 1, 0, 1)
    assert (turn.usage.input, turn.usage.output) == ("auto", "auto")


def test_bad_finish_reason_names_file_agent_entry_and_field(tmp_path: Path) -> None:
    text = "agents:\n  lead:\n" + "    - say: ok\n" * 3 + "    - finish_reason: end\n"
    message = _error(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'demo.yaml'}: agents.lead[3].finish_reason: must be one of ")
    assert "'stop'" in message and "'SAFETY'" in message and "(got 'end')" in message


@pytest.mark.parametrize(
    ("turn", "location", "reason"),
    [
        ("{sya: hi}", "agents.lead[0].sya", "unknown key"),
        ("{provider: mistral}", "agents.lead[0].provider", "must be one of"),
        ("{repeat: 0}", "agents.lead[0].repeat", "must be an integer >= 1 or 'forever' (got 0)"),
        ("{repeat: always}", "agents.lead[0].repeat", "'forever'"),
        ("{usage: {input: -3}}", "agents.lead[0].usage.input", "must be an integer >= 0 or 'auto'"),
        ("{usage: {inputs: 3}}", "agents.lead[0].usage.inputs", "unknown key"),
        ("{stream_chunks: 0}", "agents.lead[0].stream_chunks", "greater than or equal to 1"),
        ("{delay_ms: -1}", "agents.lead[0].delay_ms", "greater than or equal to 0"),
        ("{raise: {kind: teapot}}", "agents.lead[0].raise.kind", "must be one of"),
        ("{raise: {message: x}}", "agents.lead[0].raise.kind", "is required"),
        ("{expect: {contains: ''}}", "agents.lead[0].expect.contains", "at least 1 character"),
        ("{tool_calls: [{args: {}}]}", "agents.lead[0].tool_calls[0].name", "is required"),
        ("{tool_calls: [{name: t, args: {d: 2024-01-02}}]}", "agents.lead[0].tool_calls[0].args", "plain JSON"),
        ("{say: 42}", "agents.lead[0].say", "valid string"),
        ("{say: hi, raise: {kind: timeout}}", "agents.lead[0]", "cannot be combined with: say"),
    ],
)
def test_field_errors(tmp_path: Path, turn: str, location: str, reason: str) -> None:
    message = _error(tmp_path, f"agents:\n  lead:\n    - {turn}\n")
    assert message.startswith(f"{tmp_path / 'demo.yaml'}: {location}: ")
    assert reason in message


def test_every_problem_is_reported(tmp_path: Path) -> None:
    message = _error(tmp_path, "strict: maybe\nagents:\n  worker:\n    - {say: a}\n    - {provider: x}\n")
    lines = message.splitlines()
    assert len(lines) == 2
    assert ": strict: " in lines[0]
    assert ": agents.worker[1].provider: " in lines[1]


def test_entry_after_forever_is_refused(tmp_path: Path) -> None:
    message = _error(tmp_path, "agents:\n  lead:\n    - {say: a, repeat: forever}\n    - {say: b}\n")
    assert "agents.lead: " in message and "entry [1] can never play" in message


def test_unknown_top_level_key_and_wrong_shapes(tmp_path: Path) -> None:
    assert "demo.yaml: agent: unknown key" in _error(tmp_path, "agent: {}\n")
    assert "a script must be a mapping" in _error(tmp_path, "- just\n- a list\n")
    assert "agents.lead: " in _error(tmp_path, "agents:\n  lead: {say: hi}\n")


def test_unreadable_and_unparsable_files(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="cannot read the script"):
        load_script(tmp_path / "missing.yaml")
    assert "not valid YAML" in _error(tmp_path, "agents: [unclosed\n")
    assert "not valid JSON" in _error(tmp_path, "{agents: 1}", name="bad.json")


def test_parse_script_names_its_source() -> None:
    with pytest.raises(ScriptError, match=r"^inline: agents\.x\[0\]\.say: "):
        parse_script({"agents": {"x": [{"say": 1}]}}, source="inline")


def test_step_walks_repeats_and_falls_back_to_star() -> None:
    script = Script.model_validate(
        {
            "agents": {
                "lead": [{"say": "a", "repeat": 2}, {"say": "b"}],
                "*": [{"say": "x"}, {"say": "y", "repeat": "forever"}],
            }
        }
    )
    assert [getattr(script.step("lead", n), "say", None) for n in range(1, 5)] == ["a", "a", "b", None]
    assert [getattr(script.step("other", n), "say", None) for n in (1, 2, 50)] == ["x", "y", "y"]
    assert Script.model_validate({}).step("lead", 1) is None


def test_render_replaces_only_known_placeholders() -> None:
    values = {"turn": "3", "agent": "lead", "instance": "0"}
    data = {"q": "{agent}#{instance} turn {turn}", "json": '{"x": {y}}', "{agent}": ["{turn}", 4, None, "{x}"]}
    assert render(data, values) == {"q": "lead#0 turn 3", "json": '{"x": {y}}', "lead": ["3", 4, None, "{x}"]}


def test_bundled_demo_script_loads() -> None:
    demo = resources.files("agentkeel.harness").joinpath("scripts/demo.yaml")
    with resources.as_file(demo) as path:
        script = load_script(path)
    lead = script.agents["lead"]
    assert script.strict is True
    assert 12 <= len(lead) <= 20
    tools = {call.name for turn in lead for call in turn.tool_calls}
    assert tools == {"ls", "read_file", "write_file", "str_replace", "glob", "grep"}
    assert lead[-1].tool_calls == [] and lead[-1].say
    assert any(turn.stream_chunks > 1 for turn in lead)
    assert all(10 <= turn.delay_ms <= 60 for turn in lead)
    for turn in lead:  # parallel calls in one turn never touch the same file
        paths = [call.args["path"] for call in turn.tool_calls if "path" in call.args]
        assert len(paths) == len(set(paths))
