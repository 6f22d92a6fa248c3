"""Plans made before traces: 0017 gave every existing plan the same trace and root span ids (a callable default
is computed once for the existing rows), which would make all of an agent's older plans one lineage, on the plan
page's timeline and in the exported trace. A root span id shared by more than one lineage's first version is that
one: those plans' ids are cleared, so they are "made before traces" (their timeline follows the versions' links;
they are not exported), as docs/tracing.md says."""

from django.db import migrations
from django.db.models import Count


def trace_ids_cleared(apps, schema_editor):
    Plan = apps.get_model("planning", "Plan")
    shared = list(Plan.objects.filter(previous__isnull=True).exclude(trace_root_id="").values("trace_root_id")
                  .annotate(firsts=Count("id")).filter(firsts__gt=1).values_list("trace_root_id", flat=True))
    if shared:
        Plan.objects.filter(trace_root_id__in=shared).update(trace_id="", trace_root_id="", trace_parent_id="")


class Migration(migrations.Migration):

    dependencies = [
        ("planning", "0020_plan_accepted_as_done"),
    ]

    operations = [
        migrations.RunPython(trace_ids_cleared, migrations.RunPython.noop),
    ]
