"""``api``: the console for programs. A JSON API at ``/api/v1/`` (django-ninja, with its
OpenAPI document), called with a person's token; programs read what the console shows and
propose plans that a person signs in the console."""
