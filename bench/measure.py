"""Result records and the timing helpers every scenario uses."""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from .pg import Snapshot, StatsProbe


@dataclass
class Result:
    """One case of one repetition."""

    key: str  # stable id, e.g. "raw.copy"; ratios and plots refer to it
    scenario: str  # enqueue / drain / latency / claim / producers / steady / memory
    system: str  # raw psycopg / django-pgqueue / PgQueuer / ...
    variant: str
    rep: int
    ref: str | None = None  # key of the raw reference this case is compared with
    n: int = 0
    seconds: float = 0.0
    rate: float | None = None  # messages per second
    tx_per_msg: float | None = None
    wal_per_msg: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Recorder:
    """Collects results, appends each to a JSON-lines file as it comes in, and prints it."""

    def __init__(self, path: str | None, quiet: bool = False) -> None:
        self.results: list[Result] = []
        self.path = path
        self.quiet = quiet

    def add(self, result: Result) -> Result:
        self.results.append(result)
        if self.path:
            with open(self.path, "a") as out:
                out.write(json.dumps(result.to_json()) + "\n")
        if not self.quiet:
            parts = [f"[rep {result.rep}] {result.key:<34} n={result.n:<8}"]
            if result.rate is not None:
                parts.append(f"{result.rate:>10,.0f}/s")
            if result.tx_per_msg is not None:
                parts.append(f"tx/msg={result.tx_per_msg:.4f}")
            if result.wal_per_msg is not None:
                parts.append(f"WAL/msg={result.wal_per_msg:,.0f}B")
            for k, v in result.extra.items():
                if isinstance(v, float):
                    parts.append(f"{k}={v:.2f}")
                elif isinstance(v, int | str):
                    parts.append(f"{k}={v}")
            print("  ".join(parts), flush=True)
        return result


FLUSH_STATS = "SELECT pg_stat_force_next_flush()"
EXIT_SETTLE_SECONDS = 0.3


@dataclass
class Timed:
    probe: StatsProbe
    seconds: float = 0.0
    start: Snapshot | None = None
    end: Snapshot | None = None
    wal_end: int = 0
    extra_tx: int = 0  # transactions of the harness itself inside the timed phase

    def finish(self) -> None:
        """The end snapshot: call it once every process that worked has flushed its
        statistics (harness connections are flushed on leaving ``timed``; helper processes
        flush when they exit)."""
        if self.end is None:
            time.sleep(EXIT_SETTLE_SECONDS)
            self.end = self.probe.snapshot()

    def transactions(self) -> int:
        """Commits in the timed phase, the harness's own left out (after ``finish``)."""
        assert self.start is not None and self.end is not None
        return self.end.xact_commit - self.start.xact_commit - self.extra_tx

    def wal_bytes(self) -> int:
        """WAL written in the timed phase."""
        assert self.start is not None
        return self.wal_end - self.start.wal_lsn

    def per_message(self, n: int) -> tuple[float, float]:
        """Transactions and WAL bytes per message, ``n`` messages handled in the timed phase."""
        self.finish()
        return max(self.transactions(), 0) / n, self.wal_bytes() / n


def flush_stats(conns: list[Any]) -> int:
    """Make each connection's backend publish its counters now, not up to 10 s later
    (Postgres batches them). Accepts psycopg or Django connections; returns how many
    transactions that took."""
    for conn in conns:
        if hasattr(conn, "cursor") and hasattr(conn, "alias"):  # a Django connection
            with conn.cursor() as cur:
                cur.execute(FLUSH_STATS)
        else:
            conn.execute(FLUSH_STATS)
    return len(conns)


@contextmanager
def timed(probe: StatsProbe, conns: list[Any] | None = None) -> Iterator[Timed]:
    """Time a block and take the server's cost around it: the WAL position right at the
    end, the commit counter once the backends have published their statistics.

    ``conns``: the harness's own connections that work inside the block (flushed before
    and after; the flush transactions are not counted). Defaults to Django's default
    connection."""
    if conns is None:
        from django.db import connection

        conns = [connection]
    flush_stats(conns)
    time.sleep(EXIT_SETTLE_SECONDS)
    box = Timed(probe=probe, start=probe.snapshot())
    t0 = time.perf_counter()
    yield box
    box.seconds = time.perf_counter() - t0
    box.wal_end = probe.wal_now()
    box.extra_tx += flush_stats(conns)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN when there are no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def latency_summary(samples_ms: list[float]) -> dict[str, float]:
    if not samples_ms:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {
        "p50_ms": statistics.median(samples_ms),
        "p99_ms": percentile(samples_ms, 99),
        "max_ms": max(samples_ms),
        "samples": len(samples_ms),
    }


class UdpCollector:
    """Handlers report "<ms since enqueue-call start>" datagrams here (no database work).

    Enqueue time and handler-start time are both ``time.time()`` on this host. A datagram
    is ``[tag:]milliseconds``; the tag tells systems measured at the same time apart.
    """

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.samples: list[float] = []
        self.tagged: dict[str, list[float]] = {}
        # When each report arrived (time.time()), per tag: throughput over time.
        self.arrivals: dict[str, list[float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, _ = self.sock.recvfrom(256)
            except TimeoutError:
                continue
            except OSError:
                return
            text = data.decode(errors="replace")
            tag, _, value = text.rpartition(":")
            try:
                ms = float(value)
            except ValueError:
                continue
            self.samples.append(ms)
            self.tagged.setdefault(tag, []).append(ms)
            self.arrivals.setdefault(tag, []).append(time.time())

    def reset(self) -> None:
        self.samples = []
        self.tagged = {}
        self.arrivals = {}

    def count(self, tag: str) -> int:
        return len(self.tagged.get(tag, []))

    def wait_for(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.samples) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return len(self.samples) >= count

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)
        self.sock.close()


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@dataclass
class CaseRun:
    """One case's share of an interleaved measurement."""

    n: int = 0
    seconds: float = 0.0
    cost: Timed | None = None
    cost_n: int = 0

    @classmethod
    def timed(cls, box: Timed, n: int) -> CaseRun:
        """A case measured in one timed block, ``n`` messages in it."""
        return cls(n=n, seconds=box.seconds, cost=box, cost_n=n)


def interleaved(
    probe: StatsProbe,
    conns: list[Any],
    rounds: int,
    cases: list[tuple[str, Callable[[int], int]]],
    cost_round: int = 0,
) -> dict[str, CaseRun]:
    """Run the cases in ``rounds`` alternating slices (order rotated every round), so that a
    burst of load from other tenants hits every case alike: their ratios are then honest
    even when absolute rates swing 2-5x on a shared box. ``fn(round)`` does one slice and
    returns how many messages it handled. The server cost (transactions, WAL) is taken
    around each case's slice in ``cost_round``."""
    runs = {key: CaseRun() for key, _ in cases}
    for r in range(rounds):
        shift = r % len(cases)
        for key, fn in cases[shift:] + cases[:shift]:
            run = runs[key]
            if r == cost_round:
                with timed(probe, conns) as box:
                    n = fn(r)
                box.finish()
                run.cost, run.cost_n = box, n
                run.seconds += box.seconds
            else:
                t0 = time.perf_counter()
                n = fn(r)
                run.seconds += time.perf_counter() - t0
            run.n += n
    return runs


def result_from_run(
    run: CaseRun,
    *,
    key: str,
    scenario: str,
    system: str,
    variant: str,
    rep: int,
    ref: str | None = None,
    **extra: Any,
) -> Result:
    tx = wal = None
    if run.cost is not None and run.cost_n:
        tx, wal = run.cost.per_message(run.cost_n)
    return Result(
        key=key,
        scenario=scenario,
        system=system,
        variant=variant,
        rep=rep,
        ref=ref,
        n=run.n,
        seconds=run.seconds,
        rate=run.n / run.seconds if run.seconds else None,
        tx_per_msg=tx,
        wal_per_msg=wal,
        extra=dict(extra),
    )
