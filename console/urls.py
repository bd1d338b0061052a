"""The console's URLs (namespace ``console``)."""

from __future__ import annotations

from django.urls import path

from console import (
    as_of_views,
    dead_views,
    limit_views,
    proposal_views,
    record_views,
    review_views,
    rewind_views,
    schedule_views,
    token_views,
    views,
    workflow_views,
)
from console.action_forms import FORMS_BY_URL

app_name = "console"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("start/", views.start, name="start"),
    path("tasks/", views.task_list, name="tasks"),
    path("tasks/go/", views.task_go, name="task_go"),
    path("tasks/<int:pk>/", views.task_detail, name="task"),
    path("tasks/<int:pk>/as-of/", as_of_views.task_as_of, name="task_as_of"),
    # One POST per form of the operator actions' table: redrive, resolve, cancel, ...
    *(
        path(f"tasks/<int:pk>/{url}/", views.task_act, {"form": url}, name=f"task_{url}")
        for url in FORMS_BY_URL
    ),
    path("tasks/<int:pk>/rewind/", rewind_views.rewind_preview, name="task_rewind"),
    path("tasks/<int:pk>/rewind/confirm/", rewind_views.rewind_confirm, name="task_rewind_confirm"),
    path("dead/", dead_views.dead_letters, name="dead"),
    path("dead/groups/", dead_views.dead_groups, name="dead_groups"),
    path("dead/bulk/", dead_views.dead_bulk, name="dead_bulk"),
    path("plans/", proposal_views.plan_inbox, name="plans"),
    path("plans/<str:plan_id>/", proposal_views.plan_page, name="plan"),
    path("plans/<str:plan_id>/apply/", proposal_views.plan_apply, name="plan_apply"),
    path("plans/<str:plan_id>/decline/", proposal_views.plan_decline, name="plan_decline"),
    path("approvals/", review_views.approval_list, name="approvals"),
    path("approvals/<int:pk>/", review_views.review, name="review"),
    path("approvals/<int:pk>/decide/", review_views.decide, name="decide"),
    path("approvals/<int:pk>/edit/", review_views.edit, name="edit_draft"),
    path("queues/", record_views.queue_list, name="queues"),
    path("queues/<str:name>/pause/", record_views.queue_pause, name="queue_pause"),
    path("queues/<str:name>/resume/", record_views.queue_resume, name="queue_resume"),
    path("limits/", limit_views.limit_list, name="limits"),
    path("limits/<str:name>/change/", limit_views.limit_change, name="limit_change"),
    path("limits/<str:name>/reset/", limit_views.limit_reset, name="limit_reset"),
    path("limits/<str:name>/pause/", limit_views.limit_pause, name="limit_pause"),
    path("limits/<str:name>/resume/", limit_views.limit_resume, name="limit_resume"),
    path("schedules/", schedule_views.schedule_list, name="schedules"),
    path("schedules/<str:name>/", schedule_views.schedule_detail, name="schedule"),
    path("schedules/<str:name>/pause/", schedule_views.schedule_pause, name="schedule_pause"),
    path("schedules/<str:name>/resume/", schedule_views.schedule_resume, name="schedule_resume"),
    path(
        "schedules/<str:name>/backfill/", schedule_views.schedule_backfill, name="schedule_backfill"
    ),
    path("schedules/<str:name>/run-now/", schedule_views.schedule_run_now, name="schedule_run_now"),
    path("tokens/", token_views.token_list, name="tokens"),
    path("tokens/new/", token_views.token_create, name="token_create"),
    path("tokens/<int:pk>/revoke/", token_views.token_revoke, name="token_revoke"),
    path("audit/", record_views.audit, name="audit"),
    path("audit/export.csv", record_views.audit_export, name="audit_export"),
    path("mail/", record_views.mail, name="mail"),
    path("workflows/", workflow_views.workflow_list, name="workflows"),
    path("workflows/<str:name>/", workflow_views.workflow_detail, name="workflow"),
    path("workflows/<str:name>/causes/", workflow_views.workflow_causes, name="workflow_causes"),
]
