from __future__ import annotations

from django.urls import path

from policies import views

urlpatterns = [
    path("", views.policies, name="policies"),
    path("new/", views.policy_create, name="policy-create"),
    path("<int:pk>/", views.policy_detail, name="policy-detail"),
    path("<int:pk>/edit/", views.policy_edit, name="policy-edit"),
    path("<int:pk>/switch/", views.policy_switch, name="policy-switch"),
    path("<int:pk>/delete/", views.policy_delete, name="policy-delete"),
    path("<int:pk>/dry-run/", views.policy_dry_run, name="policy-dry-run"),
    path("<int:pk>/rules/", views.rule_add, name="rule-add"),
    path("<int:pk>/rules/<int:rule_pk>/", views.rule_edit, name="rule-edit"),
    path("<int:pk>/rules/<int:rule_pk>/delete/", views.rule_delete, name="rule-delete"),
    path("budgets/", views.budget_set, name="budget-set"),
    path("budgets/<int:pk>/delete/", views.budget_remove, name="budget-delete"),
    path("decisions/<int:event_pk>/undo/", views.decision_undo, name="decision-undo"),
]
