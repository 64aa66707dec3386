"""Simulator: every algorithm at thousands of ranks, from the same plans the executor runs.

``collectives.simulate(algorithm, ranks=p, nbytes=n, alpha=a, beta=b, gamma=g, **options)``
builds the plan of every rank with the algorithm's own ``build`` (no second copy of any
algorithm exists), then

- runs them through a discrete-event model: a message of m bytes takes alpha + m beta; a
  rank's link is full duplex, a send port and a receive port, each carrying one message at a
  time, in the order of their post time, ties broken by message index (the lower rank, then the
  earlier step, then post order: a deterministic model); a message takes a turn on its
  sender's send port and, on a queue of its own, a turn on its receiver's receive port, and
  ends when both carried it (so a rank sends to one peer while another sends to it, as the
  emulated hosts' links do: docs/concepts.md#a-ranks-link); a rank's step ends when all its messages
  have, and reducing m bytes costs m gamma;
- checks them symbolically (``collectives.symbolic``): every element of every rank's output
  ends reduced from every rank exactly once, FINAL applied once, out of place and in place;
  a broken rule sets ``verified=False`` and ``verify_error`` to the ``PlanError``'s text. The
  check runs at ``verify_count(p, count)`` elements (the plans are built again at that count
  when it is smaller), so that its cost stays bounded at large p.

Scale: the plans are flattened once into numpy arrays (messages matched in post order per
pair and channel); the model runs over those arrays in vectorised waves (``_waves``,
every port serving in (post, index) order), or as an event loop (``timing``) where
waves do not pay (all-to-all queues) or do not apply (zero durations, deadlocks), and the symbolic check
moves every rank that can move in one vectorised wave per step. ``--scale-check`` prints
the wall time per algorithm at 1,024 ranks and, for the logarithmic ones, at 65,536.

Topology: ``Topology(ranks_per_node=k, intra=(alpha, beta), inter=(alpha, beta),
shared_nic=True)`` prices messages inside and between nodes separately; with a shared NIC a
message between nodes takes a turn on the sending node's outgoing link and one on the receiving
node's incoming link (not its ranks' ports; each link its own queue, one message at a time) and
ends when both links carried it, so no algorithm beats the link floor 2(H-1)/H N beta_inter,
and all-to-all traffic keeps every link busy. ``sharing="fair"`` lets a link carry every
message crossing it at once, each at an equal share of its rate (as TCP streams share a link),
and ``burst=BYTES`` takes a shaper's burst off a message that finds its link idle;
``back_to_back=True`` times a call that follows an identical one (each link starts with the
tokens the call before left it). The calibration across hosts predicts with all three
(``--topology ...,nic=shared,links=fair,burst=B,calls=back-to-back``).

CLI: ``python -m collectives.simulator -a ring,tree -p 1024 -b 8 -e 1G [--topology
nodes=128x8,intra=ALPHA:BETA,inter=ALPHA:BETA[,nic=shared]] [--plot F.png] [--timeline F.png]``,
``python -m collectives.simulator --scale-check [--scale-bytes 1M]``, and
``python -m collectives.simulator --calibrate [-a ...] [-b 8] [-e 16M]`` under mpiexec.

Modules: ``core`` (``simulate``, ``SimResult``), ``topology`` (``Topology``), ``timing`` (the
event loop) and ``_waves`` (the same schedule in vectorised waves), ``verification`` (the
symbolic check on atoms or smaller plans), ``scale`` (``scale_check``),
``plots`` (``--plot``, ``timeline``); the CLI is a tool over this package
(collectives/tools/simulate_cli.py). Plans are flattened by ``collectives.flat`` and checked by
``collectives.symbolic``, which ``collectives.verify`` shares. ``collectives.simulate`` is the
function ``collectives.simulator.simulate``.
"""
from ..flat import _Flat, _registry, build_plan, build_plans  # noqa: F401  (build_plans: public here too)
from ..symbolic import EXACT_LIMIT, VERIFY_ELEMENTS, _Verifier, verify_count, verify_plans  # noqa: F401
from .core import SimResult, simulate  # noqa: F401
from .topology import Topology  # noqa: F401
from .verification import _small, verify, verify_flat  # noqa: F401
from .plots import _plot, timeline  # noqa: F401
from .scale import logarithmic, messages_per_rank, scale_check  # noqa: F401
