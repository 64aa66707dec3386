# In place, what a rank sends was written by its last reduction. Raw mpi4py loops (n=2, one
# exchange then np.add) that differ only in how the sent buffer was last written, beside native
# MPI_Allreduce in place; run with the library's single-copy path on and off:
#   PYTHONPATH=. mpiexec -n 2 python benchmarks/experiments/inplace_cma.py BYTES
#   MPIR_CVAR_CH4_CMA_ENABLE=0 mpiexec ... (MPICH)   OMPI_MCA_smsc=^cma mpiexec ... (Open MPI)
# A: np.add in place, then sent; B: added into scratch, copied back, sent; C: a copy sent;
# G: a buffer np.copyto wrote; H: a buffer an out-of-place np.add wrote; U: never written.
import sys
import numpy as np
from mpi4py import MPI
from benchmarks.allreduce_perf import time_batch
c = MPI.COMM_WORLD; peer = 1 - c.rank
n = int(sys.argv[1]) // 4
rng = np.random.default_rng(c.rank)
a = rng.random(n, dtype=np.float32)
tmp, out, w, w2, s = (np.empty_like(a) for _ in range(5))
w[:] = a; w2[:] = a; out[:] = a
ex_t = {}
def xchg(send, tag):
    reqs = [c.Irecv(tmp, peer, tag), c.Isend(send, peer, tag)]
    while not MPI.Request.Testall(reqs):
        pass
def A():  # in place add, send it
    xchg(w, 1); np.add(w, tmp, out=w)
def B():  # add into scratch, copy back, send w
    xchg(w, 2); np.add(w, tmp, out=s); np.copyto(w, s)
def C():  # copy then send copy
    np.copyto(w2, w); xchg(w2, 3); np.add(w2, tmp, out=w)
def G():  # send np.add(out of place)-written buffer
    xchg(out, 4); np.add(out, tmp, out=out2); np.copyto(out, a)
out2 = np.empty_like(a)
def H():  # send buffer written by out-of-place np.add
    xchg(out, 5); np.add(a, tmp, out=out)
def U():  # untouched
    xchg(a, 6); np.add(a, tmp, out=out2)
def X():  # exchange only of w written by add: time the exchange alone
    xchg(w, 7); np.add(w, tmp, out=w)
def N():
    c.Allreduce(MPI.IN_PLACE, w)
fns = dict(N_native_inplace=N, A_inplace_add=A, B_add_scratch_copyback=B, C_copy_send_copy=C, G_send_copyto_written=G, H_send_add_out=H, U_untouched=U)
times = {k: [] for k in fns}
with np.errstate(all="ignore"):
    for f in fns.values(): f()
    for _ in range(15):
        for k, f in fns.items():
            times[k].append(time_batch(c, f, 50))
if c.rank == 0:
    print(sys.argv[1], "  ".join(f"{k}={np.median(v)*1e6:.1f}" for k, v in times.items()))
