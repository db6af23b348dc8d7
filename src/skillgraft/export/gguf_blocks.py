"""Grafted coordinates written inside a GGUF tensor's own quantized blocks (``--to gguf``, issue 80).

A block-quantized tensor (Q4_K, Q6_K, Q5_0, Q8_0, …) stores per block of 32 or 256 values some scales and one small
integer per value. Changing only the integer of a grafted coordinate changes that value alone: every untouched
block keeps the base file's bytes and every untouched value of a touched block reads back bit for bit as before. What
a grafted coordinate can then take is one of its block's levels (``d·sc·q − dmin·m`` for the q its bits allow).

Which bits of a block hold which value is read off the type's own dequantizer (gguf-py's, the one transformers
reads GGUF files with), not from a table: each bit of a few of the tensor's real blocks is flipped in turn and the
values that change are seen. A bit that only ever changes one value is that value's; a bit that changes several
(a scale, a minimum) is left alone. The result of every edit is checked by dequantizing the edited blocks again.
"""

from __future__ import annotations

import functools


def _blocks(data, qtype):
    """The tensor's raw bytes as ``[blocks, bytes per block]`` (uint8), and the values per block."""
    import gguf  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    per_block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    return np.ascontiguousarray(data).view(np.uint8).reshape(-1, nbytes), per_block


def _dequant(blocks, qtype):
    import gguf  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    return gguf.quants.dequantize(blocks, qtype).astype(np.float32).reshape(len(blocks), -1)


@functools.lru_cache(maxsize=16)
def _bits_cached(qtype, probe: bytes, nbytes: int):
    import numpy as np  # noqa: PLC0415

    p = np.frombuffer(probe, dtype=np.uint8).reshape(-1, nbytes)
    with np.errstate(all="ignore"):  # a flipped scale bit may read as inf or NaN
        return _own_bits(p, qtype, nbytes)


def _own_bits(p, qtype, nbytes: int):
    import numpy as np  # noqa: PLC0415

    base = _dequant(p, qtype).view(np.uint32)
    nbits = nbytes * 8
    flipped = np.repeat(p[None], nbits, axis=0)  # [bit, probe block, byte]
    bit = np.arange(nbits)
    flipped[bit, :, bit // 8] ^= (1 << (bit % 8)).astype(np.uint8)[:, None]
    values = _dequant(flipped.reshape(-1, nbytes), qtype).view(np.uint32).reshape(nbits, len(p), -1)
    changed = values != base[None]
    counts = changed.sum(axis=2)  # [bit, probe block]
    where = changed.argmax(axis=2)
    own = {}
    for b in range(nbits):
        one = counts[b] == 1
        if not one.any() or (counts[b] > 1).any() or len(set(where[b][one].tolist())) != 1:
            continue
        own.setdefault(int(where[b][one][0]), []).append(b)
    per_block = base.shape[1]
    return tuple(tuple(own.get(i, ())) for i in range(per_block))


def value_bits(data, qtype, probes: int = 16) -> tuple[tuple[int, ...], ...]:
    """For each position in a block, the bit offsets (in the block's bytes) that set that value alone, found on
    ``probes`` of the tensor's own blocks spread over it (cached per type and probe)."""
    import numpy as np  # noqa: PLC0415

    blocks, _ = _blocks(data, qtype)
    pick = np.unique(np.linspace(0, len(blocks) - 1, min(probes, len(blocks))).astype(int))
    return _bits_cached(qtype, blocks[pick].tobytes(), blocks.shape[1])


def _set(blocks, rows, bits, level):
    """Set, in ``blocks[rows]``, the bit offsets ``bits`` ([n, k], −1 unused) to the binary digits of ``level``."""
    import numpy as np  # noqa: PLC0415

    level = np.broadcast_to(np.asarray(level), (len(rows),))
    for s in range(bits.shape[1]):
        use = bits[:, s] >= 0
        r, b = rows[use], bits[use, s]
        mask = (1 << (b % 8)).astype(np.uint8)
        on = ((level[use] >> s) & 1).astype(bool)
        # unbuffered: two values may share a byte (Q4's nibbles), each bit set in turn
        np.bitwise_and.at(blocks, (r, b // 8), ~mask)
        np.bitwise_or.at(blocks, (r[on], b[on] // 8), mask[on])


def rerounded(data, qtype, flat, target):
    """The tensor's bytes with each grafted coordinate (flat positions ``flat`` in its values, wanted values
    ``target``, float32) set to the level of its own block nearest to it; every other value unchanged bit for bit.
    Returns ``(bytes shaped as data, the values the coordinates read back as)``, or ``None`` when the type keeps no
    per-value bits (codebook types) or the edit does not read back as planned."""
    import numpy as np  # noqa: PLC0415

    blocks, per_block = _blocks(data, qtype)
    own = value_bits(data, qtype)
    k = max((len(b) for b in own), default=0)
    if k == 0 or k > 8:
        return None
    table = np.full((per_block, k), -1, dtype=np.int64)
    for i, b in enumerate(own):
        table[i, :len(b)] = b
    flat = np.asarray(flat, dtype=np.int64)
    target = np.asarray(target, dtype=np.float32)
    touched, row = np.unique(flat // per_block, return_inverse=True)
    pos = flat % per_block
    bits = table[pos]
    if (bits[:, 0] < 0).any():  # a grafted value whose bits were not found
        return None
    sub = blocks[touched].copy()
    before = _dequant(sub, qtype)
    best_value = before[row, pos]
    best_err = np.abs(best_value - target)
    best_level = np.full(len(flat), -1, dtype=np.int64)  # −1: the base's own level (kept on ties)
    for level in range(1 << k):
        trial = sub.copy()
        _set(trial, row, bits, level)
        v = _dequant(trial, qtype)[row, pos]
        better = np.abs(v - target) < best_err
        best_err = np.where(better, np.abs(v - target), best_err)
        best_value = np.where(better, v, best_value)
        best_level = np.where(better, level, best_level)
    change = best_level >= 0
    _set(sub, row[change], bits[change], best_level[change])
    after = _dequant(sub, qtype)
    hit = np.zeros_like(after, dtype=bool)
    hit[row, pos] = True
    same = after.view(np.uint32) == before.view(np.uint32)
    if not same[~hit].all() or not np.array_equal(after[row, pos].view(np.uint32), best_value.view(np.uint32)):
        return None
    out = blocks.copy()
    out[touched] = sub
    return out.reshape(np.asarray(data).shape), best_value
