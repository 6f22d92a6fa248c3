"""`manage.py agent_token NAME`: an API token for an external agent (created if missing), printed once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from agents.models import Agent
from agents.services import token_issue


class Command(BaseCommand):
    help = ("Create an external agent NAME if it does not exist and print a new API token for it as the last "
            "line. The token is shown only this once; it is stored hashed and can be revoked in the admin.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The agent's name (created as an external agent when missing)")
        parser.add_argument("--label", default="", help="Where the token is used, shown in the admin")
        parser.add_argument("--expires-in", type=float, default=None, metavar="DAYS",
                            help="The token stops working after this many days (default: until revoked)")
        parser.add_argument("--policy", choices=Agent.ApprovalPolicy.values,
                            help="For a new agent: whether an operator approves each plan (default: plan)")

    def handle(self, *args: Any, **options: Any) -> None:
        name = " ".join(str(options["name"]).split())
        days = options["expires_in"]
        if days is not None and not 0 < days <= 3650:
            raise CommandError("--expires-in takes a number of days between 0 and 3650. Nothing was changed.")
        expires_at = timezone.now() + timedelta(days=days) if days is not None else None
        if not name or len(name) > 100:
            raise CommandError("The agent's name must be 1-100 characters.")
        with transaction.atomic():
            agent, created = Agent.objects.get_or_create(
                name=name, defaults={"kind": Agent.Kind.EXTERNAL,
                                     "approval_policy": options["policy"] or Agent.ApprovalPolicy.PLAN,
                                     "backstory": "An agent that runs elsewhere and is steered here over the API."},
            )
            if agent.kind != Agent.Kind.EXTERNAL:
                raise CommandError(f"{agent.name} is a {agent.get_kind_display().lower()} agent; only external "
                                   "agents get API tokens. Nothing was changed.")
            token, raw = token_issue(agent=agent, label=options["label"], expires_at=expires_at,
                                     actor_label="manage.py agent_token")
        self.stdout.write(f"{'Created' if created else 'Found'} external agent {agent.name} (id {agent.pk}).")
        until = f"; it expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else ""
        self.stdout.write(f"A new API token follows; it is shown only now (revoke it in the admin){until}:")
        self.stdout.write(raw)
