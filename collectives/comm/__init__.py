"""Communicators: the small interface algorithms speak, and its transports."""
from .base import Communicator, Request
from .threaded import ThreadComm, run_threaded

__all__ = ["Communicator", "Request", "ThreadComm", "run_threaded", "MPIComm"]


def __getattr__(name):  # MPIComm imports mpi4py, so only on demand
    if name == "MPIComm":
        from .mpi import MPIComm

        return MPIComm
    raise AttributeError(name)
