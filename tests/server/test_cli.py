"""The ``tritonshm`` command: demo, ls, gc, doctor -- run as a user would."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tritonclient.grpc as tritonclient_grpc

import tritonshm
from tritonshm import _segments
from tritonshm.server import LocalServer


def tritonshm_cmd(*args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "tritonshm", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.usefixtures("server")  # starts its own; the session's only to skip where none can be had
def test_demo_runs_end_to_end_and_checks_every_output():
    done = tritonshm_cmd("demo", "--sizes-kib", "4", "1024", "--seconds", "0.05")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.split()[:2] == ["4", "KiB"] for line in lines), done.stdout
    assert any(line.split()[:2] == ["1", "MiB"] for line in lines), done.stdout
    assert "Client MB/s" in done.stdout and "Client http MB/s" in done.stdout  # the library, both wires
    assert all(len(line.split()) == 7 for line in lines if line.split()[1:2] in (["KiB"], ["MiB"]))  # size, gRPC, 2 x (MB/s, x)
    assert "every output checked" in done.stdout


def _free_ports(n):
    """*n* distinct TCP ports of 127.0.0.1 nobody listens on right now."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.mark.server
@pytest.mark.usefixtures("server")  # starts its own; the session's only to skip where none can be had
def test_server_serves_the_ports_it_is_given_and_names_a_taken_one():
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    grpc_port, http_port = _free_ports(2)
    ports = ["--grpc-port", str(grpc_port), "--http-port", str(http_port)]
    first = subprocess.Popen([sys.executable, "-m", "tritonshm", "server", *ports],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = first.stdout.readline()
        assert f"gRPC 127.0.0.1:{grpc_port}  HTTP 127.0.0.1:{http_port}" in ready, ready + first.stderr.read()
        for module, port in ((grpcclient, grpc_port), (httpclient, http_port)):
            client = module.InferenceServerClient(f"localhost:{port}")
            try:
                assert client.is_server_ready()
            finally:
                client.close()
        second = tritonshm_cmd("server", *ports, timeout=60)
        assert second.returncode == 1
        assert f"port {grpc_port} on 127.0.0.1 (grpc_port={grpc_port}) is already in use" in second.stderr
        assert "--grpc-port" in second.stderr and "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0 and "stopping" in out, out + err


def test_server_refuses_bad_ports_at_once():
    done = tritonshm_cmd("server", "--grpc-port", "18001", "--http-port", "18001", timeout=60)
    assert done.returncode == 2 and "must differ" in done.stderr


def test_the_no_server_hint_names_a_command_that_serves_the_ports_it_says():
    # An unreachable server's error says how to start one where clients look (Triton's usual ports):
    # `tritonshm server` alone serves free ones, so the command it names must say the ports.
    from tritonshm.cli import build_parser
    from tritonshm.errors import no_server_hint

    command = re.search(r"`(tritonshm server[^`]*)`", no_server_hint("localhost:8001"))[1]
    args = build_parser().parse_args(command.split()[1:])
    assert (args.grpc_port, args.http_port) == (8001, 8000), command


def test_ls_lists_live_segments_with_pid_and_size():
    with tritonshm.SystemRegion.create(8192) as region:
        done = tritonshm_cmd("ls")
        assert done.returncode == 0
        line = next(l for l in done.stdout.splitlines() if region.key in l)
        assert str(os.getpid()) in line and "live" in line and "8 KiB" in line


def test_gc_removes_segments_of_a_client_killed_with_sigkill(server):
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time, numpy as np, tritonshm
            c = tritonshm.Client({server.grpc_url!r})
            c.infer("identity_fp32", {{"INPUT0": np.ones(8, np.float32)}})
            print("ready", flush=True)
            time.sleep(600)
        """)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        theirs = [s for s in _segments.list_segments() if s.pid == child.pid]
        assert theirs and all(s.alive for s in theirs)
        assert theirs[0].key not in tritonshm_cmd("gc").stdout  # its creator lives: kept
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert all(not s.alive for s in _segments.list_segments() if s.pid == child.pid)
    dry = tritonshm_cmd("gc", "--dry-run")
    assert theirs[0].key in dry.stdout and os.path.exists("/dev/shm" + theirs[0].key)
    done = tritonshm_cmd("gc")
    assert done.returncode == 0 and theirs[0].key in done.stdout
    assert not [s for s in _segments.list_segments() if s.pid == child.pid]
    # its registration is still on the server: ls --url says so and names the command that
    # removes it; gc --url unregisters ours of processes gone, and nothing of another program's
    name = theirs[0].key.lstrip("/")
    listed = tritonshm_cmd("ls", "--url", server.grpc_url)
    line = next(l for l in listed.stdout.splitlines() if name in l)
    assert "gone" in line and f"tritonshm gc --url {server.grpc_url}" in listed.stdout
    with tritonshm.SystemRegion.create(4096) as other:
        probe = tritonclient_grpc.InferenceServerClient(server.grpc_url)
        probe.register_system_shared_memory("someone-elses-region", other.key, 4096)
        try:
            done = tritonshm_cmd("gc", "--url", server.grpc_url)
            assert done.returncode == 0 and f"unregistered {name}" in done.stdout, done.stdout + done.stderr
            names = set(tritonshm.status(probe))
            assert name not in names and "someone-elses-region" in names
        finally:
            probe.unregister_system_shared_memory("someone-elses-region")
            probe.close()
    refused = tritonshm_cmd("gc", "--url", "example.com:8001")
    assert refused.returncode == 2 and "this machine" in refused.stderr


def test_gc_never_touches_live_segments():
    with tritonshm.SystemRegion.create(4096) as region:
        tritonshm_cmd("gc")
        assert os.path.exists("/dev/shm" + region.key)


def test_doctor_checks_shm_and_the_server(server):
    done = tritonshm_cmd("doctor", "--url", server.grpc_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mode 600" in done.stdout
    assert "shared memory works" in done.stdout


def test_doctor_headlines_a_server_it_cannot_reach(server):
    (nobody,) = _free_ports(1)
    for url, detail in ((f"127.0.0.1:{nobody}", "cannot reach the Triton server"),
                        (server.http_url, f"is {server.http_url} the server's HTTP port?"),
                        ("http://" + server.grpc_url, "is it the server's gRPC port?")):
        done = tritonshm_cmd("doctor", "--url", url)
        assert done.returncode == 1, done.stdout + done.stderr
        (line,) = [line for line in done.stdout.splitlines() if url in line]
        assert line.startswith(f"[FAIL] the server at {url} is unreachable: ") and detail in line, line
        assert "cannot use our memory" not in done.stdout


def test_doctor_says_what_is_missing_when_the_server_cannot_open_our_memory():
    """A server with a /dev/shm of its own (as in another container): the failure, then what to
    check, the recipe named."""
    from tritonshm.server import LocalServer
    from triton_fixtures import start_or_skip

    with start_or_skip(LocalServer(private_shm=True)) as isolated:
        done = tritonshm_cmd("doctor", "--url", isolated.grpc_url)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    (failed,) = [i for i, line in enumerate(lines) if line.startswith(f"[FAIL] the server at {isolated.grpc_url} "
                                                                       f"cannot use our memory")]
    hints = lines[failed + 1:]
    assert hints and all(line.startswith("       - ") for line in hints)
    assert "same user" in hints[-1] and "docs/deployment.md" in hints[-1]


def test_doctor_hints_fit_where_it_runs():
    from tritonshm.doctor import deployment_hints

    pod = deployment_hints("127.0.0.1:8001", "failed to open", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert any("emptyDir at /dev/shm" in hint and "Kubernetes" in hint for hint in pod)
    remote = deployment_hints("triton.example:8001", "failed to open", {})
    assert remote[0].startswith("the server is at triton.example, not on this machine's loopback")
    flag = deployment_hints("localhost:8001", "client shared memory is not allowed", {})
    assert any("--allow-client-shm=true" in hint for hint in flag)
    assert not any("loopback" in hint for hint in flag)


def test_module_and_console_script_agree():
    done = tritonshm_cmd("--help")
    assert done.returncode == 0 and "demo" in done.stdout and "gc" in done.stdout


def test_readme_test_command_is_what_ci_runs():
    """.ci/run runs the README's test command verbatim (the line after its marker comment), then
    the AddressSanitizer run, which the README names too."""
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    ci = (root / ".ci" / "run").read_text().splitlines()
    marker = ci.index("# The README's test command, verbatim (tests/server/test_cli.py keeps the two in step).")
    command = ci[marker + 1].strip()
    assert command in readme, f"README must show CI's test command: {command}"
    assert "tritonshm demo" in readme
    assert [line.strip() for line in ci[marker + 2:] if line.strip() and not line.startswith("#")] == ["tools/asan.sh"]
    assert "tools/asan.sh" in readme


def _existing_install_env(tmp_path, **settings) -> dict:
    """Our environment with *settings* as TRITONSHM_* variables and an empty server home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONSHM_")}
    env["TRITONSHM_SERVER_HOME"] = str(tmp_path / "home")
    env.update({f"TRITONSHM_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def test_server_install_only_reports_an_existing_install(tmp_path):
    # A wheel-layout install without a Python backend, whose tritonserver only answers --help.
    prefix = tmp_path / "site" / "pytriton" / "tritonserver"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "backends").mkdir()
    (tmp_path / "site" / "nvidia_pytriton.libs").mkdir()
    server = prefix / "bin" / "tritonserver"
    server.write_text("#!/bin/sh\necho '  --allow-client-shm <boolean>'\n")
    server.chmod(0o755)
    done = tritonshm_cmd("server", "--install-only", env=_existing_install_env(tmp_path, tritonserver=server))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "existing Triton install (nothing installed)"
    assert f"tritonserver: {server}" in lines
    assert f"backends: {prefix / 'backends'}" in lines
    assert f"libraries: {tmp_path / 'site' / 'nvidia_pytriton.libs'}" in lines
    assert "server Python: none (no Python backend)" in lines
    assert "--allow-client-shm=true: passed (this server needs it)" in lines
    assert not (tmp_path / "home").exists()  # nothing installed, not even a lock file

    missing = tmp_path / "nowhere" / "tritonserver"
    done = tritonshm_cmd("server", "--install-only", env=_existing_install_env(tmp_path, tritonserver=missing))
    assert done.returncode == 1 and done.stdout == ""
    assert f"$TRITONSHM_TRITONSERVER: {missing} does not exist" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "home").exists()


def test_server_install_only_reports_the_python_of_an_existing_install(server, tmp_path):
    """The real server the session runs, named as an existing install."""
    if os.environ.get("TRITONSHM_TRITONSERVER"):
        tritonserver, python = server.tritonserver, server.server_python or "python3"
    else:
        marker = LocalServer.ensure_installed(progress=False) / "tritonshm-installed.json"
        info = json.loads(marker.read_text())
        tritonserver, python = info["tritonserver"], info["python"]
    env = _existing_install_env(tmp_path, tritonserver=tritonserver, server_python=python)
    done = tritonshm_cmd("server", "--install-only", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("existing Triton install (nothing installed)\n")
    assert f"tritonserver: {Path(tritonserver).resolve()}" in done.stdout
    assert re.search(r"\nserver Python: \S*python3? \(Python 3\.\d+, numpy 1\.", done.stdout), done.stdout
    assert not (tmp_path / "home").exists()


def test_server_install_only_prints_our_venv(server):
    if server.tritonserver is not None:
        pytest.skip("the session server is an existing install; ours may not be installable here")
    env = {k: v for k, v in os.environ.items() if k != "TRITONSHM_SERVER_PYTHON"}
    done = tritonshm_cmd("server", "--install-only", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == f"{LocalServer.ensure_installed(progress=False)}\n"
