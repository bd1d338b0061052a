"""The embedded broker's message files appear whole (integrations/file_broker.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection

from tasks_app.integrations.file_broker import PARTIAL


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[Any]:
    folder = tmp_path / "queue"
    folder.mkdir()
    connection = Connection(
        "filesystem://localhost//",
        transport="tasks_app.integrations.file_broker:Transport",
        transport_options={
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(tmp_path / "control"),
            "store_processed": False,
        },
    )
    channel = connection.channel()
    yield channel
    connection.release()


def test_a_message_being_written_is_not_read_until_it_is_whole(
    channel: Any, tmp_path: Path
) -> None:
    # A publisher half-way through a message: the consumer does not take it.
    half = json.dumps({"body": "doorbell"})[:7]
    (tmp_path / "queue" / f"1_x.steps.msg{PARTIAL}").write_text(half)
    with pytest.raises(Empty):
        channel._get("steps")
    assert (tmp_path / "queue" / f"1_x.steps.msg{PARTIAL}").exists()

    channel._put("steps", {"body": "doorbell"})
    assert channel._get("steps") == {"body": "doorbell"}
    # Nothing of the finished write is left behind under its partial name.
    assert [path.name for path in (tmp_path / "queue").iterdir()] == [f"1_x.steps.msg{PARTIAL}"]
