"""Two groups: operators decide and edit; viewers only watch."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

APPS = ["agents", "goals", "planning"]
OPERATOR_EXTRA = [("planning", "decide_plan")]


def roles_create(apps, schema_editor):
    # Permissions are normally created after all migrations; the groups need them now.
    for label in [*APPS, "auth", "contenttypes"]:
        config = apps.get_app_config(label)
        config.models_module = True
        create_permissions(config, apps=apps, verbosity=0)
        config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    operators, _ = Group.objects.get_or_create(name="operators")
    viewers, _ = Group.objects.get_or_create(name="viewers")
    in_apps = Permission.objects.filter(content_type__app_label__in=APPS)
    viewers.permissions.set(in_apps.filter(codename__startswith="view_"))
    operators.permissions.set(in_apps.exclude(codename__startswith="delete_"))


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
