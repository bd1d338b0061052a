"""The database's clock (DESIGN rule 3): every due time, lease and wait is measured by it,
so workers with slow or fast clocks agree."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection
from django.db.models import DateTimeField, ExpressionWrapper
from django.db.models.expressions import CombinedExpression
from django.db.models.functions import Now
from django.utils import timezone


def db_now() -> datetime:
    """The database's clock on PostgreSQL (rule 3); the process clock on SQLite."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT STATEMENT_TIMESTAMP()")
            value: datetime = cursor.fetchone()[0]
            return value
    return timezone.now()


def now_plus(seconds: float) -> ExpressionWrapper[CombinedExpression]:
    return ExpressionWrapper(Now() + timedelta(seconds=seconds), output_field=DateTimeField())
