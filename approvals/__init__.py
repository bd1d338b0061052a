"""Steps a person decides: the approval step kind, its requests, decisions, quorum, edits,
deadlines and the approvers' mail."""
