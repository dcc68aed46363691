"""Context compilation (docs/api.md §9): ``compiler`` runs the five steps —
scope → candidates → hydrate → rank → pack — and the record; ``request``,
``retrieval``, ``catalog``, ``planning``, ``ranking``, ``packing`` and
``record`` hold one step's rule each. Only ``retrieval`` and ``catalog``
read the snapshot; planning, ranking and packing are pure."""
