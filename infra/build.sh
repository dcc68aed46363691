#!/usr/bin/env bash
# Stage the Lambda artifacts that template.yaml points at, for arm64 / CPython 3.12:
#
#   build/lambda/deps/python/...   the DependenciesLayer: requirements-lambda.txt,
#                                  binary wheels for manylinux aarch64 only
#   build/lambda/app/{core,handler} the functions' code (CodeUri)
#
# then `sam build && sam deploy`. Runs on any host architecture without
# Docker: pip is asked for aarch64 wheels explicitly (--platform ...
# --only-binary=:all:), so nothing is compiled here. Why not let `sam build`
# resolve requirements itself: apsw 3.54's aarch64 wheels are manylinux_2_28
# (Lambda's python3.12 runtime has glibc 2.34, so they run), but SAM's pip
# builder judges python3.12 wheels against glibc 2.17 and falls back to an
# sdist build; and its copy step drops every *.so from CodeUri.
#
# Usage: infra/build.sh            (PYTHON312=/path/to/python3.12 to choose the interpreter)
# Prints the unzipped and zipped sizes of both artifacts.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=build/lambda
REQUIREMENTS=requirements-lambda.txt
PY="${PYTHON312:-}"
if [ -z "$PY" ]; then
  if python3.12 -c "" 2>/dev/null; then PY=python3.12; else PY=python3; fi
fi
PY_VERSION=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

compile() {  # byte-compile for 3.12 so a cold start does not compile in memory
  if [ "$PY_VERSION" = "3.12" ]; then
    # unchecked-hash: zip keeps mtimes at 2 s resolution, which would make
    # timestamp-checked .pyc files look stale on Lambda
    "$PY" -m compileall -q -j 0 --invalidation-mode unchecked-hash "$1" >/dev/null
  else
    echo "note: $PY is Python $PY_VERSION, not 3.12: shipping without .pyc (slower cold start)" >&2
  fi
}

# -- dependencies (rebuilt only when the requirements change) ------------------
want="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1) $PY_VERSION"
if [ "$(cat "$OUT/deps.stamp" 2>/dev/null || true)" != "$want" ]; then
  rm -rf "$OUT/deps" "$OUT/deps.stamp"
  mkdir -p "$OUT/deps/python"
  "$PY" -m pip install --quiet --no-compile --disable-pip-version-check --root-user-action=ignore \
    --target "$OUT/deps/python" \
    --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
    --implementation cp --python-version 3.12 --abi cp312 --only-binary=:all: \
    --requirement "$REQUIREMENTS"
  # not needed at run time: console scripts, apsw's own test suite and its
  # optional SQLite extension binaries (apsw.sqlite_extra; core loads none)
  rm -rf "$OUT/deps/python/bin" "$OUT/deps/python/apsw/tests" "$OUT/deps/python/apsw/sqlite_extra_binaries"
  compile "$OUT/deps/python"
  echo "$want" > "$OUT/deps.stamp"
fi

# -- code (always fresh) ---------------------------------------------------------
infra/stage-app.sh "$OUT/app"
compile "$OUT/app"

# -- sizes -----------------------------------------------------------------------
"$PY" - "$OUT" <<'EOF'
import os, sys, tempfile, zipfile
out = sys.argv[1]
def size(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
def zipped(path):
    with tempfile.TemporaryDirectory() as tmp:
        target = os.path.join(tmp, "a.zip")
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
            for d, _, fs in os.walk(path):
                for f in fs:
                    full = os.path.join(d, f)
                    z.write(full, os.path.relpath(full, path))
        return os.path.getsize(target)
total = 0
for name in ("deps", "app"):
    u, z = size(os.path.join(out, name)), zipped(os.path.join(out, name))
    total += u
    print(f"{out}/{name}: {u / 1e6:.1f} MB unzipped, {z / 1e6:.1f} MB zipped")
print(f"total unzipped {total / 1e6:.1f} MB (Lambda limit: 250 MB for function + layers)")
EOF
