#!/usr/bin/python3
"""Writes the seed corpus of the npy fuzz target: small valid files of every supported dtype and
format version, and the malformed cases the reader must refuse. Run once; the output is kept in
tests/fuzz/corpus/npy/ (libFuzzer adds what it finds beside these)."""
import io
import pathlib
import struct
import sys

import numpy as np

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent / "corpus" / "npy")
out.mkdir(parents=True, exist_ok=True)


def save(name, array, version=None):
    buffer = io.BytesIO()
    if version is None:
        np.save(buffer, array)
    else:
        np.lib.format.write_array(buffer, array, version=version)
    (out / f"seed_{name}.npy").write_bytes(buffer.getvalue())


def raw(name, header, payload=b"", version=1):
    header = header.encode("latin1")
    if version == 1:
        pre = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header))
    else:
        pre = b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(header))
    (out / f"seed_{name}.npy").write_bytes(pre + header + payload)


save("f4_2x3", np.arange(6, dtype="<f4").reshape(2, 3))
save("f2_4", np.array([1, -2, np.inf, np.nan], dtype="<f2"))
save("f8_scalar", np.array(3.5, dtype="<f8"))
save("i4_5", np.array([0, -1, 2**31 - 1, -(2**31), 7], dtype="<i4"))
save("i8_3", np.array([0, -1, 2**40], dtype="<i8"))
save("f4_empty", np.zeros((0, 4), dtype="<f4"))
save("f4_v2", np.ones((2, 2), dtype="<f4"), version=(2, 0))
save("f4_v3", np.ones((3,), dtype="<f4"), version=(3, 0))
save("fortran", np.asfortranarray(np.ones((2, 3), dtype="<f4")))
save("big_endian", np.ones(3, dtype=">f4"))
save("u1", np.ones(3, dtype="u1"))
raw("huge_shape", "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }\n")
raw("overflow_shape", "{'descr': '<f8', 'fortran_order': False, 'shape': (999999999999999999, 99), }\n")
raw("truncated_data", "{'descr': '<f4', 'fortran_order': False, 'shape': (10,), }\n", b"\0" * 12)
raw("negative_dim", "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }\n")
raw("no_shape", "{'descr': '<f4', 'fortran_order': False, }\n")
raw("unclosed", "{'descr': '<f4, 'fortran_order': False, 'shape': (2, \n")
(out / "seed_truncated_header.npy").write_bytes(b"\x93NUMPY\x01\x00\xff\xff{'descr'")
(out / "seed_empty_file.npy").write_bytes(b"")
