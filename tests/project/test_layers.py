"""Folders as layers (STYLE.md): from the database up to the pages, each folder imports only
what lies at or below its own layer, and no two folders import each other, however
roundabout. A module of ``tasks_app`` outside every folder is a folder of its own here.

From the bottom:
1. the core's utilities, which know no table: errors, input rules, who acts, redaction,
   the address a request comes from;
2. ``db``: the database's clock, its statements' bounds, online migrations;
3. the models, and the signal that announces a task's new status;
4. ``history``: recording events, the audit chain, their log lines and counters, the fold;
5. the engine: workflows, claims, leases, how an attempt ends, the effects ledger;
6. ``operations``: what people do to tasks and how it is read, and the services façade;
7. the ways in and out: admin, ``django.tasks``, Celery, commands, observability, the demo;
8. ``approvals``, which builds on all of the core and registers itself with it;
9. the console's pages; 10. the API for programs, which reads the console's filters;
11. ``config``, which wires them.
"""

from __future__ import annotations

import pytest

from tests.layout_support import MODULES, cycles, imported_anywhere

LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "tasks_app.exceptions",
        "tasks_app.validation",
        "tasks_app.access",
        "tasks_app.redaction",
        "tasks_app.addresses",
    ),
    ("tasks_app.db",),
    ("tasks_app.models", "tasks_app.signals"),
    ("tasks_app.history",),
    ("tasks_app.engine", "tasks_app.workflows"),
    ("tasks_app.operations", "tasks_app.services"),
    (
        "tasks_app.integrations",
        "tasks_app.observability",
        "tasks_app.management",
        "tasks_app.demo",
        "tasks_app.backends",
        "tasks_app.tasks",
        "tasks_app.admin",
        "tasks_app.apps",
        "tasks_app",
    ),
    ("approvals",),
    ("console",),
    ("api",),
    ("config",),
)


def folder(name: str) -> str:
    """The folder (or loose module) a module belongs to: ``tasks_app.engine.leases`` is in
    ``tasks_app.engine``, ``approvals.services`` in ``approvals``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "tasks_app" else parts[0]


LAYER_OF = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def folder_imports() -> dict[str, dict[str, list[str]]]:
    """Which folders each folder imports, with the modules that do it."""
    graph: dict[str, dict[str, list[str]]] = {}
    for name in MODULES:
        source = folder(name)
        targets = graph.setdefault(source, {})
        for imported in imported_anywhere(name):
            target = folder(imported)
            if target != source:
                targets.setdefault(target, []).append(f"{name} imports {imported}")
    return graph


def test_every_folder_has_a_layer() -> None:
    assert sorted(set(map(folder, MODULES)) - set(LAYER_OF)) == []


def test_no_folder_imports_a_layer_above_its_own() -> None:
    upward = [
        line
        for source, targets in folder_imports().items()
        for target, lines in targets.items()
        if LAYER_OF[target] > LAYER_OF[source]
        for line in lines
    ]
    assert upward == [], "\n".join(upward)


def test_no_folders_import_each_other() -> None:
    graph = {source: set(targets) for source, targets in folder_imports().items()}
    for targets in list(graph.values()):
        for target in targets:
            graph.setdefault(target, set())
    found = cycles(graph)
    if found:
        edges = folder_imports()
        detail = [
            line
            for component in found
            for source in component
            for target in component
            for line in edges.get(source, {}).get(target, [])
        ]
        pytest.fail("folders importing each other:\n" + "\n".join(detail))


def test_the_layer_check_sees_a_folder_of_a_deeper_module() -> None:
    assert folder("tasks_app.engine.leases") == "tasks_app.engine"
    assert folder("tasks_app.services") == "tasks_app.services"
    assert folder("console.management.commands.mailbox") == "console"
