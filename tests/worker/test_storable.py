"""What the worker writes to jsonb: checked and capped in the handler's thread (no database)."""

from __future__ import annotations

import pytest

from django_pgqueue.exceptions import ResultNotSerializable
from django_pgqueue.worker.storable import (
    describe_exception,
    encode_result,
    log_excerpt,
    storable_text,
    truncated,
)

from .faultapp.handlers import BAD_TEXT, BrokenStr


@pytest.mark.parametrize("kind", sorted(BAD_TEXT))
@pytest.mark.parametrize(
    "shape", [lambda t: t, lambda t: {"a": [1, {"b": t}]}, lambda t: {t: 1}, lambda t: [t]]
)
def test_a_result_jsonb_cannot_store_is_refused(kind: str, shape) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ResultNotSerializable, match="cannot store"):
        encode_result(shape(BAD_TEXT[kind]), 10_000)


@pytest.mark.parametrize(
    "value",
    [
        "\\u0000 spelled out, not a NUL",  # a backslash and 'u0000' are plain text
        "\\ud800 spelled out",
        "\ud83d\ude00 a surrogate pair is a character",
        "한국어",  # \ud55c: an escape starting \ud that is no surrogate
        {"\\u0000": ["\\\\u0000"]},
    ],
)
def test_storable_results_that_look_suspect_pass(value: object) -> None:
    assert encode_result(value, 10_000) is not None


def test_a_result_over_the_size_cap_is_refused() -> None:
    assert encode_result("x" * 98, 100) == '"' + "x" * 98 + '"'
    with pytest.raises(ResultNotSerializable, match=r"102 bytes .* MAX_RESULT_BYTES \(100\)"):
        encode_result("x" * 100, 100)


def test_storable_text_spells_what_jsonb_refuses_as_escapes() -> None:
    assert storable_text("a\x00b\ud800c\udc80") == "a\\x00b\\xd800c\\xdc80"
    assert storable_text("pair \ud83d\ude00 stays") == "pair \ud83d\ude00 stays"


def test_truncation_is_marked_and_keeps_the_end_of_a_traceback() -> None:
    assert truncated("abcdef", 6) == "abcdef"
    assert truncated("abcdefgh", 4) == "abcd…[truncated 4 chars]"
    assert truncated("abcdefgh", 4, keep_end=True) == "ab…[truncated 4 chars]gh"


def test_describe_exception_caps_and_cleans_message_and_traceback() -> None:
    try:
        raise ValueError("\x00" + "x" * 5_000)
    except ValueError as exc:
        type_name, message, trace = describe_exception(exc, max_message=50, max_traceback=300)
    assert type_name == "builtins.ValueError"
    assert message.startswith("\\x00xxx") and message.endswith("…[truncated 4951 chars]")
    assert trace.startswith("Traceback (most recent call last):")
    assert "…[truncated " in trace and trace.endswith("xxx\n")
    assert len(trace) < 300 + 40 and "\x00" not in trace


def test_describe_exception_survives_a_broken_str() -> None:
    type_name, message, trace = describe_exception(
        BrokenStr(), max_message=100, max_traceback=1_000
    )
    assert type_name.endswith("BrokenStr")
    assert message == f"<str() of the {type_name} failed>"
    assert trace  # placeholder or text: never an error


def test_log_excerpt_is_one_bounded_line() -> None:
    assert log_excerpt("card=4111 1111\n1111 1111", 9) == "card=4111…"
    assert log_excerpt("short\nline", 200) == "short line"
    assert log_excerpt("anything", 0) == ""
    assert log_excerpt(None, 10) == ""
