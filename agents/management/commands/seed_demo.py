"""A handful of persona and tool agents, so a newcomer sees a living dashboard within seconds."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from agents.models import Agent, Need
from goals.models import Goal

PERSONAS: list[dict[str, Any]] = [
    {
        "name": "Jenbina", "backstory": "Just moved to the city; hungry and out of money.",
        "personality": {"openness": 0.7, "conscientiousness": 0.6, "extraversion": 0.5},
        "emotions": {"worry": 0.6, "hope": 0.4},
        "needs": {"hunger": (0.32, 0.016), "money": (0.05, 0.011), "energy": (0.8, 0.013), "social": (0.5, 0.009), "fun": (0.6, 0.009)},
        "goals": [{"description": "Get something to eat", "horizon": "short_term", "source_needs": ["hunger"],
                   "recommended_actions": ["look for work", "work", "buy food", "eat"]}],
    },
    {
        "name": "Marco", "backstory": "A night-shift nurse who hasn't seen friends in weeks.",
        "personality": {"openness": 0.5, "conscientiousness": 0.8, "extraversion": 0.7},
        "emotions": {"loneliness": 0.7, "tiredness": 0.6},
        "needs": {"hunger": (0.7, 0.013), "money": (0.6, 0.011), "energy": (0.35, 0.016), "social": (0.2, 0.013), "fun": (0.4, 0.009)},
        "goals": [{"description": "Reconnect with a friend this week", "horizon": "mid_term", "source_needs": ["social"],
                   "recommended_actions": ["call a friend", "meet friend"]}],
    },
]

TOOL_AGENTS: list[dict[str, Any]] = [
    {
        "name": "Archivist", "backstory": "Keeps the team's data files tidy and machine-readable.",
        "files": {"data.csv": "name,role,city\nAda,engineer,London\nGrace,admiral,Arlington\nLinus,maintainer,Portland\n"},
        "goal": "Convert data.csv to JSON",
    },
    {
        "name": "Reporter", "backstory": "Reads the team's notes and writes short reports.",
        "files": {
            "notes/monday.txt": "The deploy went out on time. Two alerts fired overnight. The on-call fixed the disk alert.",
            "notes/tuesday.txt": "Customers asked for CSV export. The team agreed to ship it next sprint. Latency is stable.",
        },
        "goal": "Write a report from the notes",
    },
    {
        "name": "Intern", "backstory": "New on the team; plans with a small model first, a stronger one as fallback.",
        "planner_models": "offline-sloppy,offline-rules",
        "files": {"notes/ideas.txt": "Ship CSV export. Add dark mode. Fix the flaky login test. Write the docs."},
        "goal": "Summarize the notes",
    },
]


class Command(BaseCommand):
    help = "Create demo agents (persona and tool), their needs and goals, and the admin, operator and viewer users."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--if-empty", action="store_true", help="Do nothing when agents already exist.")
        parser.add_argument("--interval", type=float, default=3.0, help="Seconds between an agent's cycles.")
        parser.add_argument("--no-users", action="store_true", help="Do not create the demo users.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["if_empty"] and Agent.objects.exists():
            self.stdout.write("Agents already exist; demo not seeded.")
            return
        with transaction.atomic():
            for spec in PERSONAS:
                agent, created = Agent.objects.get_or_create(name=spec["name"], defaults={
                    "backstory": spec["backstory"], "kind": Agent.Kind.PERSONA, "personality": spec["personality"],
                    "emotions": spec["emotions"], "cycle_interval": options["interval"],
                })
                if not created:
                    continue
                for name, (value, rate) in spec["needs"].items():
                    Need.objects.create(agent=agent, name=name, satisfaction=value, decay_per_hour=rate)
                for goal in spec["goals"]:
                    Goal.objects.create(agent=agent, **goal)
            for spec in TOOL_AGENTS:
                agent, created = Agent.objects.get_or_create(name=spec["name"], defaults={
                    "backstory": spec["backstory"], "kind": Agent.Kind.TOOL, "cycle_interval": options["interval"],
                    "planner_models": spec.get("planner_models", ""),
                })
                if not created:
                    continue
                for rel, text in spec["files"].items():
                    path = agent.workspace / rel
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
                Goal.objects.create(agent=agent, description=spec["goal"], horizon=Goal.Horizon.SHORT,
                                    source_lessons=["given by seed_demo"])
        self.stdout.write(self.style.SUCCESS(f"Demo agents ready: {Agent.objects.count()} agents."))
        if not options["no_users"]:
            self.users_create()

    def users_create(self) -> None:
        lines = []
        for username, group, superuser in (("admin", None, True), ("operator", "operators", False), ("viewer", "viewers", False)):
            if User.objects.filter(username=username).exists():
                continue
            password = secrets.token_urlsafe(12)
            if superuser:
                user = User.objects.create_superuser(username, "", password)
            else:
                user = User.objects.create_user(username, "", password, is_staff=True)
                user.groups.add(Group.objects.get(name=group))
            lines.append(f"  {username:<9} {password}")
        if lines:
            self.stdout.write(self.style.WARNING(
                "Log in at /accounts/login/ (http://127.0.0.1:8000 by default) with these passwords, printed once "
                "and stored nowhere:\n" + "\n".join(lines)
                + "\nForgot it? `make password` (or `python manage.py changepassword admin`)."
            ))
