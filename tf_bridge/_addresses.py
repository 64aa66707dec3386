"""Worker addresses for TensorFlow under MPI: one every worker can reach, checked before use.

How a rank's address is chosen (``address=`` of tf_config_from_mpi, else COLLECTIVES_TF_ADDRESS,
else ``auto``):

* ``auto``: 127.0.0.1 when every rank runs on one node. Otherwise the rank's host name, where that
  name resolves to an address other than loopback on every rank, followed by its interface address
  (below) as a second choice; the first of the two that every rank reaches is used.
* ``hostname``: the host name (``socket.gethostname()``).
* ``interface``: the IPv4 address of the interface that reaches the other nodes: of this rank's
  interfaces that are up (loopback aside), the one whose subnet holds an address of the most other
  nodes, ties going to an interface named in UCX_NET_DEVICES (the one MPI's UCX uses), then to the
  kernel's order; where no subnet is shared, the source address the kernel's routes give towards
  the other nodes' addresses.
* the name of a network interface (``eth0``): that interface's IPv4 address.
* anything else: this rank's address, as given (a host name or an IP address).

Then every rank listens on its port and connects to every worker's candidate addresses at once,
each connection bounded (REACH_LIMIT, and half of COLLECTIVES_TIMEOUT); the outcomes are exchanged
and a worker no candidate of which every rank reached is named, with the ranks that failed and
why, in the same CollectiveError on every rank.
"""
import errno
import os
import selectors
import socket
import struct
import sys
import threading
import time

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no interface list, host names and given addresses only
    fcntl = None

import collectives
from collectives import config
from collectives.errors import CollectiveError

ENV = "COLLECTIVES_TF_ADDRESS"
MODES = ("auto", "hostname", "interface")
CHOICES = "auto, hostname, interface, an interface name or an address"
RESOLVE_LIMIT = 5.0  # seconds, at most, for resolving the workers' host names (and a quarter of the timeout)
REACH_LIMIT = 10.0  # seconds, at most, for the connection checks (and half of the timeout)
_BATCH = 256  # connections open at once per rank during the check

_SIOCGIFFLAGS, _SIOCGIFADDR, _SIOCGIFNETMASK = 0x8913, 0x8915, 0x891B
_IFF_UP, _IFF_LOOPBACK = 0x1, 0x8


def requested(address=None):
    """(kind, value) of the address choice: ``address``, else COLLECTIVES_TF_ADDRESS, else auto.
    kind is one of MODES, ``"device"`` (a network interface's name) or ``"given"``."""
    raw = os.environ.get(ENV, "") if address is None else address
    if not isinstance(raw, str):
        raise TypeError(f"address must be a string ({CHOICES}), got {type(raw).__name__}")
    value = raw.strip()
    if value.lower() in MODES or not value:
        return (value.lower() or "auto"), None
    if value in _device_names():
        return "device", value
    return "given", value


def _device_names():
    try:
        return {name for _, name in socket.if_nameindex()}
    except OSError:
        return set()


def interfaces():
    """(name, IPv4 address, netmask) of every interface that is up and not loopback, in the
    kernel's order (Linux; elsewhere an empty list)."""
    if fcntl is None or not sys.platform.startswith("linux"):
        return []
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack_from("H", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request), 16)[0]
                if not flags & _IFF_UP or flags & _IFF_LOOPBACK:
                    continue
                address = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)[20:24])
                mask = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), _SIOCGIFNETMASK, request)[20:24])
            except OSError:  # no IPv4 address on it
                continue
            found.append((name, address, mask))
    return found


def _on_subnet(address, mask, other):
    a, m, o = (struct.unpack("!I", socket.inet_aton(x))[0] for x in (address, mask, other))
    return a & m == o & m


def _route_source(destination):
    """The source address the kernel's routes give towards ``destination`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((destination, 9))
            return sock.getsockname()[0]
    except OSError:
        return None


def interface_address(mine, others, preferred=()):
    """The address of the interface in ``mine`` that reaches the nodes whose interfaces are
    ``others`` (one list per other node), by the rule in this module's docstring; None when
    ``mine`` is empty."""
    if not mine:
        return None
    order = sorted(range(len(mine)), key=lambda i: mine[i][0] not in preferred)  # stable: kernel order
    reached = [sum(any(_on_subnet(mine[i][1], mine[i][2], theirs[1]) for theirs in node) for node in others)
               for i in range(len(mine))]
    best = max(order, key=lambda i: reached[i])  # the first of the most reached, in preference order
    if reached[best]:
        return mine[best][1]
    ours = {address for _, address, _ in mine}
    for node in others:
        for _, address, _ in node:
            source = _route_source(address)
            if source in ours:
                return source
    return mine[order[0]][1]


def _lookups(names, limit, lookup):
    """{name: lookup(name)} for every name, the lookups run at once (threads of their own) and
    given ``limit`` seconds in all; a name not answered by then maps to why not."""
    found = {name: f"name not resolved within {limit:g} s" for name in names}

    def run(name):
        try:
            found[name] = lookup(socket.getaddrinfo(name, None, type=socket.SOCK_STREAM))
        except OSError as exc:
            found[name] = f"name not resolved ({exc.strerror or exc})"

    threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in names]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + limit
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return dict(found)


def _off_loopback(infos):
    """None where the lookup gave an address other than loopback, else why not."""
    addresses = {info[4][0] for info in infos}
    if {a for a in addresses if not (a.startswith("127.") or a == "::1")}:
        return None
    return f"resolves to loopback only ({', '.join(sorted(addresses))})"


def _first_address(infos):
    """(family, address) of a lookup's first IPv4 answer (the check listens there), else its first."""
    infos = sorted(infos, key=lambda info: info[0] != socket.AF_INET)
    return infos[0][0], infos[0][4][0]


def host_port(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Listener:
    """A listening socket on every address at a free port, accepting the checks' connections
    until closed (each is reset then, if its client has not reset it first: no TIME_WAIT is left
    on the port, which is then free for TensorFlow's server)."""

    def __init__(self, backlog):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("", 0))
        self.sock.listen(min(max(backlog, 16), socket.SOMAXCONN))
        self.port = self.sock.getsockname()[1]
        self._accepted = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tf_bridge address check", daemon=True)
        self._thread.start()

    def _accept(self):
        with selectors.DefaultSelector() as sel:
            sel.register(self.sock, selectors.EVENT_READ)
            while not self._stop.is_set():
                if sel.select(0.05):
                    try:
                        self._accepted.append(self.sock.accept()[0])
                    except OSError:
                        continue

    def close(self):
        self._stop.set()
        self._thread.join()
        for conn in self._accepted:
            _reset(conn)
        self.sock.close()


def _reset(sock):
    """Close with a reset: no TIME_WAIT is left on either side's port."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def probe(targets, limit):
    """For each (host, port): None if a TCP connection to it completed within ``limit`` seconds
    (all attempted at once, in batches of _BATCH), else why not. Host names are resolved first,
    within the same limit."""
    deadline = time.monotonic() + limit
    names = sorted({host for host, _ in targets if not _is_ip(host)})
    resolved = _lookups(names, limit, _first_address)
    outcome = [None] * len(targets)
    attempts = []  # (target index, sockaddr, family)
    for index, (host, port) in enumerate(targets):
        if _is_ip(host):
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            attempts.append((index, (host, port), family))
        elif isinstance(resolved.get(host), str):
            outcome[index] = resolved[host]
        else:
            family, address = resolved[host]
            attempts.append((index, (address, port), family))
    for start in range(0, len(attempts), _BATCH):
        _connect_all(attempts[start:start + _BATCH], outcome, deadline, limit)
    return outcome


def _is_ip(host):
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return True
        except OSError:
            pass
    return False


def _connect_all(attempts, outcome, deadline, limit):
    sel = selectors.DefaultSelector()
    pending = {}
    try:
        for index, sockaddr, family in attempts:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            code = sock.connect_ex(sockaddr)
            if code in (0, errno.EINPROGRESS, errno.EAGAIN):
                sel.register(sock, selectors.EVENT_WRITE, index)
                pending[index] = sock
            else:
                outcome[index] = os.strerror(code).lower()
                sock.close()
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for key, _ in sel.select(remaining):
                sock, index = key.fileobj, key.data
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                outcome[index] = os.strerror(code).lower() if code else None
                sel.unregister(sock)
                del pending[index]
                _reset(sock)
        for index, sock in pending.items():
            outcome[index] = f"no connection within {limit:g} s"
            sock.close()
    finally:
        sel.close()


def _limits():
    timeout = config.timeout()
    if not timeout:
        return RESOLVE_LIMIT, REACH_LIMIT
    return min(RESOLVE_LIMIT, timeout / 4), min(REACH_LIMIT, timeout / 2)


def _exchange(comm, value):
    """Every rank's ``value``: a bounded barrier first (a rank that never comes is named within
    COLLECTIVES_TIMEOUT), then mpi4py's all-gather, which every rank has then reached."""
    collectives.barrier(comm)
    return comm.allgather(value)


def _ranks(ranks):
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def worker_addresses(comm, address=None, node=None):
    """Every rank's worker address ("host:port"), in rank order, each reached by every rank.

    Collective over ``comm`` (an mpi4py communicator); ``node`` names this rank's node (MPI's
    processor name; ranks with one name share a node). Raises CollectiveError on every rank where
    a rank has no address to offer or a worker cannot be reached, naming them."""
    kind, value = requested(address)
    resolve_limit, reach_limit = _limits()
    hostname = socket.gethostname()
    mine = {"node": node or hostname, "hostname": hostname, "interfaces": interfaces()}
    everyone = _exchange(comm, mine)
    one_node = len({e["node"] for e in everyone}) == 1
    names = [] if one_node else sorted({e["hostname"] for e in everyone})
    # every rank looks every host name up: a name is used only where it resolves on every rank
    verdicts = _exchange(comm, _lookups(names, resolve_limit, _off_loopback))
    usable = {name for name in names if all(v[name] is None for v in verdicts)}
    others = {repr(e["interfaces"]): e["interfaces"] for e in everyone if e["node"] != mine["node"]}
    candidates, problem = _candidates(kind, value, mine, list(others.values()), one_node, usable)
    listener = None
    if problem is None:
        try:
            listener = Listener(2 * comm.Get_size())
        except OSError as exc:
            problem = f"cannot listen on a free port ({exc})"
    try:
        offers = _exchange(comm, (candidates, listener.port if listener else None, problem))
        problems = [(r, p) for r, (_, _, p) in enumerate(offers) if p is not None]
        if problems:
            raise CollectiveError("tf_config_from_mpi: " + "; ".join(
                f"rank {r} (host {everyone[r]['hostname']}) has no worker address: {p}" for r, p in problems)
                + f". Choose one with address= or {ENV} ({CHOICES})")
        targets = [(w, host, port) for w, (hosts, port, _) in enumerate(offers) for host in hosts]
        outcome = _exchange(comm, probe([(host, port) for _, host, port in targets], reach_limit))
    finally:
        if listener is not None:
            listener.close()
    return _chosen(offers, targets, outcome, everyone)


def _candidates(kind, value, mine, others, one_node, usable):
    """(this rank's candidate hosts, None), or ([], why it has none)."""
    if kind == "given":
        return [value], None
    if kind == "hostname":
        return [mine["hostname"]], None
    if kind == "device":
        found = [addr for name, addr, _ in mine["interfaces"] if name == value]
        return (found[:1], None) if found else ([], f"interface {value} has no IPv4 address or is down")
    if kind == "auto" and one_node:
        return ["127.0.0.1"], None
    preferred = {d.split(":")[0] for d in os.environ.get("UCX_NET_DEVICES", "").split(",") if d}
    found = interface_address(mine["interfaces"], others, preferred)
    if kind == "interface":
        if found is None:
            return (["127.0.0.1"], None) if one_node else ([], "it has no IPv4 interface that is up")
        return [found], None
    hosts = [mine["hostname"]] if mine["hostname"] in usable else []
    if found is not None and found not in hosts:
        hosts.append(found)
    if not hosts:
        return [], (f"its host name {mine['hostname']} does not resolve to an address other than loopback on "
                    f"every rank, and it has no IPv4 interface that is up")
    return hosts, None


def _chosen(offers, targets, outcome, everyone):
    """Each worker's first candidate every rank reached, or the CollectiveError naming the ones
    with none."""
    addresses, failures = [], []
    for worker, (hosts, port, _) in enumerate(offers):
        tried = [(i, host) for i, (w, host, _) in enumerate(targets) if w == worker]
        reached = [host for i, host in tried if all(result[i] is None for result in outcome)]
        if reached:
            addresses.append(host_port(reached[0], port))
            continue
        parts = []
        for i, host in tried:
            reasons = {}
            for r, result in enumerate(outcome):
                if result[i] is not None:
                    reasons.setdefault(result[i], []).append(r)
            parts.append(f"{host_port(host, port)} from " + ", ".join(
                f"{_ranks(ranks)} ({why})" for why, ranks in reasons.items()))
        failures.append(f"worker {worker} (rank {worker}, host {everyone[worker]['hostname']}) cannot be reached "
                        f"at " + "; nor at ".join(parts))
    if failures:
        raise CollectiveError("tf_config_from_mpi: " + "; ".join(failures) + ". Every worker must reach every "
                              f"other's address for TensorFlow's gRPC; choose the address with address= or {ENV} "
                              f"({CHOICES})")
    return addresses
