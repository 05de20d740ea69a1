"""The pieces of tests/gpu/run.sh that run without a GPU: its syntax, and the table it ends with."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import junit_summary

HERE = Path(__file__).resolve().parent

SAMPLE = textwrap.dedent("""\
    import pytest

    def test_pass(): pass
    def test_fail(): assert 0
    @pytest.mark.skip(reason="x")
    def test_skip(): pass
    @pytest.mark.xfail
    def test_xfail(): assert 0
    @pytest.fixture
    def broken(): raise RuntimeError
    def test_error(broken): pass
    class TestClass:
        def test_method(self): pass
    """)


def test_run_sh_parses():
    subprocess.run(["bash", "-n", str(HERE / "run.sh")], check=True)


@pytest.mark.parametrize("family", ["xunit1", "xunit2"])
def test_table_counts_per_file(tmp_path, family):
    (tmp_path / "sub").mkdir()
    (tmp_path / "test_one.py").write_text(SAMPLE)
    (tmp_path / "sub" / "test_two.py").write_text("def test_a(): pass\ndef test_b(): pass\n")
    (tmp_path / "sub" / "test_broken.py").write_text("import no_such_module_xyzzy\n")
    xml = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "--continue-on-collection-errors", "-o", f"junit_family={family}",
                    f"--junitxml={xml}", "."], cwd=tmp_path, stdout=subprocess.DEVNULL)
    counts, interrupted = junit_summary.summarise(str(xml))
    assert interrupted == 0
    assert counts == {
        "test_one.py": {"passed": 2, "failed": 1, "skipped": 2, "errors": 1},
        "sub/test_two.py": {"passed": 2, "failed": 0, "skipped": 0, "errors": 0},
        "sub/test_broken.py": {"passed": 0, "failed": 0, "skipped": 0, "errors": 1},
    }
    lines = junit_summary.table(counts).splitlines()
    assert lines[0].split() == ["file", "passed", "failed", "skipped", "errors"]
    assert lines[-1].split() == ["TOTAL", "4", "1", "2", "2"]


def test_an_interrupted_test_is_not_counted(tmp_path, capsys):
    xml = tmp_path / "junit.xml"
    xml.write_text('<testsuites><testsuite name="pytest">'
                   '<testcase classname="test_x" name="test_a" file="tests/test_x.py" time="0.1" />'
                   '<testcase time="0.002" /></testsuite></testsuites>')
    assert junit_summary.main(["junit_summary.py", str(xml)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "1 test(s) interrupted, not counted"
    assert out[-1].split() == ["TOTAL", "1", "0", "0", "0"]


def test_an_unreadable_file_is_reported(tmp_path, capsys):
    assert junit_summary.main(["junit_summary.py", str(tmp_path / "missing.xml")]) == 1
    assert "cannot read the junit xml" in capsys.readouterr().out
