#!/usr/bin/env bash
# `tritonshm bench --gpu` on the offline CUDA machine with the GPU kit, from the repository root:
#
#     bash .gpu-kit/setup.sh && bash bench/gpu.sh [tritonshm bench options, e.g. --json /tmp/gpu.json]
#
# .gpu-kit is the kit that ../shared/gpu/pack.sh makes (Triton 2.51 in $KIT/server, the Python
# backend's environment with numpy 1.26 in $KIT/spy, tritonclient in $KIT/site). This script
#   1. lets the server's Python import torch, for the GPU model (python/tritonshm/models_gpu): it
#      writes $KIT/spy/.../site-packages/tritonshm-image-torch.pth naming the site-packages
#      directory of the torch that $PYTHON imports. A .pth adds its directory AFTER the
#      environment's own site-packages, so numpy 1.26 still wins over the image's numpy 2;
#   2. builds and installs the project offline into $TSHM_SITE, as tests/gpu/run.sh does
#      (TSHM_SKIP_BUILD=1: reuse what is there);
#   3. points LocalServer at the kit's server (TRITONSHM_TRITONSERVER, TRITONSHM_SERVER_PYTHON)
#      and runs `python3 -m tritonshm bench --gpu "$@"`.
# `bash bench/gpu.sh --server-torch-only` does step 1 only (tests/gpu/run.sh calls it so).
# Settings (environment): TSHM_KIT (default /tmp/tshm-kit), TSHM_SITE (default /tmp/tshm-site),
# PYTHON (default python3), TSHM_SKIP_BUILD.
set -euo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
REPO=$PWD
KIT=${TSHM_KIT:-/tmp/tshm-kit}
SITE=${TSHM_SITE:-/tmp/tshm-site}
PY=${PYTHON:-python3}
SERVER_PYTHON=$KIT/spy/bin/python3
TRITONSERVER=$KIT/server/pytriton/tritonserver/bin/tritonserver

for need in "$TRITONSERVER" "$SERVER_PYTHON"; do
    if [ ! -x "$need" ]; then
        echo "bench/gpu.sh: missing $need: run 'bash .gpu-kit/setup.sh' first (the kit from ../shared/gpu/pack.sh)" >&2
        exit 2
    fi
done

# -- 1. torch for the server's Python ---------------------------------------------------------------
torch_dir=$(env -u PYTHONPATH "$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))') || {
    echo "bench/gpu.sh: $PY cannot import torch, so the server's Python cannot have it either" >&2
    exit 2
}
spy_site=$(env -u PYTHONPATH "$SERVER_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$torch_dir" > "$spy_site/tritonshm-image-torch.pth"
if ! out=$(env -u PYTHONPATH "$SERVER_PYTHON" -c 'import numpy, torch; print(f"numpy {numpy.__version__}, torch {torch.__version__}, CUDA {torch.cuda.is_available()}")' 2>&1); then
    echo "bench/gpu.sh: the server's Python still cannot import torch from $torch_dir:" >&2
    echo "$out" | tail -n 3 >&2
    exit 2
fi
case "$out" in
    "numpy 1."*) ;;
    *) echo "bench/gpu.sh: the server's Python now sees $out; it needs numpy < 2" >&2; exit 2 ;;
esac
echo "server's Python ($SERVER_PYTHON): $out (via $spy_site/tritonshm-image-torch.pth)"
if [ "${1:-}" = "--server-torch-only" ]; then
    exit 0
fi

# -- 2. build ------------------------------------------------------------------------------------
if [ "${TSHM_SKIP_BUILD:-0}" != 1 ]; then
    echo "building and installing $REPO into $SITE (offline) ..."
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --disable-pip-version-check \
        --upgrade --target "$SITE" "$REPO"
fi

# -- 3. the bench --------------------------------------------------------------------------------
export TRITONSHM_TRITONSERVER=$TRITONSERVER
export TRITONSHM_SERVER_PYTHON=$SERVER_PYTHON
export PIP_NO_INDEX=1
export PYTHONPATH=$SITE:$KIT/site${PYTHONPATH:+:$PYTHONPATH}
exec "$PY" -m tritonshm bench --gpu "$@"
