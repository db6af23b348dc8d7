"""Weight-file headers walked and bounded by skillgraft before a reader sees the file (docs/reliability.md §19).

A GGUF or safetensors header is a list of lengths, counts and offsets that the file's writer chose. The pinned
readers trust them: gguf-py 0.19.0 loops over a metadata array as long as its header claims (2⁶³ elements in a
49-byte file: a hang, allocating as it goes), and a safetensors header may claim an exabyte tensor. So every length,
count and offset is checked here first, against the file's size and the caps huggingface.js adopted
(:data:`ARRAY_MAX` elements per array, :data:`KV_MAX` metadata pairs, :data:`TENSORS_MAX` tensors, strings of at most
:data:`STRING_MAX` bytes, at most :data:`DIMS_MAX` dimensions); anything else is one error naming the file, in
milliseconds (a walk over the header only; the data is never read). Fuzzed by ``tests/test_headers_fuzz.py``
(seconds) and ``bench/fuzz_headers.py`` (longer).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

from skillgraft.errors import SkillgraftError

ARRAY_MAX = 1_000_000  # elements of one GGUF metadata array (a 262k-token vocabulary is the largest in use)
KV_MAX = 100_000  # GGUF metadata pairs
TENSORS_MAX = 10_000_000  # tensors of one file
STRING_MAX = 10 * 1024 * 1024  # bytes of one string (a key, a value, a tensor name)
DIMS_MAX = 8  # dimensions of one tensor (GGML uses 4)
NESTING_MAX = 4  # GGUF arrays of arrays
SAFETENSORS_HEADER_MAX = 100_000_000  # bytes of a safetensors JSON header (safetensors' own limit)

# GGUF metadata value types → fixed sizes (8: string, 9: array)
_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_GGUF_VERSIONS = (2, 3)  # what gguf-py 0.19.0 reads
# safetensors dtypes → bits per element
_SAFETENSORS_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
                     "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
                     "C64": 64, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


class _Damaged(Exception):
    """What is wrong with a header (turned into the file's one line by the caller)."""


class _Truncated(_Damaged):
    """A tensor's data past the file's end."""


class _Overlap(_Damaged):
    """Two tensors' data on the same bytes."""


class _UnknownType(_Damaged):
    """A tensor type the pinned gguf does not know."""


class _Cursor:
    """Reads a header front to back; every read is bounded by the file's end."""

    def __init__(self, data, order: str):
        self.data, self.order, self.at = data, order, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise _Damaged(f"{what} at byte {self.at:,} runs past the end of the {len(self.data):,}-byte file")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def u32(self, what: str) -> int:
        return struct.unpack(self.order + "I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack(self.order + "Q", self.take(8, what))[0]

    def skip(self, n: int, what: str) -> None:
        if self.at + n > len(self.data):
            raise _Damaged(f"{what} at byte {self.at:,} claims {n:,} bytes; the file has {len(self.data) - self.at:,} "
                           "left")
        self.at += n

    def string(self, what: str, decode: bool = False) -> str | None:
        n = self.u64(f"{what}'s length")
        if n > STRING_MAX:
            raise _Damaged(f"{what} at byte {self.at - 8:,} claims {n:,} bytes (at most {STRING_MAX:,})")
        raw = self.take(n, what)
        if not decode:
            return None
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise _Damaged(f"{what} at byte {self.at - n:,} is not UTF-8 text") from None


def _value(cur: _Cursor, kind: int, what: str, depth: int = 0) -> int | None:
    """Walk one GGUF metadata value of type ``kind``; a UINT32's value is returned (general.alignment)."""
    if kind in _GGUF_SCALARS:
        if kind == _UINT32:
            return cur.u32(what)
        cur.skip(_GGUF_SCALARS[kind], what)
        return None
    if kind == _STRING:
        cur.string(what)
        return None
    if kind != _ARRAY:
        raise _Damaged(f"{what} has an unknown value type {kind}")
    if depth >= NESTING_MAX:
        raise _Damaged(f"{what} nests arrays more than {NESTING_MAX} deep")
    item = cur.u32(f"{what}'s item type")
    count = cur.u64(f"{what}'s length")
    if count > ARRAY_MAX:
        raise _Damaged(f"{what} claims {count:,} elements (at most {ARRAY_MAX:,})")
    if item in _GGUF_SCALARS:
        cur.skip(count * _GGUF_SCALARS[item], f"{what} ({count:,} elements)")
        return None
    smallest = 8 if item in (_STRING, _ARRAY) else 1
    if count * smallest > len(cur.data) - cur.at:
        raise _Damaged(f"{what} claims {count:,} elements; the file has {len(cur.data) - cur.at:,} bytes left")
    for i in range(count):
        _value(cur, item, f"{what}[{i}]", depth + 1)
    return None


def walk_gguf(data) -> list[tuple[str, int, int]]:
    """Walk a GGUF file's bytes (or a memory map of them); its tensors as (name, first byte, bytes), bounded by the
    file's size, sorted and disjoint. :class:`_Damaged` says what is wrong."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: PLC0415

    size = len(data)
    if size < 4 or bytes(data[:4]) != b"GGUF":
        raise _Damaged(f"not a GGUF file (it starts with {bytes(data[:4])!r})")
    cur = _Cursor(data, "<")
    cur.at = 4
    version = cur.u32("the version")
    if version & 0xFFFF == 0 and version:  # written on a machine of the other byte order
        cur.order = ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in _GGUF_VERSIONS:
        raise _Damaged(f"GGUF version {version} (readable: {', '.join(map(str, _GGUF_VERSIONS))})")
    tensors, pairs = cur.u64("the tensor count"), cur.u64("the metadata count")
    if pairs > KV_MAX:
        raise _Damaged(f"the header claims {pairs:,} metadata pairs (at most {KV_MAX:,})")
    if tensors > TENSORS_MAX:
        raise _Damaged(f"the header claims {tensors:,} tensors (at most {TENSORS_MAX:,})")
    if pairs * 13 + tensors * 24 > size - cur.at:  # the smallest pair and tensor record
        raise _Damaged(f"the header claims {pairs:,} metadata pairs and {tensors:,} tensors; the file has "
                       f"{size - cur.at:,} bytes left")
    alignment, keys = 32, set()
    for i in range(pairs):
        key = cur.string(f"metadata key {i}", decode=True)
        if key in keys:
            raise _Damaged(f"metadata key {key!r} is given twice")
        keys.add(key)
        kind = cur.u32(f"the type of {key!r}")
        value = _value(cur, kind, f"metadata {key!r}")
        if key == "general.alignment":
            if kind != _UINT32 or not value or value & (value - 1) or value > 1 << 20:
                raise _Damaged(f"general.alignment must be a power of two up to 2^20 stored as UINT32 (got type "
                               f"{kind}, {value})")
            alignment = value
    infos, names = [], set()
    for i in range(tensors):
        name = cur.string(f"tensor {i}'s name", decode=True)
        if name in names:
            raise _Damaged(f"tensor {name!r} is named twice")
        names.add(name)
        n_dims = cur.u32(f"tensor {name!r}'s dimension count")
        if n_dims > DIMS_MAX:
            raise _Damaged(f"tensor {name!r} claims {n_dims:,} dimensions (at most {DIMS_MAX})")
        dims = [cur.u64(f"tensor {name!r}'s shape") for _ in range(n_dims)]
        kind = cur.u32(f"tensor {name!r}'s type")
        offset = cur.u64(f"tensor {name!r}'s offset")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise _UnknownType(f"a tensor of unknown quantization type (id {kind}: tensor {name!r})") from None
        elements = 1
        for d in dims:
            elements *= d
        if dims and dims[0] % block:
            raise _Damaged(f"tensor {name!r}'s rows ({dims[0]:,}) are not whole blocks of {block} "
                           f"({GGMLQuantizationType(kind).name})")
        infos.append((name, offset, elements * type_size // block))
    start = cur.at + (-cur.at % alignment)
    out = []
    for name, offset, n_bytes in infos:
        if start + offset + n_bytes > size:
            raise _Truncated(f"tensor {name!r} ends at byte {start + offset + n_bytes:,} of a {size:,}-byte file")
        out.append((name, start + offset, n_bytes))
    ordered = sorted((t for t in out if t[2]), key=lambda t: t[1])
    for before, after in zip(ordered, ordered[1:]):
        if after[1] < before[1] + before[2]:
            raise _Overlap(f"the data of tensor {after[0]!r} (from byte {after[1]:,}) overlaps that of {before[0]!r} "
                           f"(bytes {before[1]:,}–{before[1] + before[2]:,}); each tensor needs its own bytes")
    return out


def _mapped(path: Path):
    """The file's bytes, memory-mapped (b'' for an empty file); a FIFO or a device is refused, never opened (open()
    would block on a FIFO, a device has no size to bound a header by)."""
    import stat  # noqa: PLC0415

    if not stat.S_ISREG(os.stat(path).st_mode):
        raise SkillgraftError(f"{path}: not a regular file (a device, socket or pipe); expected a weight file")
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


_WALKED: dict[tuple, list] = {}  # a GGUF file's walked tensors by its identity (device, inode, size, mtime)


def check_gguf(path: str | os.PathLike) -> list[tuple[str, int, int]]:
    """Refuse a GGUF file whose header is not bounded by its size and the caps, before gguf-py reads it; its
    tensors as :func:`walk_gguf` gives them. A file walked before and unchanged since (the command line walks a
    verb's inputs before torch is imported, the loader again) is not walked twice."""
    path = Path(path)
    st = path.stat()
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if identity in _WALKED:
        return list(_WALKED[identity])
    data = _mapped(path)
    try:
        _WALKED[identity] = walk_gguf(data)
        return list(_WALKED[identity])
    except _Truncated as e:
        raise SkillgraftError(f"{path}: truncated GGUF file: {e}") from None
    except _Overlap as e:
        raise SkillgraftError(f"{path}: damaged GGUF file: {e}") from None
    except _UnknownType as e:
        from importlib.metadata import version  # noqa: PLC0415

        raise SkillgraftError(f"{path}: {e}: gguf {version('gguf')} does not know it, so it can be neither read nor "
                              "copied") from None
    except _Damaged as e:
        if str(e).startswith("not a GGUF file"):
            raise SkillgraftError(f"{path}: {e}") from None
        raise SkillgraftError(f"{path}: unreadable GGUF file, truncated or damaged ({e}); refused before it is "
                              "read") from None
    finally:
        if isinstance(data, mmap.mmap):
            data.close()


def walk_safetensors(data) -> dict:
    """Check a safetensors file's bytes: its header's length, JSON, each tensor's dtype, shape and data offsets
    (inside the data, agreeing with the shape, not overlapping). Its header as a dict; :class:`_Damaged` says what
    is wrong."""
    from skillgraft.untrusted import TOO_DEEP, unique_keys  # noqa: PLC0415

    size = len(data)
    if size < 8:
        raise _Damaged(f"{size} bytes: shorter than the header's length field")
    n = struct.unpack("<Q", data[:8])[0]
    if n > SAFETENSORS_HEADER_MAX:
        raise _Damaged(f"header too large: it claims {n:,} bytes (at most {SAFETENSORS_HEADER_MAX:,})")
    if n > size - 8:
        raise _Damaged(f"the header claims {n:,} bytes; the file has {size - 8:,} after its length")
    try:
        header = json.loads(bytes(data[8:8 + n]).decode("utf-8"), object_pairs_hook=unique_keys)
    except RecursionError:
        raise _Damaged(f"its header's {TOO_DEEP}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise _Damaged(f"its header is not JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not isinstance(header, dict):
        raise _Damaged(f"its header is a JSON {type(header).__name__}, not an object")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _Damaged("its header's '__metadata__' is not an object of text values")
    if len(header) > TENSORS_MAX:
        raise _Damaged(f"its header names {len(header):,} tensors (at most {TENSORS_MAX:,})")
    room, spans = size - 8 - n, []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict) or set(t) != {"dtype", "shape", "data_offsets"}:
            raise _Damaged(f"tensor {name!r}: expected dtype, shape and data_offsets, got {t!r}"[:300])
        bits = _SAFETENSORS_BITS.get(t["dtype"]) if isinstance(t["dtype"], str) else None
        shape, offsets = t["shape"], t["data_offsets"]
        if bits is None:
            raise _Damaged(f"tensor {name!r}: unknown dtype {t['dtype']!r}"[:300])
        if not isinstance(shape, list) or len(shape) > DIMS_MAX or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise _Damaged(f"tensor {name!r}: shape {shape!r} is not a list of at most {DIMS_MAX} sizes"[:300])
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(
                isinstance(o, int) and not isinstance(o, bool) for o in offsets) or not 0 <= offsets[0] <= offsets[1]:
            raise _Damaged(f"tensor {name!r}: data_offsets {offsets!r} are not [begin, end]"[:300])
        if offsets[1] > room:
            raise _Damaged(f"tensor {name!r}'s data ends at byte {offsets[1]:,} of the {room:,} bytes of data")
        elements = 1
        for d in shape:
            elements *= d
        if elements * bits != (offsets[1] - offsets[0]) * 8:
            raise _Damaged(f"tensor {name!r}: shape {shape} of {t['dtype']} needs {elements * bits / 8:,.0f} bytes, "
                           f"its data_offsets hold {offsets[1] - offsets[0]:,}")
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (b0, e0, a), (b1, _, b) in zip(spans, spans[1:]):
        if b1 < e0:
            raise _Damaged(f"the data of tensor {b!r} (from byte {b1:,}) overlaps that of {a!r} (bytes {b0:,}–{e0:,})")
    return header


def check_safetensors(path: str | os.PathLike, who: str | None = None) -> dict:
    """Refuse a safetensors file whose header is not bounded by its size and the caps, before safetensors reads it
    (one line naming the file and, with ``who``, its role); its header."""
    path = Path(path)
    data = _mapped(path)
    try:
        return walk_safetensors(data)
    except _Damaged as e:
        role = f"{who} " if who else ""
        raise SkillgraftError(f"{role}{path}: not a readable safetensors file ({e}); truncated or corrupted") from None
    finally:
        if isinstance(data, mmap.mmap):
            data.close()
