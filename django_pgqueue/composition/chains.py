"""Chains: steps that run one after the other, each once the previous one finished
successfully; the previous step's result is readable by the next
(:func:`~django_pgqueue.composition.results.dependency_results`). A step that dies buries the
steps after it (reason ``dependency_failed``); retrying it brings them back."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from django.db import transaction

from ..conf import get_settings
from ..core._dependencies import dependency_ids
from ..core._enqueue import EnqueuedMessage, write_message
from ..exceptions import DependencyError
from .steps import Step

__all__ = ["Chain", "chain", "enqueue_chain"]

#: At most this many steps per chain.
MAX_CHAIN_STEPS = 10_000


@dataclass(frozen=True)
class Chain:
    """A chain not written yet; a chain is also a step of a batch (its last step counts)."""

    steps: tuple[Step, ...]


@dataclass(frozen=True)
class EnqueuedChain:
    """What :func:`enqueue_chain` wrote: one message per step, in order."""

    messages: tuple[EnqueuedMessage, ...]

    @property
    def ids(self) -> list[int]:
        return [m.id for m in self.messages]

    @property
    def first(self) -> EnqueuedMessage:
        return self.messages[0]

    @property
    def last(self) -> EnqueuedMessage:
        """The last step: what to wait for (``after=[chain.last]``)."""
        return self.messages[-1]


def chain(*steps: Step | Chain) -> Chain:
    """Steps (or chains, flattened) to run in order."""
    flat: list[Step] = []
    for item in steps:
        if isinstance(item, Chain):
            flat.extend(item.steps)
        elif isinstance(item, Step):
            flat.append(item)
        else:
            raise TypeError(f"chain(): {item!r} is not a step (django_pgqueue.step(...))")
    if not flat:
        raise ValueError("chain(): no steps")
    if len(flat) > MAX_CHAIN_STEPS:
        raise ValueError(f"chain(): {len(flat)} steps; at most {MAX_CHAIN_STEPS}")
    return Chain(tuple(flat))


def enqueue_chain(
    steps: Chain | Iterable[Step],
    *,
    after: Iterable[Any] | None = None,
    using: str | None = None,
) -> EnqueuedChain:
    """Write every step in one transaction (the caller's when there is one): the first runs
    when ready (or after ``after``), each other one after the step before it. Every step is
    validated before anything is written."""
    plan = steps if isinstance(steps, Chain) else chain(*steps)
    first_after = () if after is None else dependency_ids(after)
    # Every step validated before any row exists; each but the first then waits for the one
    # written before it.
    prepared = [one.prepare(first_after) for one in plan.steps]
    if any(message.dedup_key is not None for message in prepared[1:]):
        raise DependencyError("a chain's steps after the first cannot have a dedup_key")
    alias = using or get_settings().DATABASE_ALIAS
    written: list[EnqueuedMessage] = []
    with transaction.atomic(using=alias):
        for message in prepared:
            if written:
                message = replace(message, after=(written[-1].id,))
            written.append(write_message(message, alias))
    return EnqueuedChain(tuple(written))
