"""The approvals' management commands."""
