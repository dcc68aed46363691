"""The titen command: keys, import, rebuild, demo and serve, as a user runs them."""

import contextlib
import json
import os
from pathlib import Path
import socket
import re
import shlex
import subprocess
import sys
import time
import urllib.request

import pytest

from core.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_keys_create_json_prints_the_documented_fields(tmp_path, capsys):
    code, out, _ = run(capsys, "keys", "create", "--org", "acme", "--principal", "rama",
                       "--scopes", "context:compile,memory:write", "--workspaces", "ws_a", "--json",
                       "--data-dir", str(tmp_path))
    assert code == 0
    created = json.loads(out)
    assert set(created) == {"key_id", "api_key", "org_id", "principal_id"}
    assert created["key_id"].startswith("key_") and created["org_id"] == "acme"
    stored = "".join(p.read_text() for p in (tmp_path / "keys").glob("*.json"))
    assert created["api_key"] not in stored  # only the hash is kept


def test_keys_create_rejects_an_unknown_scope(tmp_path, capsys):
    code, _, err = run(capsys, "keys", "create", "--org", "acme", "--principal", "rama", "--scopes", "root",
                       "--data-dir", str(tmp_path))
    assert code == 2 and "--scopes" in err
    assert not (tmp_path / "keys").exists()


def test_keys_revoke_by_id(tmp_path, capsys):
    _, out, _ = run(capsys, "keys", "create", "--org", "acme", "--principal", "rama", "--scopes", "admin",
                    "--json", "--data-dir", str(tmp_path))
    key_id = json.loads(out)["key_id"]
    code, out, _ = run(capsys, "keys", "revoke", key_id, "--data-dir", str(tmp_path))
    assert code == 0 and json.loads(out)["revoked_at"]
    code, _, err = run(capsys, "keys", "revoke", "key_" + "0" * 32, "--data-dir", str(tmp_path))
    assert code == 2 and "no key" in err


@pytest.mark.parametrize("key_id", ["../keys/x", "key_/../../orgs", "key_" + "0" * 31, "KEY_" + "0" * 32])
def test_keys_revoke_of_a_malformed_key_id_is_a_refusal_not_a_store_error(tmp_path, capsys, key_id):
    run(capsys, "keys", "create", "--org", "acme", "--principal", "rama", "--scopes", "admin",
        "--data-dir", str(tmp_path))
    code, out, err = run(capsys, "keys", "revoke", key_id, "--data-dir", str(tmp_path))
    assert (code, out) == (2, "") and err.startswith("titen: no key ") and "key_ followed by 32 hex" in err


@pytest.mark.parametrize("shape", [lambda k: k, lambda k: f"Bearer {k}", lambda k: f'"{k}"', lambda k: k[:-1],
                                   lambda k: k[len("titen_sk_"):]],  # the secret part alone
                         ids=["whole", "bearer", "quoted", "one-short", "secret-part"])
def test_keys_revoke_given_an_api_key_refuses_without_printing_any_of_it(tmp_path, capsys, shape):
    _, out, _ = run(capsys, "keys", "create", "--org", "acme", "--principal", "rama", "--scopes", "admin",
                    "--json", "--data-dir", str(tmp_path))
    api_key = json.loads(out)["api_key"]
    given = shape(api_key)
    code, out, err = run(capsys, "keys", "revoke", given, "--data-dir", str(tmp_path))
    assert (code, out) == (2, "")
    secret = api_key[len("titen_sk_"):]
    assert all(secret[i:i + 8] not in err for i in range(len(secret) - 7))


def _ndjson(path, n, bad_line=None):
    with open(path, "w") as f:
        for i in range(n):
            body = {"subject_id": "user_rama", "kind": "user_statement", "content": f"fact {i}",
                    "visibility": "organization", "source": {"type": "tool", "ref": f"bench#{i}"},
                    "claim": {"statement": f"deploy fact number {i}", "kind": "semantic_fact", "confidence": 0.8}}
            if i == bad_line:
                body["claim"]["confidence"] = 7
            f.write(json.dumps(body) + "\n")


def _claim_count(tmp_path):
    pointer = json.loads((tmp_path / "orgs" / "acme" / "snapshots" / "current.json").read_text())
    return pointer["claim_count"]


def test_import_batches_lines_and_is_safe_to_rerun(tmp_path, capsys):
    src = tmp_path / "in.ndjson"
    _ndjson(src, 23)
    data = str(tmp_path / "store")
    code, out, err = run(capsys, "import", str(src), "--org", "acme", "--batch-size", "10", "--data-dir", data)
    assert code == 0 and json.loads(out)["batches_written"] == 3 and "imported 23/23" in err
    code, out, _ = run(capsys, "import", str(src), "--org", "acme", "--batch-size", "10", "--data-dir", data)
    assert json.loads(out) == {**json.loads(out), "batches_written": 0, "runs_completed": 0}
    code, out, _ = run(capsys, "rebuild", "--org", "acme", "--data-dir", data)
    assert json.loads(out)["claim_count"] == 23


def test_import_with_a_bad_line_names_it_and_writes_nothing(tmp_path, capsys):
    src = tmp_path / "in.ndjson"
    _ndjson(src, 5, bad_line=3)
    code, _, err = run(capsys, "import", str(src), "--org", "acme", "--data-dir", str(tmp_path / "store"))
    assert code == 2 and "in.ndjson:4" in err and "confidence" in err
    assert not (tmp_path / "store" / "orgs").exists()


def test_import_names_every_bad_line_in_one_run(tmp_path, capsys):
    """Fixing a file takes one run, not one per bad line (the first 20 are named, then a count)."""
    src = tmp_path / "in.ndjson"
    _ndjson(src, 40)
    lines = src.read_text().splitlines()
    for i in range(5, 30):
        lines[i] = "{not json" if i % 2 else lines[i].replace('"confidence": 0.8', '"confidence": 7')
    # a team line for a workspace the import was not given: a line of its own, named too
    lines[2] = lines[2].replace('"visibility": "organization"', '"visibility": "team", "workspace_id": "ws_x"')
    src.write_text("\n".join(lines) + "\n")
    code, _, err = run(capsys, "import", str(src), "--org", "acme", "--data-dir", str(tmp_path / "store"))
    assert code == 2 and "26 bad lines; nothing was imported" in err
    named = [n for n in range(1, 41) if f"in.ndjson:{n}:" in err]
    assert named == [3, *range(6, 25)] and "and 6 more" in err and "ws_x" in err
    assert not (tmp_path / "store" / "orgs").exists()


def test_rebuild_from_scratch_reports_the_same_content_hash(tmp_path, capsys):
    src = tmp_path / "in.ndjson"
    _ndjson(src, 12)
    data = str(tmp_path / "store")
    run(capsys, "import", str(src), "--org", "acme", "--batch-size", "5", "--data-dir", data)
    _, first, _ = run(capsys, "rebuild", "--data-dir", data)
    _ndjson(src, 3)
    run(capsys, "import", str(src), "--org", "acme", "--data-dir", data)
    _, incremental, _ = run(capsys, "rebuild", "--data-dir", data)
    _, scratch, _ = run(capsys, "rebuild", "--from-scratch", "--org", "acme", "--data-dir", data)
    assert json.loads(incremental)["content_hash"] == json.loads(scratch)["content_hash"]
    assert json.loads(scratch)["claim_count"] == 15


def test_a_rollback_to_a_generation_not_kept_is_a_one_line_refusal(tmp_path, capsys):
    src = tmp_path / "in.ndjson"
    _ndjson(src, 2)
    data = str(tmp_path / "store")
    run(capsys, "import", str(src), "--org", "acme", "--data-dir", data, "--rebuild")
    code = main(["snapshots", "rollback", "--org", "acme", "--generation", "7", "--data-dir", data])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == "titen: generation 7 is not kept; kept generations: 1\n"


@pytest.mark.parametrize("argv", [["rebuild", "--org", "A B"], ["import", "x.ndjson", "--org", "Bad Org"],
                                  ["snapshots", "list", "--org", "../acme"],
                                  ["snapshots", "rollback", "--org", "acme", "--generation", "-1"],
                                  # a record written under a principal no key can name could never be read
                                  ["import", "x.ndjson", "--org", "acme", "--principal", "bad principal"],
                                  ["import", "x.ndjson", "--org", "acme", "--principal", ""],
                                  ["import", "x.ndjson", "--org", "acme", "--workspaces", "ws one"],
                                  ["serve", "--port", "-1"], ["serve", "--port", "70000"],
                                  ["demo", "--port", "-5"], ["mcp", "--url", "notaurl"]])
def test_a_malformed_org_or_generation_is_refused_before_anything_is_written(tmp_path, capsys, argv):
    data = tmp_path / "store"
    with pytest.raises(SystemExit) as exited:
        main(argv + ["--data-dir", str(data)])
    assert exited.value.code == 2 and "error: argument" in capsys.readouterr().err
    assert not data.exists()


@pytest.mark.parametrize("where", [["--store", ""], ["--store", "file://"], ["--store", "s3://"],
                                   ["--store", "s3:///prefix"], ["--data-dir", ""], ["--data-dir", " "]])
def test_an_empty_store_or_data_dir_is_refused_not_read_as_the_current_directory(tmp_path, capsys, monkeypatch,
                                                                                 where):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["keys", "create", "--org", "acme", "--principal", "rama", "--scopes", "admin", *where])
    assert exited.value.code == 2 and f"argument {where[0]}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["rebuild"], ["rebuild", "--org", "acme"], ["snapshots", "list", "--org", "acme"],
                                  ["snapshots", "rollback", "--org", "acme", "--generation", "1"],
                                  ["erasures", "reapply", "--org", "acme"],
                                  ["keys", "revoke", "key_0123456789abcdef0123456789abcdef"]])
def test_a_command_on_a_store_that_does_not_exist_is_refused_and_creates_nothing(tmp_path, capsys, argv):
    typo = tmp_path / "no-such-store"
    code, out, err = run(capsys, *argv, "--data-dir", str(typo))
    assert (code, out) == (2, "") and err == f"titen: no store at {typo}: nothing was ever written there " \
                                                "(a mistyped --data-dir?)\n"
    assert not typo.exists()


@pytest.mark.parametrize("argv", [["rebuild", "--org", "nobody"], ["snapshots", "list", "--org", "nobody"],
                                  ["erasures", "reapply", "--org", "nobody"]])
def test_an_unknown_org_is_refused_in_one_line_and_not_built(tmp_path, capsys, argv):
    src = tmp_path / "in.ndjson"
    _ndjson(src, 1)
    data = str(tmp_path / "store")
    run(capsys, "import", str(src), "--org", "acme", "--data-dir", data)
    code, out, err = run(capsys, *argv, "--data-dir", data)
    assert (code, out) == (2, "")
    assert err == "titen: no organization 'nobody' in this store (it has: acme)\n"
    assert not (tmp_path / "store" / "orgs" / "nobody").exists()


def test_a_rebuild_over_a_damaged_ledger_entry_is_one_line_naming_it(tmp_path, capsys):
    src = tmp_path / "in.ndjson"
    _ndjson(src, 1)
    data = tmp_path / "store"
    run(capsys, "import", str(src), "--org", "acme", "--data-dir", str(data))
    (entry,) = (data / "orgs" / "acme" / "ledger").iterdir()
    entry.write_bytes(b"{broken")
    code, out, err = run(capsys, "rebuild", "--org", "acme", "--data-dir", str(data))
    assert (code, out) == (1, "") and "Traceback" not in err
    assert err.splitlines()[-1].startswith(f"titen: store error: ledger entry orgs/acme/ledger/{entry.name} is damaged")


@pytest.mark.parametrize("full", ["sqlite", "os"])
def test_a_rebuild_on_a_full_disk_is_one_line_saying_so(tmp_path, capsys, monkeypatch, full):
    import errno

    import apsw
    from core.snapshot.build import SnapshotBuilder
    src = tmp_path / "in.ndjson"
    _ndjson(src, 1)
    data = tmp_path / "store"
    run(capsys, "import", str(src), "--org", "acme", "--data-dir", str(data))

    def disk_full(self, *args, **kwargs):
        raise apsw.FullError("database or disk is full") if full == "sqlite" else \
            OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(SnapshotBuilder, "_apply_new_entries", disk_full)
    code, out, err = run(capsys, "rebuild", "--org", "acme", "--data-dir", str(data))
    assert (code, out) == (1, "") and "Traceback" not in err and err.count("\n") == 1
    assert err.startswith("titen: ") and ("disk is full" in err or "No space left on device" in err)


def test_a_rebuild_the_server_asked_for_on_a_full_disk_says_so_in_its_503(tmp_path, monkeypatch):
    import errno

    from core.config import Settings
    from core.errors import Unavailable
    from core.rebuild.host import Rebuilds
    from core.service import Service
    service = Service(Settings.from_env(store_url=str(tmp_path / "s"), env={}))

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(service, "rebuild", disk_full)
    with pytest.raises(Unavailable, match="a disk of this machine is full"):
        Rebuilds(service).rebuild("acme", from_scratch=False, force=False)


@pytest.mark.parametrize("name", ["missing.ndjson", "."])
def test_importing_a_file_that_cannot_be_read_is_one_line(tmp_path, capsys, name):
    code, out, err = run(capsys, "import", str(tmp_path / name), "--org", "acme", "--data-dir", str(tmp_path / "s"))
    assert code == 1 and out == "" and err.startswith("titen: ") and err.count("\n") == 1
    assert "Traceback" not in err
    assert not (tmp_path / "s").exists()  # refused before the store was opened


def test_demo_prints_a_working_key_and_is_idempotent(tmp_path, capsys):
    code, out, _ = run(capsys, "demo", "--data-dir", str(tmp_path))
    assert code == 0 and "titen_sk_" in out
    first = _demo_claims(tmp_path)
    run(capsys, "demo", "--data-dir", str(tmp_path))
    assert _demo_claims(tmp_path) == first > 5


def test_keys_list_shows_an_organizations_keys_without_the_keys(tmp_path, capsys):
    data = str(tmp_path)
    made = []
    for principal in ("rama", "ci-bot"):
        _, out, _ = run(capsys, "keys", "create", "--org", "acme", "--principal", principal, "--scopes",
                        "context:compile", "--json", "--data-dir", data)
        made.append(json.loads(out))
    run(capsys, "keys", "create", "--org", "globex", "--principal", "rama", "--scopes", "admin", "--data-dir", data)
    run(capsys, "keys", "revoke", made[0]["key_id"], "--data-dir", data)
    code, out, err = run(capsys, "keys", "list", "--org", "acme", "--data-dir", data)
    listed = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and err == ""
    assert [(k["key_id"], k["principal_id"]) for k in listed] == [(m["key_id"], m["principal_id"]) for m in made]
    assert listed[0]["revoked_at"] is not None and listed[1]["revoked_at"] is None
    assert "titen_sk_" not in out and all(set(k) == {"key_id", "principal_id", "scopes", "workspaces", "created_at",
                                                    "revoked_at"} for k in listed)


@pytest.mark.parametrize("where", ["--data-dir", "TITEN_DATA_DIR"])
def test_demo_prints_a_revoke_command_that_works_as_pasted(tmp_path, where):
    # as make run starts it: the venv's titen, not on PATH, and a data
    # directory of the user's choosing (make run DATA_DIR=..., or the
    # environment of a shell the command is not pasted into)
    titen = os.path.join(os.path.dirname(sys.executable), "titen")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TITEN_")}
    env["PATH"] = "/usr/bin:/bin"
    flags = ["--data-dir", str(tmp_path / "data")] if where == "--data-dir" else []
    demo_env = env if flags else {**env, "TITEN_DATA_DIR": str(tmp_path / "data")}
    shown = subprocess.run([titen, "demo", *flags], cwd=tmp_path, env=demo_env,
                           capture_output=True, text=True, check=True).stdout
    command = re.search(r"key_id key_[0-9a-f]{32}: (.+)\)$", shown, re.M).group(1)
    revoked = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True)
    assert revoked.returncode == 0, (command, revoked.stderr)
    assert json.loads(revoked.stdout)["revoked_at"]


def test_demo_builds_and_leaves_no_served_copy_of_a_generation_behind(tmp_path, capsys):
    # a copy in the cache, held by no process, would outlast an erasure
    # asked later through another process until some process swept it
    assert run(capsys, "demo", "--data-dir", str(tmp_path))[0] == 0
    assert _demo_claims(tmp_path) > 5
    assert sorted(p.name for p in (tmp_path / "cache").glob("*.sqlite*")) == []

def _demo_claims(tmp_path):
    return json.loads((tmp_path / "orgs" / "demo" / "snapshots" / "current.json").read_text())["claim_count"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(method, url, body=None, key=None):
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"content-type": "application/json",
                                          **({"authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("holder", ["a server listening", "a titen serve still starting"])
def test_serve_on_a_port_already_taken_stops_before_touching_the_data_directory(tmp_path, capsys, holder):
    """Another server may own the directory: nothing is rebuilt, swept or
    created in it, and the reason is one line. A titen serve that is still
    starting up holds its port too (bound and listening before its startup
    rebuilds: with SO_REUSEADDR a port bound but not listening can be bound
    again)."""
    import socket

    from core.serving import bind

    run(capsys, "keys", "create", "--org", "acme", "--principal", "rama", "--json", "--data-dir", str(tmp_path),
        "--scopes", "context:compile,memory:write")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    if holder == "a server listening":
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
    else:
        taken = bind("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "core.cli", "serve", "--port", str(port),
                               "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    finally:
        taken.close()
    assert done.returncode == 1
    assert done.stderr == f"titen: cannot listen on 127.0.0.1:{port}: Address already in use; nothing was started\n"
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_serve_makes_a_write_compile_visible_within_about_a_second(tmp_path, capsys):
    _, out, _ = run(capsys, "keys", "create", "--org", "acme", "--principal", "rama", "--json",
                    "--data-dir", str(tmp_path), "--scopes", "context:compile,memory:write")
    key = json.loads(out)["api_key"]
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "core.cli", "serve", "--port", str(port),
                               "--data-dir", str(tmp_path)], stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if _http("GET", base + "/healthz")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        status, body = _http("POST", base + "/v1/observations", {
            "subject_id": "user_rama", "kind": "tool_result", "content": "smoke ok", "visibility": "organization",
            "source": {"type": "tool", "ref": "x"},
            "claim": {"statement": "deploy smoke passes", "kind": "procedural", "confidence": 0.9}}, key)
        assert status == 201
        written = time.monotonic()
        items = []
        while time.monotonic() - written < 5 and not items:
            status, body = _http("POST", base + "/v1/context/compile",
                                 {"subject_id": "user_rama", "task": "deploy smoke", "max_tokens": 1200}, key)
            items = body["data"]["items"]
            time.sleep(0.05)
        assert [i["claim"] for i in items] == ["deploy smoke passes"]
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_serve_starts_and_serves_when_an_organizations_rebuild_at_start_fails(tmp_path, capsys):
    # one organization's damaged entry (or a store failing at start) used to stop the whole server
    _, out, _ = run(capsys, "keys", "create", "--org", "acme", "--principal", "rama", "--json",
                    "--data-dir", str(tmp_path), "--scopes", "context:compile,memory:write")
    key = json.loads(out)["api_key"]
    run(capsys, "keys", "create", "--org", "globex", "--principal", "rama", "--data-dir", str(tmp_path),
        "--scopes", "context:compile")
    entry = tmp_path / "orgs" / "acme" / "ledger" / "01a2510f95a07000a000000000000000.json"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_bytes(b"{not json")
    with _titen_serve(tmp_path) as (server, base, said):
        status, body = _http("POST", base + "/v1/context/compile",
                             {"subject_id": "user_rama", "task": "deploy", "max_tokens": 1200}, key)
        assert status == 200 and body["data"]["items"] == []  # nothing was ever published for acme
    assert b"acme: the rebuild at start failed" in said[0] and b"serving globex generation 1" in said[0]


@contextlib.contextmanager
def _titen_serve(data_dir, *flags):
    """``titen serve`` on ``data_dir`` in a subprocess, listening: (the
    process, its base URL, a list that holds its stderr once it has ended)."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "core.cli", "serve", "--port", str(port), *flags,
                               "--data-dir", str(data_dir)], stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    base, said = f"http://127.0.0.1:{port}", []
    try:
        up = False
        for _ in range(150):
            try:
                up = _http("GET", base + "/healthz")[0] == 200
                break
            except OSError:
                time.sleep(0.1)
        assert up, server.stderr.read1().decode() if server.poll() is not None else "not listening"
        yield server, base, said
    finally:
        server.terminate()
        try:
            said.append(server.communicate(timeout=30)[1])
        except subprocess.TimeoutExpired:
            server.kill()
            said.append(server.communicate()[1])


def test_the_serve_supervisor_holds_no_generation_file_open(tmp_path, capsys):
    """It verifies each organization's generation at start and serves none:
    an unlinked copy it kept open would hold its space on the cache disk
    for the life of the process, unseen by the cache's budget."""
    run(capsys, "demo", "--data-dir", str(tmp_path), "--port", "9")
    with _titen_serve(tmp_path, "--workers", "1") as (server, base, said):
        fds = Path(f"/proc/{server.pid}/fd")
        held = [os.readlink(fd) for fd in fds.iterdir() if ".sqlite" in os.readlink(fd)]
        assert held == []
    assert b"serving demo generation 1" in said[0]


class _Terminal:
    def __init__(self, tty):
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.mark.parametrize("flag, env, tty, chosen", [
    ("json", "text", True, "json"),    # the flag wins
    (None, "json", True, "json"),      # then TITEN_LOG_FORMAT
    (None, None, True, "text"),        # a person at a terminal
    (None, None, False, "json"),       # a pipe, a file, a log collector
])
def test_serve_picks_the_request_line_format(tmp_path, flag, env, tty, chosen):
    from core.cli import serve_log_format
    from core.config import Settings
    settings = Settings.from_env(data_dir=str(tmp_path), env={"TITEN_LOG_FORMAT": env} if env else {})
    assert serve_log_format(flag, settings, _Terminal(tty)) == chosen


def test_serve_writes_one_json_line_per_request_on_stderr(tmp_path):
    port = _free_port()
    err_path = tmp_path / "serve.err"
    with open(err_path, "w") as err:
        server = subprocess.Popen([sys.executable, "-m", "core.cli", "serve", "--port", str(port), "--log-format",
                                   "json", "--data-dir", str(tmp_path / "store")], stderr=err,
                                  stdout=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    if _http("GET", f"http://127.0.0.1:{port}/healthz")[0] == 200:
                        break
                except OSError:
                    time.sleep(0.1)
            assert _http("GET", f"http://127.0.0.1:{port}/v1/claims/claim_x/evidence")[0] == 401
        finally:
            server.terminate()
            server.wait(timeout=10)
    lines = [json.loads(x) for x in err_path.read_text().splitlines() if x.startswith("{")]
    assert [(x["event"], x["method"], x["route"], x["status"]) for x in lines][-2:] == [
        ("request", "GET", "/healthz", 200), ("request", "GET", "/v1/claims/{claim_id}/evidence", 401)]


def test_titen_mcp_at_exit_builds_its_organization_when_a_stored_write_never_asked_for_it(tmp_path):
    # SIGTERM between a write's ledger entry and its rebuild request: no
    # rebuild was pending, so finishing the pending ones built nothing
    from core.cli import _finish_rebuilds
    from core.config import Settings
    from core.service import Service

    settings = Settings.from_env(data_dir=str(tmp_path))
    _write_after_a_publish(Service(settings))  # stores, asks for no rebuild
    exiting = Service(settings, auto_rebuild=True)  # the titen mcp process: nothing pending
    assert _finish_rebuilds(exiting, "acme") == []
    assert _published_claims(tmp_path) == 1


def test_titen_mcp_at_exit_tries_again_a_rebuild_another_process_beat(tmp_path, monkeypatch):
    # titen serve's supervisor publishing twice while it built is routine
    # under writes: the erasure or write it carried was left pending
    from core.cli import _finish_rebuilds
    from core.config import Settings
    from core.errors import Conflict
    from core.service import Service

    service = Service(Settings.from_env(data_dir=str(tmp_path)), auto_rebuild=True)
    _write_after_a_publish(service)  # its rebuild now pending
    rebuild, beaten = service.rebuild, []

    def beaten_twice(org_id, **kwargs):
        if len(beaten) < 2:
            beaten.append(org_id)
            raise Conflict("another rebuild of this organization published first; retry")
        return rebuild(org_id, **kwargs)
    monkeypatch.setattr(service, "rebuild", beaten_twice)
    assert _finish_rebuilds(service, "acme") == []
    assert beaten == ["acme", "acme"] and _published_claims(tmp_path) == 1


def _write_after_a_publish(service) -> None:
    """acme published empty, then one observation with a claim written through ``service``."""
    key = service.keys.create("acme", "alice", ["memory:write"], [])
    service.rebuild("acme")
    service.write(service.keys.authenticate("Bearer " + key["api_key"]), "POST /v1/observations", {}, {
        "subject_id": "user_rama", "kind": "tool_result", "content": "Smoke passed.",
        "source": {"type": "tool", "ref": "t#1"}, "visibility": "organization",
        "claim": {"statement": "Smoke passed on Friday.", "kind": "episodic_event", "confidence": 0.9}}, None)


def _published_claims(data_dir) -> int:
    return json.loads((data_dir / "orgs" / "acme" / "snapshots" / "current.json").read_text())["claim_count"]
