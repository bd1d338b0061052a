"""The dashboard: the pages and actions on-call staff, editors and auditors use."""
