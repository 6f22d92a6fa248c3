"""Drop the single-column indexes Django made for these foreign keys: an index that leads with the same column
(a composite index or unique constraint of the model's Meta) serves every lookup by it, while each index is one
more entry to write on every insert and on every update that moves a row (`make bench`, scale_*_cpu_per_cycle).
Only the indexes are dropped: the foreign keys stay as they are (no constraint is dropped and re-validated)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agents', '0012_fk_indexes_covered'),
        ('goals', '0003_goalsample_removed'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='goal',
                    name='agent',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='goals', to='agents.agent'),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "goals_goal_agent_id_7a08c4e9"',
                    reverse_sql='CREATE INDEX IF NOT EXISTS "goals_goal_agent_id_7a08c4e9" ON "goals_goal" ("agent_id")',
                ),
            ],
        ),
    ]
