"""The key lifecycle's clocks: how long a process may rely on what it cached
(docs/key-lifecycle.md).

A cache is a promise about the future; these say how long, and the code checks them at write
time. One place, so the destroyers' waits and the pruner's default grace follow the writers'
promises instead of repeating them.
"""

from __future__ import annotations

#: Seconds unwrapped keys (tenant keys, KEKs, thread keys) stay cached in a process before they
#: are read again from the registry. Reads rely on it; writes rely on :data:`WRITE_LEASE`.
KEY_CACHE_TTL = 300.0

#: Seconds a process may store data sealed under a thread key after it last confirmed, in the
#: registry, that the key is the thread's live key (the confirmation moves the thread's
#: ``last_activity``). A destroyer of a thread key (delete, prune, forget) deletes nothing
#: before the thread's last confirmation is this long past (plus :data:`CLOCK_MARGIN`).
WRITE_LEASE = 4.0

#: Seconds of disagreement between the clocks of the processes sharing a registry that the
#: lease tolerates (``last_activity`` is wall time).
CLOCK_MARGIN = 1.0

#: How long a destroyer waits after a thread's last confirmation: every lease granted before
#: has run out by then.
LEASE_FENCE = WRITE_LEASE + CLOCK_MARGIN

#: The pruner's default ``active_grace``: a thread written within the lifetime of any cache
#: that could still hold its key is not pruned (the lease fence holds even with a shorter one).
DEFAULT_ACTIVE_GRACE = KEY_CACHE_TTL + 60.0

#: The registry's ``securesaver_meta`` key naming the master versions being retired: no new
#: key-encryption key or thread key is wrapped under them (checked in the inserting transaction).
RETIRING_MASTERS = "retiring_master_versions"
