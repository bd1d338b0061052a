"""The ways in and out besides the service API: the admin's parts, Django's ``django.tasks``
backend, Celery's broker transport and beat's scheduler."""
