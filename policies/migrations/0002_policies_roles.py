"""Operators may edit policies and budgets; viewers may read them (the groups of planner_site/roles.py)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

from planner_site.roles import ROLE_APPS, roles_assign


def roles_update(apps, schema_editor):
    for label in [*ROLE_APPS, "auth", "contenttypes"]:
        config = apps.get_app_config(label)
        config.models_module = True
        create_permissions(config, apps=apps, verbosity=0)
        config.models_module = None
    roles_assign(group_model=apps.get_model("auth", "Group"), permission_model=apps.get_model("auth", "Permission"))


class Migration(migrations.Migration):
    dependencies = [
        ("policies", "0001_policies_rules_budgets"),
        ("planner_site", "0001_roles"),
    ]

    operations = [migrations.RunPython(roles_update, migrations.RunPython.noop)]
