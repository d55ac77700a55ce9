"""Agents' own telemetry over OpenTelemetry: Claude Code, Codex CLI and Gemini CLI export
their prompts, tool decisions and timings as OTLP; flowtrial receives them on the proxy
(:mod:`.receiver`) or imports them from files (:mod:`.importer`), maps each agent's events
(:mod:`.claude_code`, :mod:`.codex`, :mod:`.gemini_cli`) and links them to the participant's
cycles (:mod:`.ingest`). Needs the ``[telemetry]`` extra (``opentelemetry-proto``)."""
