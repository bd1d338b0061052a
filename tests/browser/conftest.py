"""The browser tests: Debian's chromium, driven by Playwright's sync API, against the live
server, with one real Celery worker per module on the test database and this run's Redis
keys (as in ``tests/engine/test_e2e_celery.py``).

The database is transactional (the worker and the live server's thread see what a test
commits), so each test makes its own personas; each test gets its own browser context.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from tests.browser.support import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, VIEWPORT
from tests.e2e_support import Worker, worker_on_test_database
from tests.remotes import LoopbackRemote

expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.skip(
            f"the browser tests drive Debian's chromium, missing at {CHROMIUM}: "
            "apt-get install -y chromium"
        )
    # Between its calls Playwright's sync API marks its event loop as running in this
    # thread, which Django's async-safety check takes for an async context. The ORM calls
    # the tests make here are plain synchronous ones, so the check stands down exactly as
    # long as Playwright runs (function-scoped teardowns, such as the flush, included).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            try:
                yield chromium
            finally:
                chromium.close()


@pytest.fixture
def context(browser: Browser, live_server: Any) -> Iterator[BrowserContext]:
    context = browser.new_context(base_url=live_server.url, viewport=VIEWPORT)
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield context
    finally:
        context.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()


# --- the worker and its remotes -------------------------------------------------------------


@pytest.fixture(scope="module")
def mail_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the module's worker writes the mail it sends (the file mail backend, as in the
    demo); :func:`demo_mail` has the console read it there."""
    return tmp_path_factory.mktemp("browser-mail")


@pytest.fixture(scope="module")
def worker(
    django_db_setup: None,
    tmp_path_factory: pytest.TempPathFactory,
    module_remotes: tuple[LoopbackRemote, LoopbackRemote],
    live_server: Any,
    mail_folder: Path,
) -> Iterator[Worker]:
    """One worker (with beat, so the sweeper runs) for the module."""
    # The worker keeps Django's async-safety check (see ``browser``), whichever fixture
    # started first.
    inherited = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    with worker_on_test_database(
        tmp_path_factory.mktemp("browser-worker"),
        module_remotes,
        what="the browser tests",
        env=inherited,
        # Reported again within a second of a test emptying the tables, so the pages
        # list it.
        TASKS_HEARTBEAT_SECONDS="1",
        # Its mail goes to files, and links in it lead to this run's console.
        EMAIL_FILE_PATH=str(mail_folder),
        CONSOLE_BASE_URL=live_server.url,
    ) as process:
        yield process


@pytest.fixture
def demo_mail(settings: Any, mail_folder: Path) -> Path:
    """The console reads the worker's mail (its Mail page), as in the demo."""
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.filebased.EmailBackend",
            "OPTIONS": {"file_path": str(mail_folder)},
        }
    }
    return mail_folder
