"""tritonclient's own example clients, run as written and with only their import lines changed.

The scripts in tritonclient/ are tritonclient's Python examples, unchanged (README.md there says
from where, and which were left out and why); the models they use are in the bundled repository
(``simple``, ``simple_string``, ``simple_identity``, ``simple_sequence``, ``repeat_int32``).
Each script runs twice against a real server, in a process of its own, given the server's
address with its own ``-u`` flag:

1. as written: ``python SCRIPT -u URL``, on tritonclient;
2. with ``import tritonclient.grpc as x`` made ``import tritonshm.grpc as x`` (``.http`` and the
   ``.aio`` modules alike; ``tritonclient.utils`` stays), and nothing else changed.

Both must exit 0 and print the same lines (but for the server's statistics counters, see
:func:`normalised`).

How the second run shows that the tensors went through shared memory: the changed script runs
under facade_runner.py, which wraps the ways into the slots of the :class:`tritonshm.Client` and
:class:`tritonshm.aio.Client` that the facade's clients hold (``infer``; a stream's request, sent
by ``_stream_to``) and their ``close``, and reports the calls they carried, by model, and the slot
pools they had registered with the server (model, memory, region names) when they closed, or
when the script ended for a client it never closed.  Each case names the calls it expects the
slots to carry: every ``infer`` / ``async_infer`` / streamed request of the script that the
facade documents as taken by the slots, and none of the others (tensors bound to shared memory
by hand, ``query_params``, JSON outputs over HTTP).  The slots of each model
carried must be system shared memory, and none of their regions may be left registered on the
server once the script has ended (a client closes its regions, or its finalizer does at exit);
the leak check of conftest.py also fails the test if the script's process left a segment in
/dev/shm.  Nothing of this is in the library: only the script's own process is patched.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tritonshm.server import LocalServer, bundled_model_repository
from triton_fixtures import start_or_skip

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "tritonclient"
RUNNER = HERE / "facade_runner.py"

#: The import lines the second run changes, and nothing else: tritonclient's client modules.
_IMPORT = re.compile(r"^import tritonclient\.(grpc|http)(\.aio)? as (\w+)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Case:
    script: str
    protocol: str                       # which of the server's addresses the script's -u takes
    carried: dict[str, int]             # model -> calls the slots carry in the tritonshm run
    args: tuple[str, ...] = ()
    imports: int = 1                    # import lines changed

    @property
    def id(self) -> str:
        return self.script.removesuffix(".py") + "".join(self.args).replace("-i", "-")


CASES = [
    # infer, both protocols.  HTTP's sends query_params (and asks for an output as JSON) on every
    # call: tritonclient's own, on the wire.
    Case("simple_grpc_infer_client.py", "grpc", {"simple": 2}),
    Case("simple_http_infer_client.py", "http", {}),
    # async_infer: gRPC's callback, HTTP's InferAsyncRequest.get_result().
    Case("simple_grpc_async_infer_client.py", "grpc", {"simple": 1}),
    Case("simple_http_async_infer_client.py", "http", {"simple": 2}),
    # aio, two requests awaited together.  HTTP's sends query_params: tritonclient's own.
    Case("simple_grpc_aio_infer_client.py", "grpc", {"simple": 3}),
    Case("simple_http_aio_infer_client.py", "http", {}),
    # BYTES.  HTTP's asks for some outputs as JSON (binary_data=False): those calls are
    # tritonclient's own (simple_string's, and simple_identity's JSON one).
    Case("simple_grpc_string_infer_client.py", "grpc", {"simple_string": 1, "simple_identity": 2}),
    Case("simple_http_string_infer_client.py", "http", {"simple_identity": 2}),
    # Sequences: 3 sequences of 8 requests, an int and a string correlation id.
    Case("simple_grpc_sequence_sync_infer_client.py", "grpc", {"simple_sequence": 24}),
    Case("simple_http_sequence_sync_infer_client.py", "http", {"simple_sequence": 24}),
    # Sequences over gRPC streams (start_stream / async_stream_infer, aio's stream_infer), each
    # request's inputs in a slot; and a decoupled model's stream (10 responses to 1 request).
    Case("simple_grpc_sequence_stream_infer_client.py", "grpc", {"simple_sequence": 24}),
    Case("simple_grpc_aio_sequence_stream_infer_client.py", "grpc", {"simple_sequence": 24}),
    Case("simple_grpc_custom_repeat.py", "grpc", {"repeat_int32": 1}),
    # Health, metadata, config: no tensors.
    Case("simple_grpc_health_metadata.py", "grpc", {}),
    Case("simple_http_health_metadata.py", "http", {}),
    # Tensors bound to shared memory by hand (tritonclient.utils.shared_memory): tritonclient's
    # own calls, untouched.  The scripts unregister every region of the server first and last.
    Case("simple_grpc_shm_client.py", "grpc", {}),
    Case("simple_http_shm_client.py", "http", {}),
    Case("simple_grpc_shm_string_client.py", "grpc", {}),
    Case("simple_http_shm_string_client.py", "http", {}),
    # The same InferInput / InferRequestedOutput objects bound by hand, then given data (the
    # slots carry that one), then bound again; both modules imported, one used.
    Case("reuse_infer_objects_client.py", "http", {"simple": 1}, imports=2),
    Case("reuse_infer_objects_client.py", "grpc", {"simple": 1}, ("-i", "grpc"), imports=2),
    # Connection options (keepalive, channel arguments) the slots' own client is made with too.
    Case("simple_grpc_keepalive_client.py", "grpc", {"simple": 1}),
    Case("simple_grpc_custom_args_client.py", "grpc", {"simple": 1}),
]

#: The server's inference statistics, as simple_*_infer_client.py print them (gRPC's protobuf
#: text, HTTP's dict): counts and times.  Those two runs cannot print the same there -- the
#: counts are the session server's since it started (the first run's requests are in the
#: second's), the times are measured -- so their values are masked; the keys, and every other
#: line, must match.
_STATISTICS = re.compile(r"""(\b(?:last_inference|inference_count|execution_count|count|ns)\b['"]?\s*:\s*)\d+""")


def normalised(output: str) -> str:
    """*output* with the statistics' counters and times masked (see :data:`_STATISTICS`)."""
    return _STATISTICS.sub(r"\1#", output)


def tritonshm_imports(source: str) -> tuple[str, int]:
    """*source* with its tritonclient client imports made tritonshm's, and how many there were."""
    return _IMPORT.subn(r"import tritonshm.\1\2 as \3", source)


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (
        f"{' '.join(command)} exited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}"
        f"\n--- stderr\n{done.stderr[-3000:]}")
    return done


def run_both_ways(script: Path, args: list[str], tmp_path: Path) -> tuple[str, str, dict]:
    """(stdout as written, stdout through tritonshm, the runner's report) of *script* run with *args*."""
    as_written = _run([sys.executable, str(script), *args], tmp_path).stdout
    source = script.read_text()
    changed = tmp_path / script.name
    changed.write_text(tritonshm_imports(source)[0])
    report = tmp_path / "carried.json"
    through_tritonshm = _run([sys.executable, str(RUNNER), str(report), str(changed), *args], tmp_path).stdout
    return as_written, through_tritonshm, json.loads(report.read_text())


def test_only_the_import_lines_change():
    """The tritonshm run's script differs from tritonclient's in its client imports only."""
    scripts = sorted(SCRIPTS.glob("*.py"))
    assert {s.name for s in scripts} == {case.script for case in CASES} | {"simple_http_model_control.py"}
    for script in scripts:
        source = script.read_text()
        changed, count = tritonshm_imports(source)
        expected = max([c.imports for c in CASES if c.script == script.name], default=1)
        assert count == expected, script.name
        differ = [(a, b) for a, b in zip(source.splitlines(), changed.splitlines()) if a != b]
        assert len(differ) == count and len(changed.splitlines()) == len(source.splitlines())
        for before, after in differ:
            assert before.replace("tritonclient.", "tritonshm.", 1) == after


def test_statistics_are_masked_and_nothing_else():
    grpc_text = "  last_inference: 1795792825275\n  inference_count: 9\n  success {\n    count: 9\n    ns: 27651626"
    http_dict = "{'inference_count': 19, 'success': {'count': 19, 'ns': 32082636}, 'batch_size': 1}"
    assert normalised(grpc_text) == "  last_inference: #\n  inference_count: #\n  success {\n    count: #\n    ns: #"
    assert normalised(http_dict) == "{'inference_count': #, 'success': {'count': #, 'ns': #}, 'batch_size': 1}"
    assert normalised("0 + 1 = 1\n[3] 5 : -5 : -5\n") == "0 + 1 = 1\n[3] 5 : -5 : -5\n"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_example_prints_the_same_through_tritonshm(server, case, tmp_path):
    url = server.grpc_url if case.protocol == "grpc" else server.http_url
    as_written, through_tritonshm, carried = run_both_ways(SCRIPTS / case.script, ["-u", url, *case.args],
                                                           tmp_path)
    assert normalised(through_tritonshm) == normalised(as_written)

    assert carried["calls"] == case.carried
    pools = carried["pools"]
    assert sorted((model, memory) for model, memory, _ in pools) == sorted((m, "system") for m in case.carried)
    assert all(regions for _, _, regions in pools)
    import tritonclient.grpc

    import tritonshm

    client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
    try:
        registered = set(tritonshm.status(client))
    finally:
        client.close()
    assert not registered & {name for _, _, regions in pools for name in regions}


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory):
    """A server in explicit model-control mode, nothing loaded, whose repository holds 7 models:
    what simple_http_model_control.py expects (Triton's QA repository for it)."""
    root = tmp_path_factory.mktemp("model-control")
    bundled = bundled_model_repository()
    # The models' model.py finds the shared implementation four folders up: in root.
    shutil.copy(bundled.parent / "_bundled_model.py", root)
    for model in ("simple", "simple_string", "simple_identity", "simple_sequence", "add_sub", "identity_fp32",
                  "identity_int32"):
        shutil.copytree(bundled / model, root / "models" / model, ignore=shutil.ignore_patterns("__pycache__"))
    # Its shutdown waits out --exit-timeout-secs (5 s by LocalServer's default) after the script's
    # load and unload: 1 s is enough for a server nothing is left loaded in.
    explicit = ["--model-control-mode=explicit", "--exit-timeout-secs=1"]
    with start_or_skip(LocalServer(root / "models", extra_args=explicit)) as srv:
        yield srv


@pytest.mark.server
def test_model_control_prints_the_same_through_tritonshm(explicit_server, tmp_path):
    """load_model (with a config override), unload_model, the repository index: no tensors,
    tritonclient's own calls through the facade's client."""
    as_written, through_tritonshm, carried = run_both_ways(
        SCRIPTS / "simple_http_model_control.py", ["-u", explicit_server.http_url], tmp_path)
    assert through_tritonshm == as_written == "PASS: model control\n"
    assert carried == {"calls": {}, "pools": []}
