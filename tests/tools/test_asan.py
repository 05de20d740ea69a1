"""The AddressSanitizer run's pieces that need no sanitizer: tools/asan.sh's syntax, the sorting
of reports (tools/asan_reports.py) and the leak check's exception for the sanitizer's log."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import conftest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("asan_reports", ROOT / "tools" / "asan_reports.py")
asan_reports = sys.modules["asan_reports"] = importlib.util.module_from_spec(_spec)  # (dataclasses look it up)
_spec.loader.exec_module(asan_reports)

# Two reports as ASan (gcc 12) wrote them in one log when the test helpers had their use-after-frees
# (issue 27); the stacks are cut after a few frames, the shadow dump after its first lines.
OURS = textwrap.dedent("""\
    =================================================================
    ==12207==ERROR: AddressSanitizer: heap-use-after-free on address 0x606000d86760 at pc 0x7f8e41ca8596 bp 0x7ffffa420260 sp 0x7ffffa41fa10
    READ of size 1 at 0x606000d86760 thread T0
        #0 0x7f8e41ca8595 in __interceptor_strcmp ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:466
        #1 0x7f8e4135a2b5 in name_matches Objects/capsule.c:38
        #3 0x7f8e4135a2b5 in PyCapsule_IsValid Objects/capsule.c:75
        #4 0x7f8e3cb9de47 in __pyx_f_9tritonshm_7_memory_7_dlpack__capsule_destructor /src/build/asan/cmake/cp311-cp311-linux_x86_64/_memory_dlpack.c:5213
        #5 0x7f8e4135a20e in capsule_dealloc Objects/capsule.c:257

    0x606000d86760 is located 32 bytes inside of 56-byte region [0x606000d86740,0x606000d86778)
    freed by thread T0 here:
        #0 0x7f8e41cb76a8 in __interceptor_free ../../../../src/libsanitizer/asan/asan_malloc_linux.cpp:52
        #1 0x7f8e412fda04 in _PyEval_EvalFrameDefault Python/ceval.c:4780

    previously allocated by thread T0 here:
        #0 0x7f8e41cb89cf in __interceptor_malloc ../../../../src/libsanitizer/asan/asan_malloc_linux.cpp:69
        #3 0x7f8e4134e16b in PyBytes_FromStringAndSize Objects/bytesobject.c:136

    SUMMARY: AddressSanitizer: heap-use-after-free ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:466 in __interceptor_strcmp
    Shadow bytes around the buggy address:
    =>0x0c0c801a8ce0: fd fd fd fd fa fa fa fa fd fd fd fd[fd]fd fd fa
    Shadow byte legend (one shadow byte represents 8 application bytes):
      Addressable:           00
    =================================================================
    ==12207==ERROR: AddressSanitizer: heap-use-after-free on address 0x60d000015450 at pc 0x7f8e41c4814b bp 0x7ffffa41fbf0 sp 0x7ffffa41f3a0
    READ of size 4 at 0x60d000015450 thread T0
        #0 0x7f8e41c4814a in __interceptor_memcpy ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:827
        #1 0x7f8e2cfd5809  (/src/build/asan/pytest-cache/d/fake_cudart/libfakecudart-969a661c85114a6a.so+0x7809)
        #2 0x7f8e2cfd7904  (/src/build/asan/pytest-cache/d/fake_cudart/libfakecudart-969a661c85114a6a.so+0x9904)
        #5 0x7f8e3f3ccb0c in ffi_call (/lib/x86_64-linux-gnu/libffi.so.8+0x6b0c)

    0x60d000015450 is located 112 bytes inside of 136-byte region [0x60d0000153e0,0x60d000015468)
    freed by thread T0 here:
        #0 0x7f8e41cb76a8 in __interceptor_free ../../../../src/libsanitizer/asan/asan_malloc_linux.cpp:52
        #1 0x7f8e413be979 in subtype_dealloc Objects/typeobject.c:1463

    SUMMARY: AddressSanitizer: heap-use-after-free ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:827 in __interceptor_memcpy
    Shadow bytes around the buggy address:
    =>0x0c1a7fffaa80: fd fd fd fd fd fd fd fd fd fd[fd]fd fd fa fa fa
    """)

# One that no frame of ours is in (made up in the same form): numpy and grpc's Cython alone, and
# a warning after it that is not a report.
THEIRS = textwrap.dedent("""\
    =================================================================
    ==4242==ERROR: AddressSanitizer: memcpy-param-overlap: memory ranges [0x6190000a1480,0x6190000a14a0) and [0x6190000a1490, 0x6190000a14b0) overlap
        #0 0x7f1e6b2484c5 in __interceptor_memcpy ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:827
        #1 0x7f1e63a1b2c4  (/venv/lib/python3.11/site-packages/numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so+0x21b2c4)
        #2 0x7f1e62f0a111 in __pyx_f_4grpc_7_cython_6cygrpc__copy (/venv/lib/python3.11/site-packages/grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so+0x30a111)
        #3 0x7f1e6a95861c in _PyObject_MakeTpCall Objects/call.c:214

    SUMMARY: AddressSanitizer: memcpy-param-overlap ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:827 in __interceptor_memcpy
    ==4242==WARNING: ASan doesn't fully support makecontext/swapcontext functions and may produce false reports
        #9 0x7f1e6b000000 in __pyx_f_9tritonshm_7_memory_7_region_not_part_of_a_report /x/_memory_region.c:1
    """)


def test_asan_sh_parses():
    subprocess.run(["bash", "-n", str(ROOT / "tools" / "asan.sh")], check=True)


def test_reports_are_split_and_sorted():
    ours = asan_reports.parse(OURS, "asan.12207")
    assert [(r.pid, r.ours) for r in ours] == [(12207, True), (12207, True)]
    assert ours[0].project_frames == [
        "#4 0x7f8e3cb9de47 in __pyx_f_9tritonshm_7_memory_7_dlpack__capsule_destructor "
        "/src/build/asan/cmake/cp311-cp311-linux_x86_64/_memory_dlpack.c:5213"]
    assert [f.split()[0] for f in ours[1].project_frames] == ["#1", "#2"]  # the fake, unnamed
    assert ours[1].summary.startswith("heap-use-after-free") and ours[1].summary.endswith("__interceptor_memcpy")
    # Each report ends where the next begins: the first holds none of the second's frames.
    assert "libfakecudart" not in ours[0].text

    theirs = asan_reports.parse(THEIRS)
    assert len(theirs) == 1 and not theirs[0].ours  # the frame after the warning is no report's
    assert theirs[0].summary.startswith("memcpy-param-overlap")


@pytest.mark.parametrize("frame, ours", [
    ("#2 0x7f in tshm_copy_in /home/u/tritonshm/csrc/tshm.c:120", True),
    ("#2 0x7f in tshm_copy_in csrc/tshm.h:12:3", True),
    ("#2 0x7f in snapshot_of /w/tests/fake_cudart/fake_cudart.c:744", True),
    ("#2 0x7f in main /w/bench/tshm_bench.c:50", True),
    ("#2 0x7f in __pyx_pw_9tritonshm_7_memory_7_system_12SystemRegion_3write /b/_memory_system.c:99", True),
    ("#2 0x7f in f /w/python/tritonshm/_memory/_system.pyx:40", True),
    ("#2 0x7f  (/v/site-packages/tritonshm/_memory/_copy.cpython-312-x86_64-linux-gnu.so+0x1e0)", True),
    ("#2 0x7f  (/tmp/pytest-of-u/fake-cudart0/libfakecudart-0123456789abcdef.so+0x7809)", True),
    ("#2 0x7f in __pyx_tp_dealloc_9tritonshm_7_memory_7_region_Region (/v/x.so+0x10)", True),
    # theirs: torch's own csrc, grpc's Cython, numpy, a venv that happens to be called tritonshm
    ("#2 0x7f in THPModule_x /pytorch/torch/csrc/Module.cpp:12", False),
    ("#2 0x7f in __pyx_f_4grpc_7_cython_6cygrpc_f (/v/grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so+0x3)", False),
    ("#2 0x7f  (/home/u/tritonshm/.venv/lib/python3.11/site-packages/numpy/_core/_m.cpython-311.so+0x3)", False),
    ("#2 0x7f in PyCapsule_IsValid Objects/capsule.c:75", False),
])
def test_project_frames(frame, ours):
    assert bool(asan_reports.PROJECT_FRAME.search(frame)) is ours


def test_exit_status_and_listing(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    assert asan_reports.main([str(logs)]) == 0  # a clean run writes no log
    assert "0 report(s) in the project's code, 0 outside it" in capsys.readouterr().out

    (logs / "asan.4242").write_text(THEIRS)
    (logs / "asan.4243").write_text(THEIRS.replace("4242", "4243"))
    assert asan_reports.main([str(logs)]) == 0
    out = capsys.readouterr().out
    assert "2 x memcpy-param-overlap" in out and "(asan.4242, asan.4243)" in out
    assert "0 report(s) in the project's code, 2 outside it" in out

    (logs / "asan.12207").write_text(OURS)
    assert asan_reports.main([str(logs)]) == 1
    out = capsys.readouterr().out
    assert out.count("=== ASan report in the project's code (asan.12207, pid 12207)") == 2
    assert "__pyx_f_9tritonshm_7_memory_7_dlpack__capsule_destructor" in out
    assert "Shadow byte legend" not in out and "(shadow bytes: see asan.12207)" in out
    assert "2 report(s) in the project's code, 2 outside it" in out

    assert asan_reports.main([str(tmp_path / "missing")]) == 2


def test_unnamed_project_frames_are_named_by_addr2line(tmp_path):
    """ASan leaves the functions of a library dlopen()ed after its first stack unnamed (the fake
    runtime, loaded by a test): the listing names them from the library's debug information."""
    cc, addr2line, nm = shutil.which("cc") or shutil.which("gcc"), shutil.which("addr2line"), shutil.which("nm")
    if not (cc and addr2line and nm):
        pytest.skip("needs a C compiler, addr2line and nm")
    (tmp_path / "fake.c").write_text("int snapshot_of(int x) { return x * 3 + 1; }\n")
    lib = tmp_path / "libfakecudart-0123456789abcdef.so"
    subprocess.run([cc, "-shared", "-fPIC", "-g", "-O0", "-o", str(lib), str(tmp_path / "fake.c")], check=True)
    symbols = subprocess.run([nm, str(lib)], capture_output=True, text=True, check=True).stdout
    offset = next(int(line.split()[0], 16) for line in symbols.splitlines() if line.endswith(" snapshot_of"))
    frame = f"    #1 0x7f8e2cfd5809  ({lib}+{offset + 4:#x})"
    assert asan_reports.name_frame(frame) == f"{frame} [snapshot_of {tmp_path / 'fake.c'}:1]"
    # Left as they are: a named frame, a module that is gone.
    named = "    #1 0x7f in snapshot_of /w/tests/fake_cudart/fake_cudart.c:744"
    assert asan_reports.name_frame(named) == named
    gone = f"    #1 0x7f8e2cfd5809  ({tmp_path / 'gone.so'}+0x10)"
    assert asan_reports.name_frame(gone) == gone


@pytest.mark.parametrize("options, prefix", [
    ("log_path=/tmp/logs/asan:halt_on_error=0", "/tmp/logs/asan."),
    ("halt_on_error=0,log_path='/tmp/a b/asan' detect_leaks=0", "/tmp/a b/asan."),
    ("my_log_path=/x:detect_leaks=0", None),
    ("detect_leaks=0 log_path=/x/one:log_path=/x/two", "/x/two."),
    ("log_path=stderr", None),
    ("detect_leaks=0", None),
    (None, None),
])
def test_sanitizer_log_prefix(options, prefix):
    assert conftest.sanitizer_log_prefix(options) == prefix


def test_leak_check_does_not_count_the_sanitizer_log(tmp_path, monkeypatch):
    """ASan opens <log_path>.<pid> at its first report and keeps it open: not a leaked descriptor."""
    before = conftest.open_fds()
    monkeypatch.setattr(conftest, "_SANITIZER_LOG", str(tmp_path / "asan") + ".")
    log = os.open(tmp_path / f"asan.{os.getpid()}", os.O_WRONLY | os.O_CREAT, 0o600)
    other = os.open(tmp_path / "other", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert conftest._settled_new_fds(before, settle_seconds=0) == [(other, str(tmp_path / "other"))]
    finally:
        os.close(log)
        os.close(other)
