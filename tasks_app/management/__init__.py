"""The core's management commands."""
