"""Build the vector calibration set from real text on this machine (issue #17).

    .venv/bin/python -m bench.calibration            # writes tests/fixtures/calibration/set.json

Two sources nobody here wrote, each giving a question phrased differently
from its answer:

- **man pages** (``/usr/share/man/man{1,5,7,8}``, gzipped groff): the NAME
  line's description (``ls \\- list directory contents`` → "list directory
  contents", the command name dropped) is the query; the first paragraph of
  the DESCRIPTION section, groff markup stripped, is the answer claim;
- **Python standard-library docstrings** (this interpreter's modules, their
  public functions, classes and methods): the summary line is the query, the
  body after it (first paragraphs, doctest ``>>>``/``...`` lines dropped, but
  not their expected output: a known flaw, docs/vectors.md §2) the answer claim.

Answers are cut to at most ``MAX_WORDS`` words at a sentence end where one
exists. A pair is kept only when its answer is long enough to be a claim,
its query has content words, and neither the query nor the answer text was
seen before (first in sorted order wins), so the set has no duplicate
answers for a query to tie with. Sampling is seeded: the same machine gives
the same file, byte for byte. Every claim is also every other query's
distractor: ``CLAIMS`` of them make ranking non-trivial.

The file is ``{"source": ..., "pairs": [{"id", "source", "query", "answer"}]}``,
sorted by id. ``bench.calibration_eval`` measures lexical against hybrid on it.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import inspect
import json
import os
import random
import re
import sys
import warnings
from pathlib import Path

from core.compile.planning import plan_query

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "calibration" / "set.json"
SEED = 20261204
MAN_SECTIONS = ("1", "5", "7", "8")
MAN_PAIRS = 1800
GCLOUD_PAIRS = 300  # man1 is mostly Google Cloud SDK pages, alike in wording: a share, not the bulk
PY_PAIRS = 1200
MAX_WORDS = 60
MIN_ANSWER_WORDS = 8
# importing these opens windows, starts things, prints, or takes seconds
SKIP_MODULES = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "__hello__", "__phello__",
                "lib2to3", "pydoc_data", "test", "ensurepip", "venv", "webbrowser", "xxlimited", "xxsubtype",
                "xxlimited_35", "_xxtestfuzz", "_testcapi", "_testinternalcapi", "_testbuffer",
                "_testimportmultiple", "_testmultiphase", "_ctypes_test", "sre_compile", "sre_constants",
                "sre_parse", "idlelib", "msilib", "_msi", "winreg", "winsound", "nturl2path"}

_ESCAPES = [(r"\\f\[[^\]]*\]", ""), (r"\\f\(..", ""), (r"\\f.", ""), (r"\\\(em", " - "), (r"\\\(en", "-"),
            (r"\\\(aq", "'"), (r"\\\(dq", '"'), (r"\\\(lq|\\\(rq|\\\(oq|\\\(cq", '"'), (r"\\\(bu", ""),
            (r"\\\(co", "(c)"), (r"\\\([a-zA-Z]{2}", ""), (r"\\\*\(..", ""), (r"\\\*.", ""), (r"\\-", "-"),
            (r"\\&", ""), (r"\\e", "\\\\"), (r"\\ ", " "), (r"\\~", " "), (r"\\0", " "), (r"\\/|\\,|\\\^|\\\|", ""),
            (r"\\c", ""), (r"\\s[-+]?\d", ""), (r'\\"', ""), (r"\\[a-zA-Z]", "")]
_ESCAPES = [(re.compile(p), r) for p, r in _ESCAPES]
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def groff_text(line: str) -> str:
    """One groff line as plain text: font and character escapes removed."""
    for pattern, replacement in _ESCAPES:
        line = pattern.sub(replacement, line)
    return line


def cut(text: str, max_words: int = MAX_WORDS) -> str:
    """At most ``max_words`` words, ending at the last sentence end inside them if any."""
    words = text.split()
    if len(words) <= max_words:
        return " ".join(words)
    head = " ".join(words[:max_words])
    ends = [m.end() for m in _SENTENCE_END.finditer(head)]
    return head[:ends[-1]] if ends and ends[-1] > len(head) // 3 else head


def parse_man(raw: str) -> tuple[str, str] | None:
    """(NAME description, DESCRIPTION's first paragraph) of a groff page, or None."""
    section, name_lines, desc, paragraph_done = None, [], [], False
    for line in raw.splitlines():
        if line.startswith(".SH") or line.startswith(".Sh"):
            title = line[3:].strip().strip('"').upper()
            if section == "DESCRIPTION" and desc:
                break
            section = title
            continue
        if line.startswith('.\\"') or line.startswith("'\\\""):
            continue
        if section == "NAME":
            if line.startswith(".") and not line.startswith((".B ", ".I ", ".Nm", ".Nd")):
                continue
            name_lines.append(re.sub(r"^\.(Nm|Nd|B|I)\s*", "", line))
        elif section == "DESCRIPTION" and not paragraph_done:
            if line.startswith((".PP", ".LP", ".P ", ".TP", ".IP", ".sp", ".Pp", ".RS", ".SS")) or line == ".P":
                if desc:
                    paragraph_done = True
                continue
            if line.startswith("."):
                m = re.match(r"^\.(B|I|BR|RB|BI|IB|IR|RI|SM|SB)\s+(.*)$", line)
                if not m:
                    continue
                line = m.group(2).replace('"', "")
            desc.append(line)
    if not name_lines or not desc:
        return None
    name = groff_text(" ".join(name_lines))
    if " - " not in name:
        return None
    query = name.split(" - ", 1)[1].strip()
    answer = " ".join(groff_text(" ".join(desc)).split())
    return query, re.sub(r"^\((ALPHA|BETA)\)\s*", "", answer)


def man_pairs(root: str = "/usr/share/man") -> list[dict]:
    out = []
    for section in MAN_SECTIONS:
        directory = Path(root) / f"man{section}"
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if not path.name.endswith(".gz"):
                continue
            try:
                raw = gzip.open(path, "rt", encoding="utf-8", errors="replace").read(200_000)
            except (OSError, EOFError):
                continue
            if raw.startswith(".so "):  # a link to another page
                continue
            if path.name.startswith(("gcloud_alpha", "gcloud_beta")):  # near-copies of the GA pages
                continue
            parsed = parse_man(raw)
            if parsed:
                out.append({"id": f"man{section}:{path.name[:-3]}", "source": "man", "query": parsed[0],
                            "answer": cut(parsed[1])})
    return out


def docstring_pair(qualname: str, obj) -> dict | None:
    doc = inspect.getdoc(obj)
    if not doc or "\n\n" not in doc:
        return None
    summary, body = doc.split("\n\n", 1)
    summary = " ".join(summary.split())
    if "(" in summary and summary.split("(")[0].strip().isidentifier():  # a C signature line, not a summary
        return None
    kept = [line for line in body.splitlines() if not line.lstrip().startswith((">>>", "..."))]
    answer = " ".join(" ".join(kept).split())
    return {"id": f"py:{qualname}", "source": "python", "query": summary.rstrip("."), "answer": cut(answer)}


def stdlib_module_names() -> list[str]:
    """The standard library's public modules and their public submodules, sorted."""
    import pkgutil

    names = set()
    for top in sys.stdlib_module_names:
        if top.startswith("_") or top in SKIP_MODULES:
            continue
        names.add(top)
        try:
            module = importlib.import_module(top)
        except BaseException:  # noqa: BLE001 - a module this platform lacks
            continue
        for info in pkgutil.iter_modules(getattr(module, "__path__", None) or [], top + "."):
            if not any(part.startswith("_") or part in SKIP_MODULES or part == "tests"
                       for part in info.name.split(".")):
                names.add(info.name)
    return sorted(names)


def python_pairs() -> list[dict]:
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in stdlib_module_names():
            try:
                module = importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - a module this platform lacks
                continue
            for attr in sorted(dir(module)):
                if attr.startswith("_"):
                    continue
                obj = getattr(module, attr, None)
                if getattr(obj, "__module__", None) != name or not (inspect.isroutine(obj) or inspect.isclass(obj)):
                    continue
                pair = docstring_pair(f"{name}.{attr}", obj)
                if pair:
                    out.append(pair)
                if inspect.isclass(obj):
                    for meth in sorted(vars(obj)):
                        if meth.startswith("_") or not inspect.isroutine(vars(obj)[meth]):
                            continue
                        pair = docstring_pair(f"{name}.{attr}.{meth}", vars(obj)[meth])
                        if pair:
                            out.append(pair)
    return out


def usable(pairs: list[dict]) -> list[dict]:
    """First in sorted order wins: no repeated query or answer, real content."""
    seen_q, seen_a, out = set(), set(), []
    for p in sorted(pairs, key=lambda p: p["id"]):
        q, a = p["query"], p["answer"]
        if len(a.split()) < MIN_ANSWER_WORDS or not plan_query(q).terms or len(q.split()) < 2:
            continue
        if not plan_query(q).match or q.casefold() in seen_q or a.casefold() in seen_a:
            continue
        if len(q) > 200 or q.casefold() in a.casefold():
            continue
        seen_q.add(q.casefold())
        seen_a.add(a.casefold())
        out.append(p)
    return out


def build(man_n: int = MAN_PAIRS, py_n: int = PY_PAIRS, seed: int = SEED) -> dict:
    rng = random.Random(seed)
    man = usable(man_pairs())
    gcloud = [p for p in man if p["id"].startswith("man1:gcloud")]
    other = [p for p in man if not p["id"].startswith("man1:gcloud")]
    man_sample = rng.sample(gcloud, min(GCLOUD_PAIRS, len(gcloud)))
    man_sample += rng.sample(other, min(man_n - len(man_sample), len(other)))
    py = usable(python_pairs())
    chosen = man_sample + rng.sample(py, min(py_n, len(py)))
    # an answer repeated across the two sources would make two right answers
    chosen = usable(chosen)
    return {"source": {"man_sections": list(MAN_SECTIONS), "python": sys.version.split()[0], "seed": seed,
                       "man_available": len(man), "python_available": len(py)},
            "pairs": sorted(chosen, key=lambda p: p["id"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.calibration", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    data = build()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=0, sort_keys=True)
        f.write("\n")
    print(f"{len(data['pairs'])} pairs ({data['source']}) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
