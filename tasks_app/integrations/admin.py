"""The admin, for staff: it shows everything but secrets (payloads, results, errors and
event data redacted as on the console's pages), enqueues through ``services.enqueue`` and
runs the operator actions through the services, with the user as the actor, so the same
rules and permissions apply as on every other way in. It never writes a status, a token
or history itself, and nothing can be changed or deleted here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from tasks_app import services
from tasks_app.exceptions import IdempotencyConflict, InvalidInput, NotPermitted
from tasks_app.history import timeline
from tasks_app.integrations.admin_forms import (
    EnqueueForm,
    ReasonForm,
    action_form,
    action_params,
    add_input_error,
)
from tasks_app.integrations.admin_parts import (
    OPERATOR_ACTIONS,
    OperatorAction,
    QueueFilter,
    RedactedLookupsRefused,
    StatusFilter,
    WorkflowFilter,
    conflict_message,
    event_rows,
    html_table,
    json_block,
    text_block,
    with_operator_actions,
)
from tasks_app.models import Step, Task, leases_of, live_status_fields
from tasks_app.redaction import redact_text

# The admin's classes are generic only to the type checker (subscripting them at run time
# needs django-stubs-ext, a development dependency).
if TYPE_CHECKING:
    TabularInline = admin.TabularInline[Step, Task]
    TaskModelAdmin = admin.ModelAdmin[Task]
else:
    TabularInline = admin.TabularInline
    TaskModelAdmin = admin.ModelAdmin


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StepInline(ReadOnlyMixin, TabularInline):
    model = Step
    extra = 0
    can_delete = False
    # A revision's rows beside the rows they replaced.
    ordering = ("position", "revision")
    fields = (
        "position",
        "revision",
        "kind",
        "status",
        "attempts",
        "max_attempts",
        "fencing_token",
        "available_at",
        "lease_expires_at",
        "idempotency_key",
        "error_class",
        "error",
        "step_result",
    )
    readonly_fields = fields

    @admin.display(description="Last error")
    def error(self, step: Step) -> SafeString:
        return text_block(step.last_error)

    @admin.display(description="Result")
    def step_result(self, step: Step) -> SafeString:
        return json_block(step.result)


@admin.register(Task)
@with_operator_actions
class TaskAdmin(RedactedLookupsRefused, ReadOnlyMixin, TaskModelAdmin):
    list_display = (
        "id",
        "workflow",
        "status_shown",
        "queue",
        "priority",
        "idempotency_key",
        "created_at",
        "console",
    )
    list_filter = (StatusFilter, WorkflowFilter, QueueFilter)
    # Searched by get_search_results: an idempotency key, exact or by its beginning.
    search_fields = ("idempotency_key",)
    search_help_text = "An idempotency key, exact or its beginning; or a task id."
    date_hierarchy = "created_at"
    list_per_page = 50
    show_full_result_count = False
    inlines = (StepInline,)
    # The operator actions: one per row of the table, with its permission check
    # (``with_operator_actions``).
    add_form_template = "admin/tasks_app/task/add_form.html"
    fields = (
        "console_link",
        "workflow",
        "workflow_version",
        "status_shown",
        "queue",
        "priority",
        "idempotency_key",
        "payload_shown",
        "payload_hash",
        "created_by",
        "created_by_user",
        "created_at",
        "finished_at",
        "cancel_requested_at",
        "leases",
        "timeline",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Task]:
        rows: QuerySet[Task] = super().get_queryset(request).select_related("created_by_user")
        return rows.annotate(**live_status_fields())

    @admin.display(description="Status", ordering="status")
    def status_shown(self, task: Task) -> str:
        return task.live_status

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Task], search_term: str
    ) -> tuple[QuerySet[Task], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        # The exact match is its own term so the unique index serves it in any collation.
        matches = Q(idempotency_key=term) | Q(idempotency_key__startswith=term)
        if term.isdecimal() and len(term) <= 18:  # an id, within a bigint
            matches |= Q(pk=int(term))
        return queryset.filter(matches), False

    # --- permissions: staff add through enqueue; nothing is changed or deleted -------------

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        codename = get_permission_codename("add", self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def save_model(self, request: HttpRequest, obj: Task, form: Any, change: bool) -> None:
        # Tasks are made by services.enqueue only (see add_view); no model form saves one.
        raise PermissionDenied

    # --- links -----------------------------------------------------------------------------

    @admin.display(description="Console")
    def console(self, task: Task) -> SafeString:
        return format_html('<a href="{}">open</a>', reverse("console:task", args=[task.pk]))

    @admin.display(description="Console")
    def console_link(self, task: Task) -> SafeString:
        return format_html(
            '<a href="{}">Task #{} in the console</a>',
            reverse("console:task", args=[task.pk]),
            task.pk,
        )

    # --- add: through services.enqueue -----------------------------------------------------

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Enqueue a task with the user as the actor. A rule enqueue refuses is an error on
        the field it names, and nothing is stored; a repeat of an earlier enqueue (same
        key, workflow and payload) leads to the task that already holds the key."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = EnqueueForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            data = form.cleaned_data
            try:
                result = services.enqueue(
                    data["workflow"],
                    data["payload"],
                    idempotency_key=data["idempotency_key"],
                    queue=data["queue"],
                    priority=data["priority"],
                    run_after=data["run_after"],
                    actor=request.user,
                )
            except InvalidInput as exc:
                add_input_error(form, exc)
            except IdempotencyConflict as exc:
                form.add_error("idempotency_key", conflict_message(exc))
            else:
                return self._enqueued(request, result)
        # The admin's form helpers take any form; django-stubs types them for model forms.
        admin_form: Any = form
        adminform = helpers.AdminForm(
            admin_form, [(None, {"fields": list(form.fields)})], {}, model_admin=self
        )
        context = {
            **self.admin_site.each_context(request),
            "title": "Enqueue a task",
            "subtitle": None,
            "adminform": adminform,
            "object_id": None,
            "original": None,
            "is_popup": False,
            "to_field": None,
            "media": self.media + adminform.media,
            "inline_admin_formsets": [],
            "errors": helpers.AdminErrorList(admin_form, []),
            "preserved_filters": self.get_preserved_filters(request),
            **(extra_context or {}),
        }
        return self.render_change_form(request, context, add=True, form_url=form_url)

    def _enqueued(self, request: HttpRequest, result: services.EnqueueResult) -> HttpResponse:
        task = result.task
        url = reverse("admin:tasks_app_task_change", args=[task.pk])
        if result.created:
            message = format_html(
                'Enqueued <a href="{}">task #{}</a> ({}, queue {}).',
                url,
                task.pk,
                task.workflow,
                task.queue,
            )
            self.message_user(request, message, messages.SUCCESS)
        else:
            message = format_html(
                "The key {} already names a task with this workflow and payload: the "
                'existing <a href="{}">task #{}</a> was returned and nothing new was created.',
                task.idempotency_key,
                url,
                task.pk,
            )
            self.message_user(request, message, messages.INFO)
        return HttpResponseRedirect(url)

    # --- operator actions ------------------------------------------------------------------

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # An operator action the user is not offered is refused outright, not ignored.
        if request.method == "POST":
            asked = set(request.POST.getlist("action")) & set(OPERATOR_ACTIONS)
            if asked - set(self.get_actions(request)):
                raise PermissionDenied
        return super().changelist_view(request, extra_context)

    def _operator_action(
        self, request: HttpRequest, queryset: QuerySet[Task], action: OperatorAction
    ) -> HttpResponse | None:
        """Ask for a reason on a confirmation page, then apply the action to each selected
        task through the service, with the user as the actor.

        The service checks the permission and the reason before anything changes; a task
        the action no longer applies to is reported and the others are still done.
        Returning None sends the user back to the changelist with the summary.
        """
        limit = services.bulk_limit()
        tasks = list(queryset.order_by("id")[: limit + 1])
        if len(tasks) > limit:
            self.message_user(
                request, f"Select at most {limit} tasks for one action.", messages.ERROR
            )
            return None
        form = action_form(action, request.POST if "confirm" in request.POST else None)
        if form.is_valid():
            try:
                report = services.act_on_tasks(
                    tasks,
                    action=action.name,
                    actor=request.user,
                    reason=form.cleaned_data["reason"],
                    limit=len(tasks),
                    params=action_params(form),
                )
            except NotPermitted as exc:
                self.message_user(
                    request,
                    f"{action.label}: not permitted ({exc}); nothing changed.",
                    messages.ERROR,
                )
                return None
            except InvalidInput as exc:
                add_input_error(form, exc)
            else:
                self._report(request, action, report)
                return None
        return self._confirmation(request, tasks, action, form)

    def _confirmation(
        self, request: HttpRequest, tasks: list[Task], action: OperatorAction, form: ReasonForm
    ) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": f"{action.label}: {len(tasks)} task{'s' if len(tasks) != 1 else ''}",
            "subtitle": None,
            "opts": self.opts,
            "action": action,
            "tasks": tasks,
            "form": form,
            "param_fields": [form[name] for name in form.fields if name != "reason"],
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/tasks_app/task/action_confirmation.html", context)

    def _report(
        self, request: HttpRequest, action: OperatorAction, report: services.BulkReport
    ) -> None:
        changed = ", ".join(f"#{pk}" for pk in report.changed)
        if report.changed:
            self.message_user(
                request,
                f"{action.label}: {len(report.changed)} task(s) {action.done} ({changed}); "
                f"{len(report.skipped)} skipped.",
                messages.SUCCESS,
            )
        else:
            self.message_user(
                request,
                f"{action.label}: no task changed; {len(report.skipped)} skipped.",
                messages.WARNING,
            )
        for pk, why in report.skipped:
            self.message_user(
                request, f"Task #{pk} not {action.done}: {redact_text(why)}", messages.WARNING
            )

    # --- the change page: read-only --------------------------------------------------------

    @admin.display(description="Leases")
    def leases(self, task: Task) -> SafeString:
        attempts = leases_of(task.steps.all()).values()
        rows = sorted((lease for step in attempts for lease in step), key=lambda x: x.acquired_at)
        return html_table(
            ("step", "token", "worker", "acquired", "expires", "released", "outcome"),
            (
                (
                    lease.step_id,
                    lease.token,
                    lease.worker_id,
                    lease.acquired_at,
                    lease.expires_at,
                    lease.released_at or "",
                    lease.outcome,
                )
                for lease in rows
            ),
        )

    @admin.display(description="Payload")
    def payload_shown(self, task: Task) -> SafeString:
        return json_block(task.payload)

    @admin.display(description="Event timeline")
    def timeline(self, task: Task) -> SafeString:
        return html_table(
            ("at", "event", "step", "actor", "reason", "data"),
            event_rows(timeline.history(task.pk)),
        )
