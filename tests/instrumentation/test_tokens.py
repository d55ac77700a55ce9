"""The approximate tokenizer: lossless splitting, cl100k-like pieces, speed on the token path."""

from __future__ import annotations

import inspect
import json.decoder
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from flowtrial.instrumentation.tokens import count_tokens, split_tokens

# Text that stresses the whitespace / punctuation / digit rules, plus arbitrary Unicode.
_code_alphabet = st.sampled_from(
    [*"ab_Z9 0\t\n\r'\"(){}[]:;.,=+-*/#<>\\", "é", "你", "²", "\x1c", "\u2028"]
)
_texts = st.one_of(st.text(), st.text(alphabet=_code_alphabet, max_size=200))


@given(_texts)
@settings(max_examples=400, deadline=None)
def test_pieces_join_back_to_the_input(text: str) -> None:
    pieces = split_tokens(text)
    assert "".join(pieces) == text
    assert all(pieces)  # no empty pieces
    assert count_tokens(text) == len(pieces)


def test_pieces_follow_cl100k_pretokenization() -> None:
    assert split_tokens("def foo(x):\n    return x") == [
        "def", " foo", "(x", "):\n", "   ", " return", " x",
    ]
    assert split_tokens("it's they'LL") == ["it", "'s", " they", "'LL"]
    assert split_tokens("1234567") == ["123", "456", "7"]
    assert split_tokens("a  b\n\n\tc") == ["a", " ", " b", "\n\n", "\tc"]
    assert split_tokens("snake_case") == ["snake", "_case"]
    assert split_tokens("") == []


def test_counts_are_in_a_realistic_range_for_code() -> None:
    source = inspect.getsource(json.decoder)
    # Real BPE tokenizers give ~3.5-4.5 characters per token on Python source.
    chars_per_token = len(source) / count_tokens(source)
    assert 3.0 < chars_per_token < 5.5


def test_fast_enough_for_the_token_path() -> None:
    kb = inspect.getsource(json.decoder)[:1024]
    runs = 300
    start = time.perf_counter()
    for _ in range(runs):
        split_tokens(kb)
    per_kb = (time.perf_counter() - start) / runs
    # ~0.1 ms per KB on a laptop; the bound leaves room for a loaded CI machine.
    assert per_kb < 0.002
