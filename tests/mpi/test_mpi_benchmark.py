"""The Quick start's main job, benchmarks/allreduce_perf.py, on a tiny sweep under mpiexec: every
algorithm and native in the table, no wrong elements, the JSON and plot written."""
import json
import os

import numpy as np
import pytest

pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
from benchmarks import allreduce_perf  # noqa: E402

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD


@pytest.mark.timeout(300)
def test_sweep_prints_every_algorithm_against_native_and_writes_json(tmp_path_factory, capsys):
    folder = WORLD.bcast(str(tmp_path_factory.mktemp("bench")) if WORLD.rank == 0 else None)
    out = os.path.join(folder, "sweep.json")
    plot = os.path.join(folder, "sweep.png")
    argv = ["-b", "8", "-e", "64K", "-f", "32", "-n", "2", "-w", "1", "-a", "all", "-c", "1", "-d", "int32",
            "--json", out, "--plot", plot]
    allreduce_perf.main(argv)
    text = capsys.readouterr().out
    WORLD.Barrier()
    ok, why = True, ""
    if WORLD.rank == 0:
        with open(out) as fh:
            saved = json.load(fh)
        records = saved["records"]
        memory = [line for line in text.splitlines() if line.startswith("# Peak memory per rank")]
        sizes = sorted({r["size"] for r in records})
        floors = {"floor:zero-copy", "floor:one-copy"}  # printed beside the rows, always at n=2
        names = {r["algorithm"] for r in records} - (floors if WORLD.size == 2 else set())
        expected = set(collectives.algorithm_names()) | {"native", "auto"}
        if WORLD.size == 2 and not floors <= {r["algorithm"] for r in records}:
            ok, why = False, "no memory floors at n=2"
        if not ok:
            pass
        elif sizes != [8, 256, 8192]:
            ok, why = False, f"sizes {sizes}"
        elif names != expected:
            ok, why = False, f"algorithms {sorted(names)} != {sorted(expected)}"
        elif any(r["oop"]["wrong"] or r["ip"]["wrong"] for r in records):
            ok, why = False, "wrong elements reported"
        elif not all(np.isfinite(r["oop"]["vs_native"]) and r["oop"]["time_us"] > 0 for r in records):
            ok, why = False, "missing times or ratios"
        elif "Avg bus bandwidth" not in text or "Out of bounds values : 0 OK" not in text:
            ok, why = False, "closing lines missing"
        elif len(memory) != 1 or "library memory per rank: plan scratch" not in memory[0] \
                or "shm window" not in memory[0] or "(largest message 0.01 MiB)" not in memory[0] \
                or "; programs " not in memory[0]:
            ok, why = False, f"memory line: {memory}"  # the largest size measured is 8 KiB, not -e's 64 KiB
        elif len(saved["scratch_mib"]) != WORLD.size or len(saved["shm_window_mib"]) != WORLD.size \
                or len(saved["programs_mib"]) != WORLD.size \
                or min(saved["scratch_mib"] + saved["shm_window_mib"]) < 0 \
                or (WORLD.size > 1 and min(saved["programs_mib"]) <= 0):  # 8 B and 256 B ran as programs
            ok, why = False, f"library memory in the JSON: {saved['scratch_mib']}, {saved['shm_window_mib']}"
        elif not os.path.exists(plot) or not os.path.getsize(plot):
            ok, why = False, "empty plot"
    assert WORLD.allreduce(bool(ok), op=MPI.LAND), why or "rank 0 found a problem"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_bfloat16_sweep_has_a_native_row_and_no_wrong_elements(op, capsys):
    """MPI has no bfloat16: the native row runs MPI_Allreduce with a user-defined op, and every
    algorithm is checked against it."""
    allreduce_perf.main(["-b", "8", "-e", "4K", "-f", "16", "-n", "2", "-w", "1", "-a", "all", "-c", "1",
                         "-d", "bfloat16", "-o", op])
    text = capsys.readouterr().out
    ok, why = True, ""
    if WORLD.rank == 0:
        rows = [line.split() for line in text.splitlines() if line.strip() and line.split()[0].isdigit()]
        rows = [row for row in rows if not row[4].startswith("floor:")]  # the memory floors (n=2, sum)
        natives = [row for row in rows if row[4] == "native"]
        if "user-defined op" not in text:
            ok, why = False, "no note on how native reduces bfloat16"
        elif len(natives) != 3 or len(rows) != 3 * (len(collectives.algorithm_names()) + 2):
            ok, why = False, f"{len(natives)} native rows, {len(rows)} rows"
        elif any(row[2] != "bfloat16" or row[8] != "0" or row[13] != "0" for row in rows):
            ok, why = False, "wrong elements, or a row of another dtype"
    assert WORLD.allreduce(bool(ok), op=MPI.LAND), why or "rank 0 found a problem"


@pytest.mark.timeout(300)
def test_rows_name_their_transport_and_run_on_shared_arrays(capsys):
    """-a NAME@mpi,NAME@shm rows (and auto's) show the transport that ran; --shared runs them
    on shared arrays, still checked against native."""
    allreduce_perf.main(["-b", "64K", "-e", "64K", "-n", "2", "-w", "1", "-a", "auto,ring@mpi,ring@shm",
                         "-c", "1", "--shared"])
    text = capsys.readouterr().out
    ok, why = True, ""
    if WORLD.rank == 0:
        rows = [line.split() for line in text.splitlines() if line.strip() and line.split()[0].isdigit()]
        labels = {row[4] for row in rows}
        on_node = WORLD.size > 1  # every rank of these tests shares one node
        want = {"native", "ring@mpi", "ring@shm" if on_node else "ring@mpi"}
        if not want <= labels or not any(label.startswith("auto(") for label in labels):
            ok, why = False, f"row labels {sorted(labels)}"
        elif any(row[8] not in ("0", "-") or row[13] not in ("0", "-") for row in rows):
            ok, why = False, "wrong elements on shared arrays"
    assert WORLD.allreduce(bool(ok), op=MPI.LAND), why or "rank 0 found a problem"


@pytest.mark.timeout(60)
def test_every_timed_batch_follows_one_untimed_call_of_its_own_row():
    """Rounds interleave the rows; each batch of a row is preceded by one call of that row, so no
    batch starts on buffers the previous row pushed out of the caches."""
    calls = []

    def row(name, mode):
        return lambda: calls.append((name, mode))

    runners = {name: (row(name, "oop"), row(name, "ip")) for name in ("native", "a", "b")}
    times = {name: ([], []) for name in runners}

    class Args:
        rounds = 3

    allreduce_perf.timed_rounds(Args, runners, times, 4, WORLD)
    assert all(len(times[name][k]) == 3 for name in runners for k in (0, 1))
    assert len(calls) == 3 * 3 * 2 * 5  # rounds x rows x modes x (1 untimed + 4 timed)
    runs = [calls[i:i + 5] for i in range(0, len(calls), 5)]
    assert all(len(set(run)) == 1 for run in runs), runs  # a row's untimed call, then its batch
