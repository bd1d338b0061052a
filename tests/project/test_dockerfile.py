"""The container image, checked without Docker: the Dockerfile parsed, the entrypoint run
with a stand-in shell, .dockerignore matched as Docker matches it. `make docker-check`
builds and runs the image where Docker is available (scripts/docker-check.sh)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from honcho.environ import parse_procfile

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "scripts" / "docker-entrypoint.sh"

KEYWORDS = {
    "ADD",
    "ARG",
    "CMD",
    "COPY",
    "ENTRYPOINT",
    "ENV",
    "EXPOSE",
    "FROM",
    "HEALTHCHECK",
    "LABEL",
    "ONBUILD",
    "RUN",
    "SHELL",
    "STOPSIGNAL",
    "USER",
    "VOLUME",
    "WORKDIR",
}


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions as Docker reads them: a trailing backslash continues the line, and
    comment lines are dropped, also inside a continued instruction."""
    instructions: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not parts:
            start = number
        if stripped.endswith("\\"):
            parts.append(stripped[:-1].strip())
            continue
        parts.append(stripped)
        keyword, _, arguments = " ".join(parts).partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip(), start))
        parts = []
    assert not parts, f"the instruction from line {start} ends in a continuation"
    return instructions


INSTRUCTIONS = parse_dockerfile((ROOT / "Dockerfile").read_text())
PROCESSES = parse_procfile((ROOT / "Procfile").read_text()).processes


def final_stage() -> list[Instruction]:
    last_from = max(i for i, ins in enumerate(INSTRUCTIONS) if ins.keyword == "FROM")
    return INSTRUCTIONS[last_from:]


def build_args() -> dict[str, str]:
    """The defaults of the ARGs declared before the first FROM (those FROM may use)."""
    defaults: dict[str, str] = {}
    for instruction in INSTRUCTIONS:
        if instruction.keyword == "FROM":
            break
        if instruction.keyword == "ARG":
            name, _, default = instruction.arguments.partition("=")
            defaults[name] = default
    return defaults


def env_of(instructions: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "ENV":
            for pair in shlex.split(instruction.arguments):
                name, _, value = pair.partition("=")
                env[name] = value
    return env


def json_form(instruction: Instruction) -> list[str]:
    value = json.loads(instruction.arguments)
    assert isinstance(value, list) and all(isinstance(item, str) for item in value)
    return value


def only(keyword: str) -> Instruction:
    found = [ins for ins in final_stage() if ins.keyword == keyword]
    assert len(found) == 1, f"the image has {len(found)} {keyword} instructions, not one"
    return found[0]


def test_every_instruction_is_one_docker_knows_and_is_well_formed() -> None:
    assert INSTRUCTIONS[0].keyword in {"ARG", "FROM"}
    for instruction in INSTRUCTIONS:
        where = f"line {instruction.line}"
        assert instruction.keyword in KEYWORDS, f"{where}: unknown {instruction.keyword}"
        assert instruction.arguments, f"{where}: {instruction.keyword} without arguments"
        if instruction.keyword in {"ENTRYPOINT", "CMD"}:
            assert instruction.arguments.startswith("["), f"{where}: use the exec (JSON) form"
            assert json_form(instruction), f"{where}: an empty {instruction.keyword}"
        if instruction.keyword == "ENV":
            for pair in shlex.split(instruction.arguments):
                assert re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", pair), f"{where}: ENV {pair!r}"


def test_the_base_image_is_a_slim_python_of_at_least_3_12_pinned_to_its_minor_version() -> None:
    args = build_args()
    stages: set[str] = set()
    bases = []
    for instruction in INSTRUCTIONS:
        if instruction.keyword != "FROM":
            continue
        words = instruction.arguments.split()
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args[str(m.group(1))], words[0])
        if image not in stages:
            bases.append(image)
        if len(words) == 3 and words[1].upper() == "AS":
            stages.add(words[2])
    assert bases
    for image in bases:
        match = re.fullmatch(r"python:3\.(\d+)-slim(-\w+)?", image)
        assert match, f"{image} is not python:3.N-slim (pinned to a minor version)"
        assert int(match.group(1)) >= 12, f"{image}: the project needs Python 3.12 or newer"


def test_the_processes_run_as_a_user_who_is_not_root() -> None:
    user = only("USER").arguments.split(":")[0]
    assert user not in {"root", "0"}
    created = [ins for ins in final_stage() if ins.keyword == "RUN" and "useradd" in ins.arguments]
    assert created and re.search(rf"\b{re.escape(user)}\s*$", created[0].arguments), (
        f"the image does not create the user {user}"
    )


def test_the_image_is_in_production_mode_with_unbuffered_output_and_no_bytecode() -> None:
    env = env_of(final_stage())
    assert env["DJANGO_PRODUCTION"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


SECRET_NAME = re.compile(r"SECRET|PASSWORD|TOKEN|API_KEY|CREDENTIAL", re.IGNORECASE)


def test_no_secret_is_baked_into_the_image() -> None:
    for instruction in INSTRUCTIONS:
        where = f"line {instruction.line}"
        if instruction.keyword in {"ENV", "ARG", "LABEL"}:
            for pair in shlex.split(instruction.arguments):
                name = pair.partition("=")[0]
                assert not SECRET_NAME.search(name), f"{where}: {name} is kept in the image"
                assert name not in {"DATABASE_URL", "REDIS_URL"}, f"{where}: {name}"
        assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", instruction.arguments), (
            f"{where}: a URL with a password"
        )
        # collectstatic needs a secret key to start in production mode: only one made
        # during that build step, and only in that step's environment.
        for value in re.findall(r"DJANGO_SECRET_KEY=(.{40})", instruction.arguments):
            assert instruction.keyword == "RUN", f"{where}: a secret key outside a RUN"
            assert value.startswith("\"$(python -c 'import secrets;"), f"{where}: {value}"


def test_dependencies_come_from_pyproject_without_the_dev_extras() -> None:
    runs = " ".join(ins.arguments for ins in INSTRUCTIONS if ins.keyword == "RUN")
    copies = " ".join(ins.arguments for ins in INSTRUCTIONS if ins.keyword == "COPY")
    assert "pyproject.toml" in copies
    assert "['project']['dependencies']" in runs
    assert "[dev]" not in runs and "optional-dependencies" not in runs


def test_what_the_procfile_runs_is_installed_by_the_image() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = {re.split(r"[\[<>=!~ ;]", dep)[0].lower() for dep in project["dependencies"]}
    # The entrypoint reads the Procfile with honcho.
    assert "honcho" in installed
    for name, line in PROCESSES.items():
        for command in re.split(r"&&|\|\||;", line):
            words = [w for w in shlex.split(command) if not re.fullmatch(r"\w+=\S*", w)]
            if words == ["export"]:
                continue  # the shell's own: the line sets a variable for the commands after
            program = words[0]
            assert program == "python" or program in installed, (
                f"{name}: {program} is not one of the project's dependencies"
            )


def run_entrypoint(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The entrypoint with a stand-in bash that prints what it was asked to run."""
    stub = tmp_path / "bash"
    stub.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    stub.chmod(0o755)
    path = os.pathsep.join([str(tmp_path), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    return subprocess.run(
        ["/bin/sh", str(ENTRYPOINT), *args],
        cwd=ROOT,
        env={"PATH": path, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize("name", sorted(PROCESSES))
def test_every_procfile_process_runs_from_the_image_as_the_procfile_says(
    name: str, tmp_path: Path
) -> None:
    result = run_entrypoint(name, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["-c", f'{PROCESSES[name]} "$@"', name]


def test_the_image_runs_the_procfile_processes_the_deployment_notes_name() -> None:
    assert {"release", "web", "worker", "maintenance", "beat"} <= set(PROCESSES)


def test_arguments_after_a_process_name_are_appended_to_its_line(tmp_path: Path) -> None:
    result = run_entrypoint("worker", "--concurrency", "4", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[2:] == ["worker", "--concurrency", "4"]


def test_anything_else_runs_as_a_command(tmp_path: Path) -> None:
    result = run_entrypoint("echo", "not a process", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "not a process\n"


def test_the_image_serves_the_console_by_default_on_port_8000() -> None:
    assert json_form(only("ENTRYPOINT")) == ["/app/scripts/docker-entrypoint.sh"]
    assert only("WORKDIR").arguments == "/app"
    assert os.access(ENTRYPOINT, os.X_OK), "COPY keeps the mode: the entrypoint must be +x"
    assert json_form(only("CMD")) == ["web"]
    assert only("EXPOSE").arguments == "8000"
    assert "--bind 0.0.0.0:${PORT:-8000}" in PROCESSES["web"]


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``path`` out of the build context: the last pattern that
    matches it or one of its folders decides, ``!`` keeps, ``*`` stays within a folder."""

    def regex(pattern: str) -> re.Pattern[str]:
        out = ""
        for token in re.split(r"(\*\*/?|\*|\?)", pattern.strip("/")):
            if token.startswith("**"):
                out += "(?:.*/)?" if token.endswith("/") else ".*"
            elif token == "*":
                out += "[^/]*"
            elif token == "?":
                out += "[^/]"
            else:
                out += re.escape(token)
        return re.compile(out)

    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        compiled = regex(pattern.removeprefix("!"))
        if any(compiled.fullmatch(prefix) for prefix in prefixes):
            ignored = not keep
    return ignored


DOCKERIGNORE = [
    line.strip()
    for line in (ROOT / ".dockerignore").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        "var/db.sqlite3",
        ".git/HEAD",
        "bench/results/20261130T111033Z.json",
        "staticfiles/staticfiles.json",
        ".env",
        "tests/project/test_dockerfile.py",
        "config/__pycache__/settings.cpython-313.pyc",
        "scripts/with-services.sh",
    ],
)
def test_the_build_context_leaves_out_local_and_development_files(path: str) -> None:
    assert dockerignored(path, DOCKERIGNORE)


@pytest.mark.parametrize(
    "path",
    [
        "Procfile",
        "manage.py",
        "pyproject.toml",
        "config/settings.py",
        "tasks_app/models/__init__.py",
        "approvals/steps.py",
        "console/views.py",
        "templates/registration/login.html",
        "static/console/console.css",
        "scripts/docker-entrypoint.sh",
    ],
)
def test_the_build_context_keeps_what_the_image_runs(path: str) -> None:
    assert (ROOT / path).exists(), path
    assert not dockerignored(path, DOCKERIGNORE)
