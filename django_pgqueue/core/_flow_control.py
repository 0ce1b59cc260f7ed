"""Flow control in the claim: tenant fairness, concurrency limits and rate limits.

Opt-in per queue through ``PGQUEUE["QUEUES"][<queue>]`` (see
``docs/how-to/fairness-and-limits.md``). A queue with none of the keys below set is claimed
by the plain claim (``_claim_sql.py``), untouched, and its acks never look here.

A flow-controlled queue is claimed by ``_claim_sql.FLOW_CLAIM``: the reaper and the lease as
in a plain queue's claim, its candidates chosen by the SQL function in ``_flow_sql.py`` from
the queue's settings: everything is decided in the database, with database time, in one
round trip and one short transaction.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..conf import get_settings

#: Per-queue settings keys that switch a queue to the flow-controlled claim.
FLOW_KEYS = frozenset(
    {
        "FAIRNESS",
        "TENANT_WEIGHTS",
        "CONCURRENCY_LIMIT",
        "KEY_CONCURRENCY_LIMIT",
        "KEY_CONCURRENCY_LIMITS",
        "RATE_LIMIT",
        "KEY_RATE_LIMIT",
    }
)

#: An exact claim of a queue with limits that took its whole batch reserves its session an
#: allowance of up to this many batches (``_flow_sql.py``), leased by the session's next
#: claims without counting, within ``ALLOWANCE_WINDOW`` seconds (database time). 0 switches
#: allowances off: every claim counts.
ALLOWANCE_CLAIMS = 32
ALLOWANCE_WINDOW = 0.2


@dataclass(frozen=True)
class FlowConfig:
    """The flow-control settings of one queue."""

    fairness: bool = False
    tenant_weights: Mapping[str, int] = field(default_factory=dict)
    concurrency_limit: int | None = None
    key_concurrency_limit: int | None = None
    key_concurrency_limits: Mapping[str, int] = field(default_factory=dict)
    rate_limit: float | None = None
    key_rate_limit: float | None = None

    @property
    def keyed(self) -> bool:
        """Claims follow the fair order over tenants instead of the global claim order."""
        return bool(self.fairness or self.tenant_weights or self.key_limited)

    @property
    def key_limited(self) -> bool:
        """Some tenant's claims are bounded: a key concurrency limit or a key rate."""
        return bool(
            self.key_concurrency_limit or self.key_concurrency_limits or self.key_rate_limit
        )

    @property
    def walks_from_bounds(self) -> bool:
        """Claims take the fair order's head as it is, passing over no message in it (no key
        limit or key rate skips a tenant): so a claimer may walk it from its bounds
        (``core/_claim_bound.py``)."""
        return self.keyed and not self.key_limited

    @property
    def limited(self) -> bool:
        """A concurrency limit or a rate bounds the queue's claims: one may come back short
        of its batch while messages are ready."""
        return bool(
            self.concurrency_limit is not None or self.rate_limit is not None or self.key_limited
        )

    def fair_step(self, tenant: str | None) -> float:
        """How far a tenant's next message goes behind its previous one in the fair order."""
        return 1.0 / int(self.tenant_weights.get(tenant, 1)) if tenant is not None else 1.0

    @functools.cached_property
    def settings_json(self) -> str:
        """The settings as the candidates function reads them (``_flow_sql.py``)."""
        return json.dumps(
            {
                "keyed": self.keyed,
                "weights": dict(self.tenant_weights),
                "queue_limit": self.concurrency_limit,
                "key_limit": self.key_concurrency_limit,
                "key_limits": dict(self.key_concurrency_limits),
                "rate": self.rate_limit,
                "key_rate": self.key_rate_limit,
                "allowance_claims": ALLOWANCE_CLAIMS,
                "allowance_window": ALLOWANCE_WINDOW,
            },
            sort_keys=True,
        )


# Every claim and enqueue asks for its queue's FlowConfig: built once per queue named in the
# settings and per settings object (a change of settings builds a new one: conf.get_settings).
_configs: tuple[object, dict[str, FlowConfig | None]] = (None, {})


def flow_config(queue: str) -> FlowConfig | None:
    """The queue's flow-control settings, or ``None`` when it uses none (the plain claim)."""
    global _configs
    settings = get_settings()
    overrides = settings.QUEUES.get(queue)
    if not overrides:
        return None
    built_for, configs = _configs
    if built_for is not settings:
        configs = {}
        _configs = (settings, configs)
    if queue not in configs:
        configs[queue] = _flow_config(overrides)
    return configs[queue]


def _flow_config(overrides: Mapping[str, Any]) -> FlowConfig | None:
    if not FLOW_KEYS.intersection(overrides):
        return None
    config = FlowConfig(
        fairness=bool(overrides.get("FAIRNESS", False)),
        tenant_weights=dict(overrides.get("TENANT_WEIGHTS") or {}),
        concurrency_limit=overrides.get("CONCURRENCY_LIMIT"),
        key_concurrency_limit=overrides.get("KEY_CONCURRENCY_LIMIT"),
        key_concurrency_limits=dict(overrides.get("KEY_CONCURRENCY_LIMITS") or {}),
        rate_limit=overrides.get("RATE_LIMIT"),
        key_rate_limit=overrides.get("KEY_RATE_LIMIT"),
    )
    if not (config.keyed or config.limited):
        return None  # e.g. FAIRNESS=False and limits set to None
    return config
