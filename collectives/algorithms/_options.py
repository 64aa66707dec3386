"""Validation of algorithm options passed as keyword arguments of allreduce."""


class Option:
    def __init__(self, default, check, doc):
        self.default, self.check, self.doc = default, check, doc


def positive_int(name):
    def check(value):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"option {name} must be a positive integer, got {value!r}")
        return value
    return check


def optional_positive_int(name):
    inner = positive_int(name)

    def check(value):
        return None if value is None else inner(value)
    return check


def rank_in_world(name):
    def check(value):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"option {name} must be a rank (an integer >= 0), got {value!r}")
        return value
    return check


def normalize(algorithm, declared, given):
    """Defaults filled in, values checked; ValueError naming the valid options otherwise."""
    unknown = set(given) - set(declared)
    if unknown:
        valid = ", ".join(sorted(declared)) or "none"
        raise ValueError(f"algorithm {algorithm!r} takes no option(s) {', '.join(sorted(unknown))}; "
                         f"valid options: {valid}")
    return {name: (opt.check(given[name]) if name in given else opt.default)
            for name, opt in declared.items()}


def groups_of(hosts):
    """The host number of every rank (hosts numbered in the order given) from the ranks of each
    host, as ``collectives.algorithms.resolve`` takes them: ((0, 1), (2,)) -> (0, 0, 1)."""
    groups = [0] * sum(len(host) for host in hosts)
    for number, host in enumerate(hosts):
        for rank in host:
            groups[rank] = number
    return tuple(groups)
