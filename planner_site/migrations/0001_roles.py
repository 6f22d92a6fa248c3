"""Two groups: operators decide and edit; viewers only watch."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

from planner_site.roles import ROLE_APPS, roles_assign


def roles_create(apps, schema_editor):
    # Permissions are normally created after all migrations; the groups need them now.
    for label in [*ROLE_APPS, "auth", "contenttypes"]:
        try:
            config = apps.get_app_config(label)
        except LookupError:  # an app added later (policies) creates its permissions in its own migration
            continue
        config.models_module = True
        create_permissions(config, apps=apps, verbosity=0)
        config.models_module = None
    roles_assign(group_model=apps.get_model("auth", "Group"), permission_model=apps.get_model("auth", "Permission"))


def roles_delete(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=["operators", "viewers"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("agents", "0002_initial"),
        ("goals", "0001_initial"),
        ("planning", "0001_initial"),
    ]

    operations = [migrations.RunPython(roles_create, roles_delete)]
