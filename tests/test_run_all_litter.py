"""The suite's litter check counts only what the suite's own jobs leave: MPI libraries' entries
that appeared during the run and that no process uses, and its own TMPDIR; what other processes
on the machine make meanwhile is listed, never a failure."""
import os
import sys

from collectives import cleanup

sys.path.insert(0, os.path.dirname(__file__))
import run_all  # noqa: E402


def test_only_new_unused_library_entries_and_the_tmpdir_count(monkeypatch, tmp_path):
    before = {"/dev/shm/mpich_shm_old"}
    now = ["/dev/shm/mpich_shm_old", "/dev/shm/mpich_shm_ours", "/dev/shm/mpich_shm_busy"]
    monkeypatch.setattr(cleanup, "candidates", lambda: list(now))
    monkeypatch.setattr(cleanup, "in_use", lambda: {"/dev/shm/mpich_shm_busy"})
    gone = tmp_path / "removed"
    assert run_all.own_litter(before, str(gone)) == ["/dev/shm/mpich_shm_ours"]
    kept = tmp_path / "kept"
    kept.mkdir()
    assert run_all.own_litter(before, str(kept)) == ["/dev/shm/mpich_shm_ours", str(kept)]
    now.remove("/dev/shm/mpich_shm_ours")
    assert run_all.own_litter(before, str(gone)) == []
