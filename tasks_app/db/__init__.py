"""The database underneath: the bound on every statement, lock conflicts tried again, idle
connections given back, migrations that keep the big tables writable, and the PostgreSQL backend
that applies them."""
