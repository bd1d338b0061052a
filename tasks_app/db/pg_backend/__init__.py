"""Django's PostgreSQL backend with a bound on every statement and on every DDL lock wait
(``ENGINE`` in the settings)."""
