"""factory-boy factories for every model."""

from __future__ import annotations

import factory
from django.contrib.auth.models import Group, Permission, User

from agents.models import Agent, Experience, Lesson, LLMCall, Need
from goals.models import Goal
from planner_site.roles import roles_assign
from planning.models import Plan, PlanEvent, PlanStep


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.PostGenerationMethodCall("set_password", "pw-for-tests-123")

    @factory.post_generation
    def role(self, create: bool, extracted: str | None, **kwargs: object) -> None:
        if create and extracted:
            if not Group.objects.filter(name=extracted).exists():  # a transactional test flushed the groups
                roles_assign(group_model=Group, permission_model=Permission)
            self.groups.add(Group.objects.get(name=extracted))
        if create:
            self.save()


class AgentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Agent

    name = factory.Sequence(lambda n: f"Agent {n}")
    backstory = "A test agent."
    kind = Agent.Kind.PERSONA
    cycle_interval = 0.0


class NeedFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Need

    agent = factory.SubFactory(AgentFactory)
    name = factory.Iterator(["hunger", "energy", "money", "social", "fun"])
    satisfaction = 0.6
    decay_per_hour = 0.05


class GoalFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Goal

    agent = factory.SubFactory(AgentFactory)
    description = factory.Sequence(lambda n: f"Goal number {n}")
    horizon = Goal.Horizon.SHORT
    source_needs = factory.LazyFunction(lambda: ["hunger"])


class PlanFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Plan

    agent = factory.SubFactory(AgentFactory)
    goal = factory.SubFactory(GoalFactory, agent=factory.SelfAttribute("..agent"))
    goal_text = factory.SelfAttribute("goal.description")
    status = Plan.Status.ACTIVE
    approval_mode = Plan.ApprovalMode.ALL


class PlanStepFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PlanStep

    plan = factory.SubFactory(PlanFactory)
    key = factory.Sequence(lambda n: str(n + 1))
    position = factory.Sequence(lambda n: n + 1)
    description = factory.Sequence(lambda n: f"Step {n}")
    action_hint = "work"


class PlanEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PlanEvent

    plan = factory.SubFactory(PlanFactory)
    kind = PlanEvent.Kind.CREATED
    actor_label = "runner test"


class ExperienceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Experience

    agent = factory.SubFactory(AgentFactory)
    cycle = factory.Sequence(lambda n: n + 1)
    action = "work"
    need_deltas = factory.LazyFunction(lambda: {"money": 0.3})
    outcome = "earned a wage"


class LessonFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Lesson

    agent = factory.SubFactory(AgentFactory)
    description = "Working before shopping avoids an empty wallet."


class LLMCallFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = LLMCall

    agent = factory.SubFactory(AgentFactory)
    purpose = LLMCall.Purpose.PLAN
    model = "offline-rules"
    prompt = factory.LazyFunction(lambda: [{"role": "user", "content": "plan"}])
    response = "<json>{}</json>"
