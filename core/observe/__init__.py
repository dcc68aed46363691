"""What an operator sees: one structured line per request, and CloudWatch metrics.

``emf`` writes CloudWatch Embedded Metric Format documents (one JSON line
each, on stdout), ``metrics`` is the catalogue of titen's metrics and which
part records which, ``request_line`` is the one log line every HTTP request
gets (an ASGI middleware, identical under ``titen serve`` and on Lambda).

Rules this package enforces (docs/operations.md, "Metrics, alarms and the
dashboard"):

- **nothing a caller wrote is ever recorded**: the request line and the
  metrics are built from an allowlist of fields whose values are numbers or
  names of the service's own (route templates, error codes, states), never
  a task, a claim's or an observation's text, a reason, or a key;
- **dimensions stay low-cardinality**: the route template, the error code,
  the part of the service; an organization only when named in
  ``TITEN_METRICS_ORGS``;
- **little on the cold path**: the standard library only (an EMF document
  is a dict and ``json.dumps``): ~3.5 ms of imports where Powertools'
  metrics module takes ~10 ms and a dependency (docs/operations.md, "Why no
  Powertools").
"""
