"""A batch and a chain under SIGKILLed workers and a crash of the database server: no member
lost, no step released before the one it follows finished, each callback enqueued once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from tests.worker.conftest import wait_for

from .cluster import PrivateCluster
from .conftest import REPO, WorkerProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.chaos,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]

MEMBERS = 300
STEPS = 30

_ENQUEUE = f"""
import json
import django
django.setup()
from django_pgqueue import enqueue_batch, enqueue_chain, step
batch = enqueue_batch(
    [step("tests.sleep", {{"seconds": 0.02}}) for _ in range({MEMBERS})],
    on_complete=step("tests.echo", "complete"),
    on_success=step("tests.echo", "success"),
    on_failure=step("tests.echo", "failure"),
)
chain = enqueue_chain([step("tests.chain-step") for _ in range({STEPS})])
print(json.dumps({{
    "batch": batch.id, "members": batch.member_ids, "complete": batch.on_complete.id,
    "success": batch.on_success.id, "failure": batch.on_failure.id, "chain": chain.ids,
}}))
"""


def enqueue_in(cluster: PrivateCluster) -> dict[str, Any]:
    """The batch and the chain, enqueued by a client of the cluster's database."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": cluster.url,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "example_project")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", _ENQUEUE],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def scalar(conn: psycopg.Connection[Any], statement: str, *params: Any) -> Any:
    row = conn.execute(statement, list(params)).fetchone()
    return row[0] if row else None


def test_kills_and_a_database_crash_lose_no_member_and_run_each_callback_once(
    spawn_worker: Any, private_cluster: PrivateCluster, cluster_db: psycopg.Connection[Any]
) -> None:
    ids = enqueue_in(private_cluster)
    options = ("--poll-interval", "0.2", "--visibility-timeout", "3", "--concurrency", "4")
    workers: list[WorkerProcess] = [
        spawn_worker(*options, database=private_cluster.url).ready() for _ in range(2)
    ]

    def archived() -> int:
        return int(scalar(cluster_db, "SELECT count(*) FROM pgqueue_archive"))

    wait_for(lambda: archived() >= 60, timeout=60)
    workers[0].signal(signal.SIGKILL)
    assert workers[0].wait() == -signal.SIGKILL
    workers.append(spawn_worker(*options, database=private_cluster.url).ready())
    wait_for(lambda: archived() >= 150, timeout=60)
    private_cluster.restart("immediate")

    with private_cluster.connect() as conn:

        def settled() -> bool:
            return bool(
                scalar(conn, "SELECT count(*) FROM pgqueue_message") == 0
                and scalar(conn, "SELECT count(*) FROM pgqueue_waiting") == 0
            )

        wait_for(settled, timeout=120, interval=0.3)
        assert scalar(conn, "SELECT count(*) FROM pgqueue_dead") == 0
        # Every member finished exactly once in the archive, and the batch counted each once.
        finished = [r[0] for r in conn.execute("SELECT message_id FROM pgqueue_archive").fetchall()]
        assert len(finished) == len(set(finished))
        assert set(ids["members"]) <= set(finished)
        total, succeeded, failed = conn.execute(
            "SELECT total, succeeded, failed FROM pgqueue_batch WHERE id = %s", [ids["batch"]]
        ).fetchone()
        assert (total, succeeded, failed) == (MEMBERS, MEMBERS, 0)
        # The completion and success callbacks were enqueued once and ran; the failure one
        # never existed as a live message.
        callbacks = conn.execute(
            "SELECT message_id, payload #>> '{}' FROM pgqueue_archive WHERE task = 'tests.echo'"
        ).fetchall()
        assert sorted(callbacks) == sorted(
            [(ids["complete"], "complete"), (ids["success"], "success")]
        )
        assert ids["failure"] not in finished
        # Each step ran once the step before it was archived: it read that step's result from
        # the archive (its own result counts the chain's steps). Its started_at is the claim
        # transaction's start, which may precede the previous step's archiving by a few
        # milliseconds while its claim statement, run after that commit, still found it: times
        # alone cannot say it.
        steps = {
            message_id: (started, finished_at, result)
            for message_id, started, finished_at, result in conn.execute(
                "SELECT message_id, started_at, finished_at, result FROM pgqueue_archive"
                " WHERE message_id = ANY(%s)",
                [ids["chain"]],
            ).fetchall()
        }
        assert len(steps) == STEPS
        assert steps[ids["chain"][0]][2] == 1
        for number, after in enumerate(ids["chain"][1:], 2):
            assert steps[after][2] == number
    for worker in workers[1:]:
        assert worker.proc.poll() is None, worker.output
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output
