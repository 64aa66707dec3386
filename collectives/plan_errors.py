"""``PlanError``: a plan breaks one of the rules in ``collectives.plan`` (defined apart to keep plan.py short)."""


class PlanError(ValueError):
    """A plan breaks one of the rules above. Raised by ``collectives.verify``,
    ``collectives.register_algorithm`` and the simulator, with the place named: ``algorithm``,
    ``ranks`` (world size), ``count``, ``mode`` ("out of place" or "in place"), ``rank``,
    ``step`` (1-based, of ``steps``), ``buffer`` ("in", "out", "tmp"), ``element`` and
    ``what`` is wrong. Fields that do not apply are None."""

    def __init__(self, what, algorithm=None, ranks=None, count=None, mode=None, rank=None, step=None,
                 steps=None, buffer=None, element=None):
        self.what, self.algorithm, self.ranks, self.count, self.mode = what, algorithm, ranks, count, mode
        self.rank, self.step, self.steps, self.buffer, self.element = rank, step, steps, buffer, element
        super().__init__(self.describe())

    def describe(self):
        head = [str(self.algorithm)] if self.algorithm is not None else []
        if self.ranks is not None:
            head.append(f"{self.ranks} rank{'' if self.ranks == 1 else 's'}")
        if self.count is not None:
            head.append(f"count {self.count}")
        if self.mode:
            head.append(self.mode)
        place = []
        if self.rank is not None:
            place.append(f"rank {self.rank}")
        if self.step is not None:
            place.append(f"step {self.step}" + (f"/{self.steps}" if self.steps is not None else ""))
        if self.buffer is not None:
            place.append(f"{self.buffer.upper()}[{self.element}]" if self.element is not None else
                         self.buffer.upper())
        text = ", ".join(head)
        if place:
            text = f"{text}: {', '.join(place)}" if text else ", ".join(place)
        return f"{text}: {self.what}" if text else self.what

    def __reduce__(self):
        return (_plan_error, (self.what, self.__dict__))


def _plan_error(what, fields):
    error = PlanError.__new__(PlanError)
    error.__dict__.update(fields)
    ValueError.__init__(error, error.describe())
    return error
