"""The C toolchain the packaging tests build with (shared by test_installed and test_native_bench)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig


def c_compiler() -> str | None:
    """The C compiler extensions would be built with, if it runs here."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    exe = shutil.which(cc.split()[0])
    if exe is None:
        return None
    try:
        ok = subprocess.run([exe, "--version"], capture_output=True, timeout=30).returncode == 0
    except OSError:
        return None
    return exe if ok else None
