"""The public call: ``simulate(algorithm, ranks, nbytes, ...)`` builds every rank's plan with the
algorithm's own ``build``, times them (``timing``, ``_waves``) and checks them (``verification``)."""
from dataclasses import dataclass, field
from functools import lru_cache

from ..flat import _Flat, build_plan, build_plans
from ..model import ALPHA, BETA, GAMMA
from ..plan import PlanError
from .timing import critical_path as _critical_path, time_plans as _time
from .verification import _small, verify_flat


@dataclass
class SimResult:
    algorithm: str
    ranks: int
    nbytes: int
    time: float
    verified: bool
    verify_error: str = ""
    steps: int = 0
    bytes_sent: list = field(default_factory=list)
    bytes_received: list = field(default_factory=list)
    finish: list = field(default_factory=list)
    critical_path: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    verify_mode: str = ""

    @property
    def algbw(self):
        return self.nbytes / self.time / 1e9 if self.time > 0 else float("inf")

    @property
    def busbw(self):
        return self.algbw * (2 * (self.ranks - 1) / self.ranks if self.ranks > 1 else 1.0)



# the public call ---------------------------------------------------------------------------
def simulate(algorithm, ranks, nbytes, alpha=ALPHA, beta=BETA, gamma=GAMMA, *, topology=None,
             itemsize=4, verify_data=True, record=False, **options):
    """Predict and check ``algorithm`` on ``ranks`` ranks for an ``nbytes`` all-reduce."""
    if not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be a positive integer, got {ranks!r}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    count = int(nbytes) // itemsize
    import gc

    collecting = gc.isenabled()
    gc.disable()  # millions of small tuples: the cycle collector would rescan them again and again
    try:
        return _simulate(algorithm, ranks, count, alpha, beta, gamma, topology, itemsize, verify_data, record,
                         options)
    finally:
        if collecting:
            gc.enable()


def _simulate(algorithm, ranks, count, alpha, beta, gamma, topology, itemsize, verify_data, record, options):
    plans = build_plans(algorithm, ranks, count, itemsize, topology, **options)
    # rank 0's plan at the check's count: asked here and again by verify_flat, built once
    probe = lru_cache(maxsize=None)(lambda n: build_plan(algorithm, 0, ranks, n, itemsize, topology, **options))
    ops = verify_data and not _small(plans[0].nsteps if plans else 0, ranks, count, probe)
    flat = _Flat(plans, ops=ops)  # operations flattened only when the check runs on these plans
    del plans  # the flat arrays hold everything the model and the check read
    finish, links, messages = _time(None, alpha, beta, gamma, itemsize, topology, record, flat=flat)
    result = SimResult(algorithm, ranks, count * itemsize, max(finish) if finish else 0.0, False,
                       steps=int(flat.nsteps.max()) if ranks else 0,
                       bytes_sent=[b * itemsize for b in flat.per_rank(flat.s_rank, flat.s_len)],
                       bytes_received=[b * itemsize for b in flat.per_rank(flat.r_rank, flat.r_len)],
                       finish=finish, messages=messages)
    result.critical_path = _critical_path(finish, links)
    del links
    if verify_data:
        try:
            result.verify_mode = verify_flat(
                flat, count, lambda n: build_plans(algorithm, ranks, n, itemsize, topology, **options), probe)
            result.verified = True
        except PlanError as exc:
            result.verify_error = str(exc)
    return result
