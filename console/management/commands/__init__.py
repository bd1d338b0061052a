"""The console's commands: the demo's mailbox and the audit export's check."""
