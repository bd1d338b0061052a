"""The task system's core: tasks, their steps, every lease and an append-only history,
claimed and settled under fenced leases (README, Architecture)."""
