#!/usr/bin/env bash
# Stage the functions' code (template.yaml's CodeUri) into the directory $1:
# every file of core/ and handler/ in the working tree (tracked or not)
# except bytecode caches. Every file, not
# only *.py: the code reads data files beside it at import (the cl100k_base
# merge table the token count rests on, the MiniLM tokenizer), and an
# artifact without them cannot start (tests/test_lambda_artifact.py imports
# the handlers from what this script stages).
#
# Usage: infra/stage-app.sh DEST     (DEST is emptied first)
set -euo pipefail
[ $# -eq 1 ] && [ -n "$1" ] || { echo "usage: infra/stage-app.sh DEST" >&2; exit 2; }
case "$1" in /*) dest="$1" ;; *) dest="$PWD/$1" ;; esac  # (no realpath -m: GNU only)
case "$dest" in /|"$HOME"|"$HOME/") echo "infra/stage-app.sh: refusing to empty $dest" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
rm -rf "$dest"
mkdir -p "$dest"
for package in core handler; do
  find "$package" -name "__pycache__" -prune -o -type f ! -name "*.pyc" -print |
    while read -r file; do
      mkdir -p "$dest/$(dirname "$file")"
      cp "$file" "$dest/$file"
    done
done
