"""U+0000 in a payload is refused up front: jsonb cannot store it (added with the pipeline)."""

from __future__ import annotations

import pytest

from django_pgqueue.core._validation import encode_payload
from django_pgqueue.exceptions import PayloadError


@pytest.mark.parametrize("payload", [{"e": "c\x00"}, ["\x00"], {"k\x00": 1}, "a\\\\\x00"])
def test_nul_characters_are_refused(payload: object) -> None:
    with pytest.raises(PayloadError, match="NUL"):
        encode_payload(payload, 10_000)


@pytest.mark.parametrize("payload", ["\\u0000", {"path": "C:\\u0000x"}, "\\\\u0000"])
def test_a_literal_backslash_u0000_text_is_fine(payload: object) -> None:
    assert encode_payload(payload, 10_000)
