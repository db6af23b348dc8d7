"""Fuzz targets for the weight-file readers (GGUF, safetensors), shared by tests/test_headers_fuzz.py (seconds, in
`make test`) and bench/fuzz_headers.py (longer): small valid files, the public crash shapes, hypothesis strategies
that damage the valid files, and the property every input must hold — it ends in a load or in one SkillgraftError
line, never another exception (a traceback) or a hang."""

from __future__ import annotations

import struct
from pathlib import Path

from hypothesis import strategies as st

# values a hostile header puts in a length, count or offset field
HUGE = [0, 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def small_gguf(path: Path) -> bytes:
    """A small valid GGUF: a few metadata values of each kind (a string array as a vocabulary) and three tensors."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("fuzz")
    writer.add_uint32("fuzz.count", 7)
    writer.add_float32("fuzz.eps", 1e-5)
    writer.add_bool("fuzz.flag", True)
    writer.add_array("fuzz.ints", [1, 2, 3])
    writer.add_token_list(["<s>", "</s>", "a", "b"])
    writer.add_tensor("a.weight", np.arange(8, dtype=np.float32).reshape(2, 4))
    writer.add_tensor("b.weight", np.ones((32,), dtype=np.float16))
    writer.add_tensor("c.weight", np.zeros((3,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def small_safetensors() -> bytes:
    import torch
    from safetensors.torch import save

    return save({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16),
                 "c": torch.zeros(0)}, metadata={"format": "pt"})


def _kv_array_bomb() -> bytes:
    """The 49-byte GGUF of issue 77: one metadata array claiming 2⁶³ elements (gguf-py 0.19.0 loops over it)."""
    key = b"a"
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    data += struct.pack("<IIQ", 9, 0, 2**63)
    return data + b"\0" * (49 - len(data))


BOMB_49 = _kv_array_bomb()


def gguf_crash_shapes(valid: bytes) -> dict[str, bytes]:
    """The public crash shapes of GGUF readers, made from ``valid``: huge counts and lengths, exabyte tensors,
    offsets past the end or onto another tensor, bad alignment, truncated headers."""
    head = b"GGUF" + struct.pack("<I", 3)
    string = lambda s: struct.pack("<Q", len(s)) + s  # noqa: E731
    shapes = {
        "kv-array-2^63": BOMB_49,
        "kv-count-2^63": head + struct.pack("<QQ", 0, 2**63),
        "tensor-count-2^64-1": head + struct.pack("<QQ", 2**64 - 1, 0),
        "key-length-2^64-1": head + struct.pack("<QQ", 0, 1) + struct.pack("<Q", 2**64 - 1) + b"k",
        "string-value-1-tib": head + struct.pack("<QQ", 0, 1) + string(b"k") + struct.pack("<IQ", 8, 2**40),
        "string-array-2^40": head + struct.pack("<QQ", 0, 1) + string(b"k") + struct.pack("<IIQ", 9, 8, 2**40),
        "nested-arrays": head + struct.pack("<QQ", 0, 1) + string(b"k") + struct.pack("<II", 9, 9)
        + struct.pack("<Q", 1) + (struct.pack("<IQ", 9, 1)) * 8 + struct.pack("<IQ", 0, 1) + b"\0",
        "dims-2^32-1": head + struct.pack("<QQ", 1, 0) + string(b"t") + struct.pack("<I", 2**32 - 1),
        "exabyte-tensor": head + struct.pack("<QQ", 1, 0) + string(b"t") + struct.pack("<I", 4)
        + struct.pack("<QQQQ", 2**20, 2**20, 2**20, 2**20) + struct.pack("<IQ", 0, 0),
        "offset-2^63": head + struct.pack("<QQ", 1, 0) + string(b"t") + struct.pack("<IQ", 1, 4)
        + struct.pack("<IQ", 0, 2**63),
        "two-tensors-one-offset": head + struct.pack("<QQ", 2, 0)
        + b"".join(string(n) + struct.pack("<IQ", 1, 8) + struct.pack("<IQ", 0, 0) for n in (b"x", b"y")) + bytes(64),
        "unknown-type": head + struct.pack("<QQ", 1, 0) + string(b"t") + struct.pack("<IQ", 1, 4)
        + struct.pack("<IQ", 99, 0) + bytes(64),
        "alignment-0": head + struct.pack("<QQ", 0, 1) + string(b"general.alignment") + struct.pack("<II", 4, 0),
        "version-1": b"GGUF" + struct.pack("<I", 1) + bytes(16),
        "empty": b"",
        "magic-only": b"GGUF",
    }
    for cut in (8, 23, 24, 40, len(valid) // 3, len(valid) - 1):
        shapes[f"truncated-at-{cut}"] = valid[:cut]
    return shapes


def safetensors_crash_shapes(valid: bytes) -> dict[str, bytes]:
    """The public crash shapes of safetensors readers: huge header lengths, exabyte shapes, overlapping or
    outside offsets, JSON that is no header, runaway nesting, truncation."""
    import json

    n = struct.unpack("<Q", valid[:8])[0]
    header, data = json.loads(valid[8:8 + n]), valid[8 + n:]

    def with_header(h, body=data) -> bytes:
        text = json.dumps(h).encode()
        return struct.pack("<Q", len(text)) + text + body

    def changed(name, **fields):
        return with_header({**header, name: {**header[name], **fields}})

    return {
        "header-length-2^64-1": struct.pack("<Q", 2**64 - 1) + valid[8:],
        "header-claims-1-tib": struct.pack("<Q", 2**40) + valid[8:],
        "header-past-end": struct.pack("<Q", len(valid)) + valid[8:],
        "not-json": struct.pack("<Q", 4) + b"\xff\xfe{[" + data,
        "a-list": with_header([1, 2]),
        "nested-100000": struct.pack("<Q", 200_000) + b"[" * 100_000 + b"]" * 100_000,
        "exabyte-shape": changed("a", shape=[2**31, 2**31, 2**31]),
        "shape-of-text": changed("a", shape=["2", "3"]),
        "dims-9": changed("a", shape=[1] * 9),
        "offsets-overlap": changed("b", data_offsets=header["a"]["data_offsets"]),
        "offsets-past-end": changed("a", data_offsets=[0, 2**63]),
        "offsets-negative": changed("a", data_offsets=[-24, 0]),
        "unknown-dtype": changed("a", dtype="F128"),
        "metadata-a-number": with_header({**header, "__metadata__": 5}),
        "empty": b"",
        "truncated-at-7": valid[:7],
        "truncated-header": valid[:8 + n // 2],
        "truncated-data": valid[:-3],
    }


@st.composite
def damaged(draw, valid: bytes):
    """``valid`` damaged as a hostile or unlucky writer would: fields overwritten with huge values, bytes flipped,
    spans repeated or cut, the file truncated."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["u64", "u32", "byte", "truncate", "repeat", "delete"]))
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        if how == "u64":
            data[at:at + 8] = struct.pack("<Q", draw(st.sampled_from(HUGE) | st.integers(0, 2**64 - 1)))
        elif how == "u32":
            data[at:at + 4] = struct.pack("<I", draw(st.integers(0, 2**32 - 1)))
        elif how == "byte":
            data[at] = draw(st.integers(0, 255))
        elif how == "truncate":
            del data[at:]
        elif how == "repeat":
            end = min(len(data), at + draw(st.integers(1, 64)))
            data[at:at] = data[at:end]
        else:
            del data[at:at + draw(st.integers(1, 16))]
    return bytes(data)


def gguf_target(path: Path) -> None:
    """skillgraft's GGUF reading path: the header walk, then gguf-py's reader and its tensors."""
    from skillgraft.models.gguf import open_reader

    reader = open_reader(path)
    for t in reader.tensors:
        assert t.data_offset + t.n_bytes <= path.stat().st_size


def safetensors_target(folder: Path) -> None:
    """skillgraft's safetensors reading path for a checkpoint folder (the header walk, then safetensors)."""
    from skillgraft.models.vet import check_weight_files

    check_weight_files(folder)
