"""``flow.record``: logs what the database says is in flight while the handler runs.

Each run appends one JSON line to ``$PGQ_FLOW_LOG``: the message, its key and sequence
number, start/end (host clock, for ordering only), the queue's and key's in-flight counts
read from the database (leases not yet expired) from inside the handler, and how many
allowances of the queue were live then.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from django.db import connection

import django_pgqueue
from django_pgqueue.worker.context import MessageContext

IN_FLIGHT = """
SELECT count(*), count(*) FILTER (WHERE tenant IS NOT DISTINCT FROM %s),
       (SELECT count(*) FROM pgqueue_flow_allowance
        WHERE queue = %s AND units > 0 AND until > now())
FROM pgqueue_message
WHERE queue = %s AND lease_token IS NOT NULL AND available_at > now()
"""


@django_pgqueue.handler("flow.record")
def record(context: MessageContext, payload: dict[str, Any]) -> None:
    start = time.time()
    with connection.cursor() as cursor:
        cursor.execute(IN_FLIGHT, [payload.get("key"), payload["queue"], payload["queue"]])
        in_flight, key_in_flight, allowances_live = cursor.fetchone()
    if os.environ.get("PGQ_FLOW_HANG") and payload.get("hang"):
        time.sleep(600)  # the test kills this worker while it holds the slot
    time.sleep(payload.get("sleep", 0))
    line = {
        "id": context.message_id,
        "key": payload.get("key"),
        "seq": payload.get("seq"),
        "attempt": context.attempt,
        "pid": os.getpid(),
        "start": start,
        "end": time.time(),
        "in_flight": in_flight,
        "key_in_flight": key_in_flight,
        "allowances_live": allowances_live,
    }
    with open(os.environ["PGQ_FLOW_LOG"], "a") as log:
        log.write(json.dumps(line) + "\n")
