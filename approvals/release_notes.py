"""``release_notes``: the shipped workflow that is a graph, with a fan-out, a join and an
editor in one branch.

``collect`` reads the release (its version, changes and languages); then two branches run
side by side: ``translate`` fans out into one step per language (at most 12), while
``draft_post`` writes the announcement and ``review_post`` waits for an editor to approve it
(48 h, then the task is cancelled); ``publish`` joins both branches, once the editor
approved and every translation is done, and publishes the approved post with its
translations to the publishing remote, once (the remote honours idempotency keys).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.conf import settings

from approvals.payloads import check_article_draft
from approvals.steps import approval_step, check_workflow
from approvals.workflows import publish_approved
from tasks_app.exceptions import InvalidInput, InvalidPayload, refuse_all
from tasks_app.workflows import StepContext, StepSpec, Workflow, register

LANGUAGE = re.compile(r"[a-z]{2}(-[A-Z]{2})?")
MAX_LANGUAGES = 12
MAX_CHANGES = 20


def validate_release(payload: dict[str, Any]) -> None:
    """``version`` (text), ``changes`` (1 to 20 lines of text) and ``languages`` (up to 12
    distinct codes such as ``de`` or ``pt-BR``); every field that breaks a rule is named."""
    errors: list[InvalidInput] = [
        InvalidPayload(f"payload.{name}", "known_field", f"payload.{name}: not a field")
        for name in sorted(set(payload) - {"version", "changes", "languages"})
    ]
    version = payload.get("version")
    if not isinstance(version, str) or not version.strip() or len(version) > 40:
        errors.append(
            InvalidPayload(
                "payload.version", "required", "payload.version: text of 1 to 40 characters"
            )
        )
    changes = payload.get("changes")
    if (
        not isinstance(changes, list)
        or not 1 <= len(changes) <= MAX_CHANGES
        or not all(isinstance(line, str) and line.strip() for line in changes)
    ):
        errors.append(
            InvalidPayload(
                "payload.changes",
                "lines",
                f"payload.changes: a list of 1 to {MAX_CHANGES} non-empty lines of text",
            )
        )
    languages = payload.get("languages", [])
    if (
        not isinstance(languages, list)
        or len(languages) > MAX_LANGUAGES
        or len(set(map(str, languages))) != len(languages)
        or not all(isinstance(code, str) and LANGUAGE.fullmatch(code) for code in languages)
    ):
        errors.append(
            InvalidPayload(
                "payload.languages",
                "codes",
                f"payload.languages: at most {MAX_LANGUAGES} distinct language codes such as "
                "de or pt-BR",
            )
        )
    refuse_all(errors)


def collect(ctx: StepContext) -> dict[str, Any]:
    payload = ctx.payload
    return {
        "version": payload["version"],
        "changes": payload["changes"],
        "languages": payload.get("languages", []),
    }


def languages(results: Mapping[str, Any]) -> list[str]:
    return list(results["collect"]["languages"])


def translate(ctx: StepContext) -> dict[str, Any]:
    # The demo's translator marks the text with its language; a real one calls a model
    # through the effects ledger, under a limit.
    release = ctx.results["collect"]
    lines = "\n".join(f"- [{ctx.item}] {line}" for line in release["changes"])
    return {"language": ctx.item, "title": f"[{ctx.item}] Release {release['version']}",
            "body": lines}  # fmt: skip


def draft_post(ctx: StepContext) -> dict[str, Any]:
    release = ctx.results["collect"]
    lines = "\n".join(f"- {line}" for line in release["changes"])
    return {
        "article_id": f"release-notes-{release['version']}",
        "title": f"Release {release['version']}",
        "body": f"What is new in {release['version']}:\n\n{lines}",
    }


def publish(ctx: StepContext) -> dict[str, Any]:
    translations = ctx.results["translate"]
    published = publish_approved(
        ctx, "review_post", "draft_post", extra={"translations": translations}
    )
    return {
        "remote_id": published["remote_id"],
        "languages": [t["language"] for t in translations],
    }


RELEASE_NOTES = register(
    check_workflow(
        Workflow(
            "release_notes",
            1,
            steps=(
                StepSpec("collect", collect),
                StepSpec(
                    "translate",
                    translate,
                    after=("collect",),
                    fan_out=languages,
                    max_items=MAX_LANGUAGES,
                ),
                StepSpec("draft_post", draft_post, after=("collect",)),
                approval_step(
                    "review_post",
                    draft_from="draft_post",
                    action="publish",
                    summary=lambda ctx: (
                        f"Publishes the notes of release {ctx.payload['version']} with "
                        f"{len(ctx.payload.get('languages', []))} translations to "
                        f"{settings.PUBLISH_URL}"
                    ),
                    group="editors",
                    expires_after=timedelta(hours=48),
                    on_expiry="cancel",
                    editable=("title", "body"),
                    check_draft=check_article_draft,
                    after=("draft_post",),
                ),
                StepSpec(
                    "publish",
                    publish,
                    after=("translate", "review_post"),
                    max_attempts=5,
                    backoff_base=1.0,
                    backoff_cap=60.0,
                ),
            ),
            validate_payload=validate_release,
            description=(
                "Translate a release's notes into each language at once while an editor "
                "approves the post; publish both together, once."
            ),
        )
    )
)
