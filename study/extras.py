"""flowtrial's optional dependencies, in one place: which extra provides which import.

Every command and optional feature asks here before it needs an extra (``require``) or
whether one is there (``available``); a missing one is one line naming the extra to
install (exit code 2 in the CLI), never a traceback. Detection imports nothing heavy: it asks
the import system where a top-level package would come from (``find_spec``), and looks
inside a package only when its parent is there (``find_spec("a.b")`` imports ``a`` and
raises when ``a`` is missing).

The lists mirror ``[project.optional-dependencies]`` in ``pyproject.toml`` by import name;
``tests/study/test_extras.py`` keeps the two in step.
"""

from __future__ import annotations

import importlib.util

from .errors import FlowtrialError

__all__ = ["EXTRAS", "MissingExtraError", "available", "extra_of_module", "install_hint",
           "missing", "require"]

_PROXY = ("starlette", "uvicorn", "httptools", "websockets", "httpx", "jinja2", "orjson")
_ANALYSIS = ("statsmodels", "matplotlib", "jinja2", "threadpoolctl")

#: Extra → the import names it provides (what flowtrial imports from it, own and included).
EXTRAS: dict[str, tuple[str, ...]] = {
    "proxy": _PROXY,
    "analysis": _ANALYSIS,
    "dashboard": ("streamlit", "altair", *_ANALYSIS),
    "postgres": ("psycopg",),
    "parquet": ("pyarrow",),
    "activitywatch": ("aw_client",),
    "telemetry": ("opentelemetry.proto", "google.protobuf", "google.rpc"),
    "demo": ("openai", *_PROXY, *_ANALYSIS),
    "notebooks": ("jupyterlab", *_ANALYSIS),
}


class MissingExtraError(FlowtrialError):
    """A feature was asked for whose optional dependencies are not installed."""

    def __init__(self, extra: str, modules: list[str], what: str) -> None:
        self.extra, self.modules = extra, modules
        super().__init__(f"{what} needs the [{extra}] extra ({', '.join(modules)} "
                         f"{'is' if len(modules) == 1 else 'are'} not installed): "
                         f"{install_hint(extra)}")


def install_hint(extra: str) -> str:
    """The command that installs ``extra``."""
    return f"pip install 'flowtrial[{extra}]'"


def _installed(name: str) -> bool:
    """Whether ``name`` (dotted or not) can be imported, importing at most its parents."""
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        try:
            if importlib.util.find_spec(".".join(parts[:depth])) is None:
                return False
        except (ImportError, ValueError):  # a parent that fails to import, a bad __spec__
            return False
    return True


def missing(extra: str) -> list[str]:
    """The import names of ``extra`` that are not installed (empty when it is complete)."""
    return [name for name in dict.fromkeys(EXTRAS[extra]) if not _installed(name)]


def available(extra: str) -> bool:
    """Whether every package of ``extra`` is installed."""
    return not missing(extra)


def require(extra: str, what: str) -> None:
    """Raise :class:`MissingExtraError` (one line naming the extra) if ``extra`` is not
    complete; ``what`` names the command or feature that needs it (``flowtrial proxy``)."""
    lacking = missing(extra)
    if lacking:
        raise MissingExtraError(extra, lacking, what)


def extra_of_module(name: str) -> str | None:
    """The smallest extra that provides the import ``name`` (or a submodule of it), or None
    if no extra does: a ``ModuleNotFoundError`` that slipped past :func:`require` still gets
    its one-line advice."""
    best: str | None = None
    for extra, modules in EXTRAS.items():
        if any(name == m or name.startswith(m + ".") or m.startswith(name + ".")
               for m in modules):
            if best is None or len(modules) < len(EXTRAS[best]):
                best = extra
    return best
