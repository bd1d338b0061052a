"""Every fenced block of README.md and docs/*.md works as pasted (tests/docs_support.py says
how each language runs and which directives mark a block): a broken example fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.docs_support import Block, all_blocks, blocks_of, database_env, problem, run_page

BLOCKS = all_blocks()
RUN = [block for block in BLOCKS if block.runs]
SHOWN = [block for block in BLOCKS if not block.runs]


PAGE_FAILURES: dict[str, dict[int, str]] = {}


def page_failures(page: str, folders: pytest.TempPathFactory) -> dict[int, str]:
    """A page's runnable blocks run once, together (later blocks may use what earlier ones
    defined), on the test database; what failed, by block."""
    if page not in PAGE_FAILURES:
        env = database_env(connection.settings_dict, settings.REDIS_URL)
        blocks = [block for block in RUN if block.page == page]
        PAGE_FAILURES[page] = run_page(blocks, folders.mktemp("docs"), env)
    return PAGE_FAILURES[page]


# Ids start at 1 again, so the tasks the examples name by id (42) are the seeded demo's.
@pytest.mark.django_db(transaction=True, reset_sequences=True)
@pytest.mark.parametrize("block", RUN, ids=[block.id for block in RUN])
def test_the_block_works_as_pasted(block: Block, tmp_path_factory: pytest.TempPathFactory) -> None:
    assert problem(block) is None, problem(block)
    failure = page_failures(block.page, tmp_path_factory).get(block.line)
    assert failure is None, f"{block.id} ({block.kind}) fails as pasted:\n{failure}"


@pytest.mark.parametrize("block", SHOWN, ids=[block.id for block in SHOWN])
def test_the_block_shown_and_not_run_says_why_or_parses(block: Block) -> None:
    assert problem(block) is None, f"{block.id}: {problem(block)}"


def test_every_page_has_its_blocks_found() -> None:
    pages = {block.page for block in BLOCKS}
    assert {"README.md", "docs/django-tasks.md", "docs/deployment.md"} <= pages


PAGE = """\
Text.

```sh
make run
```

<!-- run: no — tests/no_such_test.py -->
```python
print(1)
```

<!-- run: no — because -->
```sh
ls
```

```
plain
```

```json
{"a": 1,}
```

<!-- run: no — tests/docs/test_code_blocks.py -->
```sh
make run
```

```python
# config/settings.py
DEBUG = False
```

```console
$ python manage.py check
System check identified no issues (0 silenced).
$ sudo systemctl restart task-console-web
```
"""


def test_blocks_that_are_neither_run_nor_excused_fail() -> None:
    found = {block.line: problem(block) for block in blocks_of("PAGE.md", PAGE)}
    assert "cannot run in a test" in (found[3] or "")
    assert "do not exist" in (found[8] or "")
    assert "must name the test" in (found[13] or "")
    assert "no language" in (found[17] or "")
    assert "does not parse" in (found[21] or "")
    assert found[26] is None
    assert "would replace its package" in (found[30] or "")
    assert "['sudo systemctl restart task-console-web']" in (found[35] or "")


SESSION = """\
```python
# shop/workflows.py
from tasks_app.workflows import StepSpec, Workflow, register

register(Workflow("shop.order", 1, steps=(StepSpec("take", lambda ctx: {}),)))
```

```python
from tasks_app import services
from tasks_app.workflows import registry

result = services.enqueue("shop.order", {})
```

```python
assert result.created and "shop.order" in registry.names()
```

```python
def pasted():
    x = 1

    return x
```

```python
# shop/remote.py
def call():
    return client.post()
```
"""


@pytest.mark.django_db(transaction=True)
def test_a_page_runs_in_one_session_and_each_failure_is_its_blocks(tmp_path: Path) -> None:
    """Modules are installed, shell blocks share names in order, and a function with a
    blank line in its body fails as it does pasted into the shell's console."""
    blocks = blocks_of("SESSION.md", SESSION)
    env = database_env(connection.settings_dict, settings.REDIS_URL)
    failures = run_page(blocks, tmp_path, env)
    assert set(failures) == {19, 26}, failures
    assert "IndentationError" in failures[19]
    assert "Undefined name `client`" in failures[26]
