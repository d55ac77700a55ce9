"""Approximate tokenizer shared by the simulated model and the proxy's shaper.

No vocabulary files and no downloads: a single compiled regex in the spirit of the GPT-2 /
cl100k pre-tokenizers (contractions, letter runs with one leading non-letter, digit runs of up
to three, punctuation runs, newline-aware whitespace). Each pre-token counts as one token,
which tracks real BPE counts for code and English within roughly 10-20 % (real BPE splits long
or rare words further, and CJK text much further).

The pieces always concatenate back to the input, so text can be re-chunked at token
boundaries without changing a byte.
"""

from __future__ import annotations

import re

__all__ = ["TOKEN_PATTERN", "count_tokens", "split_tokens"]

# The stdlib `re` has no \p{L} / \p{N}, so the classes are built from \w:
#   letters        [^\W\d_]      (word chars minus digits and underscore)
#   "other" char   [^\r\n\w]|_   (cl100k's [^\r\n\p{L}\p{N}]: punctuation, spaces, underscore)
# Alternatives are tried in order; together they cover every character, which is what makes
# "".join(split_tokens(s)) == s hold (the final \s+ and the punctuation run catch the rest).
# Spelled out without inline flags and with possessive runs: ~20 % faster under `re` than the
# literal cl100k spelling, same output.
TOKEN_PATTERN: re.Pattern[str] = re.compile(
    r"""'(?:[sdmtSDMT]|[lL][lL]|[vV][eE]|[rR][eE])"""  # contractions: 's 't 're 've 'm 'll 'd
    r"""|[^\r\n\w]?[^\W\d_]++|_[^\W\d_]++"""  # a word, optionally after one space/symbol
    r"""|\d{1,3}"""  # numbers in groups of up to three digits
    r"""| ?(?:[^\s\w]|_)++[\r\n]*"""  # a punctuation run, optional leading space, newlines after
    r"""|\s*[\r\n]+"""  # line breaks (with the whitespace before them)
    r"""|\s+(?!\S)"""  # whitespace not followed by a word (indentation keeps its last space)
    r"""|\s+"""
)

_findall = TOKEN_PATTERN.findall


def split_tokens(text: str) -> list[str]:
    """Split `text` into approximate tokens; `"".join(split_tokens(text)) == text`."""
    return _findall(text)


def count_tokens(text: str) -> int:
    """Approximate number of tokens in `text` (the length of `split_tokens(text)`)."""
    return len(_findall(text))
