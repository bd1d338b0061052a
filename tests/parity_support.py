"""The two paths a step's claim and success can take, for the tests that play one story
through each and compare what they leave (test_parity, test_batch_completions): one by one
through the services, or as a batch through the SQL fast path (``tasks_app.engine.fastpath``).

One by one is ``services.claim_step`` (the ORM claim) and ``services.complete_step`` (the
ORM completion); a batch is ``fastpath.claim_batch`` (``claim_sql``) and
``fastpath.complete_many`` (``COMPLETE_SQL``). ``run`` hands the claim to the runner, which
records a failure with ``services.fail_step`` on either path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks_app import services
from tasks_app.engine import fastpath, runner
from tasks_app.models import Step
from tasks_app.services import Claim
from tests.batch_support import claim_due


@dataclass(frozen=True)
class Path:
    name: str
    # Claim this step, which must be claimable, for ``worker``.
    claim: Callable[[Step, str], Claim]
    # Claim these steps, which must be claimable and the only ones due in their queue, for
    # ``worker``; the claims by step id.
    claim_all: Callable[[list[Step], str], dict[int, Claim]]
    # Record successes; the ids of the steps whose success was accepted.
    complete: Callable[[list[tuple[Claim, Any]]], set[int]]
    # Claim this step and run its handler, recording whatever comes of it.
    run: Callable[[Step], None]


def succeed(path: Path, claim: Claim, result: Any) -> bool:
    """Record one success; True if it was accepted."""
    return path.complete([(claim, result)]) == {claim.step_id}


# --- one by one ---------------------------------------------------------------------------


def _claim_one_by_one(step: Step, worker: str) -> Claim:
    claim = services.claim_step(step.pk, worker_id=worker)
    assert claim is not None, f"step {step.pk} could not be claimed"
    return claim


def _claim_all_one_by_one(steps: list[Step], worker: str) -> dict[int, Claim]:
    return {step.pk: _claim_one_by_one(step, worker) for step in steps}


def _complete_one_by_one(done: list[tuple[Claim, Any]]) -> set[int]:
    return {claim.step_id for claim, result in done if services.complete_step(claim, result)}


def _run_one_by_one(step: Step) -> None:
    assert runner.run_claimed(step.pk), f"step {step.pk} could not be claimed"


# --- as a batch ---------------------------------------------------------------------------


def _claim_as_a_batch(step: Step, worker: str) -> Claim:
    # Named and alone: the batch takes this step and no other task's.
    claims = fastpath.claim_batch(worker_id=worker, limit=1, step_id=step.pk)
    assert [claim.step_id for claim in claims] == [step.pk]
    return claims[0]


def _claim_all_as_a_batch(steps: list[Step], worker: str) -> dict[int, Claim]:
    # The first by name: a step whose lease ran out is claimed only so.
    claims = claim_due(limit=len(steps), worker_id=worker, step_id=steps[0].pk)
    assert set(claims) == {step.pk for step in steps}
    return claims


def _run_as_a_batch(step: Step) -> None:
    runner.run_batch([_claim_as_a_batch(step, runner.worker_id())])


ONE_BY_ONE = Path(
    "one by one", _claim_one_by_one, _claim_all_one_by_one, _complete_one_by_one, _run_one_by_one
)
BATCHED = Path(
    "batch", _claim_as_a_batch, _claim_all_as_a_batch, fastpath.complete_many, _run_as_a_batch
)
