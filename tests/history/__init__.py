"""``history``: what a task's history says it was at any point, and what changed between two."""
