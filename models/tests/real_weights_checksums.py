"""Bit checksums of the dequantised real weights, computed with llama.cpp's own
Python reader (gguf-py, `pip install gguf==0.19.0 numpy`), independent of the
Rust dequantiser. For each file, over every tensor in file order, with `bits`
the little-endian u32 pattern of each f32 value and `i` its 0-based position in
the concatenation of all tensors:

    plain    = sum(bits)            mod 2**64
    weighted = sum(bits * (i + 1))  mod 2**64

Run from the workspace root after `cargo xtask fetch-models`:
    python3 models/tests/real_weights_checksums.py
and paste the printed values into models/tests/integration/real_weights.rs.
Output on 2026-11-22 (gguf 0.19.0, numpy as installed):
    smollm2: values=134515008 plain=0x03ec200aca7218c0 weighted=0xbbed993955da7580
    gemma3: values=268098176 plain=0x07ae17e11e89f304 weighted=0x04a50de6d2949f12
"""
import sys
import numpy as np
import gguf
from gguf.quants import dequantize

MASK = (1 << 64) - 1
for name in sys.argv[1:] or ["smollm2", "gemma3"]:
    reader = gguf.GGUFReader(f"models-cache/{name}.gguf")
    plain = weighted = 0
    position = 0
    for t in reader.tensors:
        values = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
        assert values.size == int(np.prod(t.shape)), t.name
        bits = values.view(np.uint32).astype(np.uint64)
        idx = np.arange(position + 1, position + 1 + bits.size, dtype=np.uint64)
        plain = (plain + int(bits.sum(dtype=np.uint64))) & MASK
        weighted = (weighted + int((bits * idx).sum(dtype=np.uint64))) & MASK
        position += bits.size
    print(f"{name}: values={position} plain=0x{plain:016x} weighted=0x{weighted:016x}")
