"""The claim texts (core/_claim_sql.py): whole statements that share their reaper and lease."""

from __future__ import annotations

import re

import pytest

from django_pgqueue.core import _claim_sql

CLAIMS = {
    "plain": _claim_sql.PLAIN_CLAIM,
    "bounded": _claim_sql.BOUNDED_CLAIM,
    "flow": _claim_sql.FLOW_CLAIM,
}


def parts(text: str) -> tuple[str, str, str]:
    """The reaper, the candidates and the lease of a claim."""
    reaper, rest = text.split("), candidates AS (")
    candidates, lease = rest.split("), batch AS (")
    return reaper, candidates, lease


def test_every_claim_has_the_same_reaper():
    reapers = {kind: parts(text)[0] for kind, text in CLAIMS.items()}
    assert reapers["bounded"] == reapers["plain"]
    assert reapers["flow"] == reapers["plain"]


def test_every_claim_leases_the_same_way_but_for_the_fair_order_and_the_walk_position():
    def lease(kind: str) -> str:
        text = parts(CLAIMS[kind])[2]
        text = re.sub(r"fair_order = .*\n", "fair_order = <order>\n", text)
        return re.sub(r"array_agg\(.*\) AS places\n", "array_agg(<walk>) AS places\n", text)

    assert lease("bounded") == lease("plain")
    assert lease("flow") == lease("plain")


@pytest.mark.parametrize("kind", CLAIMS)
def test_a_claim_takes_its_batch_size_as_a_parameter(kind):
    text = CLAIMS[kind]
    assert "%(batch)s" in text
    assert not re.search(r"LIMIT \d+\s+FOR UPDATE SKIP LOCKED\n\), batch", text)
    assert "{" not in text.replace("'{}'", "")  # no template left to fill in
