"""The benchmark harness: our durable core against plain Celery, procrastinate and a raw
psycopg loop, side by side on one machine. Run it with ``make bench`` or
``make bench-quick``; ``docs/performance.md`` says what each number means."""
