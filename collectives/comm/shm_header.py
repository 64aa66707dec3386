"""The shared-memory transport's header: one row of int64 slots per rank, written only by its owner.

``PROGRESS`` = call << 32 | steps published in it; ``DONE`` = calls finished; ``SIGNATURE``
(crc32 of the call's signature); ``FLAGS`` (IN shared, OUT shared, in place, cross-memory
attach) with where a shared IN and OUT lie (array id, byte offset) and their addresses; the
process id and a probe address (to try cross-memory attach); then the call's fields, one slot
each (``call_fields``), so that ranks that disagree on a call learn which field differs.
"""
import platform
import zlib

import numpy as np

from ..errors import MismatchError
from ..ops import OPS

PROGRESS, DONE, SIGNATURE, FLAGS, IN_ARRAY, IN_OFFSET, OUT_ARRAY, OUT_OFFSET, IN_ADDRESS, OUT_ADDRESS, PID, \
    PROBE_ADDRESS, CMA_OK = range(13)
CALL_FIELDS = 13  # then one slot per field of the call's signature (see call_fields)
FIELD_NAMES = ("call", "algorithm", "op", "dtype", "count", "options")
# where stores may be reordered (not x86's total store order), a store fence (the window's
# MPI_Win_sync) goes before a counter that announces them
FENCE = platform.machine().lower() not in ("x86_64", "amd64", "i686", "i386")
HEADER = 256  # bytes per rank: 19 used slots and room, keeps staging 64-byte aligned


def call_fields(signature):
    """The header's slots for a call's signature ``kind|algorithm|op|dtype|count|options``:
    the count as it is, the dtype's type character, the rest as checksums."""
    parts = (signature or "").split("|", len(FIELD_NAMES) - 1)
    parts += [""] * (len(FIELD_NAMES) - len(parts))
    slots = [zlib.crc32(part.encode()) for part in parts]
    count = FIELD_NAMES.index("count")
    slots[count] = int(parts[count]) if parts[count].isdigit() else -1
    dtype = FIELD_NAMES.index("dtype")
    try:
        slots[dtype] = ord(np.dtype(parts[dtype]).char)
    except TypeError:
        pass
    return slots


def show(field, value):
    if field == "count":
        return str(value)
    if field == "dtype" and 0 < value < 128:
        return np.dtype(chr(value)).name
    if field == "op":
        for name in OPS:
            if zlib.crc32(name.encode()) == value:
                return name
    return f"#{value:08x}"


def mismatch_error(what, rows):
    """The MismatchError naming the first field on which ``rows`` (rank -> its call fields)
    differ, with each rank's value where it can be shown; None when they agree."""
    for slot, field in enumerate(FIELD_NAMES):
        values = {rank: row[slot] for rank, row in rows.items()}
        if len(set(values.values())) > 1:
            groups = {}
            for rank, value in values.items():
                groups.setdefault(value, []).append(rank)
            detail = "; ".join(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: "
                               f"{show(field, value)}" for value, ranks in groups.items())
            return MismatchError(f"{what}: ranks disagree on {field} ({detail})")
    return None
