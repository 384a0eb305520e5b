"""The artifact loader's imports on a thread of their own (studio.runtime.aot_artifacts):
a process that will load compiled engines imports them beside its other work."""

from __future__ import annotations

import ast
import subprocess
import sys

CHECK = """
import sys
from studio.runtime import aot_artifacts
names = aot_artifacts.LOADER_MODULES
before = [n for n in names if n in sys.modules]
thread = aot_artifacts.import_loader_aside()
assert thread.daemon and thread.name == "import-artifact-loader"
thread.join(120)
assert aot_artifacts.import_loader_aside() is thread  # once per process
print(before)
print([n for n in names if n in sys.modules])
"""


def test_the_loader_modules_are_imported_on_a_daemon_thread() -> None:
    # a new process: the test session may have imported Inductor already
    run = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=180, check=True
    )
    before, after = (ast.literal_eval(line) for line in run.stdout.splitlines()[-2:])
    assert before == []
    # Inductor's loader everywhere; Triton's modules only where Triton is installed (a GPU)
    assert "torch._inductor.standalone_compile" in after
    assert "torch._inductor.async_compile" in after
