"""Summarise a pytest junit xml file: passed / failed / skipped / errors per test file.

    python3 tests/gpu/junit_summary.py OUT/junit.xml

Prints a small table, one row per test file and a total, for the last lines
of tests/gpu/run.sh. Works with either junit family (xunit1 names the file;
xunit2 only the dotted class name, from which the module is recovered).
Standard library only; exits 0 unless the file cannot be read.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

KINDS = ("passed", "failed", "skipped", "errors")


def _file_of(case: ET.Element) -> str:
    """The test file of a <testcase>: its ``file`` attribute, else guessed from ``classname``."""
    if case.get("file"):
        return case.get("file", "")
    parts = [p for p in (case.get("classname") or "").split(".") if p]
    if not parts:  # a collection error: the name is the module's dotted path
        parts = (case.get("name") or "?").split(".")
    # Keep the dotted path up to the module (test_*.py), dropping test classes.
    for i, part in enumerate(parts):
        if part.startswith("test_") or part.endswith("_test"):
            return "/".join(parts[:i + 1]) + ".py"
    return "/".join(parts)


def _outcome(case: ET.Element) -> str:
    tags = {child.tag for child in case}
    if "failure" in tags:
        return "failed"
    if "error" in tags:
        return "errors"
    if "skipped" in tags:  # also xfail
        return "skipped"
    return "passed"


def summarise(path: str) -> tuple[dict[str, dict[str, int]], int]:
    """({test file: {kind: count}}, how many tests were cut short) of the junit xml at *path*.

    A test interrupted by SIGINT (run.sh's deadline) leaves a <testcase> without a name.
    """
    root = ET.parse(path).getroot()
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(KINDS, 0))
    interrupted = 0
    for case in root.iter("testcase"):
        if not case.get("name"):
            interrupted += 1
            continue
        counts[_file_of(case)][_outcome(case)] += 1
    return dict(counts), interrupted


def table(counts: dict[str, dict[str, int]]) -> str:
    total = {kind: sum(c[kind] for c in counts.values()) for kind in KINDS}
    width = max([len("file"), len("TOTAL")] + [len(f) for f in counts])
    lines = [f"{'file':<{width}} " + " ".join(f"{k:>7}" for k in KINDS)]
    for name in sorted(counts):
        lines.append(f"{name:<{width}} " + " ".join(f"{counts[name][k]:>7}" for k in KINDS))
    lines.append(f"{'TOTAL':<{width}} " + " ".join(f"{total[k]:>7}" for k in KINDS))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        counts, interrupted = summarise(argv[1])
    except (OSError, ET.ParseError) as exc:
        print(f"cannot read the junit xml {argv[1]}: {exc}")
        return 1
    if interrupted:
        print(f"{interrupted} test(s) interrupted, not counted")
    print(table(counts) if counts else "the junit xml lists no tests")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
