"""The OpenAPI document the API serves: open to anyone, valid, listing every path with
the refusals each operation may answer with."""

from __future__ import annotations

import pytest
from django.test import Client
from openapi_spec_validator import validate

from tests.api_support import ENDPOINTS, Endpoint

pytestmark = pytest.mark.django_db


def test_the_document_needs_no_token_and_is_valid_openapi() -> None:
    answer = Client().get("/api/v1/openapi.json")
    assert answer.status_code == 200
    validate(answer.json())


def test_it_lists_every_path_and_operation() -> None:
    paths = Client().get("/api/v1/openapi.json").json()["paths"]
    for endpoint in ENDPOINTS:
        assert endpoint.method.lower() in paths.get(endpoint.template, {}), str(endpoint)


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
def test_each_operation_documents_its_refusals_and_the_bearer_token(endpoint: Endpoint) -> None:
    document = Client().get("/api/v1/openapi.json").json()
    operation = document["paths"][endpoint.template][endpoint.method.lower()]
    refusals = {"400", "401", "403", "429", "503"}
    if "{" in endpoint.template:
        refusals.add("404")
    assert refusals <= set(operation["responses"])
    assert operation["security"] == [{"TokenAuth": []}]
