"""``approvals``: the approval step, decisions, quorum and edits, the inbox, the approvers'
mail, the shipped publishing workflows."""
