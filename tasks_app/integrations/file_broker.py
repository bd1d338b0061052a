"""kombu's filesystem transport (the embedded default's broker: a folder of message files),
with one change: a message file appears whole.

kombu writes a message straight into the queue folder under its final name, and a consumer
lists the folder, moves a file away and reads it. A consumer that lists the folder while a
publisher is still writing moves a half-written file and fails to decode it. Here the
publisher writes the message under a name no consumer picks (``.part``) and renames it into
place, which is atomic within one folder: a file with a message's name is always complete.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps

PARTIAL = ".part"


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Put ``payload`` on ``queue``: written under a partial name, then renamed."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + PARTIAL
        try:
            with open(partial, "wb") as file:
                file.write(dumps(payload).encode())
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
