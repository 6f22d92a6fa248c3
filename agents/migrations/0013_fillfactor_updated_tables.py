"""Leave room in the pages of the tables every persona cycle rewrites, on PostgreSQL (the table storage parameter
`fillfactor`): an UPDATE can then write the row's new version on the same page and touch no index, since no
indexed column changed (a "heap-only tuple", HOT). A cycle moves its persona's needs and decays every active
goal's confidence (seed 001). Packed full (the default, 100 %), their pages had no room: after 40 s of 1,000
demo personas (the scale bench's fleet, pg_stat_user_tables) 55 % of the needs' updates and 12 % of the goals'
were HOT, and the tables held 44,000 and 65,000 dead row versions for 5,000 and 6,500 live rows. With 70 %:
98 % and 90 % HOT, 1,800 and 10,000 dead versions (bloat that vacuum no longer has to clean). PostgreSQL's CPU
a cycle moved within the runs' noise (0.53-0.58 against 0.56-0.60 ms, `make bench` scale_1000, alternating).

The agents, plans and steps are left packed: most of their updates change an indexed column (the agent's next
cycle in its due index, a plan's or step's status), and room did not make them HOT (tried: agents 70 %, 9 % HOT;
plans 80 %, none; steps 50 %, 9 %). Pages written from now on keep the room; rows
already stored move into it as they are updated and vacuumed. SQLite has no such parameter: nothing to do."""

from django.db import migrations

# Per table: the share of a page that inserts fill, the rest kept for the new versions of its rows.
FILLFACTOR = {
    ("agents", "Need"): 70,
    ("goals", "Goal"): 70,
}


def tables(apps):
    for (app, model), fill in FILLFACTOR.items():
        yield apps.get_model(app, model)._meta.db_table, fill


def fillfactor_set(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table, fill in tables(apps):
        schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} SET (fillfactor = {int(fill)})")


def fillfactor_reset(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table, _ in tables(apps):
        schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} RESET (fillfactor)")


class Migration(migrations.Migration):

    dependencies = [
        ("agents", "0012_fk_indexes_covered"),
        ("goals", "0004_fk_indexes_covered"),
    ]

    operations = [migrations.RunPython(fillfactor_set, fillfactor_reset, elidable=False)]
