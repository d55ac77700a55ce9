"""Where focus went, in one word: a small documented mapping from app names and URLs.

A study that does not keep content stores only the app and one of seven categories for a
focus event (no window title, no URL):

==========  =======================================================================
editor      code editors and IDEs (VS Code, Cursor, JetBrains IDEs, Vim, Emacs, …)
terminal    terminal emulators and multiplexers
browser     web browsers, when the active tab is none of the categories below
chat        messaging and meetings (Slack, Teams, Discord, Zoom, …) and AI chat sites
mail        mail clients and web mail
docs        documentation, notes and PDF readers, documentation sites and Q&A sites
other       everything else
==========  =======================================================================

App names are compared after :func:`normalize_app` (lower case, ``.exe``/``.app`` dropped),
the same normalization ``flowtrial.analysis.switches`` applies, so ActivityWatch's ``Code.exe``
(Windows), ``Code`` (macOS) and ``code`` (Linux WM_CLASS) are one app. For browsers the host
of the active tab refines the category (``mail.google.com`` → mail).
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

import pandas as pd

__all__ = [
    "CATEGORIES", "category_for_app", "category_for_url", "host_is_working", "host_of",
    "is_browser", "normalize_app", "working_set",
]

CATEGORIES = ("editor", "terminal", "browser", "chat", "mail", "docs", "other")

_APPS: dict[str, tuple[str, ...]] = {
    "editor": (
        "code", "code - insiders", "code-insiders", "code-oss", "cursor", "windsurf",
        "vscodium", "codium", "zed", "zed-editor", "sublime_text", "sublime text", "subl",
        "pycharm", "pycharm64", "idea", "idea64", "intellij idea", "webstorm", "goland",
        "clion", "rider", "rustrover", "phpstorm", "rubymine", "datagrip", "fleet",
        "android studio", "studio64", "xcode", "vim", "gvim", "nvim", "neovim", "neovide",
        "emacs", "helix", "hx", "kate", "gedit", "gnome-text-editor", "notepad++", "nova",
        "bbedit", "textmate", "atom", "lapce", "eclipse", "spyder", "jupyterlab",
    ),
    "terminal": (
        "terminal", "iterm2", "iterm", "alacritty", "kitty", "wezterm", "wezterm-gui",
        "gnome-terminal", "gnome-terminal-server", "konsole", "windowsterminal", "warp",
        "ghostty", "tmux", "xterm", "urxvt", "rxvt", "terminator", "tilix", "hyper", "foot",
        "st", "cmd", "powershell", "pwsh", "conhost", "xfce4-terminal", "terminology",
        "qterminal", "lxterminal", "mate-terminal", "tabby", "ptyxis", "kgx", "rio",
    ),
    "browser": (
        "firefox", "firefox-esr", "firefox developer edition", "google-chrome", "google chrome",
        "chrome", "chromium", "chromium-browser", "brave", "brave-browser", "brave browser",
        "safari", "microsoft edge", "msedge", "microsoft-edge", "opera", "vivaldi",
        "vivaldi-stable", "arc", "librewolf", "zen", "zen browser", "floorp", "waterfox",
        "epiphany", "orion", "thorium",
    ),
    "chat": (
        "slack", "discord", "teams", "microsoft teams", "ms-teams", "zoom", "zoom.us",
        "telegram", "telegram desktop", "telegramdesktop", "signal", "whatsapp", "element",
        "mattermost", "skype", "messages", "wechat", "rocket.chat", "zulip", "webex",
        "facetime", "chatgpt", "claude",
    ),
    "mail": (
        "thunderbird", "mail", "outlook", "microsoft outlook", "olk", "evolution",
        "mailspring", "spark", "geary", "kmail", "betterbird", "airmail", "mimestream",
    ),
    "docs": (
        "notion", "obsidian", "evince", "okular", "preview", "acrobat", "adobe acrobat",
        "acrord32", "zathura", "libreoffice", "soffice", "winword", "microsoft word", "pages",
        "zeal", "dash", "devdocs", "logseq", "joplin", "bear", "notes", "onenote",
        "sioyek", "foxit reader", "sumatrapdf",
    ),
}
_APP_CATEGORY: dict[str, str] = {app: cat for cat, apps in _APPS.items() for app in apps}
# Prefixes for families whose window class carries a product suffix.
_PREFIXES: tuple[tuple[str, str], ...] = (
    ("jetbrains-", "editor"), ("code - ", "editor"), ("visual studio", "editor"),
    ("firefox", "browser"), ("google-chrome", "browser"), ("microsoft edge", "browser"),
)

# Hosts (and their subdomains) of the active browser tab.
_HOSTS: dict[str, tuple[str, ...]] = {
    "chat": (
        "slack.com", "app.slack.com", "discord.com", "teams.microsoft.com",
        "teams.live.com", "zoom.us", "meet.google.com", "web.whatsapp.com",
        "web.telegram.org", "chat.openai.com", "chatgpt.com", "claude.ai",
        "gemini.google.com", "copilot.microsoft.com", "perplexity.ai", "chat.mistral.ai",
        "chat.deepseek.com", "app.element.io", "chat.google.com",
    ),
    "mail": (
        "mail.google.com", "outlook.live.com", "outlook.office.com", "outlook.office365.com",
        "mail.proton.me", "app.fastmail.com", "mail.yahoo.com", "app.hey.com",
    ),
    "docs": (
        "docs.python.org", "developer.mozilla.org", "readthedocs.io", "readthedocs.org",
        "docs.rs", "doc.rust-lang.org", "pkg.go.dev", "go.dev", "stackoverflow.com",
        "stackexchange.com", "superuser.com", "serverfault.com", "devdocs.io",
        "cppreference.com", "learn.microsoft.com", "docs.github.com", "notion.so",
        "confluence.atlassian.com", "atlassian.net", "wikipedia.org", "man7.org",
        "pypi.org", "npmjs.com", "docs.docker.com", "kubernetes.io",
    ),
}
_HOST_CATEGORY: dict[str, str] = {h: cat for cat, hosts in _HOSTS.items() for h in hosts}


def normalize_app(name: object) -> str | None:
    """Lower-case app name without ``.exe``/``.app`` (None for a missing or blank name).

    ActivityWatch reports both suffixes; the importer and the analysis must agree on names.
    """
    if name is None or name != name or name is pd.NA:  # None, NaN, pandas NA
        return None
    s = str(name).strip().lower()
    for suffix in (".exe", ".app"):
        if s.endswith(suffix):
            s = s[: -len(suffix)]
    return s or None


def category_for_app(app: object) -> str:
    """The category of an app name (``other`` when unknown)."""
    a = normalize_app(app)
    if a is None:
        return "other"
    hit = _APP_CATEGORY.get(a)
    if hit is not None:
        return hit
    for prefix, cat in _PREFIXES:
        if a.startswith(prefix):
            return cat
    return "other"


def is_browser(app: object) -> bool:
    return category_for_app(app) == "browser"


def host_of(url: object) -> str | None:
    """The lower-case host of a URL (None if it has none, e.g. ``about:blank``)."""
    if not isinstance(url, str) or not url:
        return None
    try:
        host = urlsplit(url.strip()).hostname
    except ValueError:
        return None
    return host.lower().removeprefix("www.") if host else None


def _lookup_host(host: str, table: dict[str, str]) -> str | None:
    # The host itself, then each parent domain: docs.example.readthedocs.io → readthedocs.io.
    parts = host.split(".")
    for i in range(len(parts) - 1):
        hit = table.get(".".join(parts[i:]))
        if hit is not None:
            return hit
    return None


def category_for_url(url: object) -> str:
    """The category of the active browser tab's URL (``browser`` when not chat/mail/docs)."""
    host = host_of(url)
    if host is None:
        return "browser"
    hit = _lookup_host(host, _HOST_CATEGORY)
    if hit is not None:
        return hit
    if host.startswith(("docs.", "doc.", "developer.", "devdocs.", "wiki.")):
        return "docs"
    return "browser"


def working_set(apps: Iterable[str]) -> frozenset[str]:
    """Normalized names of working apps (entries may also be web hosts such as ``claude.ai``,
    matched against the host of the active browser tab)."""
    return frozenset(a for a in (normalize_app(x) for x in apps) if a)


def host_is_working(url: object, working: frozenset[str]) -> str | None:
    """The working-app entry that the URL's host (or a parent domain) matches, else None."""
    host = host_of(url)
    if host is None:
        return None
    parts = host.split(".")
    for i in range(len(parts) - 1):
        cand = ".".join(parts[i:])
        if cand in working:
            return cand
    return None
