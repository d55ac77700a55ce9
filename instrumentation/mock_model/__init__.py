"""The built-in simulated model: an offline upstream speaking the OpenAI and Anthropic APIs.

`MockModel` answers in-process (`respond`, `respond_ws`); `app.create_mock_app` serves it over
HTTP and WebSocket; `commands.mock_model` is the `flowtrial mock-model` CLI command.
"""

from .model import CYCLE_ID_HEADER, MODEL_IDS, MockModel, MockReply

__all__ = ["CYCLE_ID_HEADER", "MODEL_IDS", "MockModel", "MockReply"]
