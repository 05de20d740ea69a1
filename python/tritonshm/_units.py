"""Sizes as people read them: messages give bytes (exact, what settings take) with KiB, MiB or GiB
beside them (what people compare)."""

from __future__ import annotations

__all__ = ["in_units", "nbytes_text"]

_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def in_units(nbytes: int) -> str:
    """*nbytes* in the largest binary unit it reaches: ``"8 MiB"``, ``"1.5 GiB"``, ``"100 B"``."""
    for unit, size in _UNITS:
        if nbytes >= size:
            return f"{nbytes / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{nbytes} B"


def nbytes_text(nbytes: int) -> str:
    """*nbytes* for a message: ``"8388608 bytes (8 MiB)"``; under a KiB, bytes alone."""
    return f"{nbytes} bytes" if nbytes < 1024 else f"{nbytes} bytes ({in_units(nbytes)})"
