"""The test suite's own guard: a session server that dies fails the one test it died in, and the
next test gets it back (tests/triton_fixtures.py's ``session_server_survives``).

Run in a pytest of its own, so that killing its server touches nothing of this session's."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

TESTS = Path(__file__).resolve().parent.parent


def test_a_server_that_dies_fails_that_test_and_is_started_again_for_the_next(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from triton_fixtures import server, session_server_survives  # noqa: F401
    """))
    (tmp_path / "test_inner.py").write_text(textwrap.dedent("""
        import os
        import signal

        import tritonclient.grpc

        def test_1_kills_the_server(server):
            os.kill(server.pid, signal.SIGKILL)
            server._proc.popen.wait()

        def test_2_has_a_server_again(server):
            client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
            try:
                assert client.is_model_ready("identity_fp32")
            finally:
                client.close()
    """))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                          f"--rootdir={tmp_path}", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITONSHM_REQUIRE_SERVER": "1"})
    report = run.stdout + run.stderr
    assert "2 passed, 1 error" in report, report
    assert "ERROR at teardown of test_1_kills_the_server" in report, report
    assert "the session's Triton server died during this test (exit code -9)" in report, report
