"""The tool sandbox: tools do their job inside the workspace and nothing outside it, ever."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agents.tools import (
    MAX_FILE_BYTES,
    TOOLS,
    ToolError,
    csv_to_json,
    json_to_csv,
    path_problem,
    text_summary,
    tool_precheck,
    tool_rollback,
    tool_run,
    undo_dir_for,
    workspace_listing,
    workspace_resolve,
)


@pytest.fixture
def sandbox(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace and, beside it, an outside folder that must stay untouched."""
    workspace, outside = tmp_path / "workspace", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("do not touch")
    return workspace, outside


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_registry_risk_classes() -> None:
    assert {name for name, spec in TOOLS.items() if not spec.risky} == {"file.read", "file.list", "text.summarize"}
    assert TOOLS["web.fetch"].risk_class == "network"
    assert TOOLS["file.convert"].schema_text() == '{path: str, to: "json" | "csv" | "md", output?: str}'


def test_workspace_resolve_inside(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    assert workspace_resolve(workspace, "notes/../a.txt") == workspace.resolve() / "a.txt"
    assert workspace_resolve(workspace, ".") == workspace.resolve()
    assert workspace_resolve(workspace, str(workspace / "b.txt")) == workspace.resolve() / "b.txt"
    assert workspace_resolve(workspace, "sub\\c.txt") == workspace.resolve() / "sub" / "c.txt"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../outside/secret.txt", "escapes the workspace with '..'"),
        ("a/../../outside/x.txt", "escapes the workspace"),
        ("/etc/passwd", "absolute path '/etc/passwd' is outside the workspace"),
        ("C:\\agent\\x.txt", "is outside the workspace"),
        ("~/x.txt", "home directory"),
        ("a\x00b", "NUL byte"),
    ],
)
def test_workspace_resolve_refuses_escapes(sandbox: tuple[Path, Path], path: str, message: str) -> None:
    workspace, _ = sandbox
    with pytest.raises(ToolError, match=message.replace("(", r"\(")):
        workspace_resolve(workspace, path)


@pytest.mark.parametrize(
    ("tool", "tool_input"),
    [
        ("file.write", {"path": "../outside/secret.txt", "content": "overwritten"}),
        ("file.append", {"path": "link/secret.txt", "content": "appended"}),
        ("file.write", {"path": "link/new.txt", "content": "planted"}),
        ("file.write", {"path": "evil.txt", "content": "through a file link"}),
        ("file.move", {"path": "a.txt", "to": "link/"}),
        ("file.move", {"path": "link/secret.txt", "to": "stolen.txt"}),
        ("dir.create", {"path": "link/sub"}),
        ("file.convert", {"path": "a.csv", "to": "json", "output": "link/a.json"}),
        ("report.write", {"paths": ["a.txt"], "output": "../report.md"}),
        ("file.read", {"path": "link/secret.txt"}),
    ],
)
def test_tool_run_never_touches_the_outside(sandbox: tuple[Path, Path], tool: str, tool_input: dict[str, object]) -> None:
    workspace, outside = sandbox
    (workspace / "a.txt").write_text("Alpha.")
    (workspace / "a.csv").write_text("x\n1\n")
    os.symlink(outside, workspace / "link")
    os.symlink(outside / "secret.txt", workspace / "evil.txt")
    before = snapshot(outside)
    with pytest.raises(ToolError, match="outside the workspace|escapes the workspace"):
        tool_run(tool, tool_input, workspace=workspace)
    assert snapshot(outside) == before
    assert (workspace / "a.txt").exists()


def test_file_convert_csv_to_json(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    (workspace / "data.csv").write_text('name,city,note\nAda,London,"likes, commas"\nJen,"New York",\n')
    result = tool_run("file.convert", {"path": "data.csv", "to": "json"}, workspace=workspace)
    assert result.startswith("Converted data.csv to json: wrote data.json")
    assert json.loads((workspace / "data.json").read_text()) == [
        {"name": "Ada", "city": "London", "note": "likes, commas"},
        {"name": "Jen", "city": "New York", "note": ""},
    ]


def test_file_convert_json_to_csv_to_chosen_output(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    (workspace / "people.json").write_text(json.dumps([{"name": "Ada", "tags": ["x"]}, {"name": "Jen", "age": 30}]))
    tool_run("file.convert", {"path": "people.json", "to": "csv", "output": "out/people.csv"}, workspace=workspace)
    assert (workspace / "out" / "people.csv").read_text() == 'name,tags,age\nAda,"[""x""]",\nJen,,30\n'


def test_csv_json_round_trip() -> None:
    text = "a,b\n1,2\n3,4\n"
    assert json_to_csv(csv_to_json(text)) == text


def test_file_convert_refuses_ragged_csv(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    (workspace / "bad.csv").write_text("a,b\n1,2,3\n")
    with pytest.raises(ToolError, match="CSV line 2 has more cells than the header"):
        tool_run("file.convert", {"path": "bad.csv", "to": "json"}, workspace=workspace)
    assert not (workspace / "bad.json").exists()


def test_tool_run_unknown_tool(sandbox: tuple[Path, Path]) -> None:
    with pytest.raises(ToolError, match="unknown tool 'file.delete_all'"):
        tool_run("file.delete_all", {}, workspace=sandbox[0])


@pytest.mark.parametrize(
    ("tool", "tool_input", "message"),
    [
        ("file.read", {}, "file.read input missing required key 'path'"),
        ("file.read", {"path": 3}, "file.read input 'path' must be str, got int"),
        ("file.write", {"path": "a.txt", "content": "x", "mode": "w"}, "unknown key 'mode'"),
        ("file.convert", {"path": "a.csv", "to": "xml"}, "must be one of: json, csv"),
        ("text.summarize", {"path": "a.txt", "max_sentences": True}, "'max_sentences' must be int, got bool"),
        ("report.write", {"paths": [], "output": "r.md"}, "'paths' must not be empty"),
        ("report.write", {"paths": [1], "output": "r.md"}, "'paths' must be a list of strings"),
    ],
)
def test_tool_run_bad_input(sandbox: tuple[Path, Path], tool: str, tool_input: dict[str, object], message: str) -> None:
    with pytest.raises(ToolError, match=message):
        tool_run(tool, tool_input, workspace=sandbox[0])


def test_web_fetch_is_always_refused_offline(sandbox: tuple[Path, Path]) -> None:
    with pytest.raises(ToolError, match="^network access is disabled for this agent$"):
        tool_run("web.fetch", {"url": "https://example.com"}, workspace=sandbox[0])


def test_file_read_limits(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    (workspace / "big.txt").write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    (workspace / "blob.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ToolError, match="too large to read"):
        tool_run("file.read", {"path": "big.txt"}, workspace=workspace)
    with pytest.raises(ToolError, match="not UTF-8 text"):
        tool_run("file.read", {"path": "blob.bin"}, workspace=workspace)
    with pytest.raises(ToolError, match="file 'missing.txt' does not exist"):
        tool_run("file.read", {"path": "missing.txt"}, workspace=workspace)


def test_file_write_append_read(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    assert tool_run("file.write", {"path": "notes/a.txt", "content": "one\n"}, workspace=workspace) == (
        "Wrote notes/a.txt (4 characters)"
    )
    tool_run("file.append", {"path": "notes/a.txt", "content": "two\n"}, workspace=workspace)
    assert tool_run("file.read", {"path": "notes/a.txt"}, workspace=workspace) == (
        "Read notes/a.txt (8 characters, 2 lines):\none\ntwo\n"
    )
    with pytest.raises(ToolError, match="is a folder"):
        tool_run("file.write", {"path": "notes", "content": "x"}, workspace=workspace)


def test_file_move_into_folder_and_no_overwrite(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    (workspace / "a.csv").write_text("1")
    (workspace / "b.csv").write_text("2")
    tool_run("dir.create", {"path": "csv"}, workspace=workspace)
    assert tool_run("file.move", {"path": "a.csv", "to": "csv/"}, workspace=workspace) == "Moved a.csv to csv/a.csv"
    (workspace / "a.csv").write_text("3")
    with pytest.raises(ToolError, match="'csv/a.csv' already exists"):
        tool_run("file.move", {"path": "a.csv", "to": "csv"}, workspace=workspace)
    assert (workspace / "csv" / "a.csv").read_text() == "1"


def test_file_list(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    (workspace / "b.txt").write_text("")
    (workspace / "a").mkdir()
    assert tool_run("file.list", {}, workspace=workspace) == "2 entries in .:\na/\nb.txt"
    assert workspace_listing(workspace) == ["a/", "b.txt"]


def test_text_summary_is_extractive_and_deterministic() -> None:
    text = (
        "Budgets matter. The budget for the garden project grew again this month. "
        "Lunch was nice. The garden project budget now needs approval from the board. Weather was fine."
    )
    summary = text_summary(text, max_sentences=2)
    assert summary == (
        "The budget for the garden project grew again this month. "
        "The garden project budget now needs approval from the board."
    )
    assert text_summary(text, max_sentences=2) == summary


def test_report_write_collects_summaries(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    (workspace / "a.txt").write_text("Alpha is first. It leads.")
    (workspace / "b.md").write_text("# B\n\nBeta is second.")
    result = tool_run("report.write", {"paths": ["a.txt", "b.md"], "output": "report.md"}, workspace=workspace)
    assert result == "Wrote report report.md covering 2 file(s)"
    report = (workspace / "report.md").read_text()
    assert report.startswith("# Report\n")
    assert "## a.txt\n\nAlpha is first. It leads.\n" in report
    assert "## b.md\n\nBeta is second.\n" in report


def test_workspace_resolve_symlink_loop_is_a_tool_error(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    os.symlink(workspace / "b", workspace / "a")
    os.symlink(workspace / "a", workspace / "b")
    with pytest.raises(ToolError, match="cannot be resolved"):
        tool_run("file.read", {"path": "a/x.txt"}, workspace=workspace)


# -- misleading reasons made true ------------------------------------------------------------------


def test_a_5000_character_path_is_called_too_long_not_a_link_loop(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    with pytest.raises(ToolError) as raised:
        workspace_resolve(workspace, "a" * 5000)
    assert "is too long (5000 characters; at most 1024)" in str(raised.value)
    assert "link" not in str(raised.value)
    with pytest.raises(ToolError, match="has a name of 300 characters"):
        tool_run("file.read", {"path": "b" * 300}, workspace=workspace)


# -- counting (the demo's "count the rows" goal) ------------------------------------------------------


def test_file_count_writes_the_number_of_csv_rows_and_leaves_the_source(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    (workspace / "data.csv").write_text("name,age\nAda,36\nAlan,41\n\nGrace,85\n")
    result = tool_run("file.count", {"path": "data.csv", "output": "count.txt"}, workspace=workspace)
    assert (workspace / "count.txt").read_text() == "3\n"
    assert (workspace / "data.csv").read_text().startswith("name,age\n")
    assert result == "data.csv has 3 rows; wrote 3 to count.txt"
    tool_run("file.count", {"path": "data.csv", "output": "lines.txt", "unit": "lines"}, workspace=workspace)
    assert (workspace / "lines.txt").read_text() == "5\n"


# -- seed 002 loops ------------------------------------------------------------------------------------


def test_for_each_runs_once_per_listed_file_with_its_full_path(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    (workspace / "notes").mkdir()
    (workspace / "notes" / "a.txt").write_text("Alpha is first. It leads.")
    (workspace / "notes" / "b.txt").write_text("Beta is second.")
    loop = {"for_each": "1", "items_from": {"tool": "file.list", "input": {"path": "notes"}}}
    result = tool_run("text.summarize", {"path": "{item}"}, workspace=workspace, loop=loop)
    assert result.startswith("2 runs:")
    assert "Summary of notes/a.txt" in result and "Summary of notes/b.txt" in result


def test_for_each_over_a_list_that_does_not_exist_fails_clearly(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    loop = {"for_each": "1", "items_from": {"tool": "file.list", "input": {"path": "missing"}}}
    with pytest.raises(ToolError, match="the list to iterate over does not exist: folder 'missing' is missing"):
        tool_run("text.summarize", {"path": "{item}"}, workspace=workspace, loop=loop)


def test_repeat_fills_a_zero_based_padded_index(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    tool_run("file.write", {"path": "part-{index:03d}.txt", "content": "part {index}\n"}, workspace=workspace,
             loop={"repeat": 3})
    assert sorted(p.name for p in workspace.iterdir()) == ["part-000.txt", "part-001.txt", "part-002.txt"]
    assert (workspace / "part-002.txt").read_text() == "part 2\n"


def test_a_loop_cannot_write_outside_the_workspace(sandbox: tuple[Path, Path]) -> None:
    workspace, outside = sandbox
    with pytest.raises(ToolError, match="escapes the workspace"):
        tool_run("file.write", {"path": "../outside/{index}.txt", "content": "x"}, workspace=workspace,
                 loop={"repeat": 2})
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


# -- undo and rollback ---------------------------------------------------------------------------------


def test_rollback_restores_an_overwritten_file_and_removes_a_created_one(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    undo = undo_dir_for(workspace, "7")
    (workspace / "data.csv").write_text("a,b\n1,2\n")
    tool_run("file.write", {"path": "data.csv", "content": "clobbered\n"}, workspace=workspace, undo_dir=undo)
    assert (workspace / "data.csv").read_text() == "clobbered\n"
    assert not undo.is_relative_to(workspace)  # the agent cannot reach its own undo copies
    assert tool_rollback(workspace, undo) == ["restored data.csv"]
    assert (workspace / "data.csv").read_text() == "a,b\n1,2\n"

    undo2 = undo_dir_for(workspace, "8")
    tool_run("file.convert", {"path": "data.csv", "to": "json"}, workspace=workspace, undo_dir=undo2)
    assert (workspace / "data.json").exists()
    assert tool_rollback(workspace, undo2) == ["removed data.json"]
    assert not (workspace / "data.json").exists()
    with pytest.raises(ToolError, match="kept no undo copies"):
        tool_rollback(workspace, undo2)  # nothing is rolled back twice


def test_rollback_of_a_move_puts_the_file_back(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    (workspace / "a.txt").write_text("A")
    (workspace / "docs").mkdir()
    undo = undo_dir_for(workspace, "9")
    tool_run("file.move", {"path": "a.txt", "to": "docs"}, workspace=workspace, undo_dir=undo)
    assert (workspace / "docs" / "a.txt").exists() and not (workspace / "a.txt").exists()
    tool_rollback(workspace, undo)
    assert (workspace / "a.txt").read_text() == "A" and not (workspace / "docs" / "a.txt").exists()


def test_precheck_says_what_a_step_reads_creates_and_overwrites(sandbox: tuple[Path, Path]) -> None:
    workspace, _ = sandbox
    (workspace / "data.csv").write_text("a,b\n1,2\n")
    (workspace / "count.txt").write_text("9\n")
    assert tool_precheck("file.count", {"path": "data.csv", "output": "count.txt"}, workspace) == (
        "reads data.csv (8 bytes); will overwrite count.txt")
    assert tool_precheck("file.read", {"path": "nope.txt"}, workspace) == "nope.txt does not exist yet"
    assert tool_precheck("file.write", {"path": "new.txt", "content": "x"}, workspace) == "will create new.txt"


def test_a_declared_system_tool_is_risky_and_its_steps_require_permission() -> None:
    """Seed 003: writes, network access and system changes are risky; only reads are safe."""
    from agents.declared_tools import tool_registry
    from planning.engine.validate import plan_validate

    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    tools = tool_registry([
        {"name": "service.restart", "description": "Restart a service", "input_schema": schema, "risk": "system"},
        {"name": "service.status", "description": "Read a service's status", "input_schema": schema, "risk": "read"},
    ])
    assert tools["service.restart"].risky and not tools["service.status"].risky
    result = plan_validate({"steps": [
        {"id": "1", "tool": "service.status", "intent": "Check web", "input": {"name": "web"}, "requiresPermission": False},
        {"id": "2", "tool": "service.restart", "intent": "Restart web", "input": {"name": "web"}, "requiresPermission": False},
    ]}, kind="tool", tools=tools)
    assert result.plan is not None
    assert [(s.requires_permission, s.risk) for s in result.plan.steps] == [(False, "safe"), (True, "risky")]


@pytest.mark.parametrize("path", ["people.json'}, ", "log.txt,", '"notes.txt"', "{path}.txt}", "out.md'"])
def test_a_path_holding_pieces_of_the_answers_json_is_refused(path: str) -> None:
    """A small model's badly written JSON leaves quotes, braces and commas in a path: refused with why, so its
    retry can fix it, never a file named `people.json'}, ` written beside the real one."""
    assert "holds a piece of the answer's JSON" in (path_problem(path) or "")


@pytest.mark.parametrize("path", ["bob's notes.txt", "report [draft].md", "part-{index:03d}.txt", "{item}",
                                  "notes/{name}.md"])
def test_names_with_an_apostrophe_brackets_or_a_loops_placeholder_are_fine(path: str) -> None:
    assert path_problem(path) is None
