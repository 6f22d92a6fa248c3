"""Drop the single-column indexes Django made for these foreign keys: an index that leads with the same column
(a composite index or unique constraint of the model's Meta) serves every lookup by it, while each index is one
more entry to write on every insert and on every update that moves a row (`make bench`, scale_*_cpu_per_cycle).
Only the indexes are dropped: the foreign keys stay as they are (no constraint is dropped and re-validated)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agents', '0011_llmcall_finish_reason_and_format'),
        ('planning', '0011_failing_indexes'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='experience',
                    name='agent',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='experiences', to='agents.agent'),
                ),
                migrations.AlterField(
                    model_name='llmcall',
                    name='plan',
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='llm_calls', to='planning.plan'),
                ),
                migrations.AlterField(
                    model_name='need',
                    name='agent',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='needs', to='agents.agent'),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "agents_experience_agent_id_04e065be"',
                    reverse_sql='CREATE INDEX IF NOT EXISTS "agents_experience_agent_id_04e065be" ON "agents_experience" ("agent_id")',
                ),
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "agents_llmcall_plan_id_b0ec2ae8"',
                    reverse_sql='CREATE INDEX IF NOT EXISTS "agents_llmcall_plan_id_b0ec2ae8" ON "agents_llmcall" ("plan_id")',
                ),
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "agents_need_agent_id_2b082e19"',
                    reverse_sql='CREATE INDEX IF NOT EXISTS "agents_need_agent_id_2b082e19" ON "agents_need" ("agent_id")',
                ),
            ],
        ),
    ]
