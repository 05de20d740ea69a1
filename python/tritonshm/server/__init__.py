"""A managed local Triton Inference Server for the demo, the tests and the benchmarks.

:class:`LocalServer` runs the real ``tritonserver`` that the PyPI wheel
``nvidia-pytriton`` carries, on the CPU, without Docker or a GPU::

    from tritonshm.server import LocalServer

    with LocalServer() as srv:            # the bundled demo models
        client = tritonclient.grpc.InferenceServerClient(srv.grpc_url)

On first use the server is installed into its own virtual environment under
a cache directory (``$TRITONSHM_SERVER_HOME``, else
``$XDG_CACHE_HOME/tritonshm/server``, else ``~/.cache/tritonshm/server``).
It needs an environment of its own because the Python backend runs models
with the ``python3`` first on the server's PATH and needs numpy < 2 there,
while the client is free to use numpy 2. That environment gets two wheels
(``pip install --no-deps --only-binary=:all: nvidia-pytriton==0.7.0 "numpy<2"``,
about 74 MB) and a Python 3.10-3.12 (numpy < 2 has no wheels for newer ones):
this interpreter where it is one, else one found on the machine. Without a
package index it installs from a folder of those wheels
(``tritonshm server --install-from DIR``, ``$TRITONSHM_SERVER_WHEELS``), which
:func:`download_command` fills on a connected machine.

It can also run a Triton that is already installed -- an NGC container's
``/opt/tritonserver``, or one unpacked on a machine without a package index --
with ``LocalServer(tritonserver=..., server_python=...)`` or the environment
variables ``$TRITONSHM_TRITONSERVER`` and ``$TRITONSHM_SERVER_PYTHON``; then
nothing is installed.

The package has one module per concept; each needs only the standard
library, so importing it is cheap:

``_install``
    where the server comes from: our own virtual environment (made once,
    under a lock, marked complete last) or an existing install, probed and
    checked; both give an *install record*. Failures raise
    :class:`ServerInstallError`.
``_process``
    the server process: launched as the leader of its own process group,
    killed with the kernel's help if we die, ended with its Python backend
    stubs and their shared memory.
``_health``
    whether it is up: free ports, the HTTP readiness probes, and what the
    server's log says went wrong.
``_local``
    :class:`LocalServer`, which puts the three together (it imports them;
    none of them imports it).
"""

from __future__ import annotations

from ..errors import ServerInstallError
from ._install import (REQUIREMENTS, SERVER_PYTHON_VERSIONS, WHEELS_ENV, default_home, describe_install,
                       download_command)
from ._local import LocalServer, bundled_model_repository
from ._process import group_members

__all__ = ["LocalServer", "ServerInstallError", "bundled_model_repository", "default_home",
           "describe_install", "download_command", "group_members", "REQUIREMENTS",
           "SERVER_PYTHON_VERSIONS", "WHEELS_ENV"]
