"""The cost model's rankings: every candidate algorithm priced by its ``cost`` formula (over MPI
messages, or over shared memory where a step costs more than a message), the cheapest first.

The selector (collectives/select.py) and first-use calibration (collectives/autotune.py, which
screens the model's best pairs) both rank with these.
"""

from .model import ALPHA, ALPHA_INTER, ALPHA_SHM_MESSAGE, ALPHA_SHM_STEP, BETA, BETA_INTER, GAMMA

from . import algorithms as _algorithms


def cost_choice(size, nbytes, alpha=ALPHA, beta=BETA, gamma=GAMMA, candidates=None):
    """(name, {name: predicted seconds}) of the cheapest algorithm by the cost model."""
    costs = {}
    for name in candidates or _algorithms.names():
        module = _algorithms.get(name)
        costs[name] = module.cost(size, nbytes, alpha, beta, gamma)
    return _cheapest(costs), costs


def shm_cost_choice(size, nbytes, itemsize=4, candidates=None, alpha_step=ALPHA_SHM_STEP,
                    alpha_message=ALPHA_SHM_MESSAGE, beta=BETA, gamma=GAMMA):
    """(name, {name: predicted seconds}) over the shared-memory transport, where a step costs
    ``alpha_step`` (its counters published and polled) and a message only ``alpha_message``: each
    algorithm's own cost with that alpha, plus its steps (rank 0's plan) times ``alpha_step``.
    An algorithm whose plan cannot be built here pays ``alpha_step`` per message instead."""
    count = nbytes // max(1, itemsize)
    costs = {}
    for name in candidates or _algorithms.names():
        module = _algorithms.get(name)
        try:
            params = _algorithms.resolve(module, {}, (tuple(range(size)),), size)[1]
            steps = module.build(0, size, count, itemsize=itemsize, **params).nsteps
            costs[name] = module.cost(size, nbytes, alpha_message, beta, gamma) + steps * alpha_step
        except Exception:  # a plugin's build that needs more than defaults: count its messages as steps
            costs[name] = module.cost(size, nbytes, alpha_step, beta, gamma)
    return _cheapest(costs), costs


def describe_topology(hosts):
    counts = [len(h) for h in hosts]
    per_host = str(counts[0]) if len(set(counts)) == 1 else ",".join(map(str, counts))
    return f"{len(hosts)} host{'s' if len(hosts) > 1 else ''} x {per_host} rank{'s' if max(counts) > 1 else ''}"


def two_level_choice(hosts, nbytes, alpha=ALPHA, beta=BETA, gamma=GAMMA, alpha_inter=ALPHA_INTER,
                     beta_inter=BETA_INTER, candidates=None):
    """(name, {name: predicted seconds}) across hosts: algorithms that know hosts (two_level,
    hierarchical_copy) get the intra- and inter-host parameters; a flat algorithm pays the
    inter-host ones on every step, its ranks sharing each host's link."""
    size = sum(len(h) for h in hosts)
    groups = [0] * size
    for index, ranks in enumerate(hosts):
        for rank in ranks:
            groups[rank] = index
    groups = tuple(groups)
    sharing = max(len(h) for h in hosts)
    costs = {}
    names = list(candidates or _algorithms.names())
    for name in sorted(names, key=lambda n: n != "two_level"):  # two_level first: it wins a tie
        module = _algorithms.get(name)
        if name == "two_level":
            costs[name] = module.cost(size, nbytes, alpha, beta, gamma, groups=groups, alpha_inter=alpha_inter,
                                      beta_inter=beta_inter)
        elif name == "hierarchical_copy":  # every host leads one part per host, each part's ring on its link;
            # with more hosts than ranks on one, a rank of it leads several parts: it receives, reduces and
            # sends back each of them
            led = -(-len(hosts) // min(len(h) for h in hosts))
            costs[name] = module.cost(size, nbytes, alpha, beta * led, gamma * led, group_size=sharing,
                                      alpha_inter=alpha_inter, beta_inter=beta_inter * len(hosts))
        else:
            costs[name] = module.cost(size, nbytes, alpha_inter, beta_inter * sharing, gamma)
    return _cheapest(costs), costs


def _cheapest(costs):
    """The first name whose cost is the least (a tie, rounding included, goes to the first)."""
    least = min(costs.values())
    return next(n for n, c in costs.items() if c <= least * (1 + 1e-9))
