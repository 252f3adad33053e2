#!/usr/bin/env python3
"""Reads a safetensors checkpoint with the standard library alone (struct, json) and prints each
tensor's name, dtype, shape and values, then the metadata: what a user can do without any package."""
import json
import struct
import sys

with open(sys.argv[1], "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
    data = f.read()
for name, entry in header.items():
    if name == "__metadata__":
        continue
    begin, end = entry["data_offsets"]
    raw = data[begin:end]
    if entry["dtype"] == "F32":
        values = struct.unpack(f"<{len(raw) // 4}f", raw)
    elif entry["dtype"] == "F16":  # IEEE half: struct's "e"
        values = struct.unpack(f"<{len(raw) // 2}e", raw)
    else:  # BF16: the upper 16 bits of a float32
        halves = struct.unpack(f"<{len(raw) // 2}H", raw)
        values = struct.unpack(f"<{len(halves)}f", struct.pack(f"<{len(halves)}I", *(h << 16 for h in halves)))
    print(name, entry["dtype"], entry["shape"], list(values))
for key, value in header.get("__metadata__", {}).items():
    print(key, value)
