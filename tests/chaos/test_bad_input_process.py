"""Drill 17 with a real process: hypothesis-made bad enqueues through the ``enqueue``
command, each in a process of its own, as a shell script would call it. Each is refused
with one line naming the field and exit status 2, and nothing is stored. (The service, the
admin form and the console's editor get the same inputs in ``tests/core/test_bad_input.py``.)"""

from __future__ import annotations

import os
import subprocess

import pytest
from django.db import connection
from hypothesis import assume, given

from tests.bad_input_strategies import Call, argv, bad_text_calls, examples, stored
from tests.e2e_support import PYTHON, ROOT, database_url

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]


@examples(15)
@given(bad=bad_text_calls(admin=False))
def test_row_17_the_enqueue_command_refuses_bad_input_in_its_own_process(
    transactional_db: None, bad: tuple[Call, str]
) -> None:
    call, field = bad
    args = argv(call)
    # What a command line cannot carry at all (exec refuses it) is not an input.
    assume(all("\x00" not in arg for arg in args))
    assume(all(_encodable(arg) for arg in args))
    before = stored()

    done = subprocess.run(
        [PYTHON, "manage.py", "enqueue", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url(connection.settings_dict)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"CommandError: {field}: "), lines[0]
    assert done.stdout == ""
    assert stored() == before


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
