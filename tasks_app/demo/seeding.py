"""Parts of the demo seed that an app building on the core brings: the core's seed
command (``seed_demo``) runs a scenario by name when an installed app registered it, as
the approvals app registers how the demo article is sent back once and redrafted. The
core never imports such an app; it asks here."""

from __future__ import annotations

from collections.abc import Callable

from tasks_app.models import Task

# Takes the scenario's task where the seed left it; returns what the seed reports of it
# (the revision waiting, for the article), or None.
Scenario = Callable[[Task], int | None]

_scenarios: dict[str, Scenario] = {}

# The article brought to its review, sent back once and redrafted.
REVISED_ARTICLE = "revised_article"


def register_scenario(name: str, scenario: Scenario) -> None:
    _scenarios[name] = scenario


def run_scenario(name: str, task: Task) -> int | None:
    """Run scenario ``name`` on ``task`` if an installed app registered it."""
    scenario = _scenarios.get(name)
    return None if scenario is None else scenario(task)
