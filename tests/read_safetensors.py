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
    values = struct.unpack(f"<{(end - begin) // 4}f", data[begin:end])
    print(name, entry["dtype"], entry["shape"], list(values))
for key, value in header.get("__metadata__", {}).items():
    print(key, value)
