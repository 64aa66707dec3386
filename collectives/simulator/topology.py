"""Hosts for the simulator: which node each rank is on, and the (alpha, beta) of messages inside
a node and between nodes."""
import bisect
from dataclasses import dataclass
from itertools import accumulate

import numpy as np


@dataclass
class Topology:
    """Nodes of ``ranks_per_node`` ranks each, or, given a sequence (2, 1, 2), nodes of those
    counts of consecutive ranks (uneven hosts; ranks past them are on further nodes of the last
    count); (alpha, beta) inside a node and between nodes. With ``shared_nic``, a message between
    nodes takes a turn on the sending node's outgoing link and one on the receiving node's
    incoming link (each link shared by the node's ranks and serving one message at a time, each
    on its own queue) instead of its ranks' ports, and ends when both links carried it; without,
    it takes its turns on the ranks' send and receive ports, as every message inside a node does.

    ``sharing`` says how a shared link serves the messages that cross it at once: ``"queue"``
    (the default) one at a time in the order they were posted; ``"fair"`` all at once, each at
    an equal share of its rate (as TCP streams share a link), so a message posted while another
    crosses slows it down. ``burst`` (bytes, fair links only) is what a link passes at once after
    it idled, as a token-bucket shaper does (tbf's burst): an idle link gathers tokens at its
    rate up to ``burst``, and a message that finds it idle has that many of its bytes' time
    taken off. ``back_to_back`` (fair links with a burst) times the call as one of a run of
    identical calls with no pause between them, as a benchmark loop makes them: each link starts
    with the tokens the call before left it (what it held at its last message plus what it
    gathered while it idled until the call's end), found by timing the call again until that
    start repeats; without it every link starts idle with a full bucket."""
    ranks_per_node: object
    intra: tuple
    inter: tuple
    shared_nic: bool = False
    sharing: str = "queue"
    burst: float = 0.0
    back_to_back: bool = False

    def __post_init__(self):
        if self.sharing not in ("queue", "fair"):
            raise ValueError(f"sharing must be 'queue' or 'fair', got {self.sharing!r}")
        if self.burst < 0:
            raise ValueError(f"burst must be >= 0 bytes, got {self.burst!r}")
        if (self.sharing == "fair" or self.burst) and not self.shared_nic:
            raise ValueError("sharing='fair' and burst model a node's shared link: they need shared_nic=True")
        if self.burst and self.sharing != "fair":
            raise ValueError("burst is modelled on fair links only (sharing='fair')")
        if self.back_to_back and not self.burst:
            raise ValueError("back_to_back carries a link's burst from one call to the next: it needs burst > 0")

    def _ends(self):
        counts = tuple(int(k) for k in self.ranks_per_node)
        if not counts or min(counts) < 1:
            raise ValueError(f"ranks per node must be positive, got {self.ranks_per_node!r}")
        return list(accumulate(counts)), counts[-1]

    def node(self, rank):
        if isinstance(self.ranks_per_node, (int, np.integer)):
            return rank // self.ranks_per_node
        ends, last = self._ends()
        if rank < ends[-1]:
            return bisect.bisect_right(ends, rank)
        return len(ends) + (rank - ends[-1]) // last

    def nodes(self, ranks):
        """The node of every rank of ``ranks``, as an array."""
        if isinstance(self.ranks_per_node, (int, np.integer)):
            return np.arange(ranks) // self.ranks_per_node
        return np.array([self.node(r) for r in range(ranks)], np.int64)

    @classmethod
    def parse(cls, text, alpha, beta):
        """``nodes=128x8,intra=A:B,inter=A:B,nic=shared[,links=fair,burst=BYTES[,calls=back-to-back]]``
        (nodes = count x ranks per node, or the ranks of each node: ``nodes=2+1+2``)."""
        fields = dict(part.split("=", 1) for part in text.split(",") if part)
        unknown = set(fields) - {"nodes", "intra", "inter", "nic", "links", "burst", "calls"}
        if unknown:
            raise ValueError(f"unknown topology field(s) {', '.join(sorted(unknown))}; "
                             f"valid: nodes, intra, inter, nic, links, burst, calls")
        if "nodes" not in fields:
            raise ValueError("topology needs nodes=COUNTxRANKS_PER_NODE")
        if "+" in fields["nodes"]:
            per_node = tuple(int(x) for x in fields["nodes"].split("+"))
            count, total = len(per_node), sum(per_node)
        else:
            count, per_node = (int(x) for x in fields["nodes"].lower().split("x"))
            total = count * per_node
        pair = lambda s: tuple(float(x) for x in s.split(":"))  # noqa: E731
        intra = pair(fields["intra"]) if "intra" in fields else (alpha, beta)
        inter = pair(fields["inter"]) if "inter" in fields else (alpha, beta)
        if fields.get("nic", "").lower() not in ("", "shared", "private"):
            raise ValueError("nic must be 'shared' or 'private'")
        calls = fields.get("calls", "single").lower()
        if calls not in ("single", "back-to-back"):
            raise ValueError(f"calls must be 'single' or 'back-to-back', got {calls!r}")
        return cls(per_node, intra, inter, fields.get("nic", "").lower() == "shared",
                   fields.get("links", "queue").lower(), float(fields.get("burst", 0)),
                   calls == "back-to-back"), total
