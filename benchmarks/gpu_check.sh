#!/usr/bin/env bash
# benchmarks/gpu_check.sh OUTDIR - every GPU test and a short GPU sweep, in one go (under 5 minutes).
#
# Run from anywhere; it works in the repository that holds it. Installs nothing from a network:
# MPI comes only from wheels carried in WHEELS (default: the repository's .whl/, e.g. the mpich
# and mpi4py wheels for Python 3.12, see docs/gpu.md), installed under /tmp. Without them, the
# MPI stages are skipped and say so. PYTHON picks the interpreter (default: /opt/torch/.venv/bin/python3
# where it exists, else the repository's .venv, else python3).
#
# Stages (each under its own timeout, output in OUTDIR):
#   1. single-process GPU tests (threaded world on CuPy arrays, several GPUs, NCCL, helpers)
#                                                           -> pytest-single.log
#   2. tests/gpu/test_gpu_mpi.py under mpiexec -n 2 and -n 4 (ranks share the GPUs; host staging
#      unless the MPI library is CUDA-aware)                -> pytest-mpi.log
#   3. short sweep: device copy and reduction bandwidth, every algorithm on device buffers checked
#      against a CuPy reference, threaded (4 ranks) and MPI (2 and 4 ranks)
#                                                           -> sweep.log, sweep-*.json
#   summary.txt: environment and one line per stage.
#
# Exit status: 0 everything ran and passed; 1 a stage failed or timed out; 2 usage;
#              3 no GPU (CuPy missing or no CUDA device): nothing measured, the tests' skip
#                reasons are in pytest-single.log.
set -u
if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
OUTDIR=$1
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
SUMMARY=$OUTDIR/summary.txt
: >"$SUMMARY"
START=$(date +%s)
say() { echo "$*" | tee -a "$SUMMARY"; }
FAILED=0

if [ -z "${PYTHON:-}" ]; then
    for cand in /opt/torch/.venv/bin/python3 "$ROOT/.venv/bin/python" python3; do
        if command -v "$cand" >/dev/null 2>&1; then PYTHON=$cand; break; fi
    done
fi
say "# gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) in $ROOT, python: $PYTHON ($("$PYTHON" -c 'import sys; print(sys.version.split()[0])'))"
export PYTHONUNBUFFERED=1 COLLECTIVES_TIMEOUT=${COLLECTIVES_TIMEOUT:-60}
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}

# ---- MPI from carried wheels (never from a network)
WHEELS=${WHEELS:-$ROOT/.whl}
PFX=/tmp/collectives-gpu-check
if ls "$WHEELS"/mpich-*.whl >/dev/null 2>&1; then
    if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed \
            --prefix "$PFX" "$WHEELS"/mpich-*.whl >>"$OUTDIR/pytest-mpi.log" 2>&1; then
        export PATH=$PFX/bin:$PATH LD_LIBRARY_PATH=$PFX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export MPI4PY_LIBMPI=$PFX/lib/libmpi.so.12
        say "mpich: installed from $(basename "$WHEELS"/mpich-*.whl)"
    else
        say "mpich: the carried wheel did not install (see pytest-mpi.log)"
    fi
else
    say "mpich: MISSING - no mpich wheel in $WHEELS; MPI stages need an MPI library"
fi
if ls "$WHEELS"/mpi4py-*.whl >/dev/null 2>&1; then
    if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$PFX/site" "$WHEELS"/mpi4py-*.whl >>"$OUTDIR/pytest-mpi.log" 2>&1; then
        export PYTHONPATH=$PYTHONPATH:$PFX/site
        say "mpi4py: installed from $(basename "$WHEELS"/mpi4py-*.whl)"
    else
        say "mpi4py: the carried wheel did not install for this Python (see pytest-mpi.log)"
    fi
fi

# ---- is there a GPU?
GPU_INFO=$("$PYTHON" - <<'EOF' 2>&1
try:
    import cupy
except ImportError:
    print("NO GPU: CuPy is not installed"); raise SystemExit(3)
try:
    n = cupy.cuda.runtime.getDeviceCount()
except Exception as exc:
    print(f"NO GPU: CuPy {cupy.__version__} finds no CUDA device ({exc})"); raise SystemExit(3)
if n < 1:
    print(f"NO GPU: CuPy {cupy.__version__} finds no CUDA device"); raise SystemExit(3)
names = [cupy.cuda.runtime.getDeviceProperties(i)["name"].decode() for i in range(n)]
print(f"GPUs: {n} ({', '.join(names)}); CuPy {cupy.__version__}, CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}")
try:
    from cupy.cuda import nccl
    print(f"NCCL: {nccl.get_version()}")
except Exception as exc:
    print(f"NCCL: MISSING ({exc})")
EOF
)
GPU_RC=$?
say "$GPU_INFO"
MPI_INFO=$("$PYTHON" - <<'EOF' 2>&1
try:
    from mpi4py import MPI
except Exception as exc:
    print(f"MPI: MISSING ({type(exc).__name__}: {exc})"); raise SystemExit(1)
from collectives.comm import cuda
print(f"MPI: mpi4py {__import__('mpi4py').__version__}, {MPI.Get_library_version().splitlines()[0].strip()}; "
      f"device buffers: {cuda.describe()}")
EOF
)
MPI_RC=$?
say "$MPI_INFO"
MPIEXEC=$(command -v mpiexec || true)

# run LABEL TIMEOUT LOG CMD... : one stage, its verdict in the summary; every stage also fits
# in what is left of the whole script's budget (GPU_CHECK_BUDGET seconds, default 285)
BUDGET=${GPU_CHECK_BUDGET:-285}
run() {
    local label=$1 limit=$2 log=$3
    shift 3
    local left=$(( BUDGET - ($(date +%s) - START) ))
    if [ $left -lt 15 ]; then
        say "$label: NOT RUN - the ${BUDGET}s budget is spent"
        FAILED=1
        return
    fi
    [ $limit -gt $left ] && limit=$left
    echo "=== $label: $*" >>"$log"
    local t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    local tail_line
    tail_line=$(grep -E "passed|failed|skipped|error|all results|WRONG|NO GPU" "$log" | tail -1)
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        say "$label: TIMED OUT after ${limit}s"
        FAILED=1
    elif [ $rc -ne 0 ] && [ $rc -ne 5 ]; then
        say "$label: FAILED (exit $rc, $(( $(date +%s) - t0 ))s) ${tail_line}"
        FAILED=1
    else
        say "$label: ok (${tail_line:-exit $rc}, $(( $(date +%s) - t0 ))s)"
    fi
}

PYTEST=("$PYTHON" -m pytest -q -rs -p no:cacheprovider)
if [ $GPU_RC -ne 0 ]; then
    run "gpu tests (expected to skip)" 120 "$OUTDIR/pytest-single.log" "${PYTEST[@]}" tests/gpu
    say "NO GPU: nothing was measured (exit 3); run this script on a machine with a CUDA GPU and CuPy"
    exit 3
fi

# stages in order of importance, so that a slow machine loses the least useful ones first
HAVE_MPI=0
[ $MPI_RC -eq 0 ] && [ -n "$MPIEXEC" ] && HAVE_MPI=1
mpi_tests() {
    run "mpi gpu tests, $1 ranks" "$2" "$OUTDIR/pytest-mpi.log" "$MPIEXEC" -n "$1" "$PYTHON" -m mpi4py \
        -m pytest -q -rs -p no:cacheprovider --durations=5 tests/gpu/test_gpu_mpi.py
}
mpi_sweep() {
    run "sweep, MPI $1 ranks" 40 "$OUTDIR/sweep.log" \
        "$MPIEXEC" -n "$1" "$PYTHON" -m benchmarks.gpu --quick --out "$OUTDIR/sweep-mpi$1.json"
}
# 1. single process (threaded world, several GPUs, NCCL, helpers; test_gpu_mpi.py on one rank)
run "single-process gpu tests" 110 "$OUTDIR/pytest-single.log" "${PYTEST[@]}" --durations=10 tests/gpu
# 2. MPI world of 2 (ranks share the GPUs)
[ $HAVE_MPI -eq 1 ] && mpi_tests 2 60
# 3. short sweep
run "sweep, threaded 4 ranks" 40 "$OUTDIR/sweep.log" \
    "$PYTHON" -m benchmarks.gpu --quick --threads 4 --out "$OUTDIR/sweep-threads.json"
[ $HAVE_MPI -eq 1 ] && mpi_sweep 2
# 4. MPI world of 4
if [ $HAVE_MPI -eq 1 ]; then
    mpi_tests 4 80
    mpi_sweep 4
else
    say "mpi gpu tests and MPI sweep: SKIPPED - ${MPIEXEC:-no mpiexec on PATH}; ${MPI_INFO}"
fi
grep -E "^# device copy" "$OUTDIR/sweep.log" | head -1 | tee -a "$SUMMARY"
say "total $(( $(date +%s) - START ))s; $([ $FAILED -eq 0 ] && echo 'ALL PASSED' || echo 'SOME STAGES FAILED')"
exit $FAILED
