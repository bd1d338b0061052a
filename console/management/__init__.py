"""The console's management commands."""
