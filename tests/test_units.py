"""Sizes in messages: exact bytes, with the binary unit people compare beside them."""

import pytest

from tritonshm._units import in_units, nbytes_text


@pytest.mark.parametrize("nbytes, text", [(100, "100 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (64 << 20, "64 MiB"),
                                          ((3 << 30) // 2, "1.5 GiB"), ((1 << 20) + 1, "1 MiB")])
def test_a_size_reads_in_the_largest_unit_it_reaches(nbytes, text):
    assert in_units(nbytes) == text


def test_a_message_gives_the_bytes_and_the_unit_beside_them():
    assert nbytes_text(8 << 20) == "8388608 bytes (8 MiB)"
    assert nbytes_text(512) == "512 bytes"
