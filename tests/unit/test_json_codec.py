"""The JSON codec (``core/_json.py``) gives the standard library's answer with orjson or
without: the same JSON value for what it takes, the same error type for what it refuses."""

from __future__ import annotations

import enum
import json
import math
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from django_pgqueue.core import _json
from django_pgqueue.core._validation import encode_payload
from django_pgqueue.exceptions import PayloadError


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 2


class Name(str):
    pass


@dataclass
class Point:
    x: int


_deep: list[Any] = []
for _ in range(400):
    _deep = [_deep]

TAKEN = [
    None,
    True,
    0,
    -(2**63),
    2**64,  # past orjson's range
    2**200,
    1.5,
    -0.0,
    1e-07,
    1e300,
    "",
    "é€😀 \u2028 \x7f",
    "tab\tnewline\ncontrol\x01",
    {"a": [1, 2.5, {"b": None}], "c": (1, "x")},
    {
        1: "int key",
        False: "bool key",
        None: "none key",
        2.5: "float key",
    },  # keys the standard library converts
    OrderedDict(b=1, a=2),
    Level.HIGH,  # an int subclass: written as its int
    Name("a str subclass"),
    _deep,  # deeper than orjson goes
]

REFUSED = [
    math.nan,
    math.inf,
    {"x": [-math.inf]},
    uuid.UUID(int=1),
    Color.RED,
    datetime(2026, 1, 1, tzinfo=UTC),
    Point(1),
    b"bytes",
    {1.5j: 1},
    {(1, 2): "tuple key"},
    object(),
]


@pytest.fixture(params=["orjson", "json"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "orjson":
        monkeypatch.setattr(_json, "orjson", pytest.importorskip("orjson"))
    else:
        monkeypatch.setattr(_json, "orjson", None)
    return str(request.param)


def _standard(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


@pytest.mark.parametrize("value", TAKEN, ids=lambda v: type(v).__name__)
def test_what_the_standard_library_writes_is_written_as_the_same_value(
    backend: str, value: Any
) -> None:
    text = _json.dumps(value)
    assert json.loads(text) == json.loads(_standard(value))
    assert _json.loads(text) == json.loads(text)
    assert "\n" not in text and "\t" not in text  # the COPY rows rely on it


@pytest.mark.parametrize("value", REFUSED, ids=lambda v: type(v).__name__)
def test_what_the_standard_library_refuses_is_refused(backend: str, value: Any) -> None:
    with pytest.raises((TypeError, ValueError)) as standard:
        _standard(value)
    with pytest.raises(type(standard.value)):
        _json.dumps(value)
    with pytest.raises(PayloadError):
        encode_payload(value, 1 << 20)


def test_a_circular_reference_is_refused(backend: str) -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError):
        _json.dumps(loop)


def test_a_lone_surrogate_is_refused_by_encode_payload(backend: str) -> None:
    with pytest.raises(PayloadError, match="surrogate"):
        encode_payload({"s": "\ud800"}, 1 << 20)


@pytest.mark.parametrize(
    "text",
    [
        '{"a":1,"b":[1.5,-0.0,null,true],"c":"é"}',
        "[1e400]",
        "[9223372036854775807,-9223372036854775808]",
        "123456789012345678901234567890",
        '{"n":-18446744073709551616}',
        "[" * 300 + "]" * 300,
    ],
)
def test_decoding_gives_the_standard_librarys_value(backend: str, text: str) -> None:
    decoded, standard = _json.loads(text), json.loads(text)
    assert decoded == standard
    assert json.dumps(decoded) == json.dumps(standard)  # int stays int, float float


def test_text_that_is_not_json_is_a_value_error(backend: str) -> None:
    with pytest.raises(ValueError):
        _json.loads("{nope")
