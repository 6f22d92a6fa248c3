"""Drop the single-column indexes Django made for these foreign keys: an index that leads with the same column
(a composite index or unique constraint of the model's Meta) serves every lookup by it, while each index is one
more entry to write on every insert and on every update that moves a row (`make bench`, scale_*_cpu_per_cycle).
Only the indexes are dropped: the foreign keys stay as they are (no constraint is dropped and re-validated)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agents', '0012_fk_indexes_covered'),
        ('planning', '0011_failing_indexes'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='plan',
                    name='agent',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='plans', to='agents.agent'),
                ),
                migrations.AlterField(
                    model_name='planevent',
                    name='agent',
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='agents.agent'),
                ),
                migrations.AlterField(
                    model_name='planevent',
                    name='plan',
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='planning.plan'),
                ),
                migrations.AlterField(
                    model_name='planstep',
                    name='plan',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='planning.plan'),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "planning_plan_agent_id_9cc79eee"',
                    reverse_sql='CREATE INDEX IF NOT EXISTS "planning_plan_agent_id_9cc79eee" ON "planning_plan" ("agent_id")',
                ),
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "planning_planevent_agent_id_82904c20"',
                    reverse_sql='CREATE INDEX IF NOT EXISTS "planning_planevent_agent_id_82904c20" ON "planning_planevent" ("agent_id")',
                ),
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "planning_planevent_plan_id_4706d4c0"',
                    reverse_sql='CREATE INDEX IF NOT EXISTS "planning_planevent_plan_id_4706d4c0" ON "planning_planevent" ("plan_id")',
                ),
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "planning_planstep_plan_id_db933dc4"',
                    reverse_sql='CREATE INDEX IF NOT EXISTS "planning_planstep_plan_id_db933dc4" ON "planning_planstep" ("plan_id")',
                ),
            ],
        ),
    ]
