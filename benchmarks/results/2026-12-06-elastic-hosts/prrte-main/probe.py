"""ULFM probe under PRRTE main's prterun (README.md): 3 ranks, one all-reduce, rank 2 ends
(HOW=exit: os._exit(1); HOW=kill: SIGKILL), the others revoke, shrink and all-reduce again."""
import os
import signal

from mpi4py import MPI

c = MPI.COMM_WORLD
c.Set_errhandler(MPI.ERRORS_RETURN)
print(f"rank {c.rank}/{c.size} sum={c.allreduce(1)} {MPI.Get_library_version().splitlines()[0]}", flush=True)
if c.rank == 2:
    os._exit(1) if os.environ.get("HOW", "exit") == "exit" else os.kill(os.getpid(), signal.SIGKILL)
try:
    c.allreduce(1)
    print(f"rank {c.rank}: no error", flush=True)
except MPI.Exception as e:
    print(f"rank {c.rank}: error class {e.Get_error_class()}", flush=True)
    c.Revoke()
s = c.Shrink()
print(f"rank {c.rank}: shrunk to {s.size}, sum={s.allreduce(1)}", flush=True)
