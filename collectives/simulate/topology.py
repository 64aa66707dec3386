"""Hosts for the simulator: which node each rank is on, and the (alpha, beta) of messages inside
a node and between nodes."""
from dataclasses import dataclass


@dataclass
class Topology:
    """Nodes of ``ranks_per_node`` ranks; (alpha, beta) inside a node and between nodes. With
    ``shared_nic``, a message between nodes holds the two nodes' links (one per direction, shared
    by the node's ranks) instead of its ranks' ports; without, it holds the ranks' ports only."""
    ranks_per_node: int
    intra: tuple
    inter: tuple
    shared_nic: bool = False

    def node(self, rank):
        return rank // self.ranks_per_node

    @classmethod
    def parse(cls, text, alpha, beta):
        """``nodes=128x8,intra=A:B,inter=A:B,nic=shared`` (nodes = count x ranks per node)."""
        fields = dict(part.split("=", 1) for part in text.split(",") if part)
        unknown = set(fields) - {"nodes", "intra", "inter", "nic"}
        if unknown:
            raise ValueError(f"unknown topology field(s) {', '.join(sorted(unknown))}; "
                             f"valid: nodes, intra, inter, nic")
        if "nodes" not in fields:
            raise ValueError("topology needs nodes=COUNTxRANKS_PER_NODE")
        count, per_node = (int(x) for x in fields["nodes"].lower().split("x"))
        pair = lambda s: tuple(float(x) for x in s.split(":"))  # noqa: E731
        intra = pair(fields["intra"]) if "intra" in fields else (alpha, beta)
        inter = pair(fields["inter"]) if "inter" in fields else (alpha, beta)
        if fields.get("nic", "").lower() not in ("", "shared", "private"):
            raise ValueError("nic must be 'shared' or 'private'")
        return cls(per_node, intra, inter, fields.get("nic", "").lower() == "shared"), count * per_node
