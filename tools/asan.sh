#!/usr/bin/env bash
# The fast loop under AddressSanitizer, from the repository root:
#
#     tools/asan.sh [more pytest arguments]        # e.g. tools/asan.sh tests/cuda -x
#
#   1. builds the extensions with TRITONSHM_SANITIZE=ON (CMakeLists.txt) into a venv of their own,
#      $TSHM_ASAN_DIR/venv (default build/asan/venv), with its own CMake build directory, so the
#      normal build and environment are untouched; a second run reuses both (an incremental build);
#   2. has the tests build the fake CUDA runtime (tests/fake_cudart) with ASan too
#      (TSHM_FAKE_CUDA_CFLAGS, read by tests/fake_cuda.py);
#   3. runs `python -m pytest -m "not server"` plus the arguments given (a later -m wins) with
#      PYTHONMALLOC=malloc (Python's objects come from malloc, so ASan sees one used after its
#      free), LD_PRELOAD of libasan and libstdc++ (the extensions and the fake are instrumented,
#      the interpreter is not: the runtime must come first; grpc's C++ throws, and ASan's
#      __cxa_throw finds the real one only in a library there from the start: without it the run
#      aborts inside gevent), and ASan
#      going on after a report (halt_on_error=0) and writing each process's reports to
#      $TSHM_ASAN_DIR/logs/asan.<pid>;
#   4. sorts the reports (tools/asan_reports.py): any whose stacks touch the project's code
#      (csrc/, the tritonshm extensions, the fake runtime) fails the run; those of Python,
#      numpy, grpc and the like alone are listed.
# Exit status: pytest's if it failed, else 1 if a report is in the project's code, else 0.
#
# Leaks are not checked (detect_leaks=0): CPython frees little at exit, so LeakSanitizer's list
# would be the interpreter's, not ours; the tests' own leak checks (tests/conftest.py) count
# regions, descriptors and segments instead.  Tests that start a Triton server are left out: the
# server loads the fake runtime too (LD_PRELOAD), and an instrumented fake loads only after
# the ASan runtime.  Needs gcc's libasan (Debian: libgcc-12-dev) and network access to a package
# index for the first run (the test extra, the build requirements).
# Settings (environment): TSHM_ASAN_DIR, PYTHON (default python3, makes the venv), CC (default gcc:
# the compiler whose ASan runtime is preloaded builds everything).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# Absolute: ASan opens log_path from the reporting process's working directory.
DIR=$(realpath -m "${TSHM_ASAN_DIR:-$ROOT/build/asan}")
PY=${PYTHON:-python3}
export CC=${CC:-gcc}
START=$SECONDS

# The runtimes the instrumented code needs, from the compiler that instruments it. gcc prints the
# bare name when it has no such file.
runtime() {
    local path
    path=$("$CC" -print-file-name="$1")
    if [ "$path" = "$1" ] || [ ! -e "$path" ]; then
        echo "asan.sh: $CC has no $1 (install its AddressSanitizer runtime, e.g. libgcc-12-dev)" >&2
        exit 2
    fi
    realpath "$path"
}
LIBASAN=$(runtime libasan.so)
LIBSTDCXX=$(runtime libstdc++.so)

# -- 1. the instrumented build ----------------------------------------------------------------
VPY=$DIR/venv/bin/python
[ -x "$VPY" ] || "$PY" -m venv "$DIR/venv"
echo "asan.sh: building with TRITONSHM_SANITIZE=ON into $DIR"
pip() { "$VPY" -m pip --disable-pip-version-check "$@"; }
# The build requirements go into the venv and the build runs there (no build isolation): pip's
# throwaway build environment has a new path each time, which makes CMake run Cython and compile
# everything again (~90 s here); in the venv a rebuild compiles what changed (~3 s).  Python
# 3.10 has no tomllib: it builds isolated, every time.
isolation=--no-build-isolation
if requires=$("$VPY" -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' 2>/dev/null); then
    mapfile -t requires <<< "$requires"
    pip install --quiet "${requires[@]}"
else
    isolation=
fi
# install.strip=false: keep the symbols, so ASan's stacks name our functions and lines.
pip install --quiet $isolation -e ".[test]" \
    -Ccmake.define.TRITONSHM_SANITIZE=ON -Cinstall.strip=false -Cbuild-dir="$DIR/cmake/{wheel_tag}"

# -- 2., 3. the fast loop under ASan ------------------------------------------------------------
LOGS=$DIR/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
# tests/conftest.py reads log_path too: the log a report opens is not a descriptor a test leaked.
# allocator_may_return_null=1: an impossible allocation fails (NULL, MemoryError) as it does
# without ASan, instead of ending the process with a report.
set +e
PYTHONMALLOC=malloc \
LD_PRELOAD="$LIBASAN $LIBSTDCXX" \
ASAN_OPTIONS="log_path=$LOGS/asan:halt_on_error=0:detect_leaks=0:allocator_may_return_null=1" \
TSHM_FAKE_CUDA_CFLAGS="-fsanitize=address -fsanitize-recover=address -fno-omit-frame-pointer -g" \
    "$VPY" -m pytest -o cache_dir="$DIR/pytest-cache" -m "not server" "$@"
tests=$?
set -e

# -- 4. the reports -------------------------------------------------------------------------------
# (outside the LD_PRELOAD above: the sorting is not under test)
set +e
"$VPY" tools/asan_reports.py "$LOGS"
reports=$?
set -e
echo "asan.sh: pytest exit $tests, reports exit $reports, $((SECONDS - START)) s"
if [ "$tests" != 0 ]; then
    exit "$tests"
fi
exit "$reports"
