#!/usr/bin/env bash
# The arm64 check: Lambda runs both functions on arm64 (template.yaml), so the
# code that must equal this platform's FTS5 bit for bit -- the candidate step
# (core/lexical/), ranking and packing -- is run on arm64 too, under
# qemu-user emulation in an arm64 Debian root.
#
#   sudo infra/check-arm64.sh     # 33 min from nothing on 2 shared cores, 10-20 with the root cached
#
# Run it after any change under the lexical, ranking or packing code
# (core/lexical/, core/compile/retrieval.py, core/compile/planning.py,
# core/compile/ranking.py, core/compile/packing.py, core/budget/). It is not
# part of .ci/run.
#
# What it does:
# 1. builds, once, an arm64 Debian root with debootstrap (the mirror this
#    machine's apt uses) and binfmt + qemu-user-static, and a venv in it with
#    the project's pinned dependencies from their aarch64 wheels; both are
#    cached under $TITEN_ARM64_CACHE (default /var/tmp/titen-arm64-root,
#    outside the repository) and reused while the pins do not change;
# 2. copies this checkout into the root and installs it (pip install
#    --no-compile: byte-compiling under emulation is very slow);
# 3. inside the root runs `python -m infra.arm64_check` (the platform probe's model
#    for 1..16 phrases, a random-query comparison of the candidate step
#    against FTS5's bm25, and a snapshot priced on this host -- by the
#    checkout's .venv, made with `make setup` if missing -- served there) and
#    the lexical, ranking, packing, query-plan and pack-digest tests;
# 4. prints a summary and exits non-zero on any failure or any phrase count
#    that falls back to the FTS5 query.
#
# Inside the root everything runs under `env -i`: the host's PIP_* settings
# (find-links, constraints, local file indexes) do not leak in. pip gets only
# what it needs to reach the package index: the host's index URL (its pip
# config or PIP_INDEX_URL, else PyPI), any proxy variables, and the host's CA
# bundle, copied into the root (the registries may be reached through a
# TLS-intercepting proxy whose CA only the host's bundle holds).
#
# Environment: TITEN_ARM64_CACHE (cache dir), TITEN_ARM64_SUITE (Debian
# suite, default trixie: Python 3.13), TITEN_ARM64_MIRROR (Debian mirror URL),
# TITEN_ARM64_QUERIES (random queries compared, default 400),
# TITEN_ARM64_REBUILD=1 (discard the cached root first).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${TITEN_ARM64_CACHE:-/var/tmp/titen-arm64-root}
SUITE=${TITEN_ARM64_SUITE:-trixie}
QUERIES=${TITEN_ARM64_QUERIES:-400}
ROOT=$CACHE/$SUITE-arm64
VENV=/opt/titen-venv
LOGDIR=$CACHE/logs
TESTS=(tests/test_lexical.py tests/test_ranking.py tests/test_packing.py tests/test_query_plan.py
       tests/test_pack_digest.py tests/test_index_words.py tests/test_planning.py)
START=$(date +%s)

say() { printf '[check-arm64 %4ss] %s\n' "$(( $(date +%s) - START ))" "$*"; }
die() { say "FAILED: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (debootstrap, chroot, binfmt)"
case "$CACHE" in "$REPO"|"$REPO"/*) die "TITEN_ARM64_CACHE must be outside the repository";; esac
mkdir -p "$CACHE" "$LOGDIR"

# -- host tools ----------------------------------------------------------------
if ! command -v debootstrap >/dev/null || [ ! -e /usr/bin/qemu-aarch64-static ] \
   || ! command -v update-binfmts >/dev/null; then
    say "installing debootstrap qemu-user-static binfmt-support"
    apt-get update -q >"$LOGDIR/apt.log" 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap qemu-user-static binfmt-support \
        >>"$LOGDIR/apt.log" 2>&1 || die "apt-get install (see $LOGDIR/apt.log)"
fi
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || die "cannot mount binfmt_misc"
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    update-binfmts --enable qemu-aarch64 || die "cannot register qemu-aarch64 with binfmt_misc"
fi

# -- what the host uses: Debian mirror, package index, CA bundle -----------------
debian_mirror() {
    if [ -n "${TITEN_ARM64_MIRROR:-}" ]; then echo "$TITEN_ARM64_MIRROR"; return; fi
    local m=""
    # deb822 (.sources) first, then one-line (.list) entries; the main archive, not -security
    m=$(awk 'tolower($1)=="uris:" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\/.*\/debian\/?$/) { print $i; exit } }' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
    [ -n "$m" ] || m=$(awk '$1=="deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\/.*\/debian\/?$/) { print $i; exit } }' \
        /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1)
    echo "${m:-http://deb.debian.org/debian}"
}

host_pip_setting() {  # the host's pip value for a key (index-url, extra-index-url), env first
    local key=$1 var
    var=PIP_$(echo "$key" | tr 'a-z-' 'A-Z_')
    if [ -n "${!var:-}" ]; then echo "${!var}"; return; fi
    python3 -m pip config list 2>/dev/null \
        | sed -n "s/^[a-z:]*\.$key='\(.*\)'\$/\1/p" | head -n1
}

INDEX_URL=$(host_pip_setting index-url)
INDEX_URL=${INDEX_URL:-https://pypi.org/simple}
# only network indexes reach into the root; file:// ones are this host's disk
EXTRA_INDEX=$(host_pip_setting extra-index-url | tr ' ' '\n' | grep -E '^https?://' | tr '\n' ' ' || true)
HOST_CA=""
for f in "${SSL_CERT_FILE:-}" "${PIP_CERT:-}" "${REQUESTS_CA_BUNDLE:-}" /etc/ssl/certs/ca-certificates.crt \
         /etc/pki/tls/certs/ca-bundle.crt; do
    if [ -n "$f" ] && [ -s "$f" ]; then HOST_CA=$f; break; fi
done
[ -n "$HOST_CA" ] || die "no CA bundle found on the host"

# -- the root --------------------------------------------------------------------
if [ "${TITEN_ARM64_REBUILD:-0}" = 1 ]; then say "discarding $ROOT"; rm -rf "$ROOT"; fi
if [ ! -e "$ROOT/.titen-root-ok" ]; then
    MIRROR=$(debian_mirror)
    say "debootstrap $SUITE arm64 from $MIRROR into $ROOT (log: $LOGDIR/debootstrap.log)"
    rm -rf "$ROOT.partial"
    debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv "$SUITE" "$ROOT.partial" "$MIRROR" \
        >"$LOGDIR/debootstrap.log" 2>&1 || { tail -n 20 "$LOGDIR/debootstrap.log"; die "debootstrap"; }
    touch "$ROOT.partial/.titen-root-ok"
    rm -rf "$ROOT"
    mv "$ROOT.partial" "$ROOT"
fi
# with the F flag the kernel holds the interpreter open: the root needs no copy of it
grep -q '^flags: .*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 || cp /usr/bin/qemu-aarch64-static "$ROOT/usr/bin/"
# the host's CA bundle beside the root's own (which ca-certificates may rewrite)
HOST_CA_IN_ROOT=/etc/ssl/titen-host-ca.crt
cp "$HOST_CA" "$ROOT$HOST_CA_IN_ROOT"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
cp /etc/hosts "$ROOT/etc/hosts" 2>/dev/null || true

MOUNTED=()
cleanup() {
    local i
    for (( i = ${#MOUNTED[@]} - 1; i >= 0; i-- )); do umount -l "${MOUNTED[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
mount_in() {  # mount_in DIR ARGS...: mount into the root for this run only
    local dir=$ROOT/$1; shift
    mkdir -p "$dir"
    if ! mountpoint -q "$dir"; then mount "$@" "$dir"; MOUNTED+=("$dir"); fi
}
mount_in proc -t proc proc
mount_in dev --bind /dev
mount_in dev/pts --bind /dev/pts
mount_in dev/shm -t tmpfs tmpfs

# everything in the root runs with this environment and nothing else
PASS=(HOME=/root PATH="$VENV/bin:/usr/local/bin:/usr/bin:/bin" LANG=C.UTF-8 LC_ALL=C.UTF-8 TERM=dumb
      SSL_CERT_FILE="$HOST_CA_IN_ROOT"
      PIP_CONFIG_FILE=/dev/null PIP_INDEX_URL="$INDEX_URL" PIP_CERT="$HOST_CA_IN_ROOT"
      PIP_NO_COMPILE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180 PIP_NO_INPUT=1)
if [ -n "$EXTRA_INDEX" ]; then PASS+=(PIP_EXTRA_INDEX_URL="${EXTRA_INDEX% }"); fi
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    if [ -n "${!v:-}" ]; then PASS+=("$v=${!v}"); fi
done
in_root() { env -i "${PASS[@]}" /usr/sbin/chroot "$ROOT" "$@"; }

# -- the venv and the pinned dependencies ------------------------------------------
# runtime dependencies, and the test tools the checked tests import, as pinned in pyproject.toml
REQS=$(python3 - "$REPO/pyproject.toml" <<'EOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
wanted = {"pytest", "hypothesis", "httpx2"}
dev = [r for r in project["optional-dependencies"]["dev"]
       if r.split("=")[0].split("[")[0].strip() in wanted]
print("\n".join(["setuptools>=69", *project["dependencies"], *dev]))
EOF
)
REQS_ID=$(printf '%s\n%s\n' "$REQS" "$INDEX_URL" | cksum | cut -d' ' -f1)
if [ ! -e "$ROOT$VENV/.reqs-$REQS_ID" ]; then
    say "venv with the pinned dependencies from $INDEX_URL (log: $LOGDIR/pip.log)"
    printf '%s\n' "$REQS" >"$ROOT/tmp/titen-reqs.txt"
    { [ -x "$ROOT$VENV/bin/python" ] || in_root python3 -m venv "$VENV"; } >"$LOGDIR/pip.log" 2>&1 \
        || { tail -n 20 "$LOGDIR/pip.log"; die "venv"; }
    in_root "$VENV/bin/python" -m pip install --no-compile -r /tmp/titen-reqs.txt >>"$LOGDIR/pip.log" 2>&1 \
        || { tail -n 20 "$LOGDIR/pip.log"; die "pip install of the pinned dependencies"; }
    rm -f "$ROOT$VENV"/.reqs-*
    touch "$ROOT$VENV/.reqs-$REQS_ID"
fi

# -- this checkout, installed ------------------------------------------------------------
say "copying $REPO into the root and installing it"
rm -rf "$ROOT/work/titen"
mkdir -p "$ROOT/work/titen"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
    | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -C "$ROOT/work/titen" -xf -
in_root sh -c "cd /work/titen && $VENV/bin/python -m pip install --no-compile --no-deps --no-build-isolation ." \
    >"$LOGDIR/install.log" 2>&1 || { tail -n 20 "$LOGDIR/install.log"; die "pip install of the project"; }

# -- the checks ------------------------------------------------------------------------
FAIL=0
# a snapshot priced on this host and served in the root (the laptop-built,
# Lambda-served case), priced by the checkout's own venv
HOST_PY=$REPO/.venv/bin/python
if [ ! -x "$HOST_PY" ]; then
    say "make setup: the host's venv, to price a snapshot here (log: $LOGDIR/host-setup.log)"
    make -C "$REPO" setup >"$LOGDIR/host-setup.log" 2>&1 || { tail -n 20 "$LOGDIR/host-setup.log"; die "make setup"; }
fi
HOST_FP=$(cd "$REPO" && "$HOST_PY" -c 'from core.lexical import platform_fingerprint as f; print(f())')
rm -f "$ROOT/tmp/titen-cross.sqlite"
CROSS=(--check-cross /tmp/titen-cross.sqlite)
(cd "$REPO" && "$HOST_PY" -m infra.arm64_check --build-cross "$ROOT/tmp/titen-cross.sqlite") || FAIL=1
say "probe and random-query comparison (log: $LOGDIR/compare.log)"
in_root sh -c "cd /work/titen && python -m infra.arm64_check --queries $QUERIES ${CROSS[*]}" 2>&1 \
    | tee "$LOGDIR/compare.log" || FAIL=1
say "tests: ${TESTS[*]} (log: $LOGDIR/pytest.log)"
in_root sh -c "cd /work/titen && python -m pytest ${TESTS[*]}" >"$LOGDIR/pytest.log" 2>&1 || FAIL=1
tail -n 15 "$LOGDIR/pytest.log"

echo
echo "== check-arm64 summary =="
in_root sh -c 'python -c "import platform, apsw, numpy; print(\"platform:\", platform.machine(), \"python\", platform.python_version(), \"apsw\", apsw.apsw_version(), \"sqlite\", apsw.sqlite_lib_version(), \"numpy\", numpy.__version__)"'
grep -E '^(probe|compare|fingerprint|cross)' "$LOGDIR/compare.log" || true
echo "host fingerprint: $HOST_FP"
echo "tests: $(grep -E '[0-9]+ (passed|failed|errors?)' "$LOGDIR/pytest.log" | tail -n1) (${TESTS[*]#tests/})"
echo "elapsed: $(( $(date +%s) - START ))s"
if [ "$FAIL" != 0 ]; then echo "RESULT: FAIL"; exit 1; fi
echo "RESULT: PASS"
