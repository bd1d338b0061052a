"""The core's public face (``tasks_app.services`` and what it promises): input rules through
every way in, the append-only history, the completion signals, races between actions, and
a state model of every transition."""
