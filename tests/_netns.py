"""Test hosts of the project's own: network namespaces joined by a bridge, for faults a network
makes (a link cut with no FIN and no RST, a host gone, a black hole) that loopback cannot.

Everything lives in namespaces named ``lt19-<random>-<role>``: the bridge itself is in a hub
namespace (``lt19-<random>-hub``), each host's veth pair is made there with its other end
moved into the host, so the host's own interfaces and routes are never touched. Each host has
``/etc/netns/<namespace>/hosts`` (and a ``host.conf`` with ``multi on``), which ``ip netns
exec`` bind-mounts over ``/etc/hosts`` for the processes started in it: rewritten in place (a
rename would leave the mount on the old file), it is a resolver a test changes while a worker
runs. Processes run in a host with ``ip netns exec``; the test's own HTTP clients run in
threads that entered a host's namespace (``Host.clients``). Needs root; ``unavailable`` says
why not, for a skip.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs

__all__ = ["Host", "Topology", "entered", "unavailable"]

IP = shutil.which("ip")
NETNS_ETC = Path("/etc/netns")
SUBNET = "10.199.0"
_CLONE_NEWNET = 0x40000000


def _ip(*args: str) -> None:
    assert IP is not None
    result = subprocess.run([IP, *args], capture_output=True, text=True, check=False)
    if result.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def unavailable() -> str | None:
    """Why network-namespace tests cannot run here (``None``: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if IP is None:
        return "iproute2's ip command is not installed"
    name = f"lt19-{secrets.token_hex(3)}-probe"
    try:
        _ip("netns", "add", name)
    except RuntimeError as exc:
        return f"cannot create a network namespace: {exc}"
    _ip("netns", "del", name)
    return None


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {path}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def _enter(namespace: str) -> None:
    """Move the calling thread (only it) into ``namespace``'s network namespace."""
    _setns(f"/run/netns/{namespace}")


@contextmanager
def entered(namespace: str) -> Iterator[None]:
    """The calling thread in ``namespace`` for the block, then back where it was: the
    connections it makes meanwhile start from that host (and stay there)."""
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _enter(namespace)
        try:
            yield
        finally:
            _setns(f"/proc/self/fd/{back}")
    finally:
        os.close(back)


@attrs.define
class Host:
    """A test host: a namespace with one interface (``eth0``) on the bridge."""

    role: str
    namespace: str
    address: str
    _etc: Path

    def prefix(self) -> list[str]:
        """What runs a command in this host."""
        assert IP is not None
        return [IP, "netns", "exec", self.namespace]

    def write_hosts(self, names: Mapping[str, Sequence[str]]) -> None:
        """Rewrite this host's ``/etc/hosts`` in place: each name resolves to its addresses,
        in this order."""
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        lines += [f"{address} {name}" for name, addresses in names.items() for address in addresses]
        with (self._etc / "hosts").open("r+") as hosts:
            hosts.write("\n".join(lines) + "\n")
            hosts.truncate()

    @contextmanager
    def clients(self, count: int = 8) -> Iterator[concurrent.futures.ThreadPoolExecutor]:
        """Threads inside this host: what they connect to, they connect to from here."""
        with concurrent.futures.ThreadPoolExecutor(
            count, thread_name_prefix=self.role, initializer=_enter, initargs=(self.namespace,)
        ) as pool:
            yield pool


@attrs.define
class Topology:
    """Hosts on one bridge; see the module's docstring. Use :meth:`opened`."""

    prefix: str
    hosts: dict[str, Host] = attrs.field(factory=dict)
    _namespaces: list[str] = attrs.field(factory=list)

    @classmethod
    @contextmanager
    def opened(cls, roles: Sequence[str]) -> Iterator[Topology]:
        """Hosts named ``roles`` (10.199.0.2, .3, ... in that order); all removed on exit,
        after the processes in them are gone (stop them first)."""
        topology = cls(f"lt19-{secrets.token_hex(2)}")
        try:
            topology._add_namespace("hub")
            _ip("-n", topology.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", topology.hub, "link", "set", "br0", "up")
            for index, role in enumerate(roles, start=2):
                topology.add(role, f"{SUBNET}.{index}")
            yield topology
        finally:
            topology.close()

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    def _add_namespace(self, role: str) -> str:
        namespace = f"{self.prefix}-{role}"
        _ip("netns", "add", namespace)
        self._namespaces.append(namespace)
        return namespace

    def add(self, role: str, address: str) -> Host:
        namespace = self._add_namespace(role)
        port = self.port(role)
        _ip("-n", self.hub, "link", "add", port, "type", "veth", "peer", "name", "eth0",
            "netns", namespace)  # fmt: skip
        _ip("-n", self.hub, "link", "set", port, "master", "br0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        etc = NETNS_ETC / namespace
        etc.mkdir(parents=True)
        (etc / "hosts").write_text("127.0.0.1 localhost\n")
        (etc / "host.conf").write_text("multi on\n")  # every address of a name, not the first
        host = Host(role, namespace, address, etc)
        self.hosts[role] = host
        return host

    @staticmethod
    def port(role: str) -> str:
        return f"p-{role}"[:15]

    def cut(self, role: str) -> None:
        """Unplug ``role``'s cable at the bridge: a partition (no FIN, no RST; packets either
        way vanish, and the host sees its link go down)."""
        _ip("-n", self.hub, "link", "set", self.port(role), "down")

    def heal(self, role: str) -> None:
        _ip("-n", self.hub, "link", "set", self.port(role), "up")

    def black_hole(self, role: str, towards: str) -> None:
        """From ``role``, packets to ``towards`` go to a MAC address nobody has: dropped, not
        refused (a SYN gets no answer at all, as into a firewall's drop rule)."""
        target = self.hosts[towards].address
        _ip("-n", self.hosts[role].namespace, "neigh", "replace", target, "lladdr",
            "02:00:00:19:00:99", "dev", "eth0", "nud", "permanent")  # fmt: skip

    def unblock(self, role: str, towards: str) -> None:
        target = self.hosts[towards].address
        _ip("-n", self.hosts[role].namespace, "neigh", "del", target, "dev", "eth0")

    def close(self) -> None:
        for namespace in reversed(self._namespaces):
            subprocess.run(
                [IP or "ip", "netns", "del", namespace], capture_output=True, check=False
            )
            shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)
        self._namespaces.clear()
        with contextlib.suppress(OSError):
            NETNS_ETC.rmdir()  # only when empty: other hosts' files stay
