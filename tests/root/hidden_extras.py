"""Run flowtrial commands in this process as if some optional packages were not installed.

``python -m tests.root.hidden_extras '{"hide": [...], "runs": [[name, argv], ...]}'`` hides
the named imports (and their submodules) the way a missing package is missing — importing
one raises ModuleNotFoundError, ``find_spec`` on it too — then runs each command line through
flowtrial's CLI and prints one JSON line: per run its exit code, stdout, stderr and any
traceback that escaped.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import io
import json
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType


class HideModules(importlib.abc.MetaPathFinder):
    """A finder (first on sys.meta_path) for which the hidden modules do not exist."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> None:
        if any(fullname == n or fullname.startswith(n + ".") for n in self.names):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def run(argv: list[str]) -> dict[str, object]:
    """One command line through ``flowtrial.cli.app``, as the console script runs it."""
    from flowtrial.cli import app

    out, err = io.StringIO(), io.StringIO()
    code: object = None
    escaped = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            app(args=argv, prog_name="flowtrial")
        except SystemExit as exc:
            code = exc.code
        except BaseException:  # noqa: BLE001 - what a user would see as a traceback
            escaped = traceback.format_exc()
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
            "traceback": escaped}


def main() -> None:
    job = json.loads(sys.argv[1])
    sys.meta_path.insert(0, HideModules(job["hide"]))
    for name in list(sys.modules):  # nothing hidden may be loaded already (.pth files)
        if any(name == n or name.startswith(n + ".") for n in job["hide"]):
            del sys.modules[name]
    results = {name: run(argv) for name, argv in job["runs"]}
    sys.__stdout__.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
