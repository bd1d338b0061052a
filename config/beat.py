"""Beat's scheduler: Celery's own, keeping its schedule in a file, that first makes the
file's folder.

The settings make ``var/`` only for the embedded database and broker, while beat keeps its
schedule under it in every mode unless told otherwise (``--schedule``, as ``Procfile``
does); so the folder is made here, by the one process that writes there.
"""

from __future__ import annotations

from pathlib import Path

from celery.beat import PersistentScheduler


class Scheduler(PersistentScheduler):
    def setup_schedule(self) -> None:
        filename = getattr(self, "schedule_filename", None)
        if filename:
            Path(filename).parent.mkdir(parents=True, exist_ok=True)
        super().setup_schedule()
