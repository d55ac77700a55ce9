"""Picking a harmless tool from whatever an agent offers, and arguments that fit its schema.

The simulated model drives agents it was never tuned to (``tool_steps``): it reads the
offered tools' names, descriptions and JSON schemas, keeps the read-only kinds (list a
directory, print the working directory, run ``pwd`` through a shell tool, read, search)
and never one whose name or description says it writes, edits, deletes, fetches from the
web, installs, commits or starts a sub-agent. Preference: list, pwd, shell (``pwd``), read,
search. Required arguments are filled from the schema with safe values (paths ``.``,
patterns ``*``, commands ``pwd``, the first of an enum, a schema's own default …); a tool
whose required arguments cannot be filled is passed over. None: answer with text.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["pick_harmless", "safe_arguments"]

_UNSAFE = re.compile(
    r"write|edit|delete|remove|unlink|create|patch|apply|move|rename|replace|kill|install|"
    r"commit|push|upload|fetch|web|http|url|browser|download|todo|task|agent|ask|question|"
    r"notebook|memory|plan|mcp|approve|submit|send|mkdir|rm_|exit|slash|skill", re.I)
_SHELL_NAMES = ("exec_command", "shell", "bash", "run_shell_command", "shell_command",
                "local_shell", "run_terminal_cmd", "execute_command", "run_command",
                "run_commands", "terminal", "execute", "exec", "run")
_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("list", re.compile(r"^(ls|list|list_?dir(ectory)?|list_?files|dir|tree|glob_?dir)$"
                        r"|^list_|_list$|list_dir|list_files|directory_tree", re.I)),
    ("pwd", re.compile(r"^(pwd|cwd|get_?cwd|working_?dir(ectory)?|get_working_directory)$",
                       re.I)),
    ("shell", re.compile("^(" + "|".join(_SHELL_NAMES) + ")$|shell|bash|terminal|command",
                         re.I)),
    ("read", re.compile(r"read|view|^cat$|open_?file|get_?file|show_?file", re.I)),
    ("search", re.compile(r"glob|grep|search|find|lookup", re.I)),
)
_DESCRIBED: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("list", re.compile(r"\blists?\b.*\b(director|folder|files)", re.I)),
    ("pwd", re.compile(r"working directory", re.I)),
    ("read", re.compile(r"\breads?\b.*\bfiles?\b", re.I)),
    ("search", re.compile(r"\bsearch(es)?\b", re.I)),
)
_ORDER = ("list", "pwd", "shell", "read", "search")
_COMMAND = re.compile(r"^(cmd|command|commands|script|shell_command|argv|args)$", re.I)
_PATH = re.compile(r"path|dir|directory|folder|file|cwd|workdir|root|target", re.I)
_PATTERN = re.compile(r"pattern|glob|query|regex|search|term|include", re.I)
_WORDS = re.compile(r"description|reason|explanation|purpose|summary|title|why", re.I)


def _props(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties")
    return props if isinstance(props, dict) else {}


def _command_key(schema: dict[str, Any]) -> str | None:
    return next((k for k in _props(schema) if _COMMAND.match(k)), None)


def _kind(name: str, description: str, schema: dict[str, Any]) -> str | None:
    if _UNSAFE.search(name):
        return None
    for kind, pattern in _KINDS:
        if pattern.search(name) and (kind != "shell" or _command_key(schema) is not None):
            return kind
    if _UNSAFE.search(description):
        return None
    for kind, pattern in _DESCRIBED:
        if pattern.search(description):
            return kind
    return None


def _value(key: str, spec: Any, kind: str, depth: int = 0, pattern: str = "*"
           ) -> tuple[bool, Any]:
    """(could fill, a safe value) for one argument."""
    spec = spec if isinstance(spec, dict) else {}
    if "const" in spec:
        return True, spec["const"]
    if isinstance(spec.get("enum"), list) and spec["enum"]:
        return True, spec["enum"][0]
    if "default" in spec and spec["default"] is not None:
        return True, spec["default"]
    types = spec.get("type")
    type_ = (types if isinstance(types, str) else next(
        (t for t in types if t != "null"), "string") if isinstance(types, list) else None)
    if type_ is None:
        for alt in spec.get("anyOf") or spec.get("oneOf") or []:
            ok, value = _value(key, alt, kind, depth + 1, pattern)
            if ok:
                return ok, value
        type_ = "string"
    if type_ == "string":
        if _COMMAND.match(key) or (kind == "shell" and "command" in key.lower()):
            return True, "pwd"
        if _WORDS.search(key):
            return True, "Print the working directory"
        if _PATTERN.search(key):
            return True, pattern
        return True, "."  # a path, or anything else: the working directory
    if type_ == "array":
        ok, item = _value(key, spec.get("items"), kind, depth + 1, pattern)
        return ok, [item] if ok else None
    if type_ in ("integer", "number"):
        low = spec.get("minimum", spec.get("exclusiveMinimum", 0))
        value = max(1, int(low) + (1 if "exclusiveMinimum" in spec else 0))
        return True, value
    if type_ == "boolean":
        return True, False
    if type_ == "object" and depth < 3:
        return True, safe_arguments(spec, kind, depth + 1, pattern)
    return False, None


def safe_arguments(schema: dict[str, Any], kind: str, depth: int = 0, pattern: str = "*"
                   ) -> dict[str, Any] | None:
    """Arguments for a tool of ``kind`` that fit its JSON schema: the required ones, and a
    path or pattern (``pattern``: ``*`` for a glob, a plain word for a text search) where the
    schema has one (None if a required one cannot be filled)."""
    props = _props(schema)
    required = [r for r in schema.get("required") or [] if isinstance(r, str)]
    wanted = list(required)
    for key in props:
        if key not in wanted and (_PATH.search(key) or _PATTERN.search(key)
                                  or (kind == "shell" and _COMMAND.match(key))):
            wanted.append(key)
    args: dict[str, Any] = {}
    for key in wanted:
        ok, value = _value(key, props.get(key), kind, depth, pattern)
        if ok:
            args[key] = value
        elif key in required:
            return None
    if kind == "shell" and _command_key(schema) not in args and depth == 0:
        return None  # a shell tool must run `pwd`, nothing else
    return args


def pick_harmless(offered: list[tuple[str, str, dict[str, Any]]]
                  ) -> tuple[str, dict[str, Any]] | None:
    """The most harmless of the offered (name, description, schema) tools with arguments,
    or None: answer with text."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, description, schema in offered:
        kind = _kind(name, description or "", schema if isinstance(schema, dict) else {})
        if kind is None or kind in found:
            continue
        text_search = kind == "search" and re.search(r"grep|search|find", name, re.I)
        args = safe_arguments(schema if isinstance(schema, dict) else {}, kind,
                              pattern="TODO" if text_search else "*")
        if args is not None:
            found[kind] = (name, args)
    return next((found[k] for k in _ORDER if k in found), None)
