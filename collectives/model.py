"""The alpha-beta-gamma model's default parameters, written once (select, the simulator, the
plugin checks and the tools read them from here).

alpha: seconds per message; beta: seconds per byte moved; gamma: seconds per byte reduced.
Inside a node: from ping-pong and np.add on this project's 2-core VM. Between hosts, where
nothing better is known: TCP latency and a 10 Gbit/s link per host, shared by its ranks.
"""
ALPHA = 15e-6
BETA = 1 / 2.0e9
GAMMA = 1 / 6.0e9
ALPHA_INTER = 30e-6
BETA_INTER = 1 / 1.25e9

# Over the shared-memory transport (collectives/comm/shm.py) a step is the unit of cost: every
# step publishes a progress counter and waits on its peers' (header writes, polls, the layout of
# its messages: Python work), while each message of a step adds little (a staged copy's setup or
# a peer segment mapped). Bytes cost what they cost over MPI's own shared memory, which copies them
# too. Where the two constants come from: docs/performance.md#cost-model-constants.
ALPHA_SHM_STEP = 15e-6
ALPHA_SHM_MESSAGE = 2e-6

# Over MPI point-to-point within a node, as this library's executor runs a plan, a step costs
# more than MPI's own latency: the executor's Python per step (message views, requests, the poll
# loop) on top of MPICH's. Fitted from recursive doubling (one step at n=2) against the ring (two)
# with no tuning table (docs/performance.md#cost-model-constants).
# auto's cost model within a node over MPI uses it as alpha.
ALPHA_NODE_STEP = 30e-6


def wire_ratio(compression, itemsize):
    """Bytes on the wire per byte of data: a compressed call (bf16, fp16) sends 2 bytes a value."""
    return 1.0 if compression is None else 2.0 / itemsize
