"""docs/seeds.md maps every rule of the seeds to its code and its test: each test and each code name it
cites must exist, so the map cannot silently go stale when code is renamed or a test removed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "seeds.md").read_text()
# "tests/x/test_y.py::test_a, ::test_b" (a bare "::name" belongs to the file named before it; "name_*" is
# every test whose name starts so)
TEST_REF = re.compile(r"(tests/[\w/]+\.py)?::(\w+)(\*?)")
# "`pkg/module.py` `name`" and "`pkg/module.py` `name`, `other`"; a bare "module.py" is one of the apps'
CODE_REF = re.compile(r"`([\w/]+\.py)`((?:,? `\w+`)+)")
APPS = ("agents", "goals", "planning", "planner_site")


def defined(path: Path, name: str, prefix: bool = False) -> bool:
    tail = "" if prefix else r"\b"
    pattern = rf"^\s*(?:async\s+)?(?:def|class)\s+{name}{tail}|^\s*{name}{tail}\s*[:=]"
    return re.search(pattern, path.read_text(), re.M) is not None


def modules(cited: str) -> list[Path]:
    if "/" in cited:
        return [ROOT / cited] if (ROOT / cited).exists() else []
    return [p for app in APPS for p in (ROOT / app).rglob(cited)]


def test_every_cited_test_exists() -> None:
    missing, current = [], None
    for match in TEST_REF.finditer(DOC):
        current = match.group(1) or current
        assert current is not None, f"'::{match.group(2)}' names no file before it"
        path = ROOT / current
        if not path.exists() or not defined(path, match.group(2), prefix=bool(match.group(3))):
            missing.append(f"{current}::{match.group(2)}{match.group(3)}")
    assert TEST_REF.search(DOC) is not None
    assert not missing, "docs/seeds.md cites tests that do not exist:\n" + "\n".join(missing)


def test_every_cited_code_name_exists() -> None:
    missing = []
    for match in CODE_REF.finditer(DOC):
        paths = modules(match.group(1))
        for name in re.findall(r"`(\w+)`", match.group(2)):
            if not any(defined(path, name) for path in paths):
                missing.append(f"{match.group(1)} {name}")
    assert CODE_REF.search(DOC) is not None
    assert not missing, "docs/seeds.md cites code that does not exist:\n" + "\n".join(missing)


# -- docs/mutation.md: what `make mutate` leaves unkilled is explained against code that still exists -------------

MUTATION_DOC = (ROOT / "docs" / "mutation.md").read_text()
# goals.system.x_goal_decay__mutmut_3, or a method: planning.engine.validate.xǁ_Checkerǁtext__mutmut_2
MUTANT_NAME = re.compile(r"`(?P<module>[\w.]+)\.x(?:ǁ(?P<cls>\w+)ǁ|_)(?P<func>\w+?)__mutmut_\d+`")


def test_every_explained_survivor_names_a_function_that_exists() -> None:
    section = MUTATION_DOC.split("## Survivors explained", 1)[1]
    named = list(MUTANT_NAME.finditer(section))
    missing = [m.group(0) for m in named
               if not (ROOT / (m["module"].replace(".", "/") + ".py")).exists()
               or not defined(ROOT / (m["module"].replace(".", "/") + ".py"), m["cls"] or m["func"])]
    assert named, "docs/mutation.md explains no survivor"
    assert not missing, "docs/mutation.md explains mutants of functions that no longer exist:\n" + "\n".join(missing)


def test_the_mutation_report_counts_a_mutant_for_each_row_citing_its_function() -> None:
    from tests.mutation_report import MUTANT, cites, rows_read

    rows = rows_read()
    match = MUTANT.match("agents.persona.x_step_evaluate__mutmut_7")
    assert match is not None and match["func"] == "step_evaluate"
    owners = [row.rule for row in rows if cites(row, match["module"], match["func"])]
    assert any(rule.startswith("Step completion") for rule in owners)
    assert any(rule.startswith("check_for_replan") for rule in owners)
    validate = [row.rule for row in rows if cites(row, "planning.engine.validate", "_check_loops")]
    assert validate == ["4) FOR_EACH list keys must already exist"]  # a bare `validate.py` is the engine's
