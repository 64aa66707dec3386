"""GPU helpers for the benchmarks: device buffers, an NCCL yardstick, device bandwidths, a short sweep.

Importing this module needs neither CuPy nor a GPU; the functions say what is missing.

- ``gpu_available()`` -> ``(True, None)`` or ``(False, reason)``.
- ``make_buffers(count, dtype="float32", device=None)`` -> ``(sendbuf, recvbuf)``: CuPy arrays of
  ``count`` elements on ``device`` (default: the current one), sendbuf filled with small integers
  (exact in every dtype), recvbuf zeroed. ``make_buffers(host_array, device=None)`` -> one CuPy
  copy of a NumPy array (the form benchmarks/allreduce_perf.py calls).
- ``nccl_allreduce_timer(comm, count, dtype, op="sum")`` -> ``(timer, None)`` where ``timer()``
  runs one NCCL all-reduce of ``count`` elements and returns its time in seconds (CUDA events,
  stream synchronised), or ``(None, reason)`` when NCCL cannot run (no CuPy/NCCL/GPU, a threaded
  world, or fewer GPUs than ranks on a node). Collective over ``comm`` (mpi4py communicator,
  None for COMM_WORLD, or a collectives communicator). The form
  ``nccl_allreduce_timer(comm, sendbuf, recvbuf, op)`` (CuPy arrays) returns a pair of callables
  ``(out_of_place, in_place)``, each running one NCCL all-reduce and synchronising, or None
  (the reason is printed once on rank 0) - the form benchmarks/allreduce_perf.py calls.
- ``device_copy_bandwidth(nbytes=1 << 30, repeat=20, device=None)`` -> bytes per second of a
  device-to-device copy, counting bytes read plus written (2 * nbytes per copy), median of
  ``repeat`` timed copies.
- ``device_reduce_bandwidth(nbytes=1 << 30, dtype="float32", op="sum", repeat=20, device=None)``
  -> bytes per second of ``ufunc(a, b, out=c)``, counting two reads and one write (3 * nbytes).

``python -m benchmarks.gpu [--out FILE.json] [--quick]`` runs a short sweep: the two
bandwidths (on each process's device) and, over the ranks of MPI.COMM_WORLD (or a
threaded world of ``--threads N`` ranks sharing the device), every algorithm on device
buffers for a few sizes, checked against a CuPy reference and timed.
"""
import json
import os
import sys
import time

import numpy as np


def gpu_available():
    try:
        import cupy
    except ImportError:
        return False, "CuPy is not installed"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no driver
        return False, f"no CUDA device ({exc})"
    if n < 1:
        return False, "no CUDA device"
    return True, None


def _require_gpu():
    ok, why = gpu_available()
    if not ok:
        raise RuntimeError(why)
    import cupy

    return cupy


def _device(cupy, device):
    return cupy.cuda.Device() if device is None else cupy.cuda.Device(device)


def make_buffers(count, dtype="float32", device=None):
    """(sendbuf, recvbuf) of ``count`` elements on ``device``; or one device copy of a NumPy array."""
    cupy = _require_gpu()
    with _device(cupy, device):
        if isinstance(count, np.ndarray):
            return cupy.asarray(count)
        dtype = np.dtype(dtype)
        rng = np.random.default_rng(count)
        host = rng.integers(0, 4, count).astype(dtype)
        return cupy.asarray(host), cupy.zeros(count, dtype=dtype)


_nccl_cache = {}


def _nccl_for(comm):
    """(NcclAllreduce or None, reason), made once per communicator; collective."""
    import collectives
    from benchmarks import nccl as _nccl

    ours = collectives.as_comm(comm)
    key = id(ours)
    hit = _nccl_cache.get(key)
    if hit is None:
        why = _nccl.unavailable_reason(ours)
        hit = (None, why) if why else (_nccl.NcclAllreduce(ours), None)
        _nccl_cache[key] = hit
    return hit


def _event_timer(cupy, run):
    start = cupy.cuda.Event()
    stop = cupy.cuda.Event()

    def timer():
        stream = cupy.cuda.get_current_stream()
        start.record(stream)
        run()
        stop.record(stream)
        stop.synchronize()
        return cupy.cuda.get_elapsed_time(start, stop) / 1e3
    return timer


def nccl_allreduce_timer(comm, count, dtype="float32", op="sum"):
    """See the module docstring: ``(timer, None)`` / ``(None, reason)``, or for CuPy buffers
    ``(out_of_place, in_place)`` / None."""
    buffers_form = hasattr(count, "__cuda_array_interface__")
    ok, why = gpu_available()
    if not ok:
        return None if buffers_form else (None, why)
    import cupy
    from benchmarks import nccl as _nccl

    nccl, why = _nccl_for(comm)
    if nccl is None:
        if buffers_form:
            _say_once(comm, f"# nccl row skipped: {why}")
            return None
        return None, why
    if buffers_form:
        sendbuf, recvbuf = count, dtype
        if not _nccl.supports(op, sendbuf.dtype):
            _say_once(comm, f"# nccl row skipped: NCCL does not reduce {sendbuf.dtype} with {op}")
            return None

        def out_of_place():
            nccl(sendbuf, recvbuf, op)
            cupy.cuda.get_current_stream().synchronize()

        def in_place():
            nccl(recvbuf, recvbuf, op)
            cupy.cuda.get_current_stream().synchronize()
        return out_of_place, in_place
    dtype = np.dtype(dtype)
    if not _nccl.supports(op, dtype):
        return None, f"NCCL does not reduce {dtype} with {op}"
    sendbuf, recvbuf = make_buffers(int(count), dtype)
    return _event_timer(cupy, lambda: nccl(sendbuf, recvbuf, op)), None


_said = set()


def _say_once(comm, line):
    import collectives

    if line not in _said and collectives.as_comm(comm).rank == 0:
        _said.add(line)
        print(line, file=sys.stderr, flush=True)


def _median_time(cupy, run, repeat):
    run()  # warm-up: kernel compilation, allocation
    timer = _event_timer(cupy, run)
    return float(np.median([timer() for _ in range(max(1, repeat))]))


def device_copy_bandwidth(nbytes=1 << 30, repeat=20, device=None):
    """Device-to-device copy, bytes read plus written per second."""
    cupy = _require_gpu()
    with _device(cupy, device):
        src = cupy.ones(nbytes // 4, dtype=cupy.float32)
        dst = cupy.empty_like(src)
        t = _median_time(cupy, lambda: cupy.copyto(dst, src), repeat)
        moved = 2 * src.nbytes
        del src, dst
    return moved / t


def device_reduce_bandwidth(nbytes=1 << 30, dtype="float32", op="sum", repeat=20, device=None):
    """``ufunc(a, b, out=c)`` on the device, bytes moved (two reads, one write) per second."""
    from collectives.ops import check_op_dtype

    cupy = _require_gpu()
    dtype = np.dtype(dtype)
    ufunc = getattr(cupy, check_op_dtype(op, dtype))
    with _device(cupy, device):
        count = nbytes // dtype.itemsize
        a = cupy.ones(count, dtype=dtype)
        b = cupy.ones(count, dtype=dtype)
        c = cupy.empty_like(a)
        t = _median_time(cupy, lambda: ufunc(a, b, out=c), repeat)
        moved = 3 * a.nbytes
        del a, b, c
    return moved / t


# ---------------------------------------------------------------- the short sweep (gpu_check.sh)

SWEEP_DTYPES = ("float32", "int32")
SWEEP_COUNTS = (1 << 10, 1 << 16, 1 << 22)


def _rank_data(rank, count, dtype):
    rng = np.random.default_rng(1000 + rank)
    return rng.integers(-3, 4, count).astype(dtype)


def _sweep_rank(comm, counts, dtypes, iters):
    """One rank's share of the sweep; returns its records."""
    import cupy

    import collectives

    ngpu = cupy.cuda.runtime.getDeviceCount()
    records = []
    with cupy.cuda.Device(comm.rank % ngpu):
        for dtype in map(np.dtype, dtypes):
            for count in counts:
                host = _rank_data(comm.rank, count, dtype)
                # the reference: every rank's data is known here, reduced by CuPy on the device
                ref = cupy.zeros(count, dtype=dtype)
                for r in range(comm.size):
                    cupy.add(ref, cupy.asarray(_rank_data(r, count, dtype)), out=ref)
                x = cupy.asarray(host)
                out = cupy.empty_like(x)
                for name in collectives.algorithm_names():
                    collectives.allreduce(x, out, algorithm=name, comm=comm)  # warm-up
                    wrong = int(cupy.count_nonzero(out != ref).get())
                    comm.barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        collectives.allreduce(x, out, algorithm=name, comm=comm)
                    comm.barrier()
                    t = (time.perf_counter() - t0) / iters
                    records.append({"algorithm": name, "dtype": dtype.name, "count": count,
                                    "bytes": count * dtype.itemsize, "time_us": t * 1e6,
                                    "algbw_GBps": count * dtype.itemsize / t / 1e9, "wrong": wrong,
                                    "ranks": comm.size, "rank": comm.rank, "device": comm.rank % ngpu})
    return records


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n")[0])
    p.add_argument("--out", help="write the results as JSON here (rank 0)")
    p.add_argument("--threads", type=int, default=0,
                   help="run the all-reduce sweep on a threaded world of N ranks instead of MPI")
    p.add_argument("--quick", action="store_true", help="smaller buffers and fewer iterations")
    args = p.parse_args(argv)
    ok, why = gpu_available()
    if not ok:
        print(f"NO GPU: {why}; nothing measured")
        return 3

    import cupy

    import collectives

    iters = 3 if args.quick else 10
    counts = SWEEP_COUNTS[:2] if args.quick else SWEEP_COUNTS
    if args.threads:
        comm_info = f"threaded world of {args.threads} ranks"
        per_rank = collectives.run_threaded(args.threads, _sweep_rank, counts, SWEEP_DTYPES, iters)
        records = [r for rank in per_rank for r in rank]
        rank, size, path = 0, args.threads, "threaded (device copies)"
    else:
        from mpi4py import MPI

        from collectives.comm import cuda as _cuda

        comm = collectives.as_comm(MPI.COMM_WORLD)
        rank, size = comm.rank, comm.size
        comm_info = f"MPI world of {size} ranks, {MPI.Get_library_version().splitlines()[0].strip()}"
        path = _cuda.describe()
        records = _sweep_rank(comm, counts, SWEEP_DTYPES, iters)
        gathered = MPI.COMM_WORLD.gather(records, root=0)
        records = [r for part in gathered for r in part] if rank == 0 else records

    nbytes = (1 << 28) if args.quick else (1 << 30)
    result = {"world": comm_info, "device_path": path, "device": cupy.cuda.runtime.getDeviceProperties(
        cupy.cuda.Device().id)["name"].decode(errors="replace"), "ngpu": cupy.cuda.runtime.getDeviceCount()}
    if rank == 0:
        result["copy_bandwidth_GBps"] = device_copy_bandwidth(nbytes) / 1e9
        result["reduce_bandwidth_GBps"] = {dt: device_reduce_bandwidth(nbytes, dt) / 1e9
                                           for dt in ("float32", "float16", "int32")}
        result["allreduce"] = records
        print(f"# {comm_info}; device path: {path}; {result['device']} x{result['ngpu']}")
        print(f"# device copy {result['copy_bandwidth_GBps']:.0f} GB/s (read+write); reduce (a+b->c, "
              f"2 reads + 1 write): " + ", ".join(f"{k} {v:.0f} GB/s"
                                                  for k, v in result["reduce_bandwidth_GBps"].items()))
        print(f"{'algorithm':>20} {'dtype':>8} {'bytes':>10} {'time(us)':>10} {'algbw GB/s':>11} {'#wrong':>7}")
        for r in records:
            if r["rank"] == 0:
                print(f"{r['algorithm']:>20} {r['dtype']:>8} {r['bytes']:>10} {r['time_us']:>10.1f} "
                      f"{r['algbw_GBps']:>11.3f} {r['wrong']:>7}")
        bad = sum(r["wrong"] for r in records)
        print(f"# {'all results match the CuPy reference' if not bad else f'{bad} WRONG ELEMENTS'}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    os.environ.setdefault("COLLECTIVES_TIMEOUT", "120")
    sys.exit(main())
