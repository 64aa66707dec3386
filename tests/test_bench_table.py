"""The main job's table (benchmarks/allreduce_perf.py) holds every row's label whole: auto's
label names what it ran (one pair, or one out of place and one in place), never cut."""
import itertools

import collectives
from benchmarks import allreduce_perf


def test_auto_label_fits_the_algorithm_column_whatever_it_ran():
    names = collectives.algorithm_names()
    rows = ["native", "auto"] + names
    widths = allreduce_perf.table_widths(rows, names)
    for a, b in itertools.product(names, repeat=2):
        label = f"auto({a}@mpi/{b}@shm)"
        cell = allreduce_perf.fmt_row([label], widths[allreduce_perf.LABEL:])
        assert label in cell and cell.startswith(" "), label  # whole, and apart from the column before


def test_every_row_label_fits_with_the_transport_the_library_chose():
    names = collectives.algorithm_names()
    rows = ["native", "auto"] + [f"{n}@shm" for n in names] + names
    width = allreduce_perf.label_width(rows, names)
    assert all(len(f"{n}@mpi") < width for n in names)
    assert width > len("auto(double_binary_tree@mpi/recursive_doubling@shm)")
