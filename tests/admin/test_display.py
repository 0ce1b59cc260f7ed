"""Escaping, truncation and formatting helpers of the admin pages."""

from __future__ import annotations

import datetime as dt

import pytest

from django_pgqueue.admin.display import (
    errors_html,
    json_html,
    json_preview,
    short_duration,
    traceback_html,
)


def test_json_is_escaped_pretty_printed_and_truncated() -> None:
    html = json_html({"b": "</pre><script>x</script>", "a": [1, 2]}, limit=60)
    assert html.startswith('<pre class="pgq-json">{\n  &quot;a&quot;: [\n    1,')
    assert "<script>" not in html
    assert "more characters)</pre>" in html


def test_preview_is_one_short_line() -> None:
    text = json_preview({"k": "v" * 500})
    assert "\n" not in text
    assert text.startswith('{"k":"vvv')
    assert text.endswith("more characters)")


def test_non_json_values_do_not_crash_the_page() -> None:
    assert "datetime" not in json_preview(dt.datetime(2026, 1, 1))  # rendered via str()
    assert errors_html("not a list") == "<span>no failed attempts</span>"
    assert traceback_html(None) == "<span>—</span>"
    assert "&lt;b&gt;" in errors_html(["<b>odd entry</b>"])


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (42.9, "42 s"), (125, "2 min 5 s"), (3 * 3600 + 720, "3 h 12 min"),
     (2 * 86400 + 4 * 3600, "2 d 4 h"), (-5, "0 s")],
)  # fmt: skip
def test_short_duration(seconds: float, text: str) -> None:
    assert short_duration(dt.timedelta(seconds=seconds)) == text
