"""Flow control's figures on ``/metrics`` (``tasks_app.engine.limits``): per limit, the steps
running and waiting under it, its numbers in effect, its keys at their limit, what its
rate spent this period, the claims it held a step back in, and whether it is saturated.

Labelled by limit, never by key: a key is a payload's value (a customer), so a label per
key would add series with every new customer, and Prometheus keeps every series it ever
saw. Per key, on-call reads the Limits page. A limit with no concurrency (or no rate) has
no series for it, rather than a made-up number.

Each scrape reads the limits once (:func:`tasks_app.operations.limit_use.uses`: a fixed
number of statements over the running steps, the due steps under limits and the limits'
own small tables), and the refusals from the counters the scrape read already.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from tasks_app.history.counting import LIMIT_REFUSED
from tasks_app.operations.limit_use import KeyUse, LimitUse, uses


def is_held_back(key: KeyUse) -> bool:
    """Whether due steps wait under ``key`` because it lets none more in now: at its
    concurrency, its rate spent, paused, or held by a remote's "retry after". A paused key
    counts: work waiting on a pause for long is worth a ticket (as a paused queue is), and
    the pause has its own series to tell it apart."""
    return key.waiting > 0 and (key.at_limit or key.held_until is not None)


def is_saturated(use: LimitUse) -> bool:
    """Whether some key of the limit holds its due steps back (:func:`is_held_back`)."""
    return any(is_held_back(key) for key in use.keys)


def _gauge(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=["limit"])


def limit_metrics(totals: Mapping[str, int]) -> Iterator[Metric]:
    """The limits' figures; ``totals`` are the counters (``counting.totals()``)."""
    limits = uses()
    running = _gauge("tasks_limit_running_steps", "Steps running under the limit, all keys.")
    waiting = _gauge(
        "tasks_limit_waiting_steps", "Due steps under the limit not yet claimed, all keys."
    )
    concurrency = _gauge(
        "tasks_limit_concurrency",
        "Steps each key of the limit may run at once, as in effect (0 lets none start).",
    )
    active = _gauge("tasks_limit_active_keys", "Keys of the limit with a step running or due.")
    at_limit = _gauge(
        "tasks_limit_keys_at_limit",
        "Keys of the limit at it now: at their concurrency, their rate spent, or paused.",
    )
    paused = _gauge("tasks_limit_keys_paused", "Keys of the limit an operator paused.")
    held = _gauge(
        "tasks_limit_keys_held", "Keys of the limit held by a remote's retry-after (HTTP 429)."
    )
    rate = _gauge("tasks_limit_rate_units", "Units each key of the limit may spend per period.")
    period = _gauge("tasks_limit_rate_period_seconds", "The period of the limit's rate.")
    spent = _gauge(
        "tasks_limit_rate_spent_units",
        "Units of the rate spent in the period ending now, summed over the limit's keys.",
    )
    saturated = _gauge(
        "tasks_limit_saturated",
        "1 while some key of the limit holds due steps back: at its concurrency, its rate "
        "spent, paused, or held by a remote's retry-after.",
    )
    for use in limits:
        label = [use.name]
        running.add_metric(label, use.running)
        waiting.add_metric(label, use.waiting)
        active.add_metric(label, use.active_keys)
        at_limit.add_metric(label, len(use.at_limit))
        paused.add_metric(label, len(use.paused))
        held.add_metric(label, sum(1 for key in use.keys if key.held_until is not None))
        saturated.add_metric(label, 1.0 if is_saturated(use) else 0.0)
        numbers = use.numbers
        if numbers is not None and numbers.concurrency is not None:
            concurrency.add_metric(label, numbers.concurrency)
        if numbers is not None and numbers.rate is not None:
            rate.add_metric(label, numbers.rate.count)
            period.add_metric(label, numbers.rate.seconds)
            spent.add_metric(label, use.spent)
    yield from (running, waiting, concurrency, active, at_limit, paused, held)
    yield from (rate, period, spent, saturated)

    # Every limit known here from the start (0 before its first refusal, so rate() has a
    # first sample), and any the counters remember that is no longer declared.
    prefix = f"{LIMIT_REFUSED}:"
    refused = {name[len(prefix) :]: n for name, n in totals.items() if name.startswith(prefix)}
    refusals = CounterMetricFamily(
        "tasks_limit_refusals",
        "Claims in which the limit held back a due step.",
        labels=["limit"],
    )
    for name in sorted({use.name for use in limits} | set(refused)):
        refusals.add_metric([name], refused.get(name, 0))
    yield refusals
