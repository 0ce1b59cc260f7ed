"""One ``/metrics`` for a group of workers: children's expositions summed, counters kept."""

from __future__ import annotations

from django_pgqueue.metrics.merge import GroupMetrics, combine, parse, render

CHILD_1 = """\
# HELP pgqueue_worker_info This worker process.
# TYPE pgqueue_worker_info gauge
pgqueue_worker_info{hostname="h",worker_id="w.1"} 1.0
# HELP pgqueue_worker_messages_processed_total Messages archived.
# TYPE pgqueue_worker_messages_processed_total counter
pgqueue_worker_messages_processed_total{queue="default",task="a b"} 3.0
# HELP pgqueue_worker_handler_duration_seconds Handler run time.
# TYPE pgqueue_worker_handler_duration_seconds histogram
pgqueue_worker_handler_duration_seconds_bucket{le="0.1",queue="default",task="a b"} 2.0
pgqueue_worker_handler_duration_seconds_bucket{le="+Inf",queue="default",task="a b"} 3.0
pgqueue_worker_handler_duration_seconds_count{queue="default",task="a b"} 3.0
pgqueue_worker_handler_duration_seconds_sum{queue="default",task="a b"} 0.25
# HELP pgqueue_worker_in_flight Messages leased.
# TYPE pgqueue_worker_in_flight gauge
pgqueue_worker_in_flight 2.0
# HELP pgqueue_worker_database_silence_seconds Seconds since.
# TYPE pgqueue_worker_database_silence_seconds gauge
pgqueue_worker_database_silence_seconds 0.5
"""

CHILD_2 = (
    CHILD_1.replace('worker_id="w.1"', 'worker_id="w.2"')
    .replace("} 3.0", "} 4.0")
    .replace("silence_seconds 0.5", "silence_seconds 7.0")
)


def sample(body: bytes, key: str) -> float:
    for line in body.decode().splitlines():
        if line.startswith(key + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{key} not in:\n{body.decode()}")


def test_samples_of_the_same_name_and_labels_are_summed() -> None:
    body = render(combine([parse(CHILD_1), parse(CHILD_2)]))
    key = 'pgqueue_worker_messages_processed_total{queue="default",task="a b"}'
    assert sample(body, key) == 7
    assert (
        sample(body, 'pgqueue_worker_handler_duration_seconds_count{queue="default",task="a b"}')
        == 7
    )
    assert sample(body, "pgqueue_worker_in_flight") == 4
    # Each child's info stays its own; the silence is the largest child's.
    assert sample(body, 'pgqueue_worker_info{hostname="h",worker_id="w.1"}') == 1
    assert sample(body, 'pgqueue_worker_info{hostname="h",worker_id="w.2"}') == 1
    assert sample(body, "pgqueue_worker_database_silence_seconds") == 7
    assert body.decode().count("# TYPE pgqueue_worker_messages_processed_total counter") == 1


def test_a_retired_child_keeps_its_counters_but_not_its_gauges() -> None:
    group = GroupMetrics()
    first = group.scraped("w.1", CHILD_1)
    second = group.scraped("w.2", CHILD_2)
    key = 'pgqueue_worker_messages_processed_total{queue="default",task="a b"}'
    assert sample(group.exposition([first, second], {}), key) == 7
    group.retire("w.1")
    body = group.exposition([second], {})
    assert sample(body, key) == 7  # never backwards
    assert sample(body, "pgqueue_worker_in_flight") == 2
    assert 'worker_id="w.1"' not in body.decode()
    group.retire("w.1")  # twice: nothing more
    assert sample(group.exposition([second], {}), key) == 7


def test_what_prometheus_client_writes_reads_back() -> None:
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    registry = CollectorRegistry()
    counter = Counter("things", "Things.", ["queue"], registry=registry)
    counter.labels("q").inc(5)
    families = parse(generate_latest(registry).decode())
    body = render(combine([families, families]))
    assert sample(body, 'things_total{queue="q"}') == 10
    assert "things_created" not in body.decode()
