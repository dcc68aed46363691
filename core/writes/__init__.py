"""Memory writes: observations, consolidations, lifecycle transitions, feedback, imports.

``Writes`` is the one object the service and the routes write through; its
parts live one module each: ``records`` (a body → final records, pure),
``observations``, ``consolidations``, ``transitions``, sharing ``desk`` (how
an entry lands). ``idempotency`` makes every write safe to retry,
``feedback`` records a verdict on a pack, ``importer`` bulk-loads a file
exactly once.

Writes may cite records that are not in the serving snapshot yet: every
record id locates its ledger entry (``core.ids.entry_of``), so a
consolidation can cite an observation written a second ago.
"""

from __future__ import annotations

from core.writes.consolidations import ConsolidationWrites
from core.writes.observations import ObservationWrites
from core.writes.transitions import TransitionWrites


class Writes(ObservationWrites, ConsolidationWrites, TransitionWrites):
    """Every memory write of one store (the parts share ``WriteDesk.__init__``)."""


__all__ = ["Writes"]
