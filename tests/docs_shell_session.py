"""Run by ``manage.py shell -c`` for tests/docs_support.py, in the shell's process: imports
a page's modules, then pastes its shell blocks line by line into one console over the
shell's namespace, as its python console reads lines pasted into it; writes what failed,
by block, to the file ``DOCS_RUN_RESULTS`` names."""

from __future__ import annotations

import code
import importlib
import json
import os
import sys
import traceback
from pathlib import Path

from django.core.management.commands.shell import Command

spec = json.loads(Path(os.environ["DOCS_RUN_SPEC"]).read_text())
failures: dict[str, str] = {}
for line, name in spec["modules"]:
    # Every process imports an installed app's workflows module when Django starts.
    if name.endswith(".workflows") and name not in sys.modules:
        failures[str(line)] = f"{name} was not imported when Django started"
        continue
    try:
        importlib.import_module(name)
    except BaseException:
        failures[str(line)] = traceback.format_exc()


class Paste(code.InteractiveConsole):
    line = 0

    def write(self, data: str) -> None:  # only tracebacks and syntax errors come here
        failures[str(self.line)] = failures.get(str(self.line), "") + data


console = Paste(Command().get_namespace(verbosity=0))
for line, text in spec["shell"]:
    console.line = line
    for source in text.splitlines():
        console.push(source)
    if console.push(""):  # the Enter that ends a compound statement, and it did not
        console.write("the block ends inside an unfinished statement\n")
        console.resetbuffer()
Path(os.environ["DOCS_RUN_RESULTS"]).write_text(json.dumps(failures))
