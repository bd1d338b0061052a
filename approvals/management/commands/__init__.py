"""The approvals' command: decide a request from a terminal (`decide`)."""
