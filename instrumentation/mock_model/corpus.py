"""The simulated model's answers: loading the shipped corpus and choosing one per request."""

from __future__ import annotations

import functools
import random
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from ..tokens import count_tokens

__all__ = ["Answer", "Corpus", "guess_language", "load_corpus"]

Kind = Literal["chat", "code"]

# Fence info strings and corpus languages mapped onto the families a prompt can ask for.
_FAMILY = {
    "py": "python",
    "python": "python",
    "ts": "typescript",
    "tsx": "typescript",
    "typescript": "typescript",
    "js": "typescript",
    "jsx": "typescript",
    "javascript": "typescript",
    "go": "go",
    "rust": "rust",
    "rs": "rust",
    "sql": "sql",
    "bash": "shell",
    "sh": "shell",
    "shell": "shell",
    "makefile": "shell",
    "yaml": "config",
    "dockerfile": "config",
    "java": "java",
    "c": "c",
    "css": "css",
    "text": "prose",
}

# Cues that a prompt is about one language family; the family with most hits wins. Kept
# conservative (explicit names, file suffixes, unmistakable syntax) so that plain English
# ("go through this") does not steer the choice.
_CUES: dict[str, re.Pattern[str]] = {
    family: re.compile(pattern, re.IGNORECASE | re.MULTILINE)
    for family, pattern in {
        "python": r"\bpython\b|\.py\b|^\s*def \w+\(|^\s*(?:from \w[\w.]* )?import \w+|\bpytest\b"
        r"|\basyncio\b|\bdataclass",
        "typescript": r"\btype ?script\b|\bjava ?script\b|\.[jt]sx?\b|\breact\b|\bnode(?:\.?js)?\b"
        r"|^\s*(?:export )?(?:const|let) \w+ ?=|^\s*interface \w+|\bnpm\b",
        "go": r"\bgolang\b|\bgoroutines?\b|^\s*func \w*\(|^\s*package \w+$|\.go\b"
        r"|\bgo (?:test|mod)\b",
        "rust": r"\brust\b|\bcargo\b|^\s*(?:pub )?fn \w+|\blet mut\b|^\s*impl\b|\.rs\b|\bborrow",
        "sql": r"\bsql\b|\bpostgres(?:ql)?\b|\bmysql\b|\bsqlite\b|\bselect\b[^;]*\bfrom\b"
        r"|\bindex(?:es)?\b|\bmigrations?\b",
        "shell": r"\bbash\b|\bshell\b|\bgit\b|#!/|\bgrep\b|\bfind\b\s+\.|\bterminal\b|\bmakefile\b",
        "config": r"\bdocker(?:file)?\b|\bkubernetes\b|\bk8s\b|\byaml\b|\bgithub actions\b|\bci\b",
        "java": r"\bjava\b(?!\s*script)|\bspring\b|\.java\b",
        "c": r"\bc\b(?: code| program|\s+language)|\bmalloc\b|#include\b|\.c\b",
        "css": r"\bcss\b|\bflexbox\b|\bcenter a div\b",
    }.items()
}

_CUE_WINDOW = 4000  # characters
_FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_MIN_EXTRACTED_TOKENS = 12  # tiny fenced snippets make poor inline completions


@dataclass(frozen=True)
class Answer:
    """One answer text; `kind` "code" means bare code with no prose or fences."""

    id: str
    kind: Kind
    language: str
    text: str

    @property
    def family(self) -> str:
        return _FAMILY.get(self.language, self.language)


def guess_language(text: str) -> str | None:
    """The language family a prompt is most clearly about, or None when nothing stands out.

    Only the last few thousand characters count: an agent's latest input can be a long tool
    output, and the cues near its end are the ones that matter.
    """
    text = text[-_CUE_WINDOW:]
    best, best_hits = None, 0
    for family, cue in _CUES.items():
        hits = len(cue.findall(text))
        if hits > best_hits:
            best, best_hits = family, hits
    return best


@dataclass(frozen=True)
class Corpus:
    """Chat answers (prose + fenced code) and code answers (bare code) to draw from."""

    chat: tuple[Answer, ...]
    code: tuple[Answer, ...]

    def pick(self, rng: random.Random, *, code_only: bool, language: str | None) -> Answer:
        """Draw an answer, preferring the requested language family when the pool has one."""
        pool = self.code if code_only else self.chat
        if language is not None:
            matching = [a for a in pool if a.family == language]
            if matching:
                pool = tuple(matching)
        return rng.choice(pool)


def _extract_code(answer: Answer) -> list[Answer]:
    """The fenced blocks of a chat answer, as extra bare-code answers."""
    blocks = []
    for n, match in enumerate(_FENCE.finditer(answer.text)):
        code = match.group(2).rstrip("\n")
        if count_tokens(code) >= _MIN_EXTRACTED_TOKENS:
            language = match.group(1).lower() or answer.language
            blocks.append(Answer(f"{answer.id}#{n}", "code", language, code))
    return blocks


def parse_corpus_text(text: str, source: str = "<corpus>") -> list[Answer]:
    """Parse one corpus TOML document (`[[answer]]` tables with id, kind, language, text)."""
    answers = []
    for entry in tomllib.loads(text).get("answer", []):
        kind = entry.get("kind")
        if kind not in ("chat", "code") or not str(entry.get("text", "")).strip():
            raise ValueError(f"{source}: answer {entry.get('id')!r} needs kind chat|code and text")
        # Keep leading spaces (a completion can start mid-line); drop the newlines TOML's
        # multi-line strings put around the text.
        answers.append(Answer(entry["id"], kind, entry["language"], entry["text"].strip("\n")))
    return answers


@functools.cache
def load_corpus() -> Corpus:
    """Load every `answers/*.toml` shipped in the package (once per process)."""
    answers: list[Answer] = []
    folder = resources.files("flowtrial.instrumentation.mock_model.answers")
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".toml"):
            answers.extend(parse_corpus_text(item.read_text(encoding="utf-8"), item.name))
    ids = [a.id for a in answers]
    if len(set(ids)) != len(ids):
        raise ValueError("corpus answer ids must be unique")
    chat = tuple(a for a in answers if a.kind == "chat")
    code = tuple(a for a in answers if a.kind == "code")
    extracted = tuple(block for a in chat for block in _extract_code(a))
    return Corpus(chat=chat, code=code + extracted)
