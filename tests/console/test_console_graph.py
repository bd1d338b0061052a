"""A graph task's page draws its steps: a box per current step saying its state in words, an
arrow per dependency, each box leading to its row in the steps table. A line's page has no
drawing; kinds are shown as text; superseded rows are history and not drawn. The layout's
columns are depths, so parallel branches stack in one column."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from console.graph_drawing import draw, layout
from tasks_app import services
from tasks_app.engine import leases
from tasks_app.models import Step, StepStatus, Task
from tasks_app.workflows import StepSpec, Workflow
from tests.console_support import body, login
from tests.factories import noop
from tests.graph_support import (
    Remote,
    diamond,
    enqueue,
    registered,
    reviewed_translations,
    run,
    step_of,
    translations,
)

pytestmark = pytest.mark.django_db

HOSTILE_KIND = "<script>alert(1)</script>"


@dataclass
class Drawn:
    """What the page's graph shows: its boxes (step id to kind and state), its arrows (from
    a step's id to the id of the one that waits), the boxes' links and titles, and the
    image's summary."""

    nodes: dict[int, tuple[str, str]] = field(default_factory=dict)
    edges: list[tuple[int, int]] = field(default_factory=list)
    met: set[tuple[int, int]] = field(default_factory=set)
    links: list[tuple[str, str]] = field(default_factory=list)
    summary: str = ""
    listed: list[str] = field(default_factory=list)


class GraphParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.drawn = Drawn()
        self.inside = False
        self._node: int | None = None
        self._texts: list[str] = []
        self._link: str | None = None
        self._title: str | None = None
        self._item: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "section" and a.get("aria-labelledby") == "graph-heading":
            self.inside = True
        if not self.inside:
            return
        classes = a.get("class", "").split()
        if a.get("role") == "img":
            self.drawn.summary = a.get("aria-label", "")
        elif tag == "g" and "graph-node" in classes:
            self._node, self._texts = int(a["data-step"]), []
        elif tag == "path" and "graph-edge" in classes:
            edge = (int(a["data-from"]), int(a["data-to"]))
            self.drawn.edges.append(edge)
            if "met" in classes:
                self.drawn.met.add(edge)
        elif tag == "a":
            self._link = a.get("href", "")
        elif tag == "title":
            self._title = ""
        elif tag == "li":
            self._item = ""

    def handle_data(self, data: str) -> None:
        if self._title is not None:
            self._title += data
        elif self._item is not None:
            self._item += data
        elif self._node is not None and data.strip():
            self._texts.append(data.strip())

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self.inside = False
        elif tag == "g" and self._node is not None:
            kind, state = self._texts
            self.drawn.nodes[self._node] = (kind, state)
            self._node = None
        elif tag == "title" and self._title is not None and self._link is not None:
            self.drawn.links.append((self._link, self._title))
            self._title = None
        elif tag == "li" and self._item is not None:
            self.drawn.listed.append(" ".join(self._item.split()))
            self._item = None


def drawn(page: str) -> Drawn:
    parser = GraphParser()
    parser.feed(page)
    return parser.drawn


def page_of(user: User, task: Task) -> str:
    response = login(user).get(f"/tasks/{task.pk}/")
    assert response.status_code == 200
    return body(response)


def ids(task: Task) -> dict[str, int]:
    return dict(Step.objects.current().filter(task=task).values_list("kind", "pk"))


@pytest.fixture
def remote() -> Iterator[Remote]:
    made = Remote(failing={"c"})
    with registered(diamond("test.graph.page", made)):
        yield made


def _diamond_under_way() -> Task:
    """start and a succeeded, b running, c dead, join and finish blocked."""
    from tasks_app.workflows import registry

    task = enqueue(registry.latest("test.graph.page"))
    run(task, "start")
    run(task, "a")
    run(task, "c")
    assert leases.claim_step(step_of(task, "b").pk, worker_id="worker-1") is not None
    return task


# --- the page ------------------------------------------------------------------------------


def test_a_graph_tasks_page_draws_each_step_with_its_state_and_an_arrow_per_dependency(
    oncall: User, remote: Remote
) -> None:
    task = _diamond_under_way()
    page = page_of(oncall, task)
    graph = drawn(page)
    pk = ids(task)

    assert graph.nodes == {
        pk["start"]: ("start", "succeeded"),
        pk["a"]: ("a", "succeeded"),
        pk["b"]: ("b", "running"),
        pk["c"]: ("c", "dead"),
        pk["join"]: ("join", "blocked"),
        pk["finish"]: ("finish", "blocked"),
    }
    wanted = [
        ("start", "a"),
        ("start", "b"),
        ("start", "c"),
        ("a", "join"),
        ("b", "join"),
        ("c", "join"),
        ("join", "finish"),
    ]
    assert sorted(graph.edges) == sorted((pk[x], pk[y]) for x, y in wanted)
    # An arrow is solid once the step it leaves has succeeded.
    assert graph.met == {(pk[x], pk[y]) for x, y in wanted if x in ("start", "a")}
    assert graph.summary == (
        "6 steps in 4 columns, each waiting for the steps before it: "
        "2 blocked, 1 running, 2 succeeded, 1 dead"
    )
    # Each box leads to its step's row, and says its kind, state and attempts on hover.
    assert ("#step-{}".format(pk["b"]), "b: running, attempts 1 / 1") in graph.links
    assert len(graph.links) == 6
    for step_pk in pk.values():
        assert f'<tr id="step-{step_pk}"' in page
    # Read aloud, each step says what it waits for.
    assert "join: blocked, attempts 0 / 3; waits for a, b, c" in graph.listed
    assert "start: succeeded, attempts 1 / 3; starts with the task" in graph.listed


def test_the_drawing_keeps_to_the_content_security_policy(oncall: User, remote: Remote) -> None:
    page = page_of(oncall, _diamond_under_way())
    section = page[page.index('<section aria-labelledby="graph-heading">') :]
    section = section[: section.index("</section>")]
    assert "style=" not in section and "<script" not in section
    assert not re.search(r"\son\w+=", section)


def test_a_line_tasks_page_has_no_graph(oncall: User) -> None:
    page = page_of(oncall, noop())
    assert 'id="graph-heading"' not in page and "graph-node" not in page
    assert drawn(page).nodes == {}


def _noop(ctx: Any) -> None:
    return None


def test_a_kind_is_shown_as_text(oncall: User) -> None:
    # Two branches, so a graph: a step after the one before it alone is a line.
    flow = Workflow(
        "test.graph.hostile",
        1,
        steps=(
            StepSpec("start", _noop),
            StepSpec(HOSTILE_KIND, _noop, after=("start",)),
            StepSpec("other", _noop, after=("start",)),
        ),
    )
    with registered(flow):
        task = enqueue(flow)
        page = page_of(oncall, task)
    assert "<script>alert(1)" not in page
    graph = drawn(page)
    assert graph.nodes[ids(task)[HOSTILE_KIND]] == ("<script>alert(1)</scrip…", "blocked")
    assert (f"#step-{ids(task)[HOSTILE_KIND]}", f"{HOSTILE_KIND}: blocked, attempts 0 / 3") in (
        graph.links
    )
    assert "&lt;script&gt;alert(1)&lt;/script&gt;: blocked" in page


def test_superseded_rows_are_not_drawn(oncall: User, editor: User) -> None:
    flow = reviewed_translations("test.graph.page_translations", Remote())
    with registered(flow):
        task = enqueue(flow)
        for kind in ("start", "draft_en", "draft_fr"):
            run(task, kind)
        request = ApprovalRequest.objects.get(task=task, status=ApprovalStatus.PENDING)
        approvals.request_changes(request, actor=editor, comment="Too formal")
        page = page_of(oncall, task)
    old = set(
        Step.objects.filter(task=task, status=StepStatus.SUPERSEDED).values_list("pk", flat=True)
    )
    assert len(old) == 2
    graph = drawn(page)
    pk = ids(task)
    assert set(graph.nodes) == set(pk.values())
    assert graph.nodes[pk["draft_fr"]] == ("draft_fr", "pending")
    assert graph.nodes[pk["review_fr"]] == ("review_fr", "blocked")
    drawn_ids = set(graph.nodes) | {end for edge in graph.edges for end in edge}
    assert not drawn_ids & old
    assert len(graph.edges) == 5


# --- the layout ----------------------------------------------------------------------------


def test_the_diamonds_columns_are_its_depths() -> None:
    flow = diamond("test.graph.layout", Remote())
    with registered(flow):
        task = enqueue(flow)
    drawing = layout(list(Step.objects.current().filter(task=task)))
    assert [(n.label, n.column) for n in drawing.nodes] == [
        ("start", 0),
        ("a", 1),
        ("b", 1),
        ("c", 1),
        ("join", 2),
        ("finish", 3),
    ]
    # The branches stack, centred on the steps before and after them.
    start, a, b, c, join, finish = drawing.nodes
    assert a.y < b.y < c.y and start.middle == b.middle == join.middle == finish.middle
    assert drawing.columns == 4 and len(drawing.edges) == 7


def test_ten_parallel_branches_stack_in_one_column() -> None:
    branches = tuple(f"branch_{n}" for n in range(10))
    flow = diamond("test.graph.wide", Remote(), branches=branches)
    with registered(flow):
        task = enqueue(flow)
    wide = layout(list(Step.objects.current().filter(task=task)))
    assert wide.columns == 4
    assert {n.column for n in wide.nodes if n.label in branches} == {1}
    # As wide as four boxes, whatever the number of branches.
    assert wide.width < 1000, wide.width
    assert len({n.y for n in wide.nodes if n.column == 1}) == 10


@dataclass(frozen=True)
class Row:
    """A step row as the layout reads it."""

    pk: int
    position: int
    kind: str
    after: list[int] | None
    status: str = StepStatus.BLOCKED
    attempts: int = 0
    max_attempts: int = 3


def test_rows_sharing_a_position_are_boxes_of_one_column_numbered_by_id() -> None:
    rows = [
        Row(1, 0, "list", []),
        Row(12, 1, "fetch", [0]),
        Row(10, 1, "fetch", [0]),
        Row(11, 1, "fetch", [0]),
        Row(13, 2, "merge", [1]),
    ]
    drawing = draw(rows)
    assert drawing is not None
    assert [(n.pk, n.label, n.column) for n in drawing.nodes] == [
        (1, "list", 0),
        (10, "fetch #1", 1),
        (11, "fetch #2", 1),
        (12, "fetch #3", 1),
        (13, "merge", 2),
    ]
    assert sorted((e.source, e.target) for e in drawing.edges) == [
        (1, 10),
        (1, 11),
        (1, 12),
        (10, 13),
        (11, 13),
        (12, 13),
    ]
    assert drawing.nodes[-1].waits_for == ("fetch #1", "fetch #2", "fetch #3")


def test_an_arrow_that_skips_a_column_passes_beside_its_boxes() -> None:
    """``publish`` waits for ``draft_en`` (column 1) and ``review`` (column 2): the arrow
    from ``draft_en`` crosses column 2 in a lane of its own, clear of ``review``'s box."""
    rows = [
        Row(1, 0, "start", []),
        Row(2, 1, "draft_en", [0]),
        Row(3, 2, "draft_fr", [0]),
        Row(4, 3, "review", [2]),
        Row(5, 4, "publish", [1, 3]),
    ]
    drawing = draw(rows)
    assert drawing is not None
    columns = {n.label: n.column for n in drawing.nodes}
    assert columns == {"start": 0, "draft_en": 1, "draft_fr": 1, "review": 2, "publish": 3}
    review = next(n for n in drawing.nodes if n.label == "review")
    (long,) = [e for e in drawing.edges if (e.source, e.target) == (2, 5)]
    # Across review's column at one height: ``... <x> <y> H<x + width>``.
    found = re.search(rf"(\d+) H{review.x + drawing.node_width}\b", long.path)
    assert found, long.path
    assert not review.y <= int(found.group(1)) <= review.y + drawing.node_height


def test_a_line_is_not_drawn_and_superseded_rows_are_left_out() -> None:
    assert draw([Row(1, 0, "a", None), Row(2, 1, "b", None)]) is None
    drawing = draw(
        [
            Row(1, 0, "a", []),
            Row(2, 1, "b", [0], status=StepStatus.SUPERSEDED),
            Row(3, 1, "b", [0]),
        ]
    )
    assert drawing is not None
    assert [n.pk for n in drawing.nodes] == [1, 3]
    assert [n.label for n in drawing.nodes] == ["a", "b"]


def test_the_timeline_says_how_many_rows_a_fan_out_made(oncall: User) -> None:
    remote = Remote()
    with registered(translations("test.graph.page_fan_out", remote)):
        task = services.enqueue("test.graph.page_fan_out", {"languages": ["de", "fr"]}).task
        run(task, "plan")
        page = body(login(oncall).get(f"/tasks/{task.pk}/"))
    assert "fanned out: translate into 2 rows" in page
    assert page.count('class="graph-node') == 4
