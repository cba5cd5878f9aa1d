"""Revisions: etcd's ``{main, sub}`` pair, as row keys and as index entries.

A *main* revision is the global write counter (one per Put / DeleteRange /
Txn that changed something); *sub* numbers the changes inside one main
revision, from 0.

Row key (RocksDB), big-endian so byte order is revision order::

    | off | size | field                        |
    |   0 |    8 | main (u64 BE)                |
    |   8 |    8 | sub  (u64 BE)                |
    |  16 |  0/1 | b"t" when the row is a tombstone |

Index entry (Python int, ascending in revision order)::

    entry = (main << 33) | (sub << 1) | tombstone

so ``entry < (R + 1) << 33`` exactly when ``main <= R``.
"""
from __future__ import annotations

import struct

_ROW = struct.Struct(">QQ")
SUB_BITS = 32
TOMBSTONE_SUFFIX = b"t"


def entry(main: int, sub: int, tombstone: bool) -> int:
    return (main << 33) | (sub << 1) | int(tombstone)


def entry_main(e: int) -> int:
    return e >> 33


def entry_bound(main: int) -> int:
    """Smallest entry whose main revision is greater than ``main``."""
    return (main + 1) << 33


def row_key(e: int) -> bytes:
    """RocksDB key of the row an index entry points to."""
    key = _ROW.pack(e >> 33, (e >> 1) & 0xFFFFFFFF)
    return key + TOMBSTONE_SUFFIX if e & 1 else key


def first_row_key(main: int) -> bytes:
    """Lowest row key of main revision ``main``."""
    return _ROW.pack(main, 0)
