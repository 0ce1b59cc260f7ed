"""Peers, each in its own virtualenv (bench/.venvs/<peer>), driven through an adapter process
(see protocol.py). Every peer slice is paired with a raw reference slice measured in
alternation with it, so ``x ref`` holds even when the machine's speed drifts; the server
cost is taken in a fresh adapter process that exits before the counters are read."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .. import raw
from ..context import BENCH_DIR, VENVS_DIR, Context
from ..measure import Result, latency_summary, timed
from ..pg import dsn_url

STATS_GAP = 1.1  # Postgres publishes a busy backend's counters at most once a second


@dataclass(frozen=True)
class Peer:
    name: str
    system: str
    package: str
    enqueue_batch: bool
    drains: tuple[tuple[str, str, str], ...]  # (key suffix, adapter argument, variant label)
    slow: bool
    latency_label: str = ""
    postgres: bool = True  # Celery's broker is Redis: no transactions or WAL to count
    slow_drains: tuple[str, ...] = ()  # variants that get the small backlog
    extra_env: dict[str, str] = field(default_factory=dict)


PEERS = {
    p.name: p
    for p in (
        Peer(
            "pgqueuer",
            "PgQueuer",
            "pgqueuer",
            True,
            (
                ("b10", "10", "QueueManager drain, batch_size 10"),
                ("b100", "100", "QueueManager drain, batch_size 100"),
            ),
            slow=False,
            latency_label="idle QueueManager (LISTEN/NOTIFY)",
            slow_drains=("b10",),
        ),
        Peer(
            "procrastinate",
            "Procrastinate",
            "procrastinate",
            True,
            (("c1", "1", "worker concurrency 1"), ("c8", "8", "worker concurrency 8")),
            slow=True,
            latency_label="idle worker (LISTEN/NOTIFY)",
        ),
        Peer(
            "tasksdb",
            "django-tasks-db",
            "django-tasks-db",
            False,
            (("batch", "1", "db_worker --batch in-process, CONN_MAX_AGE=600"),),
            slow=True,
            latency_label="db_worker --interval 0.1 (polling)",
        ),
        Peer(
            "celery",
            "Celery + Redis",
            "celery",
            False,
            (("c2", "2", "worker prefork -c 2"),),
            slow=True,
            latency_label="idle worker, prefork -c 2",
            postgres=False,
        ),
    )
}


class Adapter:
    def __init__(self, ctx: Context, peer: Peer, label: str) -> None:
        python = VENVS_DIR / peer.name / "bin" / "python"
        script = BENCH_DIR / "peers" / f"{peer.name}_adapter.py"
        self.proc = ctx.spawn(
            [str(python), str(script), dsn_url(ctx.dsn)], f"peer-{label}", **peer.extra_env
        )
        line = self._read()
        if line != "ready":
            self.proc.kill()
            raise RuntimeError(f"{peer.name} adapter did not start (see logs/peer-{label}.log)")

    def _read(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def call(self, command: str, *args: object) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join([command, *map(str, args)]) + "\n")
        self.proc.stdin.flush()
        line = self._read()
        if not line:
            raise RuntimeError(f"adapter exited during {command!r}")
        out: dict[str, Any] = json.loads(line)
        if "error" in out:
            raise RuntimeError(f"adapter {command!r}: {out['error']}")
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("exit")
            except Exception:
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def call_all(adapters: list[Adapter], command: str, *args: object) -> list[dict[str, Any]]:
    """The same command sent to every adapter at once; their answers, in order."""
    with ThreadPoolExecutor(len(adapters)) as pool:
        return list(pool.map(lambda a: a.call(command, *args), adapters))


def versions(peers: list[str]) -> dict[str, str]:
    out = {}
    for name in peers:
        peer = PEERS[name]
        python = VENVS_DIR / name / "bin" / "python"
        try:
            out[peer.system] = subprocess.run(
                [
                    str(python),
                    "-c",
                    f"import importlib.metadata as m; print(m.version({peer.package!r}))",
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout.strip()
        except Exception:
            out[peer.system] = "?"
    return out


def _peers(ctx: Context) -> list[Peer]:
    return [PEERS[name] for name in ctx.peers if name in PEERS]


# --- enqueue ---------------------------------------------------------------------------------


def enqueue(ctx: Context, rep: int) -> None:
    s = ctx.sizes
    rounds = 5
    for peer in _peers(ctx):
        n_single = max(1, (s.enqueue_n // 2 if peer.slow else s.enqueue_n) // rounds)
        cases = [("enqueue", "raw.insert1", n_single, "one job per call (autocommit)")]
        if peer.enqueue_batch:
            cases.append(
                (
                    "enqueue_batch",
                    "raw.copy",
                    max(1, s.bulk_n // 5 // rounds),
                    "batch API, 1,000 per call",
                )
            )
        for command, ref, n, variant in cases:
            with raw.connect(ctx.dsn) as conn:
                raw.reset(conn)
                adapter = Adapter(ctx, peer, f"{peer.name}-{command}")
                peer_s = raw_s = 0.0
                try:
                    adapter.call("reset")
                    for r in range(rounds):
                        t0 = time.perf_counter()
                        if ref == "raw.insert1":
                            raw.insert_one_by_one(conn, n, r * n)
                        else:
                            raw.copy_rows(conn, n, r * n)
                        raw_s += time.perf_counter() - t0
                        peer_s += adapter.call(command, n, r * n)["seconds"]
                    adapter.call("reset")
                finally:
                    adapter.close()
                raw.reset(conn)
            cost = _cost(ctx, peer, lambda a, n=n, c=command: a.call(c, n, 0), n)
            ctx.recorder.add(
                _paired_result(
                    peer, rep, command, "enqueue", variant, ref, n * rounds, peer_s, raw_s, cost
                )
            )


def _paired_result(
    peer: Peer,
    rep: int,
    suffix: str,
    scenario: str,
    variant: str,
    ref: str,
    n: int,
    peer_s: float,
    raw_s: float,
    cost: tuple[float | None, float | None],
) -> Result:
    """A peer's slices, beside the raw reference slices measured in alternation with them
    (``raw_s``), with the server cost ``cost`` (transactions, WAL per message)."""
    return Result(
        key=f"peer.{peer.name}.{suffix}",
        scenario=scenario,
        system=peer.system,
        variant=variant,
        rep=rep,
        ref=ref,
        n=n,
        seconds=peer_s,
        rate=n / peer_s,
        tx_per_msg=cost[0],
        wal_per_msg=cost[1],
        extra={"paired_ref_rate": n / raw_s},
    )


def _cost(
    ctx: Context, peer: Peer, work: Any, n: int, load: int = 0
) -> tuple[float | None, float | None]:
    """Transactions and WAL per message of ``work`` in a fresh adapter that then exits; none
    for a peer whose broker is not PostgreSQL."""
    if not peer.postgres:
        return None, None
    adapter = Adapter(ctx, peer, f"{peer.name}-cost")
    try:
        adapter.call("reset")
        time.sleep(STATS_GAP)
        if load:
            adapter.call("load", load, 0)
            time.sleep(STATS_GAP)
        with timed(ctx.probe, []) as box:
            work(adapter)
        adapter.call("reset")
    finally:
        adapter.close()
    return box.per_message(n)


# --- drain -----------------------------------------------------------------------------------


def drain(ctx: Context, rep: int) -> None:
    s = ctx.sizes
    rounds = 5
    for peer in _peers(ctx):
        for suffix, arg, variant in peer.drains:
            slow = peer.slow or suffix in peer.slow_drains
            chunk = max(1, (s.peer_slow_n if slow else s.drain_n) // rounds)
            with raw.connect(ctx.dsn) as conn:
                raw.reset(conn)
                raw.copy_rows(conn, chunk * rounds, queue="pla")
                adapter = Adapter(ctx, peer, f"{peer.name}-drain")
                peer_s = raw_s = 0.0
                done = 0
                try:
                    adapter.call("reset")
                    for r in range(rounds):
                        t0 = time.perf_counter()
                        raw.lease_archive_drain(conn, 100, chunk, "pla")
                        raw_s += time.perf_counter() - t0
                        adapter.call("load", chunk, r * chunk)
                        out = adapter.call("drain", chunk, arg)
                        peer_s += out["seconds"]
                        done += int(out.get("n", chunk))
                    adapter.call("reset")
                finally:
                    adapter.close()
                raw.reset(conn)
            cost = _cost(
                ctx, peer, lambda a, c=chunk, x=arg: a.call("drain", c, x), chunk, load=chunk
            )
            n = chunk * rounds
            result = _paired_result(
                peer,
                rep,
                suffix,
                "drain",
                variant,
                "raw.lease_archive.b100",
                n,
                peer_s,
                raw_s,
                cost,
            )
            result.extra["ok"] = done == n
            ctx.recorder.add(result)


# --- latency ---------------------------------------------------------------------------------


def latency(ctx: Context, rep: int) -> None:
    s = ctx.sizes
    for peer in _peers(ctx):
        if not peer.latency_label:
            continue
        worker = Adapter(ctx, peer, f"{peer.name}-latency-worker")
        producer = Adapter(ctx, peer, f"{peer.name}-latency-producer")
        try:
            worker.call("reset")
            worker.call("serve_latency")
            time.sleep(0.5)
            ctx.udp.reset()
            producer.call("trickle", s.latency_n, s.latency_rate)
            ok = ctx.udp.wait_for(s.latency_n, 30)
            worker.call("stop_latency")
            worker.call("reset")
        finally:
            producer.close()
            worker.close()
        samples = ctx.udp.tagged.get(peer.name, [])
        ctx.recorder.add(
            Result(
                key=f"peer.{peer.name}.latency",
                scenario="latency",
                system=peer.system,
                variant=peer.latency_label,
                rep=rep,
                n=s.latency_n,
                extra={**latency_summary(samples), "ok": ok},
            )
        )
