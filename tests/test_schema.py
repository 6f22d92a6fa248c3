"""The schema as migrated: the models and their migrations agree, and every foreign key has an index that leads
with its column (its own, or a composite one the model declares instead), so that no lookup or cascade by it
scans a table."""

from __future__ import annotations

import io

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection, models

pytestmark = pytest.mark.django_db

OUR_APPS = ("agents", "goals", "planning", "notifications", "policies")


def test_the_models_and_their_migrations_agree() -> None:
    out = io.StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)  # raises SystemExit(1) on a change
    assert "No changes detected" in out.getvalue()


def index_columns(model: type[models.Model]) -> list[list[str]]:
    """The columns of every index and unique constraint of the model's table, as the database has them."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, model._meta.db_table)
    return [c["columns"] for c in constraints.values() if (c["index"] or c["unique"]) and c["columns"]]


def leading_columns(model: type[models.Model]) -> set[str]:
    """The first column of every index of the model's table."""
    return {columns[0] for columns in index_columns(model)}


@pytest.mark.parametrize("app", OUR_APPS)
def test_every_foreign_key_leads_an_index(app: str) -> None:
    missing = []
    for model in apps.get_app_config(app).get_models():
        if not model._meta.managed:
            continue
        columns = leading_columns(model)
        for field in model._meta.concrete_fields:
            if isinstance(field, models.ForeignKey) and field.column not in columns:
                missing.append(f"{model._meta.label}.{field.name}")
    assert missing == []


def test_a_foreign_key_whose_own_index_was_dropped_is_served_by_a_composite_one() -> None:
    """The indexes dropped as redundant (db_index=False): the composite index that serves each is there."""
    from agents.models import Experience, LLMCall, Need
    from goals.models import Goal
    from planning.models import Plan, PlanEvent, PlanStep

    dropped = {Need: "agent", Experience: "agent", LLMCall: "plan", Goal: "agent", Plan: "agent", PlanStep: "plan",
               PlanEvent: "plan"}
    for model, name in dropped.items():
        field = model._meta.get_field(name)
        assert field.db_index is False
        assert any(columns[0] == field.column and len(columns) > 1 for columns in index_columns(model)), model


@pytest.mark.skipif(connection.vendor != "postgresql", reason="fillfactor is PostgreSQL's table storage parameter; "
                    "SQLite has none (the scale-out pass of `make test` runs this)")
def test_the_tables_every_cycle_updates_keep_room_for_their_rows_new_versions() -> None:
    """A persona cycle rewrites its needs and goals: their pages keep room so that these updates touch no index
    (agents/migrations/0013_fillfactor_updated_tables.py)."""
    from agents.models import Need
    from goals.models import Goal

    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname IN (%s, %s)",
                       [Need._meta.db_table, Goal._meta.db_table])
        options = dict(cursor.fetchall())
    assert options == {Need._meta.db_table: ["fillfactor=70"], Goal._meta.db_table: ["fillfactor=70"]}
