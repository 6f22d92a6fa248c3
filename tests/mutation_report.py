"""`make mutate`'s report: mutmut's verdicts on the seeds' rule modules, row by row of docs/seeds.md.

Reads mutmut's results (mutants/**/*.py.meta, written by `mutmut run`), maps each mutant to the rows of
docs/seeds.md whose code column cites its function, and writes var/mutation-report.md: per row, the mutants
killed, timed out and survived, each survivor either explained in docs/mutation.md ("Survivors explained") or
marked UNEXPLAINED. Exits 1 when a survivor in a function the table cites is unexplained.

    python tests/mutation_report.py [--command "what was run"]
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEEDS = ROOT / "docs" / "seeds.md"
EXPLAINED = ROOT / "docs" / "mutation.md"
MUTANTS = ROOT / "mutants"
REPORT = ROOT / "var" / "mutation-report.md"

# "`pkg/module.py` `name`, `other`" as in tests/test_seeds_doc.py; a bare "module.py" is one of the apps'
# (a name may carry its arguments: `goal_after_experience(bonus=)`)
CODE_REF = re.compile(r"`([\w/]+\.py)`((?:,? `[\w.]+(?:\([^`]*\))?`)+)")
# goals.system.x_goal_decay__mutmut_3, or a method: planning.engine.validate.xǁ_CheckerǁText__mutmut_2
MUTANT = re.compile(r"^(?P<module>[\w.]+)\.x(?:ǁ(?P<cls>\w+)ǁ|_)(?P<func>\w+?)__mutmut_(?P<n>\d+)$")
# mutmut's exit codes, as mutmut/stats.py reads them
KILLED, SURVIVED, TIMEOUT, NO_TESTS = "killed", "survived", "timeout", "no tests"
STATUS_BY_EXIT_CODE = {1: KILLED, 3: KILLED, 0: SURVIVED, 5: NO_TESTS, 33: NO_TESTS, 34: "skipped",
                       35: "suspicious", 36: TIMEOUT, 37: "caught by type check", -24: TIMEOUT, 24: TIMEOUT,
                       152: TIMEOUT, 255: TIMEOUT, -11: "segfault", -9: "segfault", 2: "interrupted"}


def verdict(exit_code: int | None) -> str | None:
    """None: not checked in this run."""
    return None if exit_code is None else STATUS_BY_EXIT_CODE.get(exit_code, "suspicious")


@dataclass
class Row:
    seed: str
    rule: str
    cited: set[tuple[str, str]]  # (module path, function or class name)
    mutants: dict[str, str] = field(default_factory=dict)  # name -> verdict


def rows_read() -> list[Row]:
    rows = []
    for line in SEEDS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("seed", "---"):
            continue
        cited = {(module, name) for module, names in CODE_REF.findall(cells[2])
                 for name in re.findall(r"`([\w.]+)(?:\([^`]*\))?`", names)}
        rows.append(Row(seed=cells[0], rule=cells[1], cited={(m, n.split(".")[0]) for m, n in cited}))
    return rows


def explanations() -> dict[str, str]:
    """Mutant name -> why it survives, from docs/mutation.md's "Survivors explained" section."""
    text = EXPLAINED.read_text() if EXPLAINED.exists() else ""
    section = text.split("## Survivors explained", 1)[1] if "## Survivors explained" in text else ""
    section = section.split("\n## ", 1)[0]
    found = {}
    for line in section.splitlines():
        for name in re.findall(r"`([\w.ǁ]+__mutmut_\d+)`", line):
            found[name] = line.split(":", 1)[1].strip() if ":" in line else line.strip()
    return found


def results() -> dict[str, str]:
    """Every checked mutant of this run: name -> verdict."""
    found = {}
    for meta in MUTANTS.rglob("*.py.meta"):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            status = verdict(code)
            if status is not None:
                found[name] = status
    return found


def cites(row: Row, module: str, name: str) -> bool:
    path = module.replace(".", "/") + ".py"
    return any((cited == path or path.endswith("/" + cited)) and fn == name for cited, fn in row.cited)


def report(command: str, started: float | None = None) -> tuple[str, list[str]]:
    rows = rows_read()
    verdicts = results()
    why = explanations()
    outside: dict[str, Counter[str]] = defaultdict(Counter)
    outside_survivors: list[str] = []
    for name, status in sorted(verdicts.items()):
        match = MUTANT.match(name)
        if not match:
            continue
        function = match["cls"] or match["func"]
        owners = [row for row in rows if cites(row, match["module"], function)]
        for row in owners:
            row.mutants[name] = status
        if not owners:
            outside[match["module"]][status] += 1
            if status == SURVIVED:
                outside_survivors.append(name)

    totals = Counter(verdicts.values())
    now = datetime.datetime.now(datetime.UTC)
    took = ""
    if started is not None:
        minutes, seconds = divmod(round(now.timestamp() - started), 60)
        took = f" ({minutes} min {seconds} s from `mutmut run`'s start to this report)"
    lines = [
        "# Mutation report: the seeds' rules",
        "",
        f"Date: {now:%Y-%m-%d %H:%M} UTC{took}. Command: `{command}`.",
        f"Mutants checked: {len(verdicts)} (killed {totals[KILLED]}, timed out {totals[TIMEOUT]}, "
        f"survived {totals[SURVIVED]}, no test reached {totals[NO_TESTS]}).",
        "",
        "| seed | rule | mutants | killed | timed out | survived (each explained or UNEXPLAINED) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    unexplained = []
    for row in rows:
        if not row.mutants:
            continue
        counts = Counter(row.mutants.values())
        survivors = []
        for name, status in sorted(row.mutants.items()):
            if status not in (KILLED, TIMEOUT, "caught by type check"):
                if name in why:
                    survivors.append(f"`{name}`: {why[name]}")
                else:
                    survivors.append(f"`{name}` ({status}): UNEXPLAINED")
                    unexplained.append(name)
        rule = row.rule if len(row.rule) <= 90 else row.rule[:87] + "..."
        lines.append(f"| {row.seed} | {rule} | {len(row.mutants)} | {counts[KILLED]} | {counts[TIMEOUT]} | "
                     f"{'<br>'.join(survivors) or 'none'} |")
    if outside:
        lines += ["", "Mutants in functions no row of docs/seeds.md cites (helpers, display, plumbing):", ""]
        for module, counts in sorted(outside.items()):
            lines.append(f"- {module}: " + ", ".join(f"{status} {n}" for status, n in sorted(counts.items())))
        if outside_survivors:
            lines.append("- survivors there: " + ", ".join(
                f"`{n}`" + (" (explained)" if n in why else "") for n in outside_survivors))
    return "\n".join(lines) + "\n", sorted(set(unexplained))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--command", default="make mutate", help="what was run, for the report's header")
    parser.add_argument("--started", type=float, help="when the run started (seconds since the epoch)")
    args = parser.parse_args()
    if not MUTANTS.exists():
        print("No mutants/ folder: run `make mutate` (mutmut run) first.", file=sys.stderr)
        return 2
    text, unexplained = report(args.command, args.started)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text)
    print(text)
    print(f"Written to {REPORT.relative_to(ROOT)}.")
    if unexplained:
        print(f"{len(unexplained)} survivor(s) in the seeds' rule functions are unexplained: kill each with a test "
              "or explain it in docs/mutation.md under 'Survivors explained'.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
