"""Symbolic values for the plan check: exact rank sets (bitsets) or 64-bit fingerprints."""
import numpy as np


class _Exact:
    """Each element is a bitset of the ranks it holds: ``ceil(p/64)`` words per element."""
    name = "exact"

    def __init__(self, p):
        self.p = p
        self.rows = (p + 63) // 64
        self.full = np.array([(1 << min(64, p - 64 * w)) - 1 for w in range(self.rows)], np.uint64)

    def zeros(self, n):
        return np.zeros((n, self.rows), np.uint64)

    def inputs(self, values, idx, owners):
        values[idx, owners // 64] = np.left_shift(np.uint64(1), (owners % 64).astype(np.uint64))

    @staticmethod
    def get(values, idx):
        return values[idx]

    @staticmethod
    def put(values, idx, new):
        values[idx] = new

    def combine(self, a, b):
        """(a op b, mask of the elements that would count some rank twice)."""
        return a | b, (a & b).any(axis=1)

    twice = "reduces some rank's contribution twice"

    @staticmethod
    def fold(acc, more):
        """acc op more[0] op more[1] ...: (result, mask of elements counting a rank twice)."""
        bits = np.bitwise_count(acc).sum(axis=-1, dtype=np.int64) + \
            np.bitwise_count(more).sum(axis=(0, 2), dtype=np.int64)
        result = acc | np.bitwise_or.reduce(more, axis=0)
        return result, np.bitwise_count(result).sum(axis=-1, dtype=np.int64) != bits

    def complete(self, values):
        return (values == self.full).all(axis=1)


class _Fingerprint:
    """Each element is the sum (mod 2^64) of the random odd 64-bit weights of the ranks it
    holds: it equals the sum of all weights, with the rank multiset wrong, with probability
    about 2^-64 (2^-63 for a rank counted three times)."""
    name = "fingerprint"
    twice = None

    def __init__(self, p):
        rng = np.random.default_rng(12345)
        self.weights = rng.integers(1, 2 ** 63, p, dtype=np.int64).astype(np.uint64) | np.uint64(1)
        self.total = np.uint64(int(self.weights.astype(object).sum()) % (1 << 64))
        self.p = p

    @staticmethod
    def zeros(n):
        return np.zeros(n, np.uint64)

    def inputs(self, values, idx, owners):
        values[idx] = self.weights[owners]

    @staticmethod
    def get(values, idx):
        return values.take(idx)

    @staticmethod
    def put(values, idx, new):
        np.put(values, idx, new)

    @staticmethod
    def combine(a, b):
        return a + b, None

    @staticmethod
    def fold(acc, more):
        return acc + more.sum(axis=0, dtype=np.uint64), None

    def complete(self, values):
        return values == self.total


_ENGINES = {"exact": _Exact, "fingerprint": _Fingerprint}


def _expand(starts, lens, dtype=np.int64):
    """The element indices of the regions ``starts[i] : starts[i] + lens[i]``, concatenated."""
    if len(starts) == 0:
        return np.zeros(0, dtype)
    starts = starts.astype(dtype, copy=False)
    width = int(lens[0])
    if (lens == width).all():
        if width == 1:
            return starts
        return (starts[:, None] + np.arange(width, dtype=dtype)).ravel()
    total = int(lens.sum())
    shift = (np.cumsum(lens) - lens).astype(dtype, copy=False)
    return np.repeat(starts - shift, lens) + np.arange(total, dtype=dtype)
