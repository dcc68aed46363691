"""Snapshots: the derived, read-only SQLite file of one organization's memory.

``schema`` is the file's layout, ``build`` makes the next generation from
the previous one and the new ledger entries (``apply``, ``projections``,
``content_hash``), ``publish`` uploads it and swaps the ``pointer``, ``keep``
holds the last one for the next build, ``rollback`` serves an older one
again, ``reader`` serves generations to compile (``lookups`` for reads by
id), and ``housekeeping`` sweeps what writes leave behind.
"""
