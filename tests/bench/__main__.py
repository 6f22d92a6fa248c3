"""`make bench`: every figure beside a baseline measured in the same run, written to var/bench.json.

Each module of this package (but `common`) exposes `figures() -> list[dict]` (see `common.figure`);
they run one after another on a throwaway database (SQLite, or DATABASE_URL if set), flushed
between modules. Only ratios carry over between machines: this one is shared and noisy.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TMP = Path(tempfile.mkdtemp(prefix="planner-bench-"))
os.environ.setdefault("PLANNER_VAR_DIR", str(TMP))
os.environ.setdefault("SQLITE_PATH", str(TMP / "bench.sqlite3"))
os.environ.setdefault("AGENT_WORKSPACES", str(TMP / "ws"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "planner_site.settings")
sys.path.insert(0, str(ROOT))


def roles_restore() -> None:
    """`flush` empties every table, the operators and viewers groups of the data migration included."""
    from django.contrib.auth.models import Group, Permission

    from planner_site.roles import roles_assign

    roles_assign(group_model=Group, permission_model=Permission)


def main() -> int:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    only = set(filter(None, os.environ.get("BENCH_ONLY", "").split(",")))
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                   if m.name not in {"common", "__main__"} and (not only or m.name in only))
    figures: list[dict] = []
    print(f"Benchmarks on {django.db.connection.vendor} (tmp: {TMP})", flush=True)
    for name in names:
        module = importlib.import_module(f"tests.bench.{name}")
        started = time.perf_counter()
        for fig in module.figures():
            figures.append(fig)
            ratio = "" if fig["ratio"] is None else f"{fig['ratio']:>7.2f}x"
            base = "" if fig["baseline"] is None else f"{fig['baseline']:.3g}"
            print(f"{'PASS' if fig['pass'] else 'MISS'}  {fig['name']:<34} {fig['value']:>10.3g} {fig['unit']:<9} "
                  f"baseline {base:>8} {ratio:>8}  goal: {fig['goal']}", flush=True)
            if fig["note"]:
                print(f"      {fig['note']}", flush=True)
        print(f"  ({name}: {time.perf_counter() - started:.1f} s)", flush=True)
        call_command("flush", interactive=False, verbosity=0)
        roles_restore()
    out = ROOT / "var" / "bench.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"figures": figures}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
