"""``api``: the JSON API for programs, its tokens, plans and schema."""
