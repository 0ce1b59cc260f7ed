"""Enqueue: transactional promises, NOTIFY once per transaction per queue, bad input."""

import datetime as dt
import decimal
import math

import pytest
from django.apps import apps
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

import django_pgqueue
from django_pgqueue.conf import SettingsError
from django_pgqueue.core import operations
from django_pgqueue.exceptions import InvalidMessage, PayloadError, QueueNameError
from django_pgqueue.models import Message
from tests.conftest import drain
from tests.sessions import lose_prepared_statements

pytestmark = pytest.mark.django_db(transaction=True)


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_enqueue_writes_one_message_with_defaults():
    sent = django_pgqueue.enqueue("send-email", {"to": "a@example.com"})
    row = Message.objects.get(pk=sent.id)
    assert (row.queue, row.task, row.payload) == ("default", "send-email", {"to": "a@example.com"})
    assert row.priority == 0 and row.attempts == 0 and row.max_attempts == 3
    assert row.lease_token is None
    assert row.available_at == row.enqueued_at == sent.enqueued_at


def test_rollback_leaves_no_message_and_sends_no_notification(listener):
    with pytest.raises(RuntimeError), transaction.atomic():
        django_pgqueue.enqueue("send-email", {"n": 1})
        raise RuntimeError("business logic failed")
    assert Message.objects.count() == 0
    assert drain(listener) == []


def test_commit_sends_exactly_one_notification_per_queue(listener):
    with transaction.atomic():
        for n in range(5):
            django_pgqueue.enqueue("a", {"n": n}, queue="alpha")
        django_pgqueue.enqueue("b", {"n": 0}, queue="beta")
        assert drain(listener, timeout=0.2) == [], "nothing is delivered before commit"
    notes = drain(listener)
    assert sorted(notes) == [("django_pgqueue", "alpha"), ("django_pgqueue", "beta")]


def test_notification_payload_is_the_queue_name_only(listener):
    django_pgqueue.enqueue("a", {"secret": "x" * 1000}, queue="alpha")
    assert drain(listener) == [("django_pgqueue", "alpha")]


def test_scheduled_messages_say_so_in_their_notification(listener):
    # Ready now: the queue name; scheduled: the queue name and ":later", so that workers look
    # up the next due time only when something scheduled came. One of each per transaction.
    with transaction.atomic():
        django_pgqueue.enqueue("a", {}, queue="alpha")
        django_pgqueue.enqueue("a", {}, queue="alpha", run_after=dt.timedelta(seconds=30))
        django_pgqueue.enqueue("a", {}, queue="alpha", run_after=dt.timedelta(seconds=60))
        django_pgqueue.enqueue("b", {}, queue="beta", run_after=timezone.now())
        django_pgqueue.enqueue_many("c", [{}, {}], queue="gamma", run_after=dt.timedelta(hours=1))
    assert sorted(drain(listener)) == [
        ("django_pgqueue", "alpha"),
        ("django_pgqueue", "alpha:later"),
        ("django_pgqueue", "beta:later"),
        ("django_pgqueue", "gamma:later"),
    ]


def test_resuming_a_queue_wakes_workers_for_what_is_ready_and_what_is_scheduled(listener):
    operations.pause_queue("alpha")
    operations.resume_queue("alpha")
    assert sorted(drain(listener)) == [
        ("django_pgqueue", "alpha"),
        ("django_pgqueue", "alpha:later"),
    ]


def test_notify_can_be_turned_off(listener):
    with override_settings(PGQUEUE={"NOTIFY": False}):
        django_pgqueue.enqueue("a", {})
        django_pgqueue.enqueue_many("a", [{}, {}])
    assert drain(listener) == []
    assert Message.objects.count() == 3


def test_enqueue_on_commit_waits_for_the_commit(listener):
    with transaction.atomic():
        django_pgqueue.enqueue_on_commit("a", {"n": 1})
        assert Message.objects.count() == 0
    assert Message.objects.count() == 1
    assert drain(listener) == [("django_pgqueue", "default")]


def test_enqueue_on_commit_after_rollback_writes_nothing(listener):
    with pytest.raises(RuntimeError), transaction.atomic():
        django_pgqueue.enqueue_on_commit("a", {"n": 1})
        raise RuntimeError
    assert Message.objects.count() == 0
    assert drain(listener) == []


def test_enqueue_on_commit_outside_a_transaction_writes_at_once():
    django_pgqueue.enqueue_on_commit("a", {"n": 1})
    assert Message.objects.count() == 1


def test_enqueue_on_commit_validates_immediately():
    with transaction.atomic():
        with pytest.raises(PayloadError):
            django_pgqueue.enqueue_on_commit("a", {"when": dt.datetime.now()})
        assert Message.objects.count() == 0


def test_enqueue_many_writes_all_rows_and_sends_one_notification(listener):
    written = django_pgqueue.enqueue_many("bulk", ({"i": i} for i in range(10_000)), queue="bulk")
    assert written == 10_000
    assert Message.objects.filter(queue="bulk").count() == 10_000
    assert drain(listener) == [("django_pgqueue", "bulk")]
    first, last = Message.objects.order_by("id")[:1][0], Message.objects.order_by("-id")[:1][0]
    assert first.payload == {"i": 0} and last.payload == {"i": 9999}


def test_enqueue_many_validates_everything_before_writing():
    payloads = [{"i": 1}, {"i": 2}, {"bad": {1, 2}}]
    with pytest.raises(PayloadError):
        django_pgqueue.enqueue_many("bulk", payloads)
    assert Message.objects.count() == 0


def test_enqueue_many_with_dedup_keys_skips_live_duplicates():
    django_pgqueue.enqueue("t", {}, dedup_key="k1")
    written = django_pgqueue.enqueue_many("t", [{}, {}, {}], dedup_keys=["k1", "k2", "k3"])
    assert written == 2
    assert sorted(Message.objects.values_list("dedup_key", flat=True)) == ["k1", "k2", "k3"]


def test_dedup_key_returns_the_live_message():
    first = django_pgqueue.enqueue("t", {"v": 1}, dedup_key="order-7")
    second = django_pgqueue.enqueue("t", {"v": 2}, dedup_key="order-7")
    assert second.id == first.id and second.deduplicated and not first.deduplicated
    assert Message.objects.count() == 1
    other_queue = django_pgqueue.enqueue("t", {}, dedup_key="order-7", queue="other")
    assert other_queue.id != first.id


def test_run_after_timedelta_is_added_to_database_time():
    before = db_now()
    sent = django_pgqueue.enqueue("t", {}, run_after=dt.timedelta(minutes=10))
    assert sent.available_at - before >= dt.timedelta(minutes=10)
    assert sent.available_at - before < dt.timedelta(minutes=10, seconds=5)


def test_run_after_aware_datetime_is_kept():
    when = timezone.now() + dt.timedelta(days=1)
    sent = django_pgqueue.enqueue("t", {}, run_after=when)
    assert sent.available_at == when


def test_enqueue_many_delay_uses_database_time():
    before = db_now()
    django_pgqueue.enqueue_many("t", [{}, {}], run_after=dt.timedelta(seconds=30))
    for available_at in Message.objects.values_list("available_at", flat=True):
        assert dt.timedelta(seconds=30) <= available_at - before < dt.timedelta(seconds=35)


@pytest.mark.parametrize(
    "queue",
    ["", "Default", "has space", "x" * 49, "'; DROP TABLE pgqueue_message --", "-lead", "ünï", 7],
)
def test_invalid_queue_names_are_refused_before_any_sql(queue, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(QueueNameError):
        django_pgqueue.enqueue("t", {}, queue=queue)


@pytest.mark.parametrize(
    "payload",
    [dt.datetime(2026, 1, 1), decimal.Decimal("1.5"), {1, 2}, object(), {"x": math.nan}, b"raw"],
)
def test_non_json_payloads_are_refused(payload):
    with pytest.raises(PayloadError, match="not JSON-serializable"):
        django_pgqueue.enqueue("t", payload)
    assert Message.objects.count() == 0


def test_oversized_payload_is_refused():
    with override_settings(PGQUEUE={"MAX_PAYLOAD_BYTES": 1024}):
        with pytest.raises(PayloadError, match="over the 1024-byte cap"):
            django_pgqueue.enqueue("t", {"blob": "x" * 2000})
        django_pgqueue.enqueue("t", {"blob": "x" * 500})
    assert Message.objects.count() == 1


def test_default_cap_is_256_kib():
    with pytest.raises(PayloadError):
        django_pgqueue.enqueue("t", "x" * (256 * 1024))


@pytest.mark.parametrize("priority", [101, -101, 1.5, True, "1"])
def test_priority_out_of_range_is_refused(priority):
    with pytest.raises(InvalidMessage, match="priority"):
        django_pgqueue.enqueue("t", {}, priority=priority)


def test_naive_run_after_is_refused():
    with pytest.raises(InvalidMessage, match="aware datetime"):
        django_pgqueue.enqueue("t", {}, run_after=dt.datetime(2030, 1, 1))


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"dedup_key": ""}, {"tenant": "x" * 300}])
def test_other_bad_arguments_are_refused(kwargs):
    with pytest.raises(InvalidMessage):
        django_pgqueue.enqueue("t", {}, **kwargs)


def test_empty_task_name_is_refused():
    with pytest.raises(InvalidMessage, match="task name"):
        django_pgqueue.enqueue("", {})


def test_unknown_setting_is_refused_at_enqueue():
    with override_settings(PGQUEUE={"MAX_PAYLOAD_BYTE": 10}), pytest.raises(SettingsError):
        django_pgqueue.enqueue("t", {})
    assert Message.objects.count() == 0


def test_database_constraints_back_the_validation(admin_conn):
    import psycopg

    with pytest.raises(psycopg.errors.CheckViolation):
        admin_conn.execute(
            "INSERT INTO pgqueue_message (queue, task, payload, priority) VALUES ('ok', 't', '{}', 500)"
        )
    with pytest.raises(psycopg.errors.CheckViolation):
        admin_conn.execute(
            "INSERT INTO pgqueue_message (queue, task, payload) VALUES ('Bad Name', 't', '{}')"
        )


QUEUE_NAMES = [
    *("a", "0", "default", "a-b", "a_b", "ab-", "9lives", "x" * 48),
    *("", "-a", "_a", "A", "Emails", "a b", "a.b", "a/b", "é", "a\n", "a%", "x" * 49),
]


@pytest.mark.parametrize("table", ["pgqueue_message", "pgqueue_queue"])
def test_the_databases_queue_name_rule_is_the_validators(admin_conn, table):
    # The CHECK spells QUEUE_NAME_PATTERN without its length bound (models.py): both must
    # accept and refuse the same names.
    import psycopg

    from django_pgqueue.core._validation import validate_queue_name
    from django_pgqueue.exceptions import QueueNameError

    insert = {
        "pgqueue_message": "INSERT INTO pgqueue_message (queue, task) VALUES (%s, 't')",
        "pgqueue_queue": "INSERT INTO pgqueue_queue (name) VALUES (%s)",
    }[table]
    for name in QUEUE_NAMES:
        try:
            validate_queue_name(name)
            valid = True
        except QueueNameError:
            valid = False
        try:
            with admin_conn.transaction():
                admin_conn.execute(insert, [name])
            stored = True
        except (psycopg.errors.CheckViolation, psycopg.errors.StringDataRightTruncation):
            stored = False
        assert stored is valid, name


@pytest.mark.parametrize(
    ("table", "constraint"),
    [("pgqueue_message", "pgq_message_queue_name"), ("pgqueue_queue", "pgq_queue_name_valid")],
)
def test_the_queue_name_check_is_one_unbounded_regular_expression(admin_conn, table, constraint):
    # The CHECK runs on every write of a row: each enqueue (prepared again per statement) and
    # each row a claim updates. One regular expression without a bounded repetition costs
    # PostgreSQL the least of the spellings measured (docs/benchmarks.md, design measurements).
    definition = admin_conn.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND conname = %s",
        [table, constraint],
    ).fetchone()[0]
    assert " ~ " in definition and "{" not in definition, definition
    assert "ltrim" not in definition, definition


def test_a_registered_handlers_queue_and_max_attempts_are_the_defaults():
    from django_pgqueue.core._registry import registry

    @django_pgqueue.handler("tests.routed", queue="routed", max_attempts=7)
    def routed(payload):
        return None

    try:
        sent = django_pgqueue.enqueue("tests.routed", {})
        row = Message.objects.get(pk=sent.id)
        assert (row.queue, row.max_attempts) == ("routed", 7)
        explicit = django_pgqueue.enqueue("tests.routed", {}, queue="other", max_attempts=2)
        row = Message.objects.get(pk=explicit.id)
        assert (row.queue, row.max_attempts) == ("other", 2)
        assert django_pgqueue.enqueue_many("tests.routed", [{}, {}]) == 2
        assert Message.objects.filter(queue="routed", max_attempts=7).count() == 3
    finally:
        registry.unregister("tests.routed")


@pytest.mark.skipif(not apps.is_installed("demo"), reason="the demo app needs a Tasks framework")
def test_handlers_modules_are_imported_at_startup():
    from django_pgqueue.core._registry import registry

    # example_project/demo/handlers.py, found without anything importing it explicitly.
    handler = registry.get("demo.send-welcome")
    assert handler is not None and handler.queue == "emails"


def prepared_enqueues() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements "
            "WHERE statement LIKE '%%INSERT INTO pgqueue_message%%'"
        )
        return cursor.fetchone()[0]


def test_enqueue_survives_a_session_that_drops_prepared_statements(listener):
    django_pgqueue.enqueue("t", {"n": 1})
    assert prepared_enqueues() == 1
    lose_prepared_statements(connection)
    second = django_pgqueue.enqueue("t", {"n": 2})
    third = django_pgqueue.enqueue("t", {"n": 3}, dedup_key="k")
    assert django_pgqueue.enqueue("t", {"n": 4}, dedup_key="k").id == third.id
    assert sorted(Message.objects.values_list("payload__n", flat=True)) == [1, 2, 3]
    assert second.id in set(Message.objects.values_list("id", flat=True))
    # One wake-up per committed enqueue; none for the deduplicated one.
    assert drain(listener) == [("django_pgqueue", "default")] * 3


@pytest.mark.parametrize("queue", ["default", "fair"])
@pytest.mark.parametrize("use_tz", [True, False])
@pytest.mark.parametrize("run_after", [None, dt.timedelta(minutes=5), "absolute"])
def test_enqueue_result_equals_the_stored_row(settings, use_tz, run_after, queue):
    # In autocommit enqueue() skips Django's cursor (_send.run): the timestamps must come
    # back exactly as Django loads the row.
    settings.TIME_ZONE = "America/New_York"
    settings.USE_TZ = use_tz
    settings.PGQUEUE = {"QUEUES": {"fair": {"FAIRNESS": True}}}
    if run_after == "absolute":
        run_after = dt.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
    sent = django_pgqueue.enqueue(
        "t", {"k": "v"}, run_after=run_after, priority=-7, queue=queue, tenant="acme"
    )
    assert prepared_enqueues() == 1
    stored = Message.objects.get(pk=sent.id)
    assert (sent.enqueued_at, sent.available_at) == (stored.enqueued_at, stored.available_at)
    assert (sent.available_at.tzinfo is None) is (not use_tz)
    if run_after is None:
        assert sent.available_at == sent.enqueued_at
    elif isinstance(run_after, dt.timedelta):
        assert sent.available_at - sent.enqueued_at == run_after
    else:
        assert stored.available_at.timestamp() == run_after.timestamp()


def test_enqueue_goes_through_djangos_cursor_when_queries_are_observed():
    from django.db import connection as conn
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(conn) as captured:
        sent = django_pgqueue.enqueue("t", {"n": 1})
    assert [q for q in captured.captured_queries if "INSERT INTO pgqueue_message" in q["sql"]]
    assert Message.objects.get(pk=sent.id).payload == {"n": 1}


def test_the_direct_path_raises_djangos_exceptions():
    from django.db import DataError

    from django_pgqueue.core import _send

    assert _send.direct(connection)
    with pytest.raises(DataError):
        _send.run(connection, "SELECT 1 / %s", [0])
    # The session carries on: the error ended its implicit transaction.
    assert _send.run(connection, "SELECT 1 / %s", [1]) == [(1,)]
    with pytest.raises(DataError):
        _send.run(connection, "SELECT 1 / %s", [0], plan={"jit": "off"})
    assert _send.run(connection, "SELECT 1 / %s", [1], plan={"jit": "off"}) == [(1,)]


def test_enqueue_many_copies_awkward_payloads_and_keys_exactly():
    # COPY's text is assembled by hand (_enqueue._copy): backslashes, escapes and separators
    # inside payloads and the shared columns must survive unchanged.
    payloads = [
        {"s": "a\\b\tc\nd\re", "q": '"quoted"', "u": "é \u2028 ✓"},
        "\\\\N",
        ["\\t", "\\n", None, 1.5],
        {"nested": {"\\": "\\\\"}},
    ] * 1500  # several COPY writes
    written = django_pgqueue.enqueue_many(
        "t\\ask", payloads, tenant="ten\\ant\tx", run_after=dt.timedelta(seconds=30), priority=4
    )
    assert written == len(payloads)
    rows = list(Message.objects.order_by("id").values_list("payload", "task", "tenant", "priority"))
    assert [r[0] for r in rows] == payloads
    assert {r[1:] for r in rows} == {("t\\ask", "ten\\ant\tx", 4)}
    first = Message.objects.order_by("id").first()
    assert first.available_at - first.enqueued_at >= dt.timedelta(seconds=29)


def test_enqueue_and_enqueue_on_commit_take_the_same_arguments():
    # One validation (prepare_message) behind both: their parameters must not drift apart.
    import inspect

    from django_pgqueue.core._enqueue import MessageOptions, prepare_message

    now = inspect.signature(django_pgqueue.enqueue).parameters
    later = inspect.signature(django_pgqueue.enqueue_on_commit).parameters
    assert list(now.values()) == list(later.values())
    options = inspect.signature(prepare_message).parameters
    assert [(p.name, p.annotation) for p in options.values() if p.kind == p.KEYWORD_ONLY] == [
        (name, getattr(annotation, "__forward_arg__", annotation))
        for name, annotation in MessageOptions.__annotations__.items()
    ]
