"""2-D torus all-reduce: rings along the rows, then along the columns, then the rows again.

Idea: arrange the n ranks as a grid of ``rows`` x ``cols`` (rank = row * cols + col). A ring
reduce-scatter along each row leaves rank (r, c) with chunk c of the buffer reduced over its
row; a ring all-reduce along each column (reduce-scatter then all-gather of chunk c, in
``rows`` pieces) completes chunk c over the whole grid; a ring all-gather along each row
hands every rank every chunk. Every element is reduced at one rank and copied to the others,
so all ranks end bitwise identical. With nodes of ``cols`` ranks, the row rings stay inside a
node and only the column rings cross the network, with 1/cols of the data.

Steps: 2(cols-1) + 2(rows-1). Bytes sent per rank: 2(n-1)/n N (as the ring).
Cost: 2(rows + cols - 2) alpha + 2(n-1)/n N beta + (n-1)/n N gamma.
Limits: ``rows`` must divide n; the default is the largest divisor of n not above sqrt(n),
so a prime n is one row (the plain ring). Scratch: one chunk of the row ring.
Reference: Mikami et al., "Massively distributed SGD: ImageNet/ResNet-50 training in a
flash" (2-D torus all-reduce), arXiv:1811.05233, 2018.

Written only with the public API (``collectives.phases`` are the library's ring phases).
"""
import math
import sys

import collectives
from collectives import phases
from collectives.plan import IN, OUT, PlanBuilder, block_bounds

NAME = "torus"


def _rows(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"option rows must be a positive integer or None, got {value!r}")
    return value


OPTIONS = {"rows": collectives.Option(default=None, check=_rows,
                                      doc="grid rows (must divide the world size; None: near-square)")}


def grid(size, rows=None):
    """(rows, cols) of the grid for ``size`` ranks."""
    if rows is None:
        rows = max(d for d in range(1, math.isqrt(size) + 1) if size % d == 0)
    if size % rows:
        raise ValueError(f"torus: rows={rows} does not divide {size} ranks")
    return rows, size // rows


def check(options, size):
    grid(size, options["rows"])


def build(rank, size, count, itemsize=1, rows=None):
    b = PlanBuilder(NAME, rank, size, count)
    nrows, ncols = grid(size, rows)
    r, c = divmod(rank, ncols)
    row = range(r * ncols, (r + 1) * ncols)
    column = range(c, size, ncols)
    chunks = block_bounds(count, ncols)  # chunk c of the buffer belongs to column c
    lo, hi = chunks[c], chunks[c + 1]
    pieces = [lo + x for x in block_bounds(hi - lo, nrows)]  # chunk c in nrows pieces
    phases.ring_reduce_scatter(b, row, chunks, src=IN, final=False)
    phases.ring_reduce_scatter(b, column, pieces, src=OUT, final=True)
    phases.ring_allgather(b, column, pieces)
    phases.ring_allgather(b, row, chunks)
    return b.build()


def cost(p, nbytes, alpha, beta, gamma, rows=None):
    if p == 1:
        return 0.0
    nrows, ncols = grid(p, rows if rows is not None and p % rows == 0 else None)
    return (2 * (nrows + ncols - 2) * alpha + 2 * (p - 1) / p * nbytes * beta
            + (p - 1) / p * nbytes * gamma)


collectives.register_algorithm(sys.modules[__name__])
