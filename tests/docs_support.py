"""Every fenced code block of README.md and docs/*.md, run as a reader would paste it.

How a block runs depends on its language, and on a directive in an HTML comment on the
line before it (blank lines between them allowed):

- ``python`` whose first line names a module (``# reports/workflows.py``, words may follow
  after ``,`` or ``:``): a module, written into a temporary app the page's settings install;
  a ``workflows`` module must be imported when Django starts (as every process imports it),
  any other is imported by the runner, and ruff checks it uses no undefined name.
- any other ``python``: pasted line by line into one ``manage.py shell`` session per page
  (an ``InteractiveConsole`` over the shell's namespace, as its python console reads pasted
  lines), in the page's order, so a later block may use what an earlier one defined; on a
  migrated PostgreSQL test database, with the page's modules installed.
- ``sh``, ``bash``, ``shell``: each command line (``\\`` continues a line) run by bash in a
  scratch copy of the project, its virtualenv first on ``PATH``, on the same database with
  the demo seeded (``manage.py seed_demo``, as ``make run`` leaves it); each must exit 0.
  ``console``: the same, for the lines after ``$ `` (the rest is output).
- ``json`` and ``yaml`` are parsed; ``text``, ``csv``, ``ini`` and ``log`` are output, shown
  and not run.

Directives:

- ``<!-- run: no — REASON -->``: not run; REASON names the test that covers what the block
  shows (``tests/….py``, which must exist). Commands that cannot run in a test need it:
  make and docker, those that start a long-running server (honcho, gunicorn, a Celery
  worker or beat) and those that change the machine (sudo, systemctl, deploy/ scripts).
- ``<!-- run: settings -->``: a python fragment of ``settings.py``, appended to the
  project's settings for the page's shell session, modules and commands.

A block without a language, of a language with no runner, or that cannot run unmarked
fails, so a new example cannot slip by untested.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

PROJECT_PACKAGES = {"config", "tasks_app", "approvals", "console", "tests"}
PYTHON_LANGS = {"python", "py"}
COMMAND_LANGS = {"sh", "bash", "shell", "console"}
PARSED_LANGS = {"json", "yaml", "yml"}
SHOWN_LANGS = {"text", "csv", "ini", "log"}

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
DIRECTIVE = re.compile(r"^\s*<!--\s*run:\s*(?P<what>.*?)\s*-->\s*$")
# "no", then an em or en dash, a colon or a hyphen, then the reason.
NOT_RUN = re.compile(r"^no\s*[\u2014\u2013:-]+\s*(?P<reason>.+)$")
NAMED_TEST = re.compile(r"\btests/[\w/]+\.py\b")
MODULE_LINE = re.compile(r"^#\s+(?P<path>[A-Za-z_]\w*(?:/[A-Za-z_]\w*)+\.py)\b")
# Commands a test cannot run: they build, start servers, run suites for minutes, or change
# the machine they run on (installing on a host is for the host's own drills).
CANNOT_RUN = re.compile(
    r"^\s*(sudo|make|docker|honcho|gunicorn|systemctl|journalctl|apt|apt-get|kubectl)\b"
    r"|^\s*(\./)?deploy/|\brunserver\b|\bcelery\b.*\b(worker|beat)\b"
)
# What a scratch copy of the project leaves out: the commands run there, so none can
# change the working tree.
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv", "var", "__pycache__", "*_cache", "*.egg-info", "staticfiles", "node_modules"
)


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    directive: str  # what follows ``run:`` in the comment before the block, or ""

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def module(self) -> str | None:
        """The dotted module a python block is (``reports.workflows``), or None."""
        if self.lang not in PYTHON_LANGS or self.directive:
            return None
        found = MODULE_LINE.match(self.text.split("\n", 1)[0])
        return found["path"].removesuffix(".py").replace("/", ".") if found else None

    @property
    def kind(self) -> str:
        """How the block runs: module, shell, settings, commands, parsed, shown, not-run, or
        unknown (which fails)."""
        if NOT_RUN.match(self.directive):
            return "not-run"
        if self.lang in PYTHON_LANGS:
            if self.directive == "settings":
                return "settings"
            return "module" if self.module else "shell"
        if self.lang in COMMAND_LANGS:
            return "commands"
        if self.lang in PARSED_LANGS:
            return "parsed"
        if self.lang in SHOWN_LANGS:
            return "shown"
        return "unknown"

    @property
    def runs(self) -> bool:
        return self.kind in {"module", "shell", "settings", "commands"}


def blocks_of(page: str, text: str) -> list[Block]:
    """The fenced blocks of a page's markdown, with the directive before each."""
    found: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            body.append(lines[end][indent:] if lines[end][:indent].isspace() else lines[end])
            end += 1
        before = index - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        directive = DIRECTIVE.match(lines[before]) if before >= 0 else None
        found.append(
            Block(
                page=page,
                line=index + 1,
                lang=opening["lang"].lower(),
                text="\n".join(body) + "\n",
                directive=directive["what"] if directive else "",
            )
        )
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks_of(page, (ROOT / page).read_text())]


def commands(block: Block) -> list[str]:
    """A command block's commands as bash reads them: continued lines joined; comments and
    blank lines dropped; in a console block only the lines after ``$ `` and their
    continuations."""
    result: list[str] = []
    pending = ""
    for raw in block.text.splitlines():
        if pending:
            line = raw.removeprefix("> ")
        elif block.lang == "console":
            if not raw.startswith("$ "):
                continue
            line = raw[2:]
        else:
            line = raw
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if command and not command.startswith("#"):
            result.append(command)
    return result


def problem(block: Block) -> str | None:
    """Why a block that is not run, or cannot be, fails; None when it passes as it is."""
    if block.directive and block.kind != "settings" and not NOT_RUN.match(block.directive):
        return (
            f"unknown directive `run: {block.directive}`: use `run: no — <the test that covers "
            "it>` or, for a python settings fragment, `run: settings`"
        )
    if block.directive == "settings" and block.lang not in PYTHON_LANGS:
        return "`run: settings` is for python blocks"
    if block.kind == "not-run":
        reason = NOT_RUN.match(block.directive)
        assert reason is not None
        named = NAMED_TEST.findall(reason["reason"])
        if not named:
            return "`run: no` must name the test that covers the block (tests/….py)"
        missing = [name for name in named if not (ROOT / name).is_file()]
        return f"`run: no` names tests that do not exist: {missing}" if missing else None
    if block.module and block.module.split(".")[0] in PROJECT_PACKAGES:
        return (
            f"a module of the project's own `{block.module}` would replace its package: show "
            "a settings fragment as `<!-- run: settings -->`, an example in an app of its own"
        )
    if block.kind == "unknown":
        what = f"language `{block.lang}`" if block.lang else "no language"
        return (
            f"a block with {what} is neither run nor checked: name its language "
            f"(python, sh, console, json, yaml, text, …) or mark it `<!-- run: no — … -->`"
        )
    if block.kind == "parsed":
        try:
            if block.lang == "json":
                json.loads(block.text)
            else:
                yaml.safe_load(block.text)
        except ValueError as exc:  # json.JSONDecodeError and yaml.YAMLError alike
            return f"{block.lang} that does not parse: {exc}"
    if block.kind == "commands":
        blocked = [command for command in commands(block) if CANNOT_RUN.search(command)]
        if blocked:
            return (
                f"cannot run in a test (a build, a server or a suite): {blocked}; mark the "
                "block `<!-- run: no — <the test that covers it> -->`"
            )
    return None


# --- running a page ------------------------------------------------------------------------

# Run by ``manage.py shell -c``: imports the page's modules, then pastes its shell blocks.
SESSION = Path(__file__).with_name("docs_shell_session.py")


def module_file(folder: Path, block: Block) -> Path:
    assert block.module is not None
    return folder.joinpath(*block.module.split(".")).with_suffix(".py")


def _write_page_project(folder: Path, blocks: list[Block]) -> None:
    """The page's modules as packages in ``folder``, and ``docs_settings``: the project's
    settings, the page's settings fragments, and those packages installed as apps."""
    apps: list[str] = []
    for block in (block for block in blocks if block.kind == "module"):
        path = module_file(folder, block)
        for package in path.relative_to(folder).parents[:-1]:
            (folder / package).mkdir(parents=True, exist_ok=True)
            (folder / package / "__init__.py").touch()
        path.write_text(block.text)
        if (app := path.relative_to(folder).parts[0]) not in apps:
            apps.append(app)
    fragments = "\n".join(block.text for block in blocks if block.kind == "settings")
    (folder / "docs_settings.py").write_text(
        "from config.settings import *  # noqa: F403\n"
        f"{fragments}\n"
        f"INSTALLED_APPS = [*INSTALLED_APPS, *{apps!r}]  # noqa: F405\n"
    )


def page_env(folder: Path, database: Mapping[str, str]) -> dict[str, str]:
    """What the page's processes run with: the test database and broker (``database``),
    the page's settings, and the project's virtualenv first on ``PATH``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("DJANGO_")}
    return {
        **env,
        **database,
        "DJANGO_SETTINGS_MODULE": "docs_settings",
        "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        "TASKS_VAR_DIR": str(folder / "var"),
        "PYTHONUNBUFFERED": "1",
    }


def _undefined_names(folder: Path, blocks: list[Block]) -> dict[int, str]:
    modules = {str(module_file(folder, b)): b.line for b in blocks if b.kind == "module"}
    if not modules:
        return {}
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run(
        [str(ruff), "check", "--isolated", "--select", "F821", "--output-format", "json", *modules],
        capture_output=True,
        text=True,
        check=False,
    )
    found: dict[int, str] = {}
    for finding in json.loads(done.stdout or "[]"):
        line = modules[finding["filename"]]
        row = finding["location"]["row"]
        found[line] = found.get(line, "") + f"line {row} of the block: {finding['message']}\n"
    return found


def _run(
    command: list[str] | str,
    env: Mapping[str, str],
    timeout: float = 120,
    name: str = "",
    cwd: Path = ROOT,
) -> str | None:
    """None when the command exits 0, else what it said (``name`` names it there)."""
    args = ["bash", "-o", "pipefail", "-c", command] if isinstance(command, str) else command
    name = name or (command if isinstance(command, str) else " ".join(command))
    try:
        done = subprocess.run(
            args, cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return f"`{name}` still running after {timeout:g} s"
    if done.returncode == 0:
        return None
    return (
        f"`{name}` exited with {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n"
        f"--- stderr\n{done.stderr[-3000:]}"
    )


def _blame(pasted: list[Block], folder: Path, crashed: str) -> dict[int, str]:
    """A session that did not get to its blocks (Django did not start): the modules its
    traceback names are to blame, and the rest did not run."""
    culprits = [b for b in pasted if b.module and str(module_file(folder, b)) in crashed]
    names = ", ".join(b.id for b in culprits) or "the page's settings or modules"
    return {
        b.line: crashed if b in culprits or not culprits else f"not run: {names} broke the session"
        for b in pasted
    }


def run_page(blocks: list[Block], folder: Path, database: Mapping[str, str]) -> dict[int, str]:
    """Run a page's runnable blocks; what failed, by the line of each failing block (one
    with a :func:`problem` is not run: its test names the problem)."""
    blocks = [block for block in blocks if block.runs and problem(block) is None]
    _write_page_project(folder, blocks)
    env = page_env(folder, database)
    failures = _undefined_names(folder, blocks)
    pasted = [b for b in blocks if b.kind in {"module", "shell", "settings"}]
    if pasted:
        spec, results = folder / "spec.json", folder / "results.json"
        spec.write_text(
            json.dumps(
                {
                    "modules": [(b.line, b.module) for b in pasted if b.kind == "module"],
                    "shell": [(b.line, b.text) for b in pasted if b.kind == "shell"],
                }
            )
        )
        env_run = {**env, "DOCS_RUN_SPEC": str(spec), "DOCS_RUN_RESULTS": str(results)}
        crashed = _run(
            [sys.executable, "manage.py", "shell", "-c", SESSION.read_text()],
            env_run,
            name="manage.py shell (the page's session)",
        )
        if crashed:
            for line, text in _blame(pasted, folder, crashed).items():
                failures.setdefault(line, text)
        else:
            for line, text in json.loads(results.read_text()).items():
                failures[int(line)] = failures.get(int(line), "") + text
    command_blocks = [b for b in blocks if b.kind == "commands"]
    if command_blocks:
        copy = folder / "project"
        shutil.copytree(ROOT, copy, ignore=NOT_COPIED)
        seed = [sys.executable, "manage.py", "seed_demo"]
        seeded = _run(seed, env, name="manage.py seed_demo", cwd=copy)
        for block in command_blocks:
            if seeded:
                failures[block.line] = "seeding the demo failed: " + seeded
                continue
            for command in commands(block):
                if failed := _run(command, env, timeout=60, cwd=copy):
                    failures[block.line] = failed
                    break
    return failures


def database_env(settings_dict: Mapping[str, Any], redis_url: str) -> dict[str, str]:
    from tests.e2e_support import database_url

    return {
        "DATABASE_URL": database_url(settings_dict),
        "REDIS_URL": redis_url,
        "TASKS_BROKER_PREFIX": os.environ.get("TASKS_BROKER_PREFIX", ""),
    }
