"""CLI command: `flowtrial mock-model` (registered by the lead in study/cli.py)."""

from __future__ import annotations

import math
import socket
from typing import Annotated

import typer


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _answer_range(text: str) -> tuple[int, int]:
    """``N`` or ``LO-HI`` as a (lo, hi) token range (a one-line error otherwise)."""
    lo, _, hi = text.strip().partition("-")
    try:
        rng = (int(lo), int(hi or lo))
    except ValueError:
        rng = (0, 0)
    if not 1 <= rng[0] <= rng[1]:
        _fail(f"--answer-tokens must be N or LO-HI with 1 <= LO <= HI, got {text!r}")
    return rng


def mock_model(
    port: Annotated[int, typer.Option(help="Port to listen on (0 picks a free one).")] = 8788,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    tokens_per_second: Annotated[
        float, typer.Option(help="Pace of content after the first token (inf: no pacing).")
    ] = 2000,
    ttft_ms: Annotated[float, typer.Option(help="Delay before the first content token.")] = 20,
    seed: Annotated[int, typer.Option(help="Seed: same seed and request, same answer.")] = 0,
    tool_steps: Annotated[int, typer.Option(
        help="Answer requests that offer tools with a harmless tool call (list a directory, "
             "pwd) for the first N steps of each turn, then with text.")] = 0,
    answer_tokens: Annotated[str | None, typer.Option(
        help="Long answers: every prose answer N tokens (e.g. 2000), or N drawn per request "
             "from LO-HI (e.g. 1500-3000); deterministic for the seed.")] = None,
) -> None:
    """Serve the built-in simulated model: OpenAI (chat, completions, responses incl.
    WebSocket mode) and Anthropic Messages wire formats, offline, with no API key."""
    if not 0 <= port <= 65535:
        _fail(f"--port must be between 0 and 65535, got {port}")
    if not tokens_per_second > 0:
        _fail(f"--tokens-per-second must be > 0 (or inf), got {tokens_per_second}")
    if not (ttft_ms >= 0 and math.isfinite(ttft_ms)):
        _fail(f"--ttft-ms must be a number >= 0, got {ttft_ms}")
    if tool_steps < 0:
        _fail(f"--tool-steps must be >= 0, got {tool_steps}")
    length = None if answer_tokens is None else _answer_range(answer_tokens)

    import uvicorn

    from .app import create_mock_app
    from .model import MockModel

    # Bind first so a busy port is one clear line (and --port 0 can print the real port).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        _fail(f"cannot listen on {host}:{port} ({exc.strerror}): pick another --port")
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host

    model = MockModel(tokens_per_second=tokens_per_second, ttft_ms=ttft_ms, seed=seed,
                      tool_steps=tool_steps, answer_tokens=length)
    typer.echo(f"flowtrial simulated model at http://{shown}:{bound}/v1")
    typer.echo(f"  OpenAI clients:    base_url=http://{shown}:{bound}/v1  (any API key)")
    typer.echo(f"  Anthropic clients: ANTHROPIC_BASE_URL=http://{shown}:{bound}")
    typer.echo(f"  pace: first token after {ttft_ms:g} ms, then {tokens_per_second:g} tokens/s")
    config = uvicorn.Config(create_mock_app(model), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])
