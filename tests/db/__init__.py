"""``tasks_app.db``: the database underneath: statement bounds under pressure, lock
conflicts, idle connections, online migrations."""
