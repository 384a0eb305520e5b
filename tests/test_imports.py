"""Modules imported ahead on a thread (studio.imports): what a later stage needs, imported
while the main thread waits on the device."""

from __future__ import annotations

import ast
import subprocess
import sys

CHECK = """
import sys
from studio.imports import import_aside
names = ["scipy.signal", "no_such_module_for_studio", "torch._inductor.standalone_compile"]
before = [n for n in names if n in sys.modules]
thread = import_aside(names)
assert thread.daemon and thread.name == "import-aside"
thread.join(120)
assert not thread.is_alive()
print(before)
print([n for n in names if n in sys.modules])
"""


def test_modules_are_imported_on_a_daemon_thread_and_missing_ones_skipped() -> None:
    # a new process: the test session has imported SciPy and Inductor already
    run = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=180, check=True
    )
    before, after = (ast.literal_eval(line) for line in run.stdout.splitlines()[-2:])
    assert before == []
    assert after == ["scipy.signal", "torch._inductor.standalone_compile"]
