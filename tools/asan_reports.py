"""Sort AddressSanitizer's reports into the project's and everybody else's.

    python3 tools/asan_reports.py LOG_DIR

Reads every file in LOG_DIR (ASan's ``log_path`` files, ``asan.<pid>``: one per process
that reported, each holding one report or more; tools/asan.sh makes them) and splits them:

* a report any of whose stacks (the access, "freed by", "previously allocated by", a thread's
  creation) has a frame in the project's code -- csrc/, the tritonshm extensions, the fake
  CUDA runtime the tests build (tests/fake_cudart) -- is printed (up to its shadow-memory dump,
  which stays in the log): it fails the run;
* a report with no such frame (Python, numpy, grpc, the C library on their own) is listed, one
  line per kind with its count: it is theirs, not ours, and does not fail the run.

A report that touches our code counts as ours even when the memory is someone else's: a use
after free in our destructor of a name that a test helper freed is a bug to fix either way.
Standard library only.  Exit status: 1 if a report is the project's, 0 otherwise (also when
there is no log at all: a clean run writes none), 2 when LOG_DIR cannot be read.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: Where a frame is in the project's code, by the file or module it names.  A frame reads
#: ``#3 0x7f.. in <function> <source>:<line>`` when ASan finds debug information, else
#: ``#3 0x7f.. in <function> (<module>+0x..)`` or ``#3 0x7f..  (<module>+0x..)``.  The extensions
#: (TRITONSHM_SANITIZE adds -g, tools/asan.sh keeps the symbols) and the fake are built with debug
#: information, so their frames name source files, but for the case noted at name_frame().
PROJECT_FRAME = re.compile(
    r"""
      (?:^|/) csrc/tshm\w* \.[ch] :                       # the C core
    | (?:^|/) tests/fake_cudart/ \w+ \.c :                 # the fake CUDA runtime
    | (?:^|/) bench/tshm\w* \.c :                         # the native microbenchmarks
    | (?:^|/) _memory_\w+ \.c :                           # Cython's C for tritonshm._memory.* (CMakeLists.txt)
    | (?:^|/) tritonshm/_memory/ \w+ \.(?:pyx|pxd|pxi) :  # the same, where Cython's line directives point
    | (?:^|/) tritonshm/_memory/ \w+ \.cpython-[^/()\s]*\.so\b  # an extension module, unnamed frame
    | (?:^|/) libfakecudart- [0-9a-f]+ \.so\b             # the fake's library (tests/fake_cuda.py names it)
    | \b in \s+ __pyx_\w*?9tritonshm_                     # a Cython function of a tritonshm module
    | \b in \s+ tshm_\w                                  # the C core's and the fake's own functions
    """,
    re.VERBOSE,
)

#: A frame line of a stack.
FRAME = re.compile(r"^\s*#\d+\s+0x[0-9a-f]+\s")
#: The line that opens a report: "==<pid>==ERROR: AddressSanitizer: <what> ...".
REPORT_START = re.compile(r"^==(?P<pid>\d+)==ERROR: (?P<tool>\w+Sanitizer): (?P<what>.*)$")
#: Lines that end a report: the next report's separator or error line, a warning, the end.
REPORT_END = re.compile(r"^(?:={20,}\s*$|==\d+==(?:ERROR|WARNING|ABORTING))")
SUMMARY = re.compile(r"^SUMMARY: \w+Sanitizer: (?P<summary>.*)$")
#: A frame ASan could not name: "#1 0x7f.. (<module>+0x<offset>)".
UNNAMED = re.compile(r"^\s*#\d+\s+0x[0-9a-f]+\s+\((?P<module>[^()\s]+)\+(?P<offset>0x[0-9a-f]+)\)")
#: Where the shadow memory dump starts: the rest of a report is its legend (still in the log).
SHADOW = "Shadow bytes around the buggy address:"


@dataclasses.dataclass
class Report:
    """One ASan report: its text, where it was found and the frames of its stacks."""

    log: str  # the file it came from
    pid: int
    text: str

    @property
    def frames(self) -> list[str]:
        return [line.strip() for line in self.text.splitlines() if FRAME.match(line)]

    @property
    def project_frames(self) -> list[str]:
        return [frame for frame in self.frames if PROJECT_FRAME.search(frame)]

    @property
    def ours(self) -> bool:
        return bool(self.project_frames)

    @property
    def summary(self) -> str:
        """ASan's SUMMARY line without its prefix, else the first line (a report cut short)."""
        for line in self.text.splitlines():
            match = SUMMARY.match(line)
            if match:
                return match.group("summary")
        return REPORT_START.match(self.text.splitlines()[0]).group("what")


def parse(text: str, log: str = "-") -> list[Report]:
    """The reports in one log file's *text*, in order."""
    reports, current, pid = [], None, 0
    for line in text.splitlines():
        start = REPORT_START.match(line)
        if current is not None and (start or REPORT_END.match(line)):
            reports.append(Report(log, pid, "\n".join(current)))
            current = None
        if start:
            current, pid = [line], int(start.group("pid"))
        elif current is not None:
            current.append(line)
    if current is not None:
        reports.append(Report(log, pid, "\n".join(current)))
    return reports


def read_logs(log_dir: str | Path) -> list[Report]:
    """Every report in the files of *log_dir* (sorted by name, so the order is stable)."""
    reports = []
    for path in sorted(Path(log_dir).iterdir()):
        if path.is_file():
            reports.extend(parse(path.read_text(errors="replace"), path.name))
    return reports


def name_frame(frame: str) -> str:
    """*frame* with addr2line's function and line added where ASan gave only module+offset.

    ASan names the functions of the libraries loaded when it first printed a stack, not of
    those dlopen()ed after (the fake runtime, loaded by a test); addr2line reads the module
    itself, if it is still there.
    """
    match = UNNAMED.match(frame)
    addr2line = shutil.which("addr2line")
    if match is None or addr2line is None or not os.path.isfile(match.group("module")):
        return frame
    try:
        out = subprocess.run([addr2line, "-f", "-i", "-e", match.group("module"), match.group("offset")],
                             capture_output=True, text=True, timeout=60).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return frame
    # One (function, file:line) pair per inlined level, innermost first.
    places = [f"{func} {where}" for func, where in zip(out[0::2], out[1::2]) if func and func != "??"]
    return f"{frame} [{'; '.join(places)}]" if places else frame


def render(reports: list[Report]) -> str:
    """What the run prints: our reports whole but the shadow dump, theirs one line per kind,
    then the counts."""
    ours = [r for r in reports if r.ours]
    theirs = [r for r in reports if not r.ours]
    out = []
    for report in ours:
        out.append(f"=== ASan report in the project's code ({report.log}, pid {report.pid})")
        for line in report.text.splitlines():
            if line.startswith(SHADOW):
                out.append(f"(shadow bytes: see {report.log})")
                break
            out.append(name_frame(line) if PROJECT_FRAME.search(line) else line)
        out.append("")
    if theirs:
        out.append(f"=== ASan reports outside the project's code (listed, not failing): {len(theirs)}")
        by_summary = collections.Counter(r.summary for r in theirs)
        logs = collections.defaultdict(list)
        for r in theirs:
            logs[r.summary].append(r.log)
        for summary, count in by_summary.most_common():
            out.append(f"  {count} x {summary}  ({', '.join(sorted(set(logs[summary]))[:5])})")
    out.append(f"asan_reports: {len(ours)} report(s) in the project's code, "
               f"{len(theirs)} outside it")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        reports = read_logs(argv[0])
    except OSError as exc:
        print(f"asan_reports: cannot read {argv[0]}: {exc}", file=sys.stderr)
        return 2
    print(render(reports))
    return 1 if any(r.ours for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
