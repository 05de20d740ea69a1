#!/usr/bin/env bash
# Run the GPU tests on the offline CUDA machine, in one call, from the repository root:
#
#     bash .gpu-kit/setup.sh && bash tests/gpu/run.sh [more pytest arguments]
#
# .gpu-kit is the kit that ../shared/gpu/pack.sh makes (Triton 2.51 in $KIT/server, the backend's
# Python with numpy 1.26 in $KIT/spy, tritonclient in $KIT/site; see ../shared/gpu/README.md).
# This script
#   1. builds and installs the project offline into $SITE (pip --no-index --no-build-isolation),
#   2. points LocalServer at the kit's server (TRITONSHM_TRITONSERVER, TRITONSHM_SERVER_PYTHON),
#      and lets that server's Python import the image's torch (bench/gpu.sh --server-torch-only),
#   3. prints the GPUs and the versions of the libraries the tests use,
#   4. runs `pytest -m gpu -v -rs` plus the arguments given (a later -m wins over -m gpu),
#   5. prints LAST a table: passed / failed / skipped / errors per test file.
# Everything is also written, as it happens, under $OUT (default /tmp/tshm-out): build.log,
# pytest.log, junit.xml, summary.txt -- so a run cut short by a timeout still leaves its logs.
# pytest gets SIGINT (it then still writes junit.xml) once $TSHM_DEADLINE seconds (default 500)
# have passed since this script started (SIGKILL 20 s later), so that setup.sh, the build, the tests
# and the table fit in a 10-minute limit; TSHM_DEADLINE=0 disables that.
# It reads the GPUs' state only (nvidia-smi -L, --query-gpu); it changes no GPU setting.
#
# Settings (environment): OUT, TSHM_KIT (default /tmp/tshm-kit), TSHM_SITE (default /tmp/tshm-site),
# PYTHON (default python3), TSHM_DEADLINE, TSHM_SKIP_BUILD=1 (reuse what is in $TSHM_SITE).
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS

cd "$(dirname "$0")/../.." || exit 2
REPO=$PWD
OUT=${OUT:-/tmp/tshm-out}
KIT=${TSHM_KIT:-/tmp/tshm-kit}
SITE=${TSHM_SITE:-/tmp/tshm-site}
PY=${PYTHON:-python3}
DEADLINE=${TSHM_DEADLINE:-500}
mkdir -p "$OUT" || exit 2
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"

say() { printf '\n=== %s\n' "$*"; }

# The table, last: from the junit xml if pytest wrote one.
finish() {
    local rc=$1 what=$2
    {
        printf '\n=== summary (%s, exit code %s, %ss; logs in %s)\n' "$what" "$rc" "$((SECONDS - START))" "$OUT"
        if { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && [ -s "$OUT/pytest.log" ]; then
            echo "running when stopped: $(grep -E '^tests/[^ ]*::' "$OUT/pytest.log" | tail -n 1)"
        fi
        if [ -s "$OUT/junit.xml" ]; then
            "$PY" "$REPO/tests/gpu/junit_summary.py" "$OUT/junit.xml"
        else
            echo "no junit.xml: pytest did not run, or did not finish"
        fi
    } | tee -a "$SUMMARY"
    exit "$rc"
}

# -- the kit -------------------------------------------------------------------------------------
TRITONSERVER=$KIT/server/pytriton/tritonserver/bin/tritonserver
SERVER_PYTHON=$KIT/spy/bin/python3
for need in "$TRITONSERVER" "$SERVER_PYTHON"; do
    if [ ! -x "$need" ]; then
        echo "missing $need: run 'bash .gpu-kit/setup.sh' first (the kit from ../shared/gpu/pack.sh)"
        finish 2 "no kit"
    fi
done
export TRITONSHM_TRITONSERVER=$TRITONSERVER
export TRITONSHM_SERVER_PYTHON=$SERVER_PYTHON
# There is no package index: make pip say so at once rather than retry, and keep any attempt
# to install a server (a non-gpu test, say) away from the home directory.
export PIP_NO_INDEX=1
export TRITONSHM_SERVER_HOME=/tmp/tshm-server-home

# -- build and install, offline ------------------------------------------------------------------
if [ "${TSHM_SKIP_BUILD:-0}" != 1 ]; then
    say "building and installing $REPO into $SITE (offline)"
    "$PY" -m pip install --no-index --no-deps --no-build-isolation --disable-pip-version-check \
        --upgrade --target "$SITE" "$REPO" 2>&1 | tee "$OUT/build.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" != 0 ]; then
        echo "the build failed (exit code $rc); its log: $OUT/build.log"
        finish "$rc" "build failed"
    fi
fi
export PYTHONPATH=$SITE:$KIT/site${PYTHONPATH:+:$PYTHONPATH}

# -- what we run on ------------------------------------------------------------------------------
say "GPUs"
nvidia-smi -L 2>&1 || echo "(nvidia-smi failed)"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 || true
say "versions"
"$PY" - <<'EOF' 2>&1
import importlib, importlib.metadata, platform, sys
print(f"python {platform.python_version()} ({sys.executable})")
# tritonclient 2.73 also imports ml_dtypes and urllib3: a kit without them fails here, not in pytest.
for name in ("numpy", "torch", "cupy", "cuda.bindings", "tritonclient.grpc", "tritonclient.http",
             "tritonshm"):
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # report, never stop
        print(f"{name}: not importable ({type(exc).__name__}: {exc})")
        continue
    extra = ""
    if name == "torch":
        try:
            extra = f" cuda {module.version.cuda}, available {module.cuda.is_available()}, devices {module.cuda.device_count()}"
        except Exception as exc:
            extra = f" ({exc})"
    elif name == "tritonshm":
        try:
            from tritonshm import cuda
            extra = f" {cuda.runtime_info()}"
        except Exception as exc:
            extra = f" (cuda: {type(exc).__name__}: {exc})"
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version(name.split(".")[0])
        except Exception:
            version = "?"
    print(f"{name} {version} ({getattr(module, '__file__', '?')}){extra}")
EOF
echo "server: $TRITONSHM_TRITONSERVER; its Python: $(env -u PYTHONPATH "$TRITONSHM_SERVER_PYTHON" -c 'import sys, numpy; print(sys.version.split()[0], "numpy", numpy.__version__)' 2>&1)"
# The GPU model (python/tritonshm/models_gpu) needs torch in the server's Python: a .pth naming the
# image's torch (bench/gpu.sh writes it); without it only the tests of that model skip.
TSHM_KIT=$KIT PYTHON=$PY bash "$REPO/bench/gpu.sh" --server-torch-only 2>&1 \
    || echo "(the server's Python has no torch: tests that need the GPU model will skip)"

# -- the tests -----------------------------------------------------------------------------------
say "pytest -m gpu -v -rs $*"
rm -f "$OUT/junit.xml"
limit=()
if [ "$DEADLINE" -gt 0 ] 2>/dev/null; then
    left=$((DEADLINE - (SECONDS - START)))
    [ "$left" -lt 30 ] && left=30
    # SIGINT: pytest stops, tears its fixtures down (servers stop) and still writes junit.xml.
    limit=(timeout -s INT -k 20 "$left")
fi
# --continue-on-collection-errors: a file that cannot be imported must not keep the others from running.
${limit[@]+"${limit[@]}"} "$PY" -m pytest -m gpu -v -rs --continue-on-collection-errors \
    -o junit_family=xunit1 --junitxml="$OUT/junit.xml" "$@" \
    2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
what="pytest"
[ "$rc" = 124 ] && what="pytest stopped at the deadline"
[ "$rc" = 137 ] && what="pytest killed at the deadline"
[ "$rc" = 5 ] && what="pytest selected no tests"
finish "$rc" "$what"
