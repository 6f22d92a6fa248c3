"""Importing the settings changes nothing on disk; var/ and the secret key appear at first use, and a
fresh checkout still migrates and signs with no setup step (what `make run` does first)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, var: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DATABASE_URL", "SQLITE_PATH")}
    env |= {"PLANNER_VAR_DIR": str(var), "DJANGO_SETTINGS_MODULE": "planner_site.settings"}
    command = [sys.executable, "-c", code] if code else [sys.executable, "manage.py", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True)


def test_importing_settings_creates_nothing(tmp_path: Path) -> None:
    var = tmp_path / "var"
    run("import planner_site.settings as s; print(s.SQLITE_PATH)", var)
    assert not var.exists()


def test_secret_key_is_made_once_at_first_use_and_kept_private(tmp_path: Path) -> None:
    var = tmp_path / "var"
    sign = "import django; django.setup(); from django.core import signing; print(signing.dumps('x'))"
    first = run(sign, var).stdout.strip()
    key = var / "secret_key"
    assert key.exists() and stat.S_IMODE(key.stat().st_mode) == 0o600
    check = f"import django; django.setup(); from django.core import signing; print(signing.loads({first!r}))"
    assert run(check, var).stdout.strip() == "x"  # another process signs with the same kept key


def test_a_fresh_checkout_migrates_without_a_setup_step(tmp_path: Path) -> None:
    var = tmp_path / "fresh" / "var"
    run("", var, "migrate", "--noinput", "-v", "0")
    assert (var / "planner.sqlite3").exists()
