"""A fence around the NATS sockets a sandbox's door hands out (``natsdoor``): they reach NATS' servers and nothing else.

A door's socket is made in the node's network, since NATS is there. Connected, it reaches one server; but code in
the sandbox can disconnect it (``connect`` with ``AF_UNSPEC``) and connect it again, to any port the node reaches:
its loopback services, the cloud's metadata service, a ``block_network=True`` function's way out. So the door's
sockets are made by a process of their own, the door smith (``doorsmith``), in a cgroup v2 group of its own, and
that group carries a cgroup BPF egress program (``BPF_CGROUP_INET_EGRESS``) that passes a packet only when its
socket's peer is one of NATS' servers (address and port, as resolved). A socket is judged by the group it was made
in, wherever its descriptor goes and for as long as it lives, even after its group is removed: a door socket pointed
elsewhere sends nothing (its connection attempt is dropped and times out).

The program is eight instructions and a compare per server, assembled here (the kernel's verifier checks it); it is
loaded and attached with the ``bpf`` system call. Where the node does not allow it (no cgroup v2 the agent may
write, no ``CAP_BPF``/``CAP_NET_ADMIN``, another architecture), ``DoorWall.start`` raises ``WallUnavailable`` with
the reason, the agent says so at start and in the node's status, and doors hand out unfenced sockets as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import platform
import socket
import struct
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ember_runtime import hostpid
from ember_runtime.agent import cgroups, doorsmith

log = logging.getLogger("ember.agent")
GROUP_PREFIX = "ember-doors-"  # <the agent's cgroup>/ember-doors-<agent pid>: the smith's group
READY_TIMEOUT_S = 10.0  # the smith's interpreter starts in tens of milliseconds
NR_BPF = {"x86_64": 321, "aarch64": 280}  # the bpf system call's number, by machine
BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
BPF_PROG_TYPE_CGROUP_SKB = 8
BPF_CGROUP_INET_EGRESS = 1
ATTR_SIZE = 128  # bytes of ``union bpf_attr`` passed: the kernel reads what it knows, the rest must be zero
# struct __sk_buff: the socket's family and peer, as a cgroup skb program reads them (uapi/linux/bpf.h)
SKB_FAMILY, SKB_REMOTE_IP4, SKB_REMOTE_IP6, SKB_REMOTE_PORT = 88, 92, 100, 132

Allowed = frozenset[tuple[int, bytes, int]]  # (family, packed address, port) of each NATS server


class WallUnavailable(RuntimeError):
    """This node cannot fence door sockets: the reason."""


def allowed_of(servers: Iterable[tuple[str, int]]) -> Allowed:
    """Every address each ``(host, port)`` resolves to, as the program compares them."""
    found = set()
    for host, port in servers:
        with contextlib.suppress(OSError, UnicodeError):
            for family, _, _, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
                found.add(_entry(family, address))
    return frozenset(found)


def _entry(family: int, address: tuple[Any, ...]) -> tuple[int, bytes, int]:
    """One of ``getaddrinfo``'s answers, ``(host, port, ...)``, as the program compares it."""
    return family, socket.inet_pton(family, str(address[0])), int(address[1])


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def _word(raw: bytes) -> int:
    """Four bytes of network order as the program's 32-bit load sees them, as a signed immediate."""
    return struct.unpack("<i", raw)[0]


def _port(port: int) -> int:
    """``__sk_buff.remote_port`` as loaded: the port in network order in the upper half (on a little-endian CPU)."""
    return struct.unpack("<i", b"\0\0" + struct.pack(">H", port))[0]


LDX_W, MOV64_K, JNE32_K, JA, EXIT = 0x61, 0xB7, 0x56, 0x05, 0x95
Insn = tuple[int, int, int, "int | str", int]  # (opcode, dst, src, offset or the label jumped to, immediate)


def program(allowed: Allowed) -> bytes:
    """The egress program: 1 (pass) for a packet whose socket's peer is in ``allowed``, 0 (drop) for any other.

    r2 = family, r3 = remote port, r4-r7 = the remote address's words (one for IPv4, four for IPv6); for each
    server of that family, compare and jump to the pass on a match; fall through to the drop. With no server
    (none resolved yet), every packet is dropped (the verifier refuses code no jump reaches)."""
    if not allowed:
        return _assemble([(MOV64_K, 0, 0, 0, 0), (EXIT, 0, 0, 0, 0)])
    code: list[Insn | str] = [(LDX_W, 2, 1, SKB_FAMILY, 0), (LDX_W, 3, 1, SKB_REMOTE_PORT, 0),
                              (JNE32_K, 2, 0, "ipv6", socket.AF_INET), (LDX_W, 4, 1, SKB_REMOTE_IP4, 0)]
    for family, raw, port in sorted(allowed):
        if family == socket.AF_INET:
            code += [(JNE32_K, 4, 0, 2, _word(raw)), (JNE32_K, 3, 0, 1, _port(port)), (JA, 0, 0, "pass", 0)]
    code += [(JA, 0, 0, "drop", 0), "ipv6", (JNE32_K, 2, 0, "drop", socket.AF_INET6)]
    code += [(LDX_W, 4 + i, 1, SKB_REMOTE_IP6 + 4 * i, 0) for i in range(4)]
    for family, raw, port in sorted(allowed):
        if family == socket.AF_INET6:
            code += [(JNE32_K, 4 + i, 0, 5 - i, _word(raw[4 * i:4 * i + 4])) for i in range(4)]
            code += [(JNE32_K, 3, 0, 1, _port(port)), (JA, 0, 0, "pass", 0)]
    code += ["drop", (MOV64_K, 0, 0, 0, 0), (EXIT, 0, 0, 0, 0), "pass", (MOV64_K, 0, 0, 0, 1), (EXIT, 0, 0, 0, 0)]
    return _assemble(code)


def _assemble(code: list[Insn | str]) -> bytes:
    """Instructions, with their labels (the strings between them) resolved to relative jumps."""
    labels: dict[str, int] = {}
    real: list[Insn] = []
    for item in code:
        if isinstance(item, str):
            labels[item] = len(real)
        else:
            real.append(item)
    return b"".join(_insn(op, dst, src, labels[off] - at - 1 if isinstance(off, str) else off, imm)
                    for at, (op, dst, src, off, imm) in enumerate(real))


def _bpf(command: int, attr: bytes) -> int:
    number = NR_BPF.get(platform.machine())
    if number is None:
        raise WallUnavailable(f"no bpf system call known for {platform.machine()}")
    buffer = ctypes.create_string_buffer(attr, ATTR_SIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    found = libc.syscall(number, command, buffer, ATTR_SIZE)
    if found < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return int(found)


def load(allowed: Allowed) -> int:
    """The program, loaded: its file descriptor. The verifier's log is in the error when it refuses."""
    code = program(allowed)
    text = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    verifier_log = ctypes.create_string_buffer(16384)
    attr = struct.pack("<IIQQIIQII16sII", BPF_PROG_TYPE_CGROUP_SKB, len(code) // 8, ctypes.addressof(text),
                       ctypes.addressof(license_), 1, len(verifier_log), ctypes.addressof(verifier_log), 0, 0,
                       b"ember_doors", 0, BPF_CGROUP_INET_EGRESS)
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except OSError as exc:
        said = verifier_log.value.decode(errors="replace").strip()
        raise WallUnavailable(f"the kernel refused the door sockets' filter: {exc}{': ' + said if said else ''}") \
            from exc


def attach(group: Path, allowed: Allowed) -> None:
    """Load the program for ``allowed`` and attach it to ``group`` (replacing the one there, at once)."""
    prog = load(allowed)
    try:
        target = os.open(group, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _bpf(BPF_PROG_ATTACH, struct.pack("<IIIII", target, prog, BPF_CGROUP_INET_EGRESS, 0, 0))
        finally:
            os.close(target)
    except OSError as exc:
        raise WallUnavailable(f"cannot attach the door sockets' filter to {group}: {exc}") from exc
    finally:
        os.close(prog)


def sweep(parent: Path) -> int:
    """Remove the smiths' groups of agents no longer running (an agent killed outright leaves its group, empty)."""
    removed = 0
    with contextlib.suppress(OSError):
        for group in parent.glob(f"{GROUP_PREFIX}*"):
            pid = group.name.removeprefix(GROUP_PREFIX)
            if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):  # still holding a process: not empty, kept
                    group.rmdir()
                    removed += 1
    return removed


class DoorWall:
    """This agent's door smith and its fenced group: ``connect`` makes a socket that reaches NATS and nothing else."""

    def __init__(self, group: Path, allowed: Allowed, smith: subprocess.Popen[bytes], channel: socket.socket) -> None:
        self.group = group
        self._allowed = allowed
        self._smith = smith
        self._channel = channel

    @classmethod
    def start(cls, servers: Iterable[tuple[str, int]]) -> DoorWall:
        """A group of this agent's own with the filter for ``servers`` attached, and the smith in it, ready."""
        mount, own = cgroups.cgroup2_mount(), cgroups.own_cgroup()
        if mount is None or not own:
            raise WallUnavailable("this node has no cgroup v2 hierarchy")
        parent = mount / own.lstrip("/")
        if parent.name == cgroups.AGENT_LEAF:  # an agent started before moved itself to a leaf: its parent is ours
            parent = parent.parent
        sweep(parent)
        group = parent / f"{GROUP_PREFIX}{os.getpid()}"
        try:
            group.mkdir(exist_ok=True)
        except OSError as exc:
            raise WallUnavailable(f"cannot make a cgroup in {parent}: {exc}") from exc
        allowed = allowed_of(servers)
        try:
            attach(group, allowed)
            return cls(group, allowed, *_start_smith(group))
        except WallUnavailable:
            with contextlib.suppress(OSError):
                group.rmdir()
            raise

    async def connect(self, server: tuple[str, int]) -> socket.socket:
        """A TCP socket connected to NATS server ``server`` (a ``(host, port)`` of the node's NATS URL), made by the
        smith; its addresses are added to the filter first where they are new (a name that resolves anew)."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(*server, type=socket.SOCK_STREAM)
        entries = [(family, address) for family, _, _, _, address in infos]
        new = {_entry(family, address) for family, address in entries} - self._allowed
        if new:
            attach(self.group, self._allowed | new)
            self._allowed = self._allowed | new
        last: OSError = OSError(f"{server[0]} did not resolve")
        for family, address in entries:
            try:
                return await self._made(family, str(address[0]), int(address[1]))
            except OSError as exc:
                last = exc
        raise last

    async def _made(self, family: int, host: str, port: int) -> socket.socket:
        loop = asyncio.get_running_loop()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with mine:
            with theirs:
                if self._smith.poll() is not None:
                    raise ConnectionError(f"the door smith exited ({self._smith.returncode})")
                socket.send_fds(self._channel, [f"{family} {host} {port}".encode()], [theirs.fileno()])
            mine.setblocking(False)
            await hostpid.readable(loop, mine)
            message, fds, _, _ = socket.recv_fds(mine, 512, 1)
        if not fds:
            raise ConnectionRefusedError(message.decode(errors="replace").removeprefix("no ") or
                                         "the door smith did not answer")
        tcp = socket.socket(fileno=fds[0])
        tcp.setblocking(False)
        return tcp

    def close(self) -> None:
        """Stop the smith and remove its group (the sockets it made stay fenced: they hold the group's filter)."""
        self._channel.close()
        try:
            self._smith.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._smith.kill()
            self._smith.wait()
        with contextlib.suppress(OSError):
            self.group.rmdir()


def _start_smith(group: Path) -> tuple[subprocess.Popen[bytes], socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with theirs:
        try:
            smith = subprocess.Popen([sys.executable, "-I", "-S", doorsmith.__file__, str(group),
                                      str(theirs.fileno())], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError as exc:
            ours.close()
            raise WallUnavailable(f"cannot start the door smith: {exc}") from exc
    ours.settimeout(READY_TIMEOUT_S)
    try:
        said = ours.recv(512)
    except OSError:
        said = b""
    if said != doorsmith.READY:
        ours.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            smith.wait(timeout=READY_TIMEOUT_S)
        smith.kill()
        smith.wait()
        raise WallUnavailable(f"the door smith could not join {group}: "
                              f"{said.decode(errors='replace').removeprefix('no ').strip()[-300:] or 'no answer'}")
    ours.setblocking(True)
    return smith, ours

