"""``tritonshm bench``'s --url and --http-url (bench/_where.py): read by the parser Client reads its
URL with, the server checked at each address before anything is measured, and whatever cannot be
used said in one line with exit status 2 -- never a traceback; --help in groups; the table's legend."""

from __future__ import annotations

import http.server
import os
import re
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

from tritonshm import cli, errors
from tritonshm.bench import _methods, _where

TINY = ("--sizes", "4K", "--reps", "2", "--warmup", "1")


def bench_cmd(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="80")  # --help wraps at the terminal's width: the usual one
    return subprocess.run([sys.executable, "-m", "tritonshm", "bench", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def refused(done: subprocess.CompletedProcess) -> str:
    """The one line a refused bench said, once it is checked to be one line, exit status 2,
    nothing measured, no traceback (nor tritonclient's ``Exception ignored`` from a half-made client)."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert not done.stdout, done.stdout
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tritonshm bench: "), done.stderr
    assert "starting" not in done.stderr
    return lines[0]


def table_lines(stdout: str) -> list[str]:
    """The rows of a bench table (not its legend's lines)."""
    table = stdout[:stdout.index("columns and reference rows")]
    return [line for line in table.splitlines() if line.startswith("  ") and not line.split()[0] == "method"]


# -- listeners that are not Triton ----------------------------------------------------------------


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def web_server():
    """An HTTP server that is not Triton (404, an HTML page, for everything): its "host:port"."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()


@pytest.fixture
def silent_listener():
    """A port that accepts connections and never answers: its "host:port"."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield f"127.0.0.1:{listener.getsockname()[1]}"


# -- what is refused before any server is asked ------------------------------------------------------

FORMS = "expected 'host', 'host:port', 'grpc://host[:port]'"  # the parser's own list of forms


@pytest.mark.parametrize("args, message", [
    (["--url", "nope::x"], f"--url: cannot read a host and port in server URL 'nope::x': {FORMS}"),
    (["--url", "ftp://x"], f"--url: unknown scheme 'ftp' in server URL 'ftp://x': {FORMS}"),
    (["--url", ""], f"--url: a server URL must not be empty: {FORMS}"),
    (["--url", "localhost:99999"], "--url: port 99999 in server URL 'localhost:99999' is not in 1-65535"),
    (["--url", "grpcs://localhost"], "--url grpcs://localhost: the bench measures a server on this machine, without "
                                     "TLS: give its plain gRPC address (host:port)"),
    (["--url", "https://localhost"], "without TLS: give its plain HTTP address (http://host:port)"),
    (["--url", "127.0.0.1:1", "--http-url", "http://"], "--http-url: cannot read a host and port"),
    (["--url", "127.0.0.1:1", "--http-url", "https://localhost"], "--http-url https://localhost: the bench measures"),
    (["--url", "127.0.0.1:1", "--http-url", "grpc://127.0.0.1:2"],
     "--http-url grpc://127.0.0.1:2 is a gRPC URL: --http-url takes the server's HTTP address (http://host:port, "
     "or host:port)"),
    (["--url", "http://127.0.0.1:1", "--http-url", "127.0.0.1:2"],
     "--url http://127.0.0.1:1 is an HTTP URL and --http-url gives one too: --url takes the server's gRPC address"),
    (["--http-url", "http://127.0.0.1:2"], "--http-url: only with --url"),
    (["--gpu", "--url", "http://127.0.0.1:1"], "--gpu measures over gRPC only: give the server's gRPC address as "
                                               "--url (host:port), not http://127.0.0.1:1"),
    (["--stream", "--url", "http://127.0.0.1:1"], "--stream measures over gRPC only"),
    (["--stream", "--url", "127.0.0.1:1", "--http-url", "127.0.0.1:2"],
     "--http-url: not with --stream, whose methods are all gRPC"),
])
def test_a_url_that_cannot_be_used_is_one_line_and_status_2(args, message):
    line = refused(bench_cmd(*args, *TINY))
    assert message in line, line


def test_urls_are_read_as_client_reads_them():
    assert _where.resolve("localhost", None) == _where.Addresses("localhost:8001", None)  # gRPC's default port
    assert _where.resolve("grpc://h:1", "h:2") == _where.Addresses("h:1", "h:2")
    assert _where.resolve("h:1", "http://h") == _where.Addresses("h:1", "h:8000")  # HTTP's default port
    assert _where.resolve("[::1]:1", "http://[::1]:2/") == _where.Addresses("[::1]:1", "[::1]:2")
    # an http:// URL alone: the HTTP rows run, the gRPC ones sit out
    assert _where.resolve("http://h:2", None) == _where.Addresses(None, "h:2")
    with pytest.raises(errors.InvalidOption, match="no server address"):
        _where.resolve(None, None)


# -- what the server check says --------------------------------------------------------------------


@pytest.mark.parametrize("url", ["127.0.0.1:1", "http://127.0.0.1:1"])
def test_nothing_listening_is_one_line_and_status_2(url):
    line = refused(bench_cmd("--url", url, *TINY))
    protocol = "HTTP" if url.startswith("http") else "gRPC"
    assert line.startswith(f"tritonshm bench: asking the server at {url} ({protocol}) for its version: cannot reach "
                           f"the Triton server. Server said: "), line
    assert "is a Triton server running at" in line and "`tritonshm server" in line and "starts one here" in line


@pytest.mark.parametrize("scheme", ["", "http://"])
def test_a_listener_that_is_not_triton_is_one_line_and_status_2(web_server, scheme):
    line = refused(bench_cmd("--url", scheme + web_server, *TINY))
    assert f"asking the server at {scheme}{web_server}" in line
    # gRPC: its HTTP/2 preface is refused; HTTP: an HTML page, not Triton's JSON (its lines left out)
    assert ("cannot reach the Triton server" in line if not scheme else
            f"is a Triton server running at {web_server}?" in line), line


@pytest.mark.parametrize("http", [False, True])
def test_a_listener_that_never_answers_fails_the_check_in_one_line(silent_listener, http):
    where = _where.Addresses(None, silent_listener) if http else _where.Addresses(silent_listener, None)
    with pytest.raises(errors.ServerUnavailable) as caught:
        _where.server_version(where, "identity_fp32", timeout=0.5)
    message = str(caught.value)
    assert "\n" not in message and f"is a Triton server running at {silent_listener}?" in message, message


def test_the_other_protocols_port_is_one_line_with_the_tables_hint(server):
    line = refused(bench_cmd("--url", server.http_url, *TINY))  # the HTTP port, as gRPC
    assert (f"is {server.http_url} the server's HTTP port? A gRPC client (an address without a scheme) needs its "
            f"gRPC port; for HTTP, give http://{server.http_url}") in line
    for http_url in (server.grpc_url, f"http://{server.grpc_url}"):  # the gRPC port, as HTTP
        line = refused(bench_cmd("--url", server.grpc_url, "--http-url", http_url, *TINY))
        assert f"asking the server at http://{server.grpc_url} (HTTP) for its version" in line
        assert "the address does not answer HTTP/1.1: is it the server's gRPC port?" in line


def test_a_server_without_the_bench_model_is_one_line_and_status_2(server, monkeypatch, capsys):
    with pytest.raises(errors.ServerError, match="has no ready model 'no_such_model'") as caught:
        _where.server_version(_where.Addresses(server.grpc_url, server.http_url), "no_such_model")
    assert "\n" not in str(caught.value)
    # the command, in this process: --dtype uint8's model renamed to one the server lacks
    monkeypatch.setitem(_methods.MODELS, "uint8", ("no_such_model", "UINT8", np.dtype(np.uint8)))
    status = cli.main(["bench", "--url", server.grpc_url, "--dtype", "uint8", *TINY])
    out, err = capsys.readouterr()
    assert status == 2 and not out
    assert err.splitlines() == [f"tritonshm bench: the server at {server.grpc_url} has no ready model 'no_such_model': "
                                f"the bench needs tritonshm's bundled models (`tritonshm server` serves them; or "
                                f"leave --url out and the bench starts one)"]


# -- the forms the README and Client use are taken ------------------------------------------------


@pytest.mark.parametrize("scheme", ["http://", ""])
def test_http_url_with_or_without_its_scheme_runs_the_http_rows(server, scheme):
    done = bench_cmd("--url", server.grpc_url, "--http-url", scheme + server.http_url, *TINY,
                     "--methods", "http", "Client.infer-http", "floor-http", "memcpy")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert f"at {server.grpc_url} and http://{server.http_url} (given with --url)" in done.stdout
    rows = {line.split()[0]: line.split() for line in table_lines(done.stdout)}
    assert float(rows["http"][1]) > 0 and float(rows["Client.infer-http"][1]) > 0
    assert float(rows["Client.infer-http"][-1]) > 0  # its /limit: over the HTTP limit
    assert "limit-http = floor-http+memcpy" in done.stdout


def test_an_http_url_alone_runs_the_http_rows_and_says_why_the_grpc_ones_sit_out(server):
    done = bench_cmd("--url", f"http://{server.http_url}", *TINY, "--methods", "grpc", "http", "floor", "memcpy")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    assert f"at http://{server.http_url} (given with --url)" in done.stdout
    assert "the gRPC rows sit out: the run had the server's HTTP URL alone" in done.stdout
    rows = {line.split()[0]: line for line in table_lines(done.stdout)}
    assert "no gRPC address: --url gave the HTTP URL alone" in rows["grpc"]
    assert "no gRPC address" in rows["floor"] and float(rows["http"].split()[1]) > 0


# -- --help and the legend --------------------------------------------------------------------------


def test_help_is_grouped_short_and_opens_with_two_examples():
    done = bench_cmd("--help")
    assert done.returncode == 0 and not done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) < 50, done.stdout  # (it was ~160: every method's description in one list)
    for group in ("what to measure:", "where (default: a local server started for the run):",
                  "how long (per size):", "output (the table: stdout; stderr with --json -):"):
        assert group in lines, group
    examples = lines.index("examples:")
    assert examples < lines.index("what to measure:")
    assert lines[examples + 1].strip() == "tritonshm bench"
    assert lines[examples + 3].strip() == "tritonshm bench --url localhost:8001 --http-url localhost:8000 --sizes 4K 16M"
    assert "tritonshm bench --list-methods" in done.stdout


def test_list_methods_says_what_each_does_and_what_the_columns_mean():
    done = bench_cmd("--list-methods")
    assert done.returncode == 0 and not done.stderr
    for heading in ("Methods:", "With --gpu", "With --stream", "With --concurrency N", "columns and reference rows:"):
        assert heading in done.stdout
    assert "floor-http         the same floor over HTTP: tritonclient.http's infer call alone" in done.stdout


def test_the_legend_explains_every_column_and_each_protocols_limit(server):
    done = bench_cmd("--url", server.grpc_url, "--http-url", server.http_url, *TINY,
                     "--methods", "zero-copy", "zero-copy-http", "floor", "floor-http", "memcpy")
    assert done.returncode == 0, done.stdout + done.stderr
    legend = done.stdout[done.stdout.index("columns and reference rows"):]
    for column in ("median", "p25 - p75", "MB/s", "/best peer", "/limit", "floor", "memcpy", "limit", "below 1"):
        assert re.search(rf"^  {re.escape(column)} ", legend, re.MULTILINE), (column, legend)
    flat = " ".join(legend.split())
    assert ("/limit tritonshm's rows only: median / the limit of the row's own protocol -- limit (gRPC) for "
            "Client.infer, tritonshm.grpc, zero-copy; limit-http (HTTP) for Client.infer-http, tritonshm.http, "
            "zero-copy-http") in flat
    assert "limit = floor + memcpy; limit-http = floor-http + memcpy, repetition by repetition" in flat
    assert "tritonclient's infer call alone, over gRPC (floor) and over HTTP (floor-http)" in flat
    assert "not through tritonclient.http" in flat  # why an HTTP row can read below its limit
