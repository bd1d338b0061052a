"""A graph task's steps laid out for its page: a box per current step, an arrow from each
step to every step that waits for it. Coordinates are computed here and drawn by
``console/_graph.html``; nothing here reads the database.

Columns are depths (the longest chain of dependencies from a step that starts with its
task), so however many branches run side by side they stack in one column and the drawing
grows downwards, not past the page's width. Several current rows at one position (the
items of a fan-out) each get a box in that position's column, labelled ``kind #n`` in the
order of their ids.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tasks_app.models import StepStatus
from tasks_app.models.graphs import waits_for

# The box of a step and the room around it, in SVG units (pixels at the natural size).
NODE_HEIGHT = 46
MIN_NODE_WIDTH = 132
MAX_NODE_WIDTH = 208
COLUMN_GAP = 56
ROW_GAP = 14
MARGIN = 16
# An arrow that skips columns crosses each of them in a lane of its own, a slot this high
# among the boxes, so it never runs behind a box.
LANE_HEIGHT = 10
# About how wide a character of a kind is at the stylesheet's 13px (``.graph-kind``), and
# the room left and right of it: a box fits its longest kind up to ``MAX_NODE_WIDTH``.
CHAR_WIDTH = 7.4
TEXT_PADDING = 24


class _Row(Protocol):
    @property
    def pk(self) -> Any: ...
    @property
    def position(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def attempts(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def after(self) -> Any: ...


@dataclass(frozen=True)
class Node:
    pk: int
    position: int
    # The step's kind, or ``kind #n`` for item n of a fan-out.
    label: str
    # The label as it fits in the box (the full one is in the node's title).
    text: str
    status: str
    attempts: int
    max_attempts: int
    column: int
    # The box's top left corner.
    x: int
    y: int
    # The labels of the boxes it waits for.
    waits_for: tuple[str, ...]

    @property
    def middle(self) -> int:
        return self.y + NODE_HEIGHT // 2


@dataclass(frozen=True)
class Edge:
    # SVG path data, from the right side of the step waited for to the left side of the one
    # that waits.
    path: str
    # The step it comes from has succeeded: this dependency is met.
    met: bool
    source: int
    target: int


@dataclass(frozen=True)
class Drawing:
    width: int
    height: int
    node_width: int
    node_height: int
    columns: int
    nodes: list[Node]
    edges: list[Edge]
    # How many steps are in each state, in the order ``StepStatus`` declares them.
    counts: list[tuple[str, int]]

    @property
    def centre(self) -> int:
        """Where a box's text is centred, from its left side."""
        return self.node_width // 2


def draw(rows: Iterable[_Row]) -> Drawing | None:
    """The drawing of a task's step ``rows``, or None for a line (no row stores ``after``),
    which its page shows as its table alone. Superseded rows are history and left out, as
    ``StepQuerySet.current`` does in SQL."""
    current = [row for row in rows if row.status != StepStatus.SUPERSEDED]
    if not any(row.after is not None for row in current):
        return None
    return layout(current)


def layout(rows: Sequence[_Row]) -> Drawing:
    """Where each box and arrow goes.

    1. Group the rows by position; several rows at one position are told apart as
       ``#1``, ``#2``... in the order of their ids.
    2. Give each position its depth: 0 for a step that waits for nothing, else one more
       than the deepest step it waits for. Dependencies come before the steps that name
       them, so one pass in position order settles every depth.
    3. Give a dependency that skips columns a lane in each column it crosses, so its
       arrows pass between the boxes there rather than behind one.
    4. Order each column's boxes and lanes by the average height of what they hang from
       in the column before, so arrows cross as little as this simple rule can manage,
       then by position and id; centre each column on the tallest one.
    5. Draw an arrow from every box at a position waited for to each box that waits,
       through the dependency's lanes.
    """
    at: dict[int, list[_Row]] = defaultdict(list)
    for row in sorted(rows, key=lambda row: (row.position, row.pk)):
        at[row.position].append(row)
    labels = {
        row.pk: row.kind if len(group) == 1 else f"{row.kind} #{n}"
        for group in at.values()
        for n, row in enumerate(group, start=1)
    }
    needs = {
        position: sorted({p for row in group for p in waits_for(row) if p in at})
        for position, group in at.items()
    }
    depth: dict[int, int] = {}
    for position in sorted(at):
        known = [depth[p] for p in needs[position] if p in depth]
        depth[position] = max(known) + 1 if known else 0
    columns = max(depth.values()) + 1

    def boxes(position: int) -> tuple[_Key, ...]:
        return tuple(("step", row.pk) for row in at[position])

    def hop(p: int, q: int, column: int) -> tuple[_Key, ...]:
        """What the arrows from position ``p`` to ``q`` come from into ``column``."""
        return boxes(p) if column - 1 == depth[p] else (("lane", p, q, column - 1),)

    slots: dict[int, list[_Slot]] = defaultdict(list)
    for row in rows:
        q = row.position
        parents = tuple(key for p in needs[q] for key in hop(p, q, depth[q]))
        slots[depth[q]].append(_Slot(("step", row.pk), NODE_HEIGHT, parents, (q, row.pk)))
    for q in at:
        for p in needs[q]:
            for column in range(depth[p] + 1, depth[q]):
                key = ("lane", p, q, column)
                slots[column].append(_Slot(key, LANE_HEIGHT, hop(p, q, column), (p, -1)))
    tops, tallest = _stack(slots, columns)

    longest = max(len(label) for label in labels.values())
    node_width = min(
        max(round(longest * CHAR_WIDTH) + TEXT_PADDING, MIN_NODE_WIDTH), MAX_NODE_WIDTH
    )
    fits = int((node_width - TEXT_PADDING) / CHAR_WIDTH)
    nodes = [
        Node(
            pk=row.pk,
            position=row.position,
            label=labels[row.pk],
            text=_fitted(labels[row.pk], fits),
            status=row.status,
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            column=depth[row.position],
            x=MARGIN + depth[row.position] * (node_width + COLUMN_GAP),
            y=tops["step", row.pk],
            waits_for=tuple(labels[dep.pk] for p in needs[row.position] for dep in at[p]),
        )
        for row in sorted(rows, key=lambda row: (depth[row.position], tops["step", row.pk]))
    ]
    lanes = {
        (p, q): [
            _Lane(
                MARGIN + column * (node_width + COLUMN_GAP),
                tops["lane", p, q, column] + LANE_HEIGHT // 2,
            )
            for column in range(depth[p] + 1, depth[q])
        ]
        for q in at
        for p in needs[q]
    }
    return Drawing(
        width=2 * MARGIN + columns * node_width + (columns - 1) * COLUMN_GAP,
        height=2 * MARGIN + tallest,
        node_width=node_width,
        node_height=NODE_HEIGHT,
        columns=columns,
        nodes=nodes,
        edges=_edges(nodes, needs, lanes, node_width),
        counts=_counts(nodes),
    )


# A slot in a column: ("step", id) for a box, ("lane", from, to, column) for a lane.
_Key = tuple[Any, ...]


@dataclass(frozen=True)
class _Slot:
    key: _Key
    height: int
    # The slots in the column before that it hangs from.
    parents: tuple[_Key, ...]
    # Its order among slots that hang at the same height: position, then id.
    tie: tuple[int, int]


@dataclass(frozen=True)
class _Lane:
    # Its column's left side, and the height arrows cross that column at.
    x: int
    y: int


def _stack(slots: dict[int, list[_Slot]], columns: int) -> tuple[dict[_Key, int], int]:
    """Each slot's top, its column stacked in order and centred on the tallest column; and
    the tallest column's height."""

    def height(column: list[_Slot]) -> int:
        return sum(slot.height for slot in column) + (len(column) - 1) * ROW_GAP

    tallest = max(height(slots[column]) for column in range(columns))
    tops: dict[_Key, int] = {}
    middles: dict[_Key, float] = {}
    for column in range(columns):

        def order(slot: _Slot) -> tuple[float, tuple[int, int]]:
            above = [middles[key] for key in slot.parents]
            return (sum(above) / len(above) if above else 0.0, slot.tie)

        top = MARGIN + (tallest - height(slots[column])) // 2
        for slot in sorted(slots[column], key=order):
            tops[slot.key] = top
            middles[slot.key] = top + slot.height / 2
            top += slot.height + ROW_GAP
    return tops, tallest


def _fitted(label: str, fits: int) -> str:
    return label if len(label) <= fits else label[: fits - 1] + "…"


def _edges(
    nodes: list[Node],
    needs: dict[int, list[int]],
    lanes: dict[tuple[int, int], list[_Lane]],
    node_width: int,
) -> list[Edge]:
    """An edge per box waited for and box that waits. A box's arrows leave from (and
    arrive at) points spread along its side in the order of the heights they go to, so
    arrowheads into a join do not sit on one another and arrows do not cross at a box.
    Arrows from steps that have not succeeded come last: where arrowheads meet at one point
    the one drawn on top says the step still waits."""
    by_position: dict[int, list[Node]] = defaultdict(list)
    for node in nodes:
        by_position[node.position].append(node)
    pairs = [
        (source, node)
        for node in nodes
        for position in needs[node.position]
        for source in sorted(by_position[position], key=lambda n: n.pk)
    ]
    pairs.sort(key=lambda pair: pair[0].status != StepStatus.SUCCEEDED)

    def first(s: Node, t: Node) -> int:
        via = lanes[s.position, t.position]
        return via[0].y if via else t.middle

    def last(s: Node, t: Node) -> int:
        via = lanes[s.position, t.position]
        return via[-1].y if via else s.middle

    leaving = _ports([(s.pk, (first(s, t), t.pk)) for s, t in pairs], nodes)
    arriving = _ports([(t.pk, (last(s, t), s.pk)) for s, t in pairs], nodes)
    edges = []
    for source, target in pairs:
        x, y = source.x + node_width, leaving[source.pk, target.pk]
        path = [f"M{x} {y}"]
        for lane in lanes[source.position, target.position]:
            path += [_bend(x, y, lane.x, lane.y), f"H{lane.x + node_width}"]
            x, y = lane.x + node_width, lane.y
        path.append(_bend(x, y, target.x, arriving[target.pk, source.pk]))
        edges.append(
            Edge(
                path=" ".join(path),
                met=source.status == StepStatus.SUCCEEDED,
                source=source.pk,
                target=target.pk,
            )
        )
    return edges


# How far from a box's top and bottom an arrow may leave or arrive, and how close two may
# be: more arrows than fit that far apart meet at the middle of the side, as one.
PORT_INSET = 9
PORT_GAP = 7


def _ports(
    ends: list[tuple[int, tuple[int, int]]], nodes: list[Node]
) -> dict[tuple[int, int], int]:
    """For each box, the heights its arrows meet its side at, keyed by (its id, the id of
    the box at the other end): evenly spread, in the order of the heights they go to, or
    all at the middle when they do not fit ``PORT_GAP`` apart."""
    tops = {node.pk: node.y for node in nodes}
    sides: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for pk, end in ends:
        sides[pk].append(end)
    found = {}
    span = NODE_HEIGHT - 2 * PORT_INSET
    for pk, others in sides.items():
        gap = span / (len(others) + 1)
        for i, (_, other) in enumerate(sorted(others)):
            offset = PORT_INSET + round(gap * (i + 1)) if gap >= PORT_GAP else NODE_HEIGHT // 2
            found[pk, other] = tops[pk] + offset
    return found


def _bend(x1: int, y1: int, x2: int, y2: int) -> str:
    """The path on from (x1, y1) to (x2, y2): straight when level, else an S-curve that
    leaves and arrives horizontally, so each arrowhead points straight into its box."""
    if y1 == y2:
        return f"H{x2}"
    bend = (x2 - x1) // 2
    return f"C{x1 + bend} {y1} {x2 - bend} {y2} {x2} {y2}"


def _counts(nodes: list[Node]) -> list[tuple[str, int]]:
    counted = Counter(node.status for node in nodes)
    return [(status, counted[status]) for status in StepStatus.values if counted[status]]
