"""The layout the README's architecture section describes, held as rules: the product's
modules import one another without a cycle, each says what it is for in a docstring, and
none grows past what a reader takes in at one sitting; no test module imports from
another."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.layout_support import MODULES, MOST_LINES, ROOT, cycles, imported_at_load


def test_the_product_modules_import_one_another_without_a_cycle() -> None:
    graph = {name: set(imported_at_load(name)) - {name} for name in MODULES}
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_says_what_it_is_for(name: str) -> None:
    path = MODULES[name]
    docstring = ast.get_docstring(ast.parse(path.read_text()))
    assert docstring, f"{path.relative_to(ROOT)} has no docstring"


def test_no_module_is_longer_than_one_sitting() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in MODULES.values()
        if (lines := len(path.read_text().splitlines())) > MOST_LINES
    }
    assert long == {}


def test_the_app_loads_at_start_what_registers_itself_on_import() -> None:
    """Modules that register workflows or connect signals when imported are imported by
    ``TasksAppConfig.ready``: a worker that never imports them itself still knows the
    ``django.tasks`` workflow and the demo ones, and starts its doorbell backstop. Read in
    a fresh interpreter, as the suite's own imports would hide a missing one."""
    script = (
        "import django; django.setup()\n"
        "from celery.signals import worker_ready\n"
        "from tasks_app.workflows import registry\n"
        "receivers = [ref() for _, ref in worker_ready.receivers]\n"
        "print(sorted(registry.names()))\n"
        "print(sorted(f'{r.__module__}.{r.__name__}' for r in receivers if r))\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    names, receivers = (ast.literal_eval(line) for line in done.stdout.splitlines()[-2:])
    assert "django.task" in names and "demo.noop" in names, names
    assert "tasks_app.engine.backstop._start" in receivers, receivers


def test_no_test_module_imports_from_another() -> None:
    """What several tests share lives in a support module (``tests/*_support.py``,
    ``tests/factories.py``, the tables and strategies), where a reader looks for it: a
    helper inside a test module is found only by reading its tests, and splitting or
    moving them breaks the other module."""
    offenders = [
        f"{path.relative_to(ROOT)} imports {node.module}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").rpartition(".")[2].startswith("test_")
    ]
    assert not offenders, "\n".join(offenders)


def test_a_workflow_in_an_installed_apps_workflows_module_registers_at_start(
    tmp_path: Path,
) -> None:
    """A workflow of one's own lives in ``<app>/workflows.py`` of any installed app: every
    process imports it when Django starts, so web and workers know it without importing it
    themselves. A fresh interpreter, with an app of its own beside the project."""
    app = tmp_path / "shop"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "workflows.py").write_text(
        "from tasks_app.workflows import StepSpec, Workflow, register\n"
        "register(Workflow('shop.order', 1, steps=(StepSpec('take', lambda ctx: {}),)))\n"
    )
    (tmp_path / "shop_settings.py").write_text(
        "from config.settings import *  # noqa: F403\n"
        "INSTALLED_APPS = [*INSTALLED_APPS, 'shop']  # noqa: F405\n"
    )
    script = (
        "import django; django.setup()\n"
        "from tasks_app.workflows import registry\n"
        "print('shop.order' in registry.names())\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "shop_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "True", done.stdout


# A test module longer than this wants splitting by the concern its tests share.
MOST_TEST_LINES = 600


def test_no_test_module_is_longer_than_one_sitting() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MOST_TEST_LINES
    }
    assert long == {}
