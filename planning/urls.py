from __future__ import annotations

from django.urls import path

from planning import views, views_a2a, views_audit, views_editor, views_inbox

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("agents/new/", views.agent_new, name="agent-new"),
    path("agents/new/a2a/", views.agent_a2a_new, name="agent-a2a-new"),
    path("agents/new/agui/", views.agui_agent_new, name="agui-agent-new"),
    path("glance/", views.dashboard_glance_view, name="dashboard-glance"),
    path("agents/<int:pk>/", views.agent_detail, name="agent-detail"),
    path("agents/<int:pk>/workspace/", views.agent_upload_view, name="agent-upload"),
    path("agents/<int:pk>/status/", views.agent_status_view, name="agent-status"),
    path("agents/<int:pk>/goals/", views.agent_goal_view, name="agent-goal"),
    path("agents/<int:pk>/a2a-credential/", views_a2a.agent_a2a_credential, name="agent-a2a-credential"),
    path("plans/<int:pk>/", views.plan_detail, name="plan-detail"),
    path("plans/<int:pk>/approve/", views.plan_approve_view, name="plan-approve"),
    path("plans/<int:pk>/cancel/", views.plan_cancel_view, name="plan-cancel"),
    path("plans/<int:pk>/replan/", views.plan_replan_view, name="plan-replan"),
    path("steps/<int:pk>/approve/", views.step_approve_view, name="step-approve"),
    path("steps/<int:pk>/decline/", views.step_decline_view, name="step-decline"),
    path("steps/<int:pk>/edit/", views.step_edit_view, name="step-edit"),
    path("steps/<int:pk>/skip/", views.step_skip_view, name="step-skip"),
    path("plans/<int:pk>/clarify/", views.plan_clarify_view, name="plan-clarify"),
    path("plans/<int:pk>/accept-done/", views.plan_accept_done_view, name="plan-accept-done"),
    path("steps/<int:pk>/rollback/", views.step_rollback_view, name="step-rollback"),
    path("steps/<int:pk>/undo-policy-approval/", views.step_policy_undo_view, name="step-policy-undo"),
]

# The inbox, the plan editor, versions compared, the audit log and usage.
urlpatterns += [
    path("inbox/", views_inbox.inbox, name="inbox"),
    path("inbox/count/", views_inbox.inbox_count_view, name="inbox-count"),
    path("inbox/steps/<int:pk>/approve/", views_inbox.inbox_step_approve, name="inbox-step-approve"),
    path("inbox/steps/<int:pk>/decline/", views_inbox.inbox_step_decline, name="inbox-step-decline"),
    path("inbox/plans/<int:pk>/approve/", views_inbox.inbox_plan_approve, name="inbox-plan-approve"),
    path("inbox/plans/<int:pk>/cancel/", views_inbox.inbox_plan_cancel, name="inbox-plan-cancel"),
    path("inbox/plans/<int:pk>/clarify/", views_inbox.inbox_plan_clarify, name="inbox-plan-clarify"),
    path("inbox/plans/<int:pk>/accept-done/", views_inbox.inbox_plan_accept_done, name="inbox-plan-accept-done"),
    path("inbox/plans/<int:pk>/decline/", views_inbox.inbox_plan_decline, name="inbox-plan-decline"),
]

urlpatterns += [
    path("plans/<int:pk>/editor/", views_editor.plan_editor, name="plan-editor"),
    path("plans/<int:pk>/versions/", views_editor.plan_versions, name="plan-versions"),
    path("plans/compare/", views_editor.plan_compare, name="plan-compare"),
]

urlpatterns += [
    path("audit/", views_audit.audit, name="audit"),
    path("audit/export.csv", views_audit.audit_export, {"fmt": "csv"}, name="audit-export-csv"),
    path("audit/export.json", views_audit.audit_export, {"fmt": "json"}, name="audit-export-json"),
    path("usage/", views_audit.usage, name="usage"),
]

urlpatterns += [
    path("plans/<int:pk>/graph/", views_editor.plan_graph_view, name="plan-graph"),
]

# Where remote A2A agents POST their tasks' updates (push notifications): no login, the task's token instead.
urlpatterns += [
    path("a2a/push/<int:pk>/", views_a2a.a2a_push, name="a2a-push"),
]
