"""What a built wheel ships, checked on the installed package.

Most of these tests mean something only where tritonshm runs from an
installed wheel (cibuildwheel's test step, tools/build_wheel.sh): from the
source tree they skip and say so. Two of them always run: the version
``tritonshm --version`` prints, and (given ``TRITONSHM_WHEEL=<path>``) the
file list of a built wheel.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import tritonshm
from toolchain import c_compiler

MEMORY = Path(tritonshm.__file__).resolve().parent / "_memory"

#: module -> the cdef classes its .pxd must declare (the public ones first).
PXD_CLASSES = {
    "_region": {"Region"},
    "_system": {"SystemRegion", "Window"},
    "_pinned": {"PinnedRegion"},
    "_cuda_region": {"CudaRegion"},
    "_cuda_array": {"CudaArray"},
    "_cuda_window": {"CudaWindow"},
    "_capture": {"Capture"},
    "_cai": set(),
    "_copy": set(),
    "_runtime": {"Runtime"},
    "_dlpack": {"Imported"},
    "_stream": {"Stream", "Event", "DeviceGuard"},
}
#: .pxd files with declarations only (no extension module of their own).
PXD_ONLY = {"_tshm"}
HEADERS = {"tshm.h", "tshm_cuda.h", "tshm_dlpack.h"}


def installed_distribution() -> importlib.metadata.Distribution | None:
    """The distribution tritonshm was imported from; None when it runs from the source tree."""
    try:
        dist = importlib.metadata.distribution("tritonshm")
    except importlib.metadata.PackageNotFoundError:
        return None
    located = Path(str(dist.locate_file("tritonshm/__init__.py"))).resolve()
    return dist if located == Path(tritonshm.__file__).resolve() else None


needs_installed = pytest.mark.skipif(
    installed_distribution() is None,
    reason=f"tritonshm runs from the source tree ({MEMORY.parent}), not from an installed wheel: "
    "nothing of a wheel's contents to check",
)


def extension_of(module: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = MEMORY / f"{module}{suffix}"
        if path.exists():
            return path
    return None


# --- the version: one source ---------------------------------------------------


def test_version_command_matches_metadata():
    """``python -m tritonshm --version`` prints the installed distribution's
    version (from the source tree: ``tritonshm.__version__``)."""
    dist = installed_distribution()
    expected = dist.version if dist is not None else tritonshm.__version__
    out = subprocess.run(
        [sys.executable, "-m", "tritonshm", "--version"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    first = out.splitlines()[0]
    assert re.fullmatch(r"tritonshm \S+ \(Python \S+, numpy \S+\)", first), out
    assert first.split()[1] == expected
    assert f"Python {sys.version.split()[0]}" in first


@needs_installed
def test_metadata_version_is_dunder_version():
    """The wheel's metadata was read from tritonshm/__init__.py at build time."""
    assert installed_distribution().version == tritonshm.__version__


@needs_installed
def test_license_and_metadata_installed():
    dist = installed_distribution()
    assert dist.metadata["License-Expression"] == "BSD-3-Clause"
    assert "Programming Language :: Python :: 3.14" in dist.metadata.get_all("Classifier")
    licenses = [f for f in dist.files if f.name == "LICENSE"]
    assert licenses, "LICENSE is not among the installed files"
    assert "BSD 3-Clause License" in licenses[0].read_text()
    assert "the tritonshm authors" in licenses[0].read_text()


# --- the Cython declarations --------------------------------------------------


@needs_installed
@pytest.mark.parametrize("module", sorted(PXD_CLASSES))
def test_pxd_next_to_its_module_declares_its_classes(module):
    pxd = MEMORY / f"{module}.pxd"
    assert pxd.is_file(), f"{pxd.name} is not installed next to the extension"
    assert extension_of(module) is not None, f"no compiled {module} next to {pxd.name}"
    assert not (MEMORY / f"{module}.pyx").exists(), "the .pyx implementation must not ship"
    declared = set(re.findall(r"^cdef class (\w+)", pxd.read_text(), re.MULTILINE))
    assert PXD_CLASSES[module] <= declared
    extension = importlib.import_module(f"tritonshm._memory.{module}")
    for name in PXD_CLASSES[module]:
        assert isinstance(getattr(extension, name), type)


@needs_installed
def test_headers_named_by_the_pxds_are_installed():
    """Every ``cdef extern from "x.h"`` of a shipped .pxd has x.h in _memory/include."""
    for name in PXD_ONLY:
        assert (MEMORY / f"{name}.pxd").is_file()
    include = MEMORY / "include"
    assert {p.name for p in include.glob("*.h")} >= HEADERS
    for pxd in MEMORY.glob("*.pxd"):
        for header in re.findall(r'^cdef extern from "([^"]+)"', pxd.read_text(), re.MULTILINE):
            assert (include / header).is_file(), f"{pxd.name} needs {header}, not installed"




DOWNSTREAM_PYX = '''\
# cython: language_level=3
# distutils: include_dirs = {include}
"""A downstream extension using tritonshm's declarations, as a user's would."""
from libc.string cimport memcpy
from tritonshm._memory._system cimport SystemRegion
from tritonshm._memory._tshm cimport tshm_mapping


def mapped_bytes(SystemRegion region):
    """The size of the live mapping, read from the C struct."""
    cdef tshm_mapping *m = region._live_mapping()
    return m.nbytes


def write_through_cdef_method(SystemRegion region, bytes data, size_t offset):
    """A bounds-checked copy through the class's C-level method (its vtable)."""
    cdef const char *src = data
    region._copy(True, offset, <void *>src, len(data))
'''

DOWNSTREAM_CHECK = '''\
import sys
sys.path.insert(0, sys.argv[1])
import downstream, tritonshm
with tritonshm.SystemRegion.create(8192) as r:
    assert downstream.mapped_bytes(r) == 8192
    downstream.write_through_cdef_method(r, b"hello", 100)
    assert bytes(r.read("uint8", (5,), offset=100)) == b"hello"
    try:
        downstream.write_through_cdef_method(r, b"x" * 10, 8190)
    except tritonshm.Error:
        pass
    else:
        raise AssertionError("an out-of-bounds copy was not refused")
print("cimport ok")
'''


@needs_installed
def test_cimport_from_installed_package(tmp_path):
    """Another Cython extension compiles against the installed .pxd files and
    headers, and runs (needs Cython, setuptools and a C compiler)."""
    pytest.importorskip("Cython", reason="Cython is not installed: cannot build a downstream extension")
    pytest.importorskip("setuptools", reason="setuptools is not installed: cannot build a downstream extension")
    if c_compiler() is None:
        pytest.skip("no working C compiler: cannot build a downstream extension")
    (tmp_path / "downstream.pyx").write_text(DOWNSTREAM_PYX.format(include=MEMORY / "include"))
    build = subprocess.run(
        [sys.executable, "-m", "Cython.Build.Cythonize", "-i", "-q", "downstream.pyx"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run(
        [sys.executable, "-c", DOWNSTREAM_CHECK, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "cimport ok" in run.stdout


# --- a built wheel's file list (TRITONSHM_WHEEL=path/to/tritonshm-*.whl) ----


def test_wheel_file_list():
    wheel = os.environ.get("TRITONSHM_WHEEL")
    if not wheel:
        pytest.skip("no wheel to inspect: set TRITONSHM_WHEEL=path/to/tritonshm-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        version = Path(wheel).name.split("-")[1]
        metadata = zf.read(f"tritonshm-{version}.dist-info/METADATA").decode()
    for module in PXD_CLASSES:
        assert f"tritonshm/_memory/{module}.pxd" in names
        assert f"tritonshm/_memory/{module}.pyi" in names
    for module in PXD_ONLY:
        assert f"tritonshm/_memory/{module}.pxd" in names
    for header in HEADERS:
        assert f"tritonshm/_memory/include/{header}" in names
    assert f"tritonshm-{version}.dist-info/licenses/LICENSE" in names
    assert "tritonshm/py.typed" in names
    assert not [n for n in names if n.endswith((".pyx", ".pyc", ".c", ".o")) or "__pycache__" in n]
    # One extension per module, all for the one Python the wheel is tagged for.
    sos = sorted(n for n in names if n.endswith(".so"))
    assert {n.split("/")[-1].split(".")[0] for n in sos} == set(PXD_CLASSES)
    assert len(sos) == len(PXD_CLASSES), sos
    assert len({n.split(".")[-2] for n in sos}) == 1, sos
    assert f"\nVersion: {version}\n" in metadata
    assert "\nLicense-Expression: BSD-3-Clause\n" in metadata
    assert re.search(r"^Requires-Python: >=3\.10$", metadata, re.MULTILINE)
    for minor in range(10, 15):
        assert f"Classifier: Programming Language :: Python :: 3.{minor}\n" in metadata


def test_source_tree_declares_what_the_wheel_ships():
    """From a source checkout: the version is written once, and the .pxd files
    are not excluded from the wheel (the .pyx files are)."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if not (root / "CMakeLists.txt").is_file() or not pyproject.is_file():
        pytest.skip("no source tree here (the tests run from a copy next to an installed wheel)")
    text = pyproject.read_text()
    assert 'dynamic = ["version"]' in text
    assert not re.search(r"^version\s*=", text, re.MULTILINE), "a second, static version in pyproject.toml"
    assert 'provider = "scikit_build_core.metadata.regex"' in text
    assert 'input = "python/tritonshm/__init__.py"' in text
    assert 'wheel.exclude = ["**.pyx"]' in text
    init = (root / "python" / "tritonshm" / "__init__.py").read_text()
    assert len(re.findall(r'^__version__ = "[^"]+"$', init, re.MULTILINE)) == 1
    assert (root / "LICENSE").read_text().startswith("BSD 3-Clause License")
    assert "DESTINATION tritonshm/_memory/include" in (root / "CMakeLists.txt").read_text()
