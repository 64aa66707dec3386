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
