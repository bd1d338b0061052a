"""The horizon and faults cells in the report: their tables (a row per phase and system,
and the faults' counts per system) and the line the harness prints for each cell.
``bench/report.py`` calls ``tables`` with the systems' labels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HORIZON = "horizon"
FAULTS = "faults"
HORIZON_CELLS = (HORIZON, FAULTS)
# Each cell's first phase, in the results but in no table.
WARMUP = "warmup"
# The metrics the targets read (bench/report.py collects them from the faults cells).
LOST = "faults_lost"
EFFECTS_TWICE = "faults_effects_twice"

DASH = "\u2013"


def phase_title(phase: Mapping[str, Any], cell: Mapping[str, Any]) -> str:
    name = str(phase["name"])
    rate = f"{phase['rate']:,.0f}/s"
    if name.startswith("kill_"):
        return f"every worker SIGKILLed and restarted ({name[5:]} of {cell.get('kills', '?')})"
    titles = {
        "steady": f"steady, {rate}",
        "idle_in_tx": "a transaction idle on its snapshot",
        "active_readers": "REPEATABLE READ scans of the hot tables, in a loop",
        "idle_connections": f"idle connections held ({phase.get('wanted', '?')} asked)",
        "high_load": f"high load, {rate}",
        "recovery": f"back to {rate} after it",
        "baseline": f"steady, {rate}, a job with an external effect",
        "pg_restart": "PostgreSQL restarted",
        "terminations": (
            f"a worker backend terminated every {phase.get('every_s', 0):g} s "
            f"for {phase.get('active_s', 0):g} s"
        ),
    }
    return titles.get(name, name)


def _ms(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _count(value: Any) -> str:
    return DASH if value is None else f"{value:,.0f}"


def _recovered(phase: Mapping[str, Any]) -> str:
    if phase.get("skipped"):
        return f"skipped: {phase['skipped']}"
    if "since" not in phase:
        return ""
    if phase.get("recovered_s") is None:
        left = phase["start"] + phase["seconds"] - phase["since"]
        return f"not within {left:.0f} s"
    return f"{phase['recovered_s']:.1f} s"


def phase_rows(cells: list[Mapping[str, Any]], labels: Mapping[str, str]) -> list[str]:
    """A row per phase and system, the phases in the order they ran."""
    names: list[str] = []
    for cell in cells:
        for phase in cell.get("phases", []):
            if phase["name"] not in names and phase["name"] != WARMUP:
                names.append(phase["name"])
    lines = []
    for name in names:
        first = True
        for cell in cells:
            phase = next((p for p in cell.get("phases", []) if p["name"] == name), None)
            if phase is None:
                continue
            system = labels.get(cell["system"], cell["system"])
            if "held" in phase:
                system += f" ({phase['held']} held)"
            pickup = " / ".join(_ms(phase.get(f"p{pct}_ms")) for pct in (50, 95, 99))
            if phase.get("never_started"):
                pickup += f" ({phase['never_started']:,} never started)"
            rate = phase.get("completion_rate")
            sent = phase.get("sent")
            row = [
                phase_title(phase, cell) if first else "",
                system,
                DASH if sent is None else f"{sent / phase['seconds']:,.0f}",
                DASH if rate is None else f"{rate:,.0f}",
                pickup,
                _count(phase.get("max_depth")),
                _count(phase.get("max_dead")),
                _recovered(phase),
            ]
            lines.append("| " + " | ".join(row) + " |")
            first = False
    for cell in cells:
        if "phases" not in cell:
            why = "failed (see the problems)" if cell.get("error") else "skipped"
            system = labels.get(cell["system"], cell["system"])
            lines.append(f"| {why} | {system} |" + f" {DASH} |" * 6)
    return lines


def _measured(cells: list[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The first cell that measured something (its settings head the table)."""
    return next((cell for cell in cells if "phases" in cell), cells[0])


def tables(result: Mapping[str, Any], labels: Mapping[str, str]) -> list[str]:
    """Both cells' tables, each system in the labels' order; nothing when neither ran."""
    order = list(labels)

    def ran(name: str) -> list[Mapping[str, Any]]:
        found = [cell for cell in result["cells"] if cell["cell"] == name]
        return sorted(found, key=lambda c: order.index(c["system"]) if c["system"] in order else 99)

    lines: list[str] = []
    header = (
        "| {} | system | sent/s | done/s | pickup p50 / p95 / p99 (ms) | depth at most "
        "| dead tuples at most | back to steady in |"
    )
    horizon = ran(HORIZON)
    if horizon:
        first = _measured(horizon)
        rate = first.get("rate", 0)
        lines += [
            "",
            header.format(f"horizon: a producer at {rate:,.0f}/s, 2 worker processes"),
            "|---|---|--:|--:|--:|--:|--:|--:|",
            *phase_rows(horizon, labels),
        ]
        lost = [
            f"{labels.get(c['system'], c['system'])} {_count(c.get('lost'))}"
            for c in horizon
            if "phases" in c
        ]
        if lost:
            settle = first.get("settle_limit_s", 0)
            lines += ["", f"- jobs lost in it (not finished {settle:g} s after the producer "
                      f"stopped): {', '.join(lost)}"]  # fmt: skip
    faults = ran(FAULTS)
    if faults:
        first = _measured(faults)
        rate = first.get("rate", 0)
        lease = first.get("lease_s", 0)
        lines += [
            "",
            header.format(
                f"faults: a producer at {rate:,.0f}/s, 2 worker processes, a dead worker's "
                f"jobs run again after {lease:g} s"
            ),
            "|---|---|--:|--:|--:|--:|--:|--:|",
            *phase_rows(faults, labels),
            "",
            f"| faults, counted {first.get('settle_limit_s', 0):g} s at most after the "
            "producer stopped | jobs lost | failed | run more than once "
            "| effects applied twice | workers killed / restarted on exit "
            "| backends terminated | failed sends |",
            "|---|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for cell in faults:
            system = labels.get(cell["system"], cell["system"])
            if "phases" not in cell:
                lines.append(f"| {system} |" + f" {DASH} |" * 7)
                continue
            terminated = sum(p.get("terminated", 0) for p in cell["phases"])
            row = [
                system,
                _count(cell.get("lost")),
                _count(cell.get("failed")),
                _count(cell.get("ran_more_than_once")),
                _count(cell.get("effects_twice")),
                f"{cell.get('worker_kills', 0)} / {cell.get('worker_restarts', 0)}",
                _count(terminated),
                _count(cell.get("producer", {}).get("error_count")),
            ]
            lines.append("| " + " | ".join(row) + " |")
        failed = [
            f"{labels.get(c['system'], c['system'])} "
            + ", ".join(f"{count:,} {kind}" for kind, count in c["failed_by_kind"].items())
            for c in faults
            if c.get("failed_by_kind")
        ]
        if failed:
            lines += ["", f"- failed, by kind: {'; '.join(failed)}"]
    return lines


def brief(cell: Mapping[str, Any]) -> str:
    """The line the harness prints for a cell."""
    if cell.get("error"):
        return "ERROR " + str(cell["error"]).strip().splitlines()[-1][:200]
    phases = [phase for phase in cell.get("phases", []) if phase["name"] != WARMUP]
    parts = []
    for phase in phases:
        rate = phase.get("completion_rate")
        text = f"{phase['name']} {DASH if rate is None else f'{rate:,.0f}'}/s"
        if phase.get("p99_ms") is not None:
            text += f" p99 {_ms(phase['p99_ms'])} ms"
        if "since" in phase:
            text += f" back in {_recovered(phase)}"
        parts.append(text)
    parts.append(f"lost {_count(cell.get('lost'))}")
    if cell["cell"] == FAULTS:
        parts.append(f"run twice {_count(cell.get('ran_more_than_once'))}")
        parts.append(f"effects twice {_count(cell.get('effects_twice'))}")
    return "; ".join(parts)
