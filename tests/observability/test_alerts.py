"""The Prometheus alert rules (docs/alerts.yml) and the runbook they point at.

Always: the rules file is read and checked for what an on-call engineer relies on (every
rule has a severity, a summary, a description and a runbook section that exists; every
metric an expression reads is one the console exports). Where promtool is on PATH it also
checks the rules and runs their unit tests (tests/alerts_test.yml). CI installs it and sets
CI_REQUIRE_PROMTOOL=1, so there a missing promtool fails instead of falling back.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "docs" / "alerts.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"
UNIT_TESTS = ROOT / "tests" / "alerts_test.yml"

# What /metrics exports (tasks_app.observability.metrics, limit_metrics and schedule_metrics),
# by type. A rule reading any other name would never fire, silently.
GAUGES = {
    "tasks_tasks",
    "tasks_dead_steps",
    "tasks_queue_due_steps",
    "tasks_queue_lag_seconds",
    "tasks_queue_paused",
    "tasks_running_steps",
    "tasks_workers",
    "tasks_sweeper_last_run_age_seconds",
    "tasks_approvals_pending",
    "tasks_approval_oldest_pending_age_seconds",
    "tasks_login_usernames_slowed",
    "tasks_limit_running_steps",
    "tasks_limit_waiting_steps",
    "tasks_limit_concurrency",
    "tasks_limit_active_keys",
    "tasks_limit_keys_at_limit",
    "tasks_limit_keys_paused",
    "tasks_limit_keys_held",
    "tasks_limit_rate_units",
    "tasks_limit_rate_period_seconds",
    "tasks_limit_rate_spent_units",
    "tasks_limit_saturated",
    "tasks_schedule_overdue_seconds",
    "tasks_schedule_paused",
    "tasks_schedule_next_slot_timestamp_seconds",
    "tasks_schedule_last_enqueued_timestamp_seconds",
}
COUNTERS = {
    "tasks_enqueued_total",
    "tasks_enqueue_duplicates_total",
    "tasks_idempotency_conflicts_total",
    "tasks_claims_total",
    "tasks_events_total",
    "tasks_logins_slowed_total",
    "tasks_limit_refusals_total",
    "tasks_schedule_missed_slots_total",
    "tasks_schedule_runs_total",
}
HISTOGRAMS = {"tasks_step_duration_seconds", "tasks_approval_decision_seconds"}
# Series Prometheus makes itself (`up` for every scrape) and the blackbox exporter's.
EXTERNAL = {"up", "probe_success"}
METRICS = frozenset(
    GAUGES
    | COUNTERS
    | EXTERNAL
    | {f"{name}_{suffix}" for name in HISTOGRAMS for suffix in ("bucket", "sum", "count")}
)

SEVERITIES = {"page", "ticket"}
RULE_KEYS = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
ANNOTATIONS = ("summary", "description", "runbook")
RUNBOOK_LINK = re.compile(r"^docs/runbook\.md#([a-z0-9_-]+)$")
# Prometheus durations: units from years down to milliseconds, largest first ("1h30m").
DURATION = re.compile(r"^(?=\d)(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")

# PromQL's keywords, aggregations and functions: names that are not metrics. A word list
# reads best as words.
PROMQL_WORDS = frozenset(
    """
    and or unless by without on ignoring group_left group_right offset bool inf nan sum
    min max avg group stddev stdvar count count_values bottomk topk quantile abs absent
    absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week
    day_of_year days_in_month delta deriv exp floor histogram_quantile holt_winters hour
    idelta increase irate label_join label_replace ln log2 log10 minute month
    predict_linear rate resets round scalar sgn sort sort_desc sqrt time timestamp
    vector year avg_over_time min_over_time max_over_time sum_over_time count_over_time
    quantile_over_time stddev_over_time stdvar_over_time last_over_time
    present_over_time
    """.split()  # noqa: SIM905
)


# --- reading the files -----------------------------------------------------------------------


def load_rules(path: Path = ALERTS) -> list[dict[str, Any]]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it: lower case, punctuation dropped
    (hyphens and underscores kept), spaces as hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = re.match(r"^#{1,6}\s+(.+?)\s*#*\s*$", line)
        if heading and not fenced:
            found.add(slug(heading.group(1)))
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: what is left once strings, label
    matchers, ranges, grouping clauses, numbers and durations, functions and keywords are
    taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"(?<![\w:])\d[\w.]*", "", text)
    names = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text)
    return {name for name in names if name.lower() not in PROMQL_WORDS}


def problems(rules: list[dict[str, Any]], runbook: str) -> list[str]:
    """What is wrong with the rules, one line each (nothing when all is well)."""
    found: list[str] = []
    headings = anchors(runbook)
    seen: set[str] = set()
    for index, rule in enumerate(rules):
        name = rule.get("alert") or f"rule #{index + 1}"
        for key in sorted(set(rule) - RULE_KEYS):
            found.append(f"{name}: unknown key {key!r}")
        if "alert" not in rule:
            found.append(f"{name}: no alert name")
        elif name in seen:
            found.append(f"{name}: named twice")
        seen.add(name)
        expr = rule.get("expr")
        if not isinstance(expr, str) or not expr.strip():
            found.append(f"{name}: no expr")
        else:
            for metric in sorted(metric_names(expr) - METRICS):
                found.append(f"{name}: reads {metric!r}, which /metrics does not export")
        duration = rule.get("for")
        if not isinstance(duration, str) or not DURATION.match(duration):
            found.append(f"{name}: 'for' is {duration!r}, not a duration such as 5m")
        severity = (rule.get("labels") or {}).get("severity")
        if severity not in SEVERITIES:
            found.append(f"{name}: severity is {severity!r}, not one of {sorted(SEVERITIES)}")
        annotations = rule.get("annotations") or {}
        for key in ANNOTATIONS:
            if not str(annotations.get(key) or "").strip():
                found.append(f"{name}: no {key} annotation")
        link = RUNBOOK_LINK.match(str(annotations.get("runbook") or ""))
        if annotations.get("runbook") and not link:
            found.append(f"{name}: runbook {annotations['runbook']!r} is not docs/runbook.md#…")
        elif link and link.group(1) not in headings:
            found.append(f"{name}: docs/runbook.md has no heading #{link.group(1)}")
        if "alert" in rule and name not in runbook:
            found.append(f"{name}: not named in docs/runbook.md")
        for key, text in annotations.items():
            for template in re.findall(r"\{\{.*?\}\}", str(text)):
                if not re.fullmatch(r"\{\{ \$labels\.\w+ \}\}", template):
                    found.append(f"{name}: {key} uses {template}; only {{{{ $labels.NAME }}}}")
    return found


# --- the checks, always ----------------------------------------------------------------------


def test_the_rules_are_complete_and_point_at_the_runbook() -> None:
    assert problems(load_rules(), RUNBOOK.read_text(encoding="utf-8")) == []


def test_the_checker_finds_what_a_broken_rule_gets_wrong() -> None:
    broken = [
        {
            "alert": "Broken",
            "expr": 'tasks_queue_lagg_seconds{queue="default"} > 300',
            "for": "five minutes",
            "labels": {"severity": "urgent"},
            "annotations": {"summary": "lag", "runbook": "docs/runbook.md#no-such-section"},
            "anotations": {},
        },
        {"alert": "Broken", "expr": "up == 0", "for": "1h30m", "labels": {"severity": "page"}},
    ]
    assert problems(broken, "# Runbook\n\n## Queue lag\nBroken\n") == [
        "Broken: unknown key 'anotations'",
        "Broken: reads 'tasks_queue_lagg_seconds', which /metrics does not export",
        "Broken: 'for' is 'five minutes', not a duration such as 5m",
        "Broken: severity is 'urgent', not one of ['page', 'ticket']",
        "Broken: no description annotation",
        "Broken: docs/runbook.md has no heading #no-such-section",
        "Broken: named twice",
        "Broken: no summary annotation",
        "Broken: no description annotation",
        "Broken: no runbook annotation",
    ]


def test_it_reads_metric_names_and_not_functions_labels_or_durations() -> None:
    expr = (
        'sum by (queue) (rate(tasks_claims_total{queue="default"}[5m] offset 1h)) > 0.2 * 3600'
        " and on (queue) max by (queue) (tasks_queue_paused) == 0"
        ' or absent(up{job="task-console"})'
        " or histogram_quantile(0.99, sum by (le) (rate(tasks_step_duration_seconds_bucket[1h])))"
    )
    assert metric_names(expr) == {
        "tasks_claims_total",
        "tasks_queue_paused",
        "up",
        "tasks_step_duration_seconds_bucket",
    }


def test_anchors_are_the_headings_as_github_links_them() -> None:
    markdown = "# On-call runbook\n\n## Dead letter: lease_expired\n```\n# not a heading\n```\n"
    assert anchors(markdown) == {"on-call-runbook", "dead-letter-lease_expired"}


def test_every_alert_is_unit_tested_firing() -> None:
    names = {rule["alert"] for rule in load_rules()}
    spec = yaml.safe_load(UNIT_TESTS.read_text(encoding="utf-8"))
    cases = [case for group in spec["tests"] for case in group.get("alert_rule_test", [])]
    assert {case["alertname"] for case in cases} <= names
    firing = {case["alertname"] for case in cases if case.get("exp_alerts")}
    assert sorted(names - firing) == []


# --- promtool, where it is installed ---------------------------------------------------------


def promtool() -> str | None:
    """promtool's path; None where it is missing and not required, so the checks above
    stand alone. CI requires it (CI_REQUIRE_PROMTOOL=1) and fails here without it."""
    path = shutil.which("promtool")
    if path is None and os.environ.get("CI_REQUIRE_PROMTOOL") == "1":
        pytest.fail(
            "promtool is not on PATH and CI_REQUIRE_PROMTOOL=1 requires it: install Debian's "
            "prometheus package (apt-get install prometheus), as .ci/run does"
        )
    return path


def render(text: str, labels: dict[str, str]) -> str:
    """An annotation as Prometheus expands it, for the templates the rules use (labels)."""
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)


def unit_tests_with_annotations(folder: Path) -> Path:
    """tests/alerts_test.yml with every expected alert's annotations filled in from the
    rules, and the rules named by their absolute path."""
    spec = yaml.safe_load(UNIT_TESTS.read_text(encoding="utf-8"))
    rules = {rule["alert"]: rule for rule in load_rules()}
    spec["rule_files"] = [str(ALERTS)]
    for group in spec["tests"]:
        for case in group.get("alert_rule_test", []):
            annotations = rules[case["alertname"]]["annotations"]
            for alert in case.get("exp_alerts") or []:
                labels = {str(k): str(v) for k, v in alert["exp_labels"].items()}
                alert["exp_annotations"] = {
                    key: render(str(text), labels) for key, text in annotations.items()
                }
    path = folder / "alerts_test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout}\n{done.stderr}"


def test_promtool_accepts_the_rules() -> None:
    tool = promtool()
    if tool is None:
        # No promtool here: what stands is the reading of the file.
        assert problems(load_rules(), RUNBOOK.read_text(encoding="utf-8")) == []
        return
    run([tool, "check", "rules", str(ALERTS)])


def test_the_alerts_fire_and_stay_quiet_as_their_unit_tests_expect(tmp_path: Path) -> None:
    tool = promtool()
    path = unit_tests_with_annotations(tmp_path)
    if tool is None:
        # No promtool here: at least every expected alert is a rule with its annotations.
        assert "exp_annotations" in path.read_text(encoding="utf-8")
        return
    run([tool, "test", "rules", str(path)])


# --- the commands the files give for running these checks by hand -------------------------


def documented_commands(path: Path) -> list[str]:
    """The commands a file's comments give, each on a line of its own indented under a
    ``#`` (``#   promtool check rules docs/alerts.yml``)."""
    return re.findall(r"^#   (\S.*)$", path.read_text(encoding="utf-8"), re.MULTILINE)


def test_the_promtool_commands_the_rules_give_pass_as_pasted_in_the_project_folder() -> None:
    commands = [c for c in documented_commands(ALERTS) if c.startswith("promtool ")]
    assert commands, "docs/alerts.yml says how to check its rules with promtool"
    tool = promtool()
    if tool is None:
        return  # nothing to run them with here; CI requires promtool
    for command in commands:
        done = subprocess.run(
            [tool, *command.split()[1:]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"


def test_the_unit_tests_are_run_by_hand_through_this_module_as_both_files_say() -> None:
    # Run as pasted it would run this module again; what is checked is that it names this
    # module, from the project's folder, and that promtool alone is not offered.
    expected = f".venv/bin/python -m pytest {Path(__file__).relative_to(ROOT)}"
    for path in (ALERTS, UNIT_TESTS):
        commands = documented_commands(path)
        assert expected in commands, f"{path.name} gives {commands}"
        assert not [c for c in commands if c.startswith("promtool test rules")], path.name
