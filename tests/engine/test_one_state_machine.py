"""One home for the step's state machine (``tasks_app.engine.states``): no other product
module assigns a step's or a task's status, whether by setting the attribute, by a
keyword of a constructor or an ``update``, or by naming ``status`` among the fields a save
or a bulk update writes. Read from the source, so a new path that writes a status by hand
fails here before it drifts from the rules."""

from __future__ import annotations

import ast

from tests.layout_support import MODULES, ROOT

HOME = "tasks_app.engine.states"
# Writes of other statuses, which are not the step's or the task's, by the module and
# function that write them.
OTHER_STATUSES = {
    # An approval request's: the approvals app's own decisions on it.
    ("approvals.deadlines", "expire_due"),
    ("approvals.services", "_close"),
    ("approvals.services", "close_open_requests"),
    ("approvals.steps", "open_request"),
    # An effect's in the ledger: started, then done.
    ("tasks_app.engine.effects", "run"),
    ("tasks_app.operations.operator_actions", "resolve"),
    ("tasks_app.operations.rewinds", "_settle_writes"),
    # A new task's row, as enqueue makes it: pending (its steps' statuses are new_step's
    # and make_due's).
    ("tasks_app.engine.enqueueing", "_insert_with_orm"),
    # A program's plan's: applied or declined by a person (tasks_app.operations.proposals).
    ("tasks_app.operations.proposals", "_decide"),
    # An error's HTTP status.
    ("tasks_app.exceptions", "__init__"),
}
WRITING_CALLS = {"Step", "Task", "update", "create", "update_or_create", "get_or_create"}


def _names_status(node: ast.AST | None) -> bool:
    return isinstance(node, (ast.List, ast.Tuple, ast.Set)) and any(
        isinstance(item, ast.Constant) and item.value == "status" for item in node.elts
    )


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def status_writes(source: str) -> list[tuple[str, int]]:
    """Where ``source`` writes a ``status``: (the enclosing function, the line)."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flat = [
                target
                for each in targets
                for target in (each.elts if isinstance(each, ast.Tuple) else [each])
            ]
            if any(isinstance(t, ast.Attribute) and t.attr == "status" for t in flat):
                found.append((function, node.lineno))
        if isinstance(node, ast.Call):
            callee = _callee(node)
            keywords = {keyword.arg: keyword.value for keyword in node.keywords}
            if (
                (callee in WRITING_CALLS and "status" in keywords)
                or (callee == "save" and _names_status(keywords.get("update_fields")))
                or (callee == "bulk_update" and any(_names_status(a) for a in node.args[1:2]))
            ):
                found.append((function, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), "<module>")
    return found


def test_nothing_but_the_state_machine_assigns_a_status() -> None:
    writes = [
        f"{MODULES[name].relative_to(ROOT)}:{line} in {function}"
        for name in sorted(MODULES)
        if name != HOME
        for function, line in status_writes(MODULES[name].read_text())
        if (name, function) not in OTHER_STATUSES
    ]
    assert writes == [], "\n".join(writes)


def test_the_state_machine_is_where_the_statuses_are_written() -> None:
    assert len(status_writes(MODULES[HOME].read_text())) >= 8


def test_the_reading_finds_every_way_of_writing_a_status() -> None:
    source = """
def by_hand(step):
    step.status = "dead"
def as_a_pair(step):
    step.status, outcome = "pending", "pending"
def by_update(qs):
    qs.update(status="cancelled")
def by_constructor():
    Step(position=0, status="blocked")
def by_save(step):
    step.save(update_fields=["status", "finished_at"])
def by_bulk_update(steps):
    Step.objects.bulk_update(steps, ["status"])
def reading(qs):
    qs.filter(status="dead").exclude(status="running")
"""
    assert [function for function, _ in status_writes(source)] == [
        "by_hand",
        "as_a_pair",
        "by_update",
        "by_constructor",
        "by_save",
        "by_bulk_update",
    ]
