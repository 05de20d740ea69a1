"""How the local server gets installed: which Python, what pip shows, and offline from a folder of wheels.

The unit tests use fake interpreters and fake pip output; the offline tests
install for real inside ``unshare -rn`` (a network namespace with no network)
from the two wheels, downloaded once into a cache under the temp directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tritonshm.server import LocalServer, ServerInstallError, download_command
from tritonshm.server import _install
from tritonshm.server._install import (DOWNLOAD_MB, REQUIREMENTS, _Display, _find_base_python, _log_tail,
                                       _PipOutput, _read_marker, _search_dirs)


@pytest.fixture
def no_install_env(monkeypatch):
    """No TRITONSHM_* settings from the environment that runs the tests."""
    for name in ("TRITONSHM_TRITONSERVER", "TRITONSHM_SERVER_PYTHON", "TRITONSHM_SERVER_HOME",
                 "TRITONSHM_SERVER_WHEELS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# -- which Python makes the server's environment -----------------------------------


def _fake_python(directory: Path, name: str, version: str, *, missing: str = "", fails: bool = False,
                 executable: str | None = None) -> Path:
    """A script that answers _find_base_python's probe as a Python *version* would."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if fails:  # as a pyenv shim for a version that is not selected
        body = f'echo "pyenv: {name}: command not found" >&2\nexit 127\n'
    else:
        answer = json.dumps({"version": version, "executable": executable or str(path), "missing": missing})
        body = f"echo '{answer}'\n"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture
def only_dirs(monkeypatch):
    """Make _find_base_python search exactly the given directories."""
    def use(*dirs: Path) -> None:
        monkeypatch.setattr(_install, "_search_dirs", lambda: [str(d) for d in dirs])
    return use


def test_a_supported_client_python_makes_the_environment(tmp_path, only_dirs):
    client = _fake_python(tmp_path / "client", "python", "3.11")
    only_dirs(tmp_path / "bin")
    _fake_python(tmp_path / "bin", "python3.12", "3.12")
    assert _find_base_python(current=(str(client), "3.11")) == (str(client), "3.11")


def test_a_313_client_gets_the_newest_supported_python(tmp_path, only_dirs):
    only_dirs(tmp_path / "a", tmp_path / "b")
    _fake_python(tmp_path / "a", "python3.10", "3.10")
    newest = _fake_python(tmp_path / "b", "python3.12", "3.12")
    assert _find_base_python(current=("/nowhere/python3.13", "3.13")) == (str(newest), "3.12")
    assert _find_base_python(current=("/nowhere/python3.14", "3.14")) == (str(newest), "3.12")


def test_unusable_pythons_are_passed_over(tmp_path, only_dirs):
    only_dirs(tmp_path / "shims", tmp_path / "bin", tmp_path / "real")
    _fake_python(tmp_path / "shims", "python3.12", "3.12", fails=True)
    _fake_python(tmp_path / "bin", "python3.12", "3.12", missing="ensurepip")
    _fake_python(tmp_path / "bin", "python3.11", "3.13")  # a misnamed one
    real = tmp_path / "real" / "python3.11.7"
    launcher = _fake_python(tmp_path / "real", "python3.11", "3.11", executable=str(real))
    # The interpreter it reports, not the launcher (a pyenv shim picks by the directory it runs in).
    assert _find_base_python(current=("/nowhere/python3.13", "3.13")) == (str(real), "3.11")
    launcher.unlink()
    with pytest.raises(ServerInstallError) as info:
        _find_base_python(current=("/nowhere/python3.13", "3.13"))
    message = str(info.value)
    assert "\n" not in message
    assert "needs a Python 3.12, 3.11 or 3.10" in message and "wheels for Python 3.13" in message
    assert "uv python install 3.12" in message and "$TRITONSHM_SERVER_PYTHON" in message
    assert f"{tmp_path / 'bin' / 'python3.12'} is Python 3.12 without its ensurepip module" in message
    assert "apt install python3.12-venv" in message
    assert "shims" not in message  # one that does not run at all is not worth a word


def test_no_python_found_is_one_line_naming_what_to_install(tmp_path, only_dirs):
    only_dirs(tmp_path / "empty")
    with pytest.raises(ServerInstallError, match=r"^the local Triton server needs a Python 3\.12, 3\.11 or 3\.10 "
                                                 r"[^\n]*install one \(e\.g\. `uv python install 3\.12`[^\n]*$"):
        _find_base_python(current=(sys.executable, "3.13"))


def test_an_explicit_python_is_used_or_refused(tmp_path, only_dirs):
    only_dirs(tmp_path / "bin")
    _fake_python(tmp_path / "bin", "python3.12", "3.12")
    mine = _fake_python(tmp_path / "mine", "python", "3.10")
    assert _find_base_python(str(mine), "$TRITONSHM_SERVER_PYTHON") == (str(mine), "3.10")
    new = _fake_python(tmp_path / "mine", "python3.13", "3.13")
    with pytest.raises(ServerInstallError, match=r"^\$TRITONSHM_SERVER_PYTHON: .*python3\.13 is Python 3\.13; "
                                                 r"the server's environment needs Python 3\.12, 3\.11 or 3\.10"):
        _find_base_python(str(new), "$TRITONSHM_SERVER_PYTHON")
    with pytest.raises(ServerInstallError, match=r"server_python=: .*/nothing does not exist"):
        _find_base_python(str(tmp_path / "nothing"), "server_python=")
    bare = _fake_python(tmp_path / "mine", "python3.11", "3.11", missing="venv")
    with pytest.raises(ServerInstallError, match=r"without its venv module \(on Debian/Ubuntu: apt install "
                                                 r"python3\.11-venv\)"):
        _find_base_python(str(bare), "server_python=")


def test_search_dirs_cover_path_the_system_pyenv_and_uv(tmp_path, monkeypatch):
    for version in ("3.12.1", "3.12.10", "3.9.18"):
        (tmp_path / "pyenv" / "versions" / version / "bin").mkdir(parents=True)
    (tmp_path / "data" / "uv" / "python" / "cpython-3.12.3-linux-x86_64-gnu" / "bin").mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{tmp_path / 'p1'}:{tmp_path / 'p2'}:/usr/bin")
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("UV_PYTHON_INSTALL_DIR", raising=False)
    versions = tmp_path / "pyenv" / "versions"
    assert _search_dirs() == [
        str(tmp_path / "p1"), str(tmp_path / "p2"), "/usr/bin", "/usr/local/bin",
        str(versions / "3.12.10" / "bin"), str(versions / "3.12.1" / "bin"), str(versions / "3.9.18" / "bin"),
        str(tmp_path / "data" / "uv" / "python" / "cpython-3.12.3-linux-x86_64-gnu" / "bin"),
    ]


@pytest.mark.server
def test_server_python_alone_makes_our_environment(no_install_env, tmp_path, only_dirs):
    """Without tritonserver=, server_python= is the Python our install is made with, checked first."""
    only_dirs(tmp_path / "empty")
    new = _fake_python(tmp_path, "python3.13", "3.13")
    srv = LocalServer(server_python=new, home=tmp_path / "home", quiet=True)
    with pytest.raises(ServerInstallError, match=r"server_python=: .* is Python 3\.13"):
        srv.install()
    no_install_env.setenv("TRITONSHM_SERVER_PYTHON", str(new))
    with pytest.raises(ServerInstallError, match=r"\$TRITONSHM_SERVER_PYTHON: .* is Python 3\.13"):
        LocalServer(home=tmp_path / "home", quiet=True).install()
    assert not (tmp_path / "home" / "venv").exists()


# -- what the install shows ---------------------------------------------------------


class _Recorder(_Display):
    """A display that records its lines instead of writing them."""

    def __init__(self, verbose: bool = False, tty: bool = False) -> None:
        super().__init__(True, verbose)
        self.tty = tty
        self.text = ""

    def _write(self, text: str) -> None:
        self.text += text


PIP_23 = """\
Looking in indexes: https://pypi.org/simple, file:///opt/pypi/simple
Looking in links: /opt/wheels
WARNING: Location 'file:///opt/pypi/simple/nvidia-pytriton/' is ignored: it is neither a file nor a directory.
Collecting nvidia-pytriton==0.7.0
  Downloading nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl (55.4 MB)
     ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 55.4/55.4 MB 76.9 MB/s eta 0:00:00
WARNING: Location 'file:///opt/pypi/simple/numpy/' is ignored: it is neither a file nor a directory.
Collecting numpy<2
  Using cached numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl (18.3 MB)
Installing collected packages: nvidia-pytriton, numpy
Successfully installed numpy-1.26.4 nvidia-pytriton-0.7.0
"""

PIP_24_OFFLINE = """\
Looking in links: /wheels
Processing /wheels/nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl
Processing /wheels/numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
Installing collected packages: nvidia-pytriton, numpy
Successfully installed numpy-1.26.4 nvidia-pytriton-0.7.0
"""


def _show(pip_output: str, **display) -> str:
    recorder = _Recorder(**display)
    output = _PipOutput(recorder, None)
    for line in pip_output.splitlines():
        output.line(line)
    output.finish()
    return recorder.text


def test_progress_says_what_comes_from_where_in_a_few_lines():
    assert _show(PIP_23) == (
        "tritonshm:   downloading nvidia_pytriton-0.7.0 (55.4 MB)\n"
        "tritonshm:   numpy-1.26.4 (18.3 MB): from pip's cache\n"
        "tritonshm:   installing nvidia-pytriton, numpy\n")
    assert _show(PIP_24_OFFLINE) == (
        "tritonshm:   nvidia_pytriton-0.7.0: from /wheels\n"
        "tritonshm:   numpy-1.26.4: from /wheels\n"
        "tritonshm:   installing nvidia-pytriton, numpy\n")


def test_on_a_terminal_the_download_line_is_updated_in_place(tmp_path):
    recorder = _Recorder(tty=True)
    output = _PipOutput(recorder, tmp_path)
    output.line("  Downloading nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl (55.4 MB)")
    (tmp_path / "pip-unpack-x").mkdir()
    (tmp_path / "pip-unpack-x" / "part").write_bytes(b"\0" * 2_500_000)  # what pip got so far
    output.tick()
    output.line("Installing collected packages: nvidia-pytriton, numpy")
    lines = recorder.text.split("\r")
    assert lines[1].startswith("tritonshm:   downloading nvidia_pytriton-0.7.0 (55.4 MB)")
    assert lines[2].startswith("tritonshm:   downloading nvidia_pytriton-0.7.0 (55.4 MB): 2.5 MB, 0 s")
    assert lines[3].startswith("tritonshm:   downloading nvidia_pytriton-0.7.0 (55.4 MB): done in 0 s")
    assert recorder.text.endswith("\ntritonshm:   installing nvidia-pytriton, numpy\n")


def test_verbose_shows_pips_own_output_instead():
    assert _show(PIP_23, verbose=True) == PIP_23


def test_the_error_tail_leaves_out_local_index_warnings():
    tail = _log_tail(PIP_23.splitlines())
    assert "Location" not in tail and "Downloading nvidia_pytriton" in tail


def test_the_download_command_fetches_exactly_the_two_wheels():
    command = download_command("3.12")
    assert command.startswith('pip download --no-deps nvidia-pytriton==0.7.0 "numpy<2" -d DIR '
                              '--python-version 3.12 --only-binary=:all: ')
    machine = os.uname().machine
    assert command.endswith(f"--platform manylinux_2_35_{machine} --platform manylinux2014_{machine}")


def test_an_install_made_with_dependencies_stays_valid(tmp_path):
    """Markers written before --no-deps (same requirements, no pip_options) still count as complete."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "tritonserver").write_text("")
    old = {"version": "3.11", "requirements": ["nvidia-pytriton==0.7.0", "numpy<2"],
           "python": str(venv / "bin" / "python"), "tritonserver": str(venv / "tritonserver")}
    (venv / "tritonshm-installed.json").write_text(json.dumps(old))
    assert _read_marker(venv) == old
    assert list(REQUIREMENTS) == old["requirements"]


def test_cli_install_flags(tmp_path):
    for command in ("server", "demo"):
        done = subprocess.run([sys.executable, "-m", "tritonshm", command, "--help"], capture_output=True, text=True)
        assert "--install-from DIR" in done.stdout and "--verbose" in done.stdout, done.stdout
    done = subprocess.run([sys.executable, "-m", "tritonshm", "server", "--install-only", "--install-from",
                           str(tmp_path / "none")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"tritonshm server: --install-from {tmp_path / 'none'}: not a directory\n"


# -- offline, for real ----------------------------------------------------------------


def _unshare_or_skip() -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare command: cannot cut the network for the offline install")
    done = subprocess.run(["unshare", "-rn", "true"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"unshare -rn does not work here ({done.stderr.strip() or done.returncode}): "
                    f"cannot cut the network for the offline install")


@pytest.fixture(scope="module")
def server_python() -> tuple[str, str]:
    """The (interpreter, version) an install here makes the server's environment with."""
    try:
        return _find_base_python(os.environ.get("TRITONSHM_SERVER_PYTHON"), "$TRITONSHM_SERVER_PYTHON")
    except ServerInstallError as exc:
        pytest.skip(f"no Python to make the server's environment with: {exc}")


@pytest.fixture(scope="module")
def wheels(server_python) -> Path:
    """A folder with just the two wheels, downloaded once per server Python into the temp directory."""
    version = server_python[1]
    cache = Path(tempfile.gettempdir()) / f"tritonshm-test-wheels-py{version}"
    if len(list(cache.glob("nvidia_pytriton-0.7.0-*.whl")) + list(cache.glob("numpy-1.*.whl"))) == 2:
        return cache
    partial = Path(tempfile.mkdtemp(prefix=cache.name + "-", dir=cache.parent))
    command = download_command(version, str(partial)).split()
    command = [sys.executable, "-m", *[c.strip('"') for c in command]]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        last = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["?"]
        pytest.skip(f"cannot fetch the server's wheels for Python {version} ({last[0]})")
    try:
        os.rename(partial, cache)  # whole or not at all; another session may have won
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
    assert sorted(p.name.split("-")[0] for p in cache.iterdir()) == ["numpy", "nvidia_pytriton"]
    return cache


def _offline_env(tmp_path: Path, **extra: str) -> dict:
    """Our environment for an install inside unshare -rn: no pip configuration, no TRITONSHM_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITONSHM_", "PIP_"))}
    env.update(TRITONSHM_SERVER_HOME=str(tmp_path / "home"), PIP_CONFIG_FILE=os.devnull, PIP_RETRIES="0")
    env.update(extra)
    return env


@pytest.mark.server
def test_offline_install_from_a_folder_of_wheels_runs_the_models(no_install_env, tmp_path, wheels,
                                                                  server_python):
    _unshare_or_skip()
    done = subprocess.run(["unshare", "-rn", sys.executable, "-m", "tritonshm", "server", "--install-only",
                           "--install-from", str(wheels)],
                          env=_offline_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    venv = tmp_path / "home" / "venv"
    assert done.stdout == f"{venv}\n"
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"tritonshm: installing the Triton server (nvidia-pytriton 0.7.0 + numpy<2; "
                               f"from {wheels}, no download")
    assert f"tritonshm:   nvidia_pytriton-0.7.0: from {wheels}" in lines
    assert lines[-1].startswith("tritonshm: Triton server installed in ")
    assert len(lines) <= 6 and "Location" not in done.stderr
    marker = json.loads((venv / "tritonshm-installed.json").read_text())
    assert marker["wheels"] == str(wheels) and marker["version"] == server_python[1]
    assert marker["pip_options"] == ["--no-deps", "--only-binary=:all:"]
    # Exactly the two wheels (and the venv's own pip), nothing of nvidia-pytriton's dependencies.
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
                               capture_output=True, text=True, check=True).stdout
    assert {p["name"].lower() for p in json.loads(installed)} - {"pip", "setuptools"} == {"nvidia-pytriton", "numpy"}
    # The server installed offline runs the bundled models (outside the namespace: it needs loopback).
    with LocalServer(home=tmp_path / "home", quiet=True) as srv:
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        try:
            x = np.arange(64, dtype=np.float32) / 3
            inp = grpcclient.InferInput("INPUT0", [64], "FP32")
            inp.set_data_from_numpy(x)
            result = client.infer("identity_fp32", [inp], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
        finally:
            client.close()


def test_without_network_the_error_says_how_to_pre_seed(no_install_env, tmp_path, server_python):
    _unshare_or_skip()
    done = subprocess.run(["unshare", "-rn", sys.executable, "-m", "tritonshm", "server", "--install-only"],
                          env=_offline_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and done.stdout == ""
    assert "Traceback" not in done.stderr and "Location" not in done.stderr
    assert f"~{DOWNLOAD_MB} MB download" in done.stderr
    assert "failed while running pip install (exit code 1)" in done.stderr
    assert f"\n  {download_command(server_python[1])}\n" in done.stderr
    assert "\n  tritonshm server --install-only --install-from DIR\n" in done.stderr
    assert "TRITONSHM_SERVER_WHEELS=DIR" in done.stderr
    assert f"(full log: {tmp_path / 'home' / 'install.log'})" in done.stderr
    assert not (tmp_path / "home" / "venv" / "tritonshm-installed.json").exists()


@pytest.mark.server
def test_the_wheels_folder_comes_from_the_environment_too(no_install_env, tmp_path, server_python):
    """$TRITONSHM_SERVER_WHEELS reaches LocalServer; a folder without the wheels says how to fill it."""
    empty = tmp_path / "empty"
    empty.mkdir()
    no_install_env.setenv("TRITONSHM_SERVER_WHEELS", str(empty))
    no_install_env.setenv("PIP_CONFIG_FILE", os.devnull)
    no_install_env.delenv("PIP_FIND_LINKS", raising=False)
    srv = LocalServer(home=tmp_path / "home", quiet=True)
    assert srv.wheels == str(empty)
    with pytest.raises(ServerInstallError) as info:
        srv.install()
    message = str(info.value)
    assert f"--no-index --find-links {empty}" in message
    assert f"needs both wheels for Python {server_python[1]}" in message
    assert download_command(server_python[1], str(empty)) in message
    no_install_env.setenv("TRITONSHM_SERVER_WHEELS", str(tmp_path / "nowhere"))
    with pytest.raises(ServerInstallError, match=r"^\$TRITONSHM_SERVER_WHEELS: .*/nowhere is not a directory"):
        LocalServer(home=tmp_path / "home2", quiet=True).install()
