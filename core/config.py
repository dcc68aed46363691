"""Configuration from the environment, read once at start-up.

| variable | default | meaning |
| TITEN_STORE | file://$TITEN_DATA_DIR | store URL: file://DIR or s3://bucket/prefix |
| TITEN_DATA_DIR | ./.titen | the embedded store's directory |
| TITEN_CACHE_DIR | <data dir>/cache, or /tmp/titen for S3 | where snapshots are kept for reading |
| TITEN_SNAPSHOT_TTL | 0.1 on a local store, 5 on S3 | seconds between checks for a new generation (the SAM template sets 1) |
| TITEN_SKEW_SECONDS | 600 | how far behind its watermark a rebuild re-reads the ledger |
| TITEN_MAX_ORGS | 16 | snapshots held at once (least recently used evicted) |
| TITEN_CACHE_BYTES | 75% of TITEN_EPHEMERAL_MB, else of the cache volume | disk budget of the snapshot cache (evicted by bytes) |
| TITEN_EPHEMERAL_MB | unset | the function's ephemeral storage (/tmp) size; the template sets it |
| TITEN_EMBEDDER | unset | vector capability; unset means disabled (see core.vectors) |
| TITEN_EMBED_TIMEOUT_MS | 2000 | how long compile waits for the task's embedding before going lexical |
| TITEN_EMBED_CALIBRATION | unset | floor,ceiling,knn[,cap]: overrides the embedder's shipped calibration (docs/vectors.md) |
| TITEN_MODEL_CACHE | $XDG_CACHE_HOME/titen or ~/.cache/titen | where the local embedder keeps the int8 model it derives (read by core.vectors.minilm) |
| TITEN_REBUILD_FUNCTION | unset | on Lambda: the rebuild function POST /v1/admin/rebuild invokes |
| TITEN_BODY_TIMEOUT | 10 | seconds for a request body to arrive before a 408 |
| TITEN_REBUILD_QUEUE_URL | unset | on Lambda: the SQS FIFO queue a write asks its rebuild on (core.rebuild.queue) |
| TITEN_LOG_FORMAT | json | the request line (core.observe.request_line): json, or text for a person |
| TITEN_METRICS | off | emf: write CloudWatch EMF metrics to stdout (core.observe.emf); the template sets it |
| TITEN_METRICS_NAMESPACE | titen | the metrics' CloudWatch namespace (the template: titen/<stack name>) |
| TITEN_METRICS_ORGS | unset | comma list of at most 10 organizations whose metrics also carry an Organization dimension |
| TITEN_PRELOAD_ORGS | unset | comma list of organizations whose snapshot the Lambda API function loads at import |
"""

from __future__ import annotations

import os
from dataclasses import dataclass


# How often a reader reads an organization's pointer, by default. On a
# local store the read is a file read, and another process on the same
# directory (``titen mcp`` beside ``titen serve``) publishes without ringing
# this one's bell: a tenth of a second. On S3 a read is a request.
LOCAL_SNAPSHOT_TTL = 0.1
S3_SNAPSHOT_TTL = 5.0


@dataclass(frozen=True)
class Settings:
    store_url: str
    cache_dir: str
    snapshot_ttl: float
    skew_seconds: int
    max_orgs: int
    embedder: str | None
    rebuild_function: str | None = None
    embed_timeout_ms: int = 2000
    embed_calibration: str | None = None  # "floor,ceiling,knn[,cap]", parsed by core.vectors.calibration
    rebuild_keep_bytes: int = 1 << 30
    body_timeout: float = 10.0
    cache_bytes: int | None = None  # None: 75% of the cache volume (core.snapshot)
    rebuild_queue_url: str | None = None
    log_format: str | None = None  # None: json, or what `titen serve` picks (core.cli)
    metrics: str = "off"
    metrics_namespace: str = "titen"
    metrics_organizations: tuple[str, ...] = ()
    preload_organizations: tuple[str, ...] = ()

    @property
    def local_store(self) -> bool:
        return not self.store_url.startswith("s3://")

    @classmethod
    def from_env(cls, *, data_dir: str | None = None, store_url: str | None = None,
                 env: dict | None = None) -> "Settings":
        env = os.environ if env is None else env
        if store_url is None and data_dir is None:
            store_url = env.get("TITEN_STORE") or None
        if store_url is None:
            data_dir = data_dir or env.get("TITEN_DATA_DIR") or "./.titen"
            store_url = "file://" + os.path.abspath(data_dir)
        if store_url.startswith("file://"):
            default_cache = os.path.join(store_url[len("file://"):], "cache")
        else:
            default_cache = "/tmp/titen"
        return cls(store_url=store_url,
                   cache_dir=env.get("TITEN_CACHE_DIR") or default_cache,
                   snapshot_ttl=float(env.get("TITEN_SNAPSHOT_TTL")
                                      or (S3_SNAPSHOT_TTL if store_url.startswith("s3://") else LOCAL_SNAPSHOT_TTL)),
                   skew_seconds=int(env.get("TITEN_SKEW_SECONDS") or 600),
                   max_orgs=int(env.get("TITEN_MAX_ORGS") or 16),
                   embedder=env.get("TITEN_EMBEDDER") or None,
                   rebuild_function=env.get("TITEN_REBUILD_FUNCTION") or None,
                   embed_timeout_ms=int(env.get("TITEN_EMBED_TIMEOUT_MS") or 2000),
                   embed_calibration=env.get("TITEN_EMBED_CALIBRATION") or None,
                   rebuild_keep_bytes=int(env.get("TITEN_REBUILD_KEEP_BYTES") or 1 << 30),
                   body_timeout=float(env.get("TITEN_BODY_TIMEOUT") or 10),
                   cache_bytes=cache_budget(env),
                   rebuild_queue_url=env.get("TITEN_REBUILD_QUEUE_URL") or None,
                   log_format=choice(env, "TITEN_LOG_FORMAT", LOG_FORMATS, None),
                   metrics=choice(env, "TITEN_METRICS", METRICS_MODES, "off"),
                   metrics_namespace=env.get("TITEN_METRICS_NAMESPACE") or "titen",
                   metrics_organizations=metric_organizations(env.get("TITEN_METRICS_ORGS") or ""),
                   preload_organizations=organization_list(env.get("TITEN_PRELOAD_ORGS") or ""))


LOG_FORMATS = ("json", "text")
METRICS_MODES = ("emf", "off")
# Each named organization adds a dimension set to every metric: a few, not many.
MAX_METRIC_ORGANIZATIONS = 10


def choice(env, name: str, allowed: tuple[str, ...], default):
    value = env.get(name) or default
    if value is not None and value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def organization_list(value: str) -> tuple[str, ...]:
    """A comma list of organization ids, each once, in order."""
    return tuple(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))


def metric_organizations(value: str) -> tuple[str, ...]:
    names = organization_list(value)
    if len(names) > MAX_METRIC_ORGANIZATIONS:
        raise ValueError(f"TITEN_METRICS_ORGS names {len(names)} organizations; at most "
                         f"{MAX_METRIC_ORGANIZATIONS} keep the metrics' dimensions few")
    return names


def cache_bytes_from_ephemeral(megabytes: int) -> int:
    """The snapshot cache's share of /tmp: 75%, leaving room for everything
    else a function writes there."""
    return int(megabytes * 1024 * 1024 * 0.75)


def cache_budget(env) -> int | None:
    if env.get("TITEN_CACHE_BYTES"):
        return int(env["TITEN_CACHE_BYTES"])
    if env.get("TITEN_EPHEMERAL_MB"):
        return cache_bytes_from_ephemeral(int(env["TITEN_EPHEMERAL_MB"]))
    return None
