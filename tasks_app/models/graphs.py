"""A workflow's steps as a graph: which steps each one waits for, and what that means for a
task's rows.

A workflow declares each step's dependencies by kind (``StepSpec.after``); a step declared
without them waits for the one declared before it, so a workflow that never says ``after``
is a line, as every workflow was before graphs. Each dependency is declared before the
step that names it, so the declaration order is an order in which the steps can run and
a cycle cannot be written.

A task runs under the graph it was enqueued with: each step row stores the positions it
waits for (``Step.after``), or nothing in a line (the position before). Everything that
asks what a step waits for, or what waits for it, reads the rows (:func:`waits_for`), never
today's code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class _Declared(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def after(self) -> tuple[str, ...] | None: ...


class _Row(Protocol):
    @property
    def position(self) -> int: ...
    @property
    def after(self) -> Any: ...
    @property
    def status(self) -> str: ...


@dataclass(frozen=True)
class Graph:
    """The positions each step of a workflow waits for, by position."""

    after: tuple[tuple[int, ...], ...]

    @property
    def is_line(self) -> bool:
        return all(
            deps == ((position - 1,) if position else ())
            for position, deps in enumerate(self.after)
        )

    def ancestors(self, position: int) -> set[int]:
        """The positions the step at ``position`` waits for, directly or not."""
        found: set[int] = set()
        todo = list(self.after[position])
        while todo:
            at = todo.pop()
            if at not in found:
                found.add(at)
                todo += self.after[at]
        return found

    def roots(self) -> tuple[int, ...]:
        """The steps that start when the task does."""
        return tuple(position for position, deps in enumerate(self.after) if not deps)


def graph_of(workflow: str, steps: Sequence[_Declared]) -> Graph:
    """The graph ``steps`` declare, or ``ValueError`` naming the step and the rule."""
    seen: dict[str, int] = {}
    after: list[tuple[int, ...]] = []
    for position, spec in enumerate(steps):
        if spec.after is None:
            deps: tuple[int, ...] = (position - 1,) if position else ()
        else:
            missing = [kind for kind in spec.after if kind not in seen]
            if missing:
                raise ValueError(
                    f"workflow {workflow}: step {spec.kind} waits for {', '.join(missing)}, "
                    "which must be declared before it"
                )
            if len(set(spec.after)) != len(spec.after):
                raise ValueError(f"workflow {workflow}: step {spec.kind} names a step twice")
            deps = tuple(sorted(seen[kind] for kind in spec.after))
        after.append(deps)
        seen[spec.kind] = position
    return Graph(tuple(after))


def waits_for(step: _Row) -> tuple[int, ...]:
    """The positions the step row ``step`` waits for, as its task was enqueued."""
    if step.after is not None:
        return tuple(int(position) for position in step.after)
    return (step.position - 1,) if step.position else ()


def is_root(position: int, after: Iterable[int] | None) -> bool:
    """Whether a step stored with ``after`` starts when its task does."""
    return not list(after) if after is not None else position == 0


def ready(rows: Iterable[_Row], succeeded: str, blocked: str) -> list[Any]:
    """Among a task's current ``rows``, the ``blocked`` ones every step they wait for has
    ``succeeded`` (every row of it: a fan-out has several at one position)."""
    current = list(rows)
    done = {row.position for row in current if row.status == succeeded} - {
        row.position for row in current if row.status != succeeded
    }
    return [
        row
        for row in current
        if row.status == blocked and all(position in done for position in waits_for(row))
    ]


def ancestors(rows: Iterable[_Row], position: int) -> set[int]:
    """The positions the step at ``position`` waits for, directly or not."""
    after = {row.position: waits_for(row) for row in rows}
    found: set[int] = set()
    todo = list(after.get(position, ()))
    while todo:
        at = todo.pop()
        if at not in found:
            found.add(at)
            todo += after.get(at, ())
    return found


def descendants(rows: Iterable[_Row], position: int) -> set[int]:
    """The positions that wait for the step at ``position``, directly or not."""
    current = list(rows)
    return {row.position for row in current if position in ancestors(current, row.position)}
