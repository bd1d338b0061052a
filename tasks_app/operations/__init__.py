"""What people do to tasks and how it is read: operator actions and which a task allows, the reads
behind the console's pages, retention, the audit chain and redaction."""
