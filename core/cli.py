"""The ``titen`` command: serve, mcp, rebuild, import, keys, demo, snapshots,
erasures.

Every command takes ``--data-dir DIR`` (default ``$TITEN_DATA_DIR``, else
``./.titen``) or ``--store URL`` (``file://…`` or ``s3://bucket/prefix``;
default ``$TITEN_STORE``), so commands pointed at one store share it.
Errors print one clear line and exit non-zero; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import time

from core.config import Settings
from core.errors import Conflict, TitenError, disk_full
from core.writes.importer import check_rereadable, import_file, stderr_progress
from core.keys import Principal
from core.snapshot.publish import RebuildConflict
from core.storage import StoreError


def _settings(args) -> Settings:
    return Settings.from_env(data_dir=args.data_dir, store_url=args.store)


def _service(args, **kw):
    from core.service import Service
    return Service(_settings(args), **kw)


def _existing_service(args, **kw):
    """The service of a store that exists: a command that only reads or
    changes what is there (rebuild, snapshots, erasures, keys revoke) never
    makes an empty store of a mistyped ``--data-dir``."""
    settings = _settings(args)
    missing = _missing_store(settings)
    if missing is not None:
        raise missing
    from core.service import Service
    return Service(settings, **kw)


def _missing_store(settings: Settings) -> TitenError | None:
    """NotFound when the store is a local directory that does not exist."""
    url = settings.store_url
    if not url.startswith("s3://"):  # file://DIR or a bare path, as core.storage.open_store reads it
        root = url[len("file://"):] if url.startswith("file://") else url
        if not os.path.isdir(root):
            from core.errors import NotFound
            return NotFound(f"no store at {root}: nothing was ever written there (a mistyped --data-dir?)")
    return None


def default_workers() -> int:
    """One server process per core, up to 4: each holds its own generations
    and tokenizer (~80 MiB at 10k claims)."""
    import os

    return max(1, min(4, os.cpu_count() or 1))


def serve_log_format(flag: str | None, settings: Settings, stderr=sys.stderr) -> str:
    """The request lines' format: ``--log-format``, else ``TITEN_LOG_FORMAT``,
    else text for a person at a terminal and JSON for everything else."""
    return flag or settings.log_format or ("text" if stderr.isatty() else "json")


def cmd_serve(args) -> int:
    import dataclasses

    from core.service import Service
    from core.serving import bind, serve

    settings = _settings(args)
    settings = dataclasses.replace(settings, log_format=serve_log_format(args.log_format, settings))
    if args.workers < 1:
        print("titen: --workers must be at least 1", file=sys.stderr)
        return 2
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        print(f"titen: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; nothing was started",
              file=sys.stderr)
        return 1
    # this process builds (at start, then for every server: core.serving) and serves nothing
    service = Service(settings, auto_rebuild=True, serves=False)
    # A store failing at start (S3 throttling, a disk error) must not keep
    # every organization from being served: each is reported, served from
    # what is published, and its rebuild tried again (core.service)
    try:
        orgs = service.ledger.organizations()
    except Exception as exc:
        print(f"titen: listing the organizations failed ({exc}); serving anyway (each organization's "
              "generation loads at its first request) and rebuilding them once the listing succeeds",
              file=sys.stderr)
        service.rebuild_all_later()
        orgs = []
    for org_id in orgs:
        try:
            result = service.rebuild(org_id, progress=stderr_progress)
        except Exception as exc:
            delay = service.retry_rebuild(org_id)
            print(f"{org_id}: the rebuild at start failed ({exc}); serving what is published, and "
                  f"trying again in {delay:g} s", file=sys.stderr)
            continue
        for note in result.notes:
            print(f"{org_id}: {note}", file=sys.stderr)
        _say_what_is_served(service, org_id)
    # the supervisor serves nothing: no generation file of its may stay open
    # (an unlinked file still holds its space on the cache disk)
    service.reader.release()
    serve(service, sock, host=args.host, workers=args.workers, log_level=args.log_level)
    return 0


def _say_what_is_served(service, org_id: str) -> None:
    """Verify the published generation as a server will, and say what is
    served, not what was built. (A function of its own: a local name left
    holding the generation would keep its file open for the process's life.)"""
    snapshot, reason = service.reader.check(org_id)
    if snapshot is None:
        print(f"NOT serving {org_id}: {reason or 'no generation published'}", file=sys.stderr)
    else:
        print(f"serving {org_id} generation {snapshot.generation} ({snapshot.claim_count} claims)", file=sys.stderr)


def cmd_mcp(args) -> int:
    import os

    from core.api import mcp_stdio

    api_key = args.api_key or os.environ.get("TITEN_API_KEY")
    if args.url:
        answer = mcp_stdio.bridged(args.url, api_key)
    else:
        if not api_key:
            print("titen: titen mcp needs a key: --api-key or TITEN_API_KEY", file=sys.stderr)
            return 2
        refusal = _mcp_key_refusal(_settings(args), api_key)
        if refusal is not None:
            print(f"titen mcp: {refusal.message}; every message is answered with this error", file=sys.stderr)
            mcp_stdio.run(mcp_stdio.refusing(refusal), sys.stdin.buffer, sys.stdout.buffer)
            return 2
        from core.serving import standalone_service
        service = standalone_service(_settings(args), auto_rebuild=True)
        org_id = service.keys.authenticate("Bearer " + api_key).org_id
        if org_id in service.ledger.organizations():
            try:
                _rebuild_beside_others(service, org_id)
            except Exception as exc:
                # as titen serve at start: serve what is published, and try again
                delay = service.retry_rebuild(org_id)
                print(f"titen mcp: the rebuild of {org_id} at start failed ({exc}); serving what is "
                      f"published, and trying again in {delay:g} s", file=sys.stderr)
        answer = mcp_stdio.embedded(service, api_key)
        # a host stops its server by closing stdin, then by SIGTERM: either
        # way the rebuilds its writes and erasures asked for run first
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            return mcp_stdio.run(answer, sys.stdin.buffer, sys.stdout.buffer)
        finally:
            # a host closes stdin, then sends SIGTERM after a grace period
            # (the MCP SDK's is 2 s): that SIGTERM must not cut short the
            # rebuilds it waits for. SIGKILL (the SDK's, 2 s later) or
            # SIGINT still ends them; titen serve's catch-up, or the next
            # titen mcp's start, then builds what they left
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            for failed_org, exc in _finish_rebuilds(service, org_id):
                print(f"titen mcp: the rebuild of {failed_org} at exit failed ({exc}); the next rebuild "
                      "applies its writes (titen rebuild, or a titen serve on this store at its next ledger check)",
                      file=sys.stderr)
    return mcp_stdio.run(answer, sys.stdin.buffer, sys.stdout.buffer)


def _mcp_key_refusal(settings: Settings, api_key: str) -> TitenError | None:
    """Why ``titen mcp`` on this store cannot act as ``api_key``, checked
    before anything is made there (a cache directory, a held server
    directory): no store at a local path, or a key it does not know."""
    from core.keys import KeyRing
    from core.storage import open_store

    missing = _missing_store(settings)
    if missing is not None:
        return missing
    try:
        KeyRing(open_store(settings.store_url)).authenticate("Bearer " + api_key)
    except TitenError as exc:
        return exc
    return None


def _finish_rebuilds(service, org_id: str) -> list[tuple[str, Exception]]:
    """The rebuilds this process scheduled, then its key's organization
    once more if its ledger still holds entries no generation holds: a
    write stopped by SIGTERM after its entry was stored, before it asked
    for its rebuild."""
    from core.rebuild.backlog import backlog

    failed = []
    for org, exc in service.finish_scheduled_rebuilds():
        if not isinstance(exc, Conflict):
            failed.append((org, exc))
            continue
        try:  # another process (titen serve's supervisor) published twice meanwhile
            _rebuild_beside_others(service, org)
        except Exception as again:
            failed.append((org, again))
    if any(org == org_id for org, _ in failed):
        return failed
    try:
        if backlog(service.store, org_id, skew_seconds=service.settings.skew_seconds).due:
            _rebuild_beside_others(service, org_id)
    except Exception as exc:
        failed.append((org_id, exc))
    return failed


CONFLICT_TRIES = 5


def _rebuild_beside_others(service, org_id: str) -> None:
    """A rebuild in a process that shares its store with others (``titen
    serve``'s supervisor, other ``titen mcp``): losing the publish to one of
    them (``Conflict``: it published twice while this built) is routine
    under writes, so it is tried again, a little later each time."""
    for attempt in range(CONFLICT_TRIES):
        try:
            service.rebuild(org_id)
            return
        except Conflict:
            if attempt == CONFLICT_TRIES - 1:
                raise
            time.sleep(0.1 * 2 ** attempt)


def _exit_on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the rebuilds short
    raise SystemExit(0)  # to the finally that runs the pending rebuilds


def cmd_rebuild(args) -> int:
    service = _existing_service(args)
    orgs = [known_org(service, args.org)] if args.org else service.ledger.organizations()
    for org_id in orgs:
        result = service.builder(org_id, progress=stderr_progress).rebuild(from_scratch=args.from_scratch)
        print(json.dumps(result.as_dict()))
    return 0


def cmd_import(args) -> int:
    check_rereadable(args.file)  # before the store is opened: a refusal leaves no directory behind
    service = _service(args)
    principal = Principal(org_id=args.org, principal_id=args.principal, key_id="cli",
                          scopes=frozenset({"admin", "memory:write", "memory:verify"}),
                          workspaces=args.workspaces or ())
    summary = import_file(service.store, principal, args.file, batch_size=args.batch_size,
                          progress=stderr_progress)
    print(json.dumps(summary))
    if args.rebuild:
        print(json.dumps(service.builder(args.org, progress=stderr_progress).rebuild().as_dict()))
    return 0


def cmd_keys_create(args) -> int:
    service = _service(args)
    created = service.keys.create(args.org, args.principal, [s for s in args.scopes.split(",") if s],
                                  [w for w in (args.workspaces or "").split(",") if w])
    if args.json:
        print(json.dumps(created))
    else:
        print(f"key_id:  {created['key_id']}\napi_key: {created['api_key']}  (shown once; only its hash is stored)")
    return 0


def cmd_keys_list(args) -> int:
    for record in _existing_service(args).keys.listing(args.org):
        print(json.dumps(record))
    return 0


def cmd_keys_revoke(args) -> int:
    record = _existing_service(args).keys.revoke(args.key_id)
    print(json.dumps({"key_id": record["key_id"], "revoked_at": record["revoked_at"]}))
    return 0


def cmd_demo(args) -> int:
    from core.demo import DEMO_ORG, DEMO_SUBJECT, load_demo

    # builds and publishes, serves nothing: a generation it loaded would lie
    # in the cache, held by no process, until another process swept it
    service = _service(args, serves=False)
    created = service.keys.create(DEMO_ORG, "demo-admin", ["context:compile", "context:feedback", "memory:write",
                                                           "memory:verify", "memory:erase", "admin"], [])
    principal = service.keys.authenticate("Bearer " + created["api_key"])
    written = load_demo(service, principal)
    result = service.rebuild(DEMO_ORG)
    print(f"demo organization '{DEMO_ORG}': {written} new writes, generation {result.generation}, "
          f"{result.claim_count} claims")
    print(f"API key (org {DEMO_ORG}, all scopes): {created['api_key']}  (key_id {created['key_id']}: "
          f"{_this_command(args)} keys revoke {created['key_id']}{_where_flag(args)})")
    print(f"try:\n  curl -s localhost:{args.port}/v1/context/compile -H 'authorization: Bearer "
          f"{created['api_key']}' -H 'content-type: application/json' \\\n"
          f"    -d '{{\"subject_id\":\"{DEMO_SUBJECT}\",\"task\":\"can we deploy on friday\",\"max_tokens\":1200}}'")
    return 0


def _this_command(args) -> str:
    """How to run titen again from here, for a printed hint that works when
    pasted: ``make run`` starts ``.venv/bin/titen``, which is not on PATH."""
    program = sys.argv[0] if os.path.basename(sys.argv[0]) == "titen" else ""
    if not program or shutil.which("titen") == os.path.abspath(program):
        return "titen"
    relative = os.path.relpath(program)
    return shlex.quote(relative if not relative.startswith("..") else os.path.abspath(program))


def _where_flag(args) -> str:
    """The store this command used, as a flag, for a printed hint: given
    as a flag, or by TITEN_STORE or TITEN_DATA_DIR, which the shell the hint
    is pasted into may not have."""
    store = args.store or (None if args.data_dir else os.environ.get("TITEN_STORE"))
    if store:
        return f" --store {shlex.quote(store)}"
    data_dir = args.data_dir or os.environ.get("TITEN_DATA_DIR")
    return f" --data-dir {shlex.quote(data_dir)}" if data_dir else ""


def cmd_snapshots_list(args) -> int:
    from core.snapshot.pointer import read_pointer
    service = _existing_service(args)
    pointer, _ = read_pointer(service.store, known_org(service, args.org))
    print(json.dumps(pointer or {}, indent=1))
    return 0


def cmd_snapshots_rollback(args) -> int:
    from core.snapshot.rollback import rollback
    service = _existing_service(args)
    print(json.dumps(rollback(service.store, known_org(service, args.org), args.generation)))
    return 0


def cmd_erasures_reapply(args) -> int:
    from core.erasure.work import reapply
    service = _existing_service(args)
    print(json.dumps(reapply(service.store, known_org(service, args.org), stderr_progress)))
    return 0


def org_id(value: str) -> str:
    """``--org``: an organization id as keys name it (docs/api.md §5); any
    other is refused before anything is read or written."""
    from core.keys import ORG_ID
    if not ORG_ID.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an organization id ({ORG_ID.pattern})")
    return value


def principal_id(value: str) -> str:
    """``--principal``: an identifier, as a key names it: a record written
    under any other could never be read through a key."""
    from core.bodies import IDENTIFIER
    if not IDENTIFIER.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an identifier (letters, digits, '_.:@-')")
    return value


def workspace_list(value: str) -> tuple[str, ...]:
    """``--workspaces``: a comma list of identifiers."""
    from core.bodies import IDENTIFIER
    names = tuple(w for w in value.split(",") if w)
    bad = [w for w in names if not IDENTIFIER.fullmatch(w)]
    if bad:
        raise argparse.ArgumentTypeError(f"{bad[0]!r} is not an identifier (letters, digits, '_.:@-')")
    return names


def port_number(value: str) -> int:
    number = int(value)
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (0-65535; 0 picks a free one)")
    return number


def http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or len(value.split("://", 1)[1]) == 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not an http:// or https:// URL")
    return value


def generation_number(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a generation (they count from 1)")
    return number


def known_org(service, org: str) -> str:
    """An organization this store holds a ledger for; else NotFound naming those it does."""
    from core.errors import NotFound
    known = service.ledger.organizations()
    if org not in known:
        raise NotFound(f"no organization {org!r} in this store (it has: {', '.join(known) or 'none'})")
    return org


def _data_dir(value: str) -> str:
    # an empty value (an unset shell variable) would quietly mean the default
    # directory, and a key created there would never reach the real store
    if not value.strip():
        raise argparse.ArgumentTypeError("is empty (an unset variable?); name a directory")
    return value


def _store_url(value: str) -> str:
    # "" or "file://" would be the current directory; "s3://" no bucket
    if value.startswith("s3://"):
        if not value[len("s3://"):].split("/", 1)[0]:
            raise argparse.ArgumentTypeError(f"{value!r} names no bucket: s3://bucket/prefix")
        return value
    path = value[len("file://"):] if value.startswith("file://") else value
    if not path.strip():
        raise argparse.ArgumentTypeError(f"{value!r} names no store (an unset variable?): "
                                         "file://DIR or s3://bucket/prefix")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="titen", description=" ".join(__doc__.split("\n\n")[0].split()))
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_mutually_exclusive_group()
    where.add_argument("--data-dir", type=_data_dir,
                       help="embedded store directory (default $TITEN_DATA_DIR or ./.titen)")
    where.add_argument("--store", type=_store_url,
                       help="store URL: file://DIR or s3://bucket/prefix (default $TITEN_STORE)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", parents=[common],
                       help="run the HTTP API (server processes; this one rebuilds after writes)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=8787)
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="server processes behind the port (default: the CPU count, at most 4)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", choices=["json", "text"],
                   help="one line per request on stderr: json, or text (the default on a terminal)")
    p.set_defaults(run=cmd_serve)

    p = sub.add_parser("mcp", parents=[common], help="serve the MCP tools over stdio (embedded store, or --url)")
    p.add_argument("--api-key", help="the key every tool call runs as (default $TITEN_API_KEY)")
    p.add_argument("--url", type=http_url,
                   help="bridge to a served titen (its base URL or .../mcp) instead of the local store")
    p.set_defaults(run=cmd_mcp)

    p = sub.add_parser("rebuild", parents=[common], help="build and publish snapshots from the ledger")
    p.add_argument("--org", type=org_id, help="one organization (default: every organization with new entries)")
    p.add_argument("--from-scratch", action="store_true", help="replay the whole ledger from empty")
    p.set_defaults(run=cmd_rebuild)

    p = sub.add_parser("import", parents=[common], help="bulk-load NDJSON observation bodies")
    p.add_argument("file")
    p.add_argument("--org", required=True, type=org_id, help="the organization the lines are written to")
    p.add_argument("--principal", default="importer", type=principal_id,
                   help="recorded as the writer (owner of private records; default importer)")
    p.add_argument("--workspaces", type=workspace_list,
                   help="comma list of workspaces the importer may write team records to")
    p.add_argument("--batch-size", type=int, default=500, help="lines per ledger entry (1-10000; default 500)")
    p.add_argument("--rebuild", action="store_true", help="rebuild the organization afterwards")
    p.set_defaults(run=cmd_import)

    keys = sub.add_parser("keys", help="create, list or revoke API keys").add_subparsers(dest="keys_command",
                                                                                     required=True)
    p = keys.add_parser("create", parents=[common], help="create a key and print it (the only time it is shown)")
    p.add_argument("--org", required=True, type=org_id, help="the organization the key belongs to")
    p.add_argument("--principal", required=True, help="who the key acts as (owner of its private records)")
    p.add_argument("--scopes", required=True, help="comma list of context:compile, context:feedback, "
                                                   "memory:write, memory:verify, memory:erase, admin")
    p.add_argument("--workspaces", default="", help="comma list of workspaces whose team records the key reads")
    p.add_argument("--json", action="store_true", help="print the key as one JSON object")
    p.set_defaults(run=cmd_keys_create)
    p = keys.add_parser("list", parents=[common], help="one JSON line per key of an organization (never the key)")
    p.add_argument("--org", required=True, type=org_id)
    p.set_defaults(run=cmd_keys_list)
    p = keys.add_parser("revoke", parents=[common], help="revoke a key by its key_id (effective within seconds)")
    p.add_argument("key_id")
    p.set_defaults(run=cmd_keys_revoke)

    p = sub.add_parser("demo", parents=[common], help="load the demo memory and print a working key")
    p.add_argument("--port", type=port_number, default=8787, help="the port the printed curl call uses (default 8787)")
    p.set_defaults(run=cmd_demo)

    snaps = sub.add_parser("snapshots", help="inspect or roll back published generations").add_subparsers(
        dest="snapshots_command", required=True)
    p = snaps.add_parser("list", parents=[common])
    p.add_argument("--org", required=True, type=org_id)
    p.set_defaults(run=cmd_snapshots_list)
    p = snaps.add_parser("rollback", parents=[common])
    p.add_argument("--org", required=True, type=org_id)
    p.add_argument("--generation", type=generation_number, required=True)
    p.set_defaults(run=cmd_snapshots_rollback)

    erasures = sub.add_parser("erasures", help="carry completed erasures out again").add_subparsers(
        dest="erasures_command", required=True)
    p = erasures.add_parser("reapply", parents=[common],
                            help="after restoring ledger objects from a backup: erase again every record a "
                                 "completed erasure named (reads the whole ledger)")
    p.add_argument("--org", required=True, type=org_id)
    p.set_defaults(run=cmd_erasures_reapply)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except TitenError as exc:
        print(f"titen: {exc.message}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"titen: store error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file to import that is not there, a directory, unreadable
        print(f"titen: {exc.strerror or exc}: {exc.filename}" if exc.filename else f"titen: {exc}", file=sys.stderr)
        return 1
    except RebuildConflict as exc:
        print(f"titen: {exc}; that organization's build was withdrawn (run it again)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not disk_full(exc):
            raise
        print(f"titen: a disk is full ({exc}): free space where the data directory or TITEN_CACHE_DIR is, "
              "and run it again", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
