from __future__ import annotations

from django.urls import path

from planning import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("agents/<int:pk>/", views.agent_detail, name="agent-detail"),
    path("agents/<int:pk>/status/", views.agent_status_view, name="agent-status"),
    path("agents/<int:pk>/goals/", views.agent_goal_view, name="agent-goal"),
    path("plans/<int:pk>/", views.plan_detail, name="plan-detail"),
    path("plans/<int:pk>/approve/", views.plan_approve_view, name="plan-approve"),
    path("plans/<int:pk>/cancel/", views.plan_cancel_view, name="plan-cancel"),
    path("plans/<int:pk>/replan/", views.plan_replan_view, name="plan-replan"),
    path("steps/<int:pk>/approve/", views.step_approve_view, name="step-approve"),
    path("steps/<int:pk>/decline/", views.step_decline_view, name="step-decline"),
    path("steps/<int:pk>/edit/", views.step_edit_view, name="step-edit"),
    path("steps/<int:pk>/skip/", views.step_skip_view, name="step-skip"),
    path("plans/<int:pk>/clarify/", views.plan_clarify_view, name="plan-clarify"),
    path("steps/<int:pk>/rollback/", views.step_rollback_view, name="step-rollback"),
]
