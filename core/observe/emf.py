"""CloudWatch Embedded Metric Format: metrics written as one JSON log line each.

Why it exists: on Lambda, a JSON line on stdout that carries an ``_aws``
block is turned into CloudWatch metrics by CloudWatch Logs itself — no
``PutMetricData`` call, no permission, no latency on the request. This
module is the whole writer (the standard library only; a third of the
import cost of Powertools' metrics module, and several dimension sets in one
document: docs/operations.md, "Why no Powertools").

The document, per the EMF specification::

    {"_aws": {"Timestamp": <ms since the epoch>,
              "CloudWatchMetrics": [{"Namespace": "titen/<stack>",
                                     "Dimensions": [["Service", "Route"]],
                                     "Metrics": [{"Name": "Latency", "Unit": "Milliseconds"}]}]},
     "Service": "api", "Route": "/v1/context/compile", "Latency": 12.4}

Rules it enforces:

- one document per ``emit``, one line per document, written whole under a
  lock (threads of one process never interleave lines);
- every group of metrics (one ``MetricDirective``) carries its own
  dimensions; an organization is added as a second dimension set only for
  the organizations named in ``TITEN_METRICS_ORGS`` (cardinality stays
  bounded by configuration, never by traffic);
- a value that is not a finite number is dropped, not written (CloudWatch
  rejects the whole document otherwise);
- off unless configured (``TITEN_METRICS=emf``; the template sets it):
  ``titen serve`` and the tests write nothing unless asked.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from dataclasses import dataclass, field

# The units CloudWatch accepts (the EMF specification's list).
UNITS = frozenset({
    "Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes", "Terabytes",
    "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second",
    "Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second",
    "Kilobits/Second", "Megabits/Second", "Gigabits/Second", "Terabits/Second", "Count/Second", "None"})

ORGANIZATION = "Organization"  # the opt-in dimension's name


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str

    def __post_init__(self):
        if self.unit not in UNITS:
            raise ValueError(f"{self.unit!r} is not a CloudWatch unit")


@dataclass(frozen=True)
class Group:
    """Metrics that share one set of dimensions: one EMF ``MetricDirective``."""
    dimensions: dict[str, str]
    values: dict[Metric, float] = field(default_factory=dict)


def document(namespace: str, groups: list[Group], *, organization: str | None = None,
             timestamp_ms: int | None = None) -> dict:
    """The EMF document of ``groups`` (with an ``Organization`` dimension
    set beside each group's own when ``organization`` is given)."""
    directives = []
    root: dict = {}
    for group in groups:
        values = {m: v for m, v in group.values.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if not values:
            continue
        keys = list(group.dimensions)
        sets = [keys] + ([keys + [ORGANIZATION]] if organization else [])
        for key, value in group.dimensions.items():
            if root.setdefault(key, value) != value:
                raise ValueError(f"dimension {key!r} has two values in one document")
        for metric, value in values.items():
            if metric.name in root:
                raise ValueError(f"{metric.name!r} is written twice in one document")
            root[metric.name] = value
        directives.append({"Namespace": namespace, "Dimensions": sets,
                           "Metrics": [{"Name": m.name, "Unit": m.unit} for m in values]})
    if organization:
        root[ORGANIZATION] = organization
    stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    return {"_aws": {"Timestamp": stamp, "CloudWatchMetrics": directives}, **root}


# every whole line this process writes to stdout (EMF documents, the
# rebuild's per-organization lines) goes through one lock in one write, so
# lines written from several threads never interleave
_LINES = threading.Lock()


def write_line(text: str, stream=None) -> None:
    """``text`` and its newline, whole, to ``stream`` (stdout as it is now)."""
    stream = stream or sys.stdout  # looked up now: Lambda's (and a test's) current stdout
    with _LINES:
        stream.write(text + "\n")
        stream.flush()


class Metrics:
    """Writes EMF documents, one line each, to stdout (or ``stream``)."""

    def __init__(self, namespace: str = "titen", *, enabled: bool = False,
                 organizations: tuple[str, ...] | frozenset[str] = (), stream=None):
        self.namespace = namespace
        self.enabled = enabled
        self.organizations = frozenset(organizations)
        self._stream = stream

    @classmethod
    def from_settings(cls, settings) -> "Metrics":
        return cls(settings.metrics_namespace, enabled=settings.metrics == "emf",
                   organizations=settings.metrics_organizations)

    def emit(self, groups: list[Group], *, org_id: str | None = None) -> dict | None:
        """Write one document for ``groups``; the document, or None when
        metrics are off or there was nothing to write."""
        if not self.enabled:
            return None
        doc = document(self.namespace, groups,
                       organization=org_id if org_id in self.organizations else None)
        if not doc["_aws"]["CloudWatchMetrics"]:
            return None
        write_line(json.dumps(doc, separators=(",", ":")), self._stream)
        return doc
