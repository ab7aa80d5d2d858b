#!/usr/bin/env python3
"""tests/read_checkpoint.py — reads a mixtape checkpoint without mixtape, as an independent check of the format.

    read_checkpoint.py CHECKPOINT EXPECTED_JSON

Parses the safetensors layout by hand (8-byte little-endian header length, JSON header, raw bytes), decodes every
tensor with torch, and compares each with EXPECTED_JSON ({"tensors": {key: {"dtype", "shape", "values"}},
"metadata": {...}}), values exactly. When Python's `safetensors` package is importable, its reader must agree too.
Exit status 0 when everything matches; otherwise the first difference is printed and the status is 1.
"""
import json
import struct
import sys

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}


def fail(message):
    print("read_checkpoint.py: " + message)
    sys.exit(1)


def main(path, expected_path):
    with open(expected_path) as f:
        expected = json.load(f)
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    for key, value in expected["metadata"].items():
        if metadata.get(key) != value:
            fail(f"metadata {key!r}: {metadata.get(key)!r}, expected {value!r}")
    if set(header) != set(expected["tensors"]):
        fail(f"keys {sorted(header)}, expected {sorted(expected['tensors'])}")
    tensors = {}
    for key, entry in header.items():
        begin, end = entry["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=DTYPES[entry["dtype"]]) if end > begin else \
            torch.empty(0, dtype=DTYPES[entry["dtype"]])
        t = t.reshape(entry["shape"])
        want = expected["tensors"][key]
        if entry["dtype"] != want["dtype"] or list(t.shape) != want["shape"]:
            fail(f"{key}: {entry['dtype']} {list(t.shape)}, expected {want['dtype']} {want['shape']}")
        got = t.to(torch.float64).flatten().tolist()
        if got != want["values"]:
            fail(f"{key}: values {got[:8]}..., expected {want['values'][:8]}...")
        tensors[key] = t
    try:
        from safetensors.torch import load_file
    except ImportError:
        print("read_checkpoint.py: Python's safetensors is not installed; checked with the hand reader alone")
    else:
        for key, t in load_file(path).items():
            if not torch.equal(t, tensors[key]):
                fail(f"{key}: safetensors' reader disagrees")
    print(f"read_checkpoint.py: {len(tensors)} tensors and {len(expected['metadata'])} metadata entries match")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
