"""The core's commands: enqueue, redrive, resolve, cancel, pause and resume, sweep, prune,
status and the checks."""
