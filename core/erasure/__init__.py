"""Forgetting on request (docs/api.md §16): ``requests`` (the routes' work),
``records`` (an erasure's status object), ``purge`` (carrying it out in the
ledger), ``work`` (what a rebuild does with pending erasures). The snapshot
side is ``core.snapshot.erase``."""
