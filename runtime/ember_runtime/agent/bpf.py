"""The few cgroup BPF programs the door sockets' fence needs (``doorwall``), assembled here and loaded with the
``bpf`` system call: no compiler, no library. Each is a handful of instructions the kernel's verifier checks.

- ``peer_filter(allowed, layout)``: 1 (let through) when the socket's peer, or the address it connects to, is one
  of ``allowed`` (family, address, port), 0 otherwise. ``SKB`` reads a packet's socket (``struct __sk_buff``: a
  ``cgroup_skb`` program, egress or ingress: 0 drops the packet); ``SOCK_ADDR`` reads a ``connect``'s address
  (``struct bpf_sock_addr``: 0 fails the call with ``EPERM``).
- ``refuse_all()``: 0 whatever is asked (a ``bind``: ``EPERM``).

Offsets are those of ``uapi/linux/bpf.h``; words are loaded as a little-endian CPU does (``NR_BPF`` lists the
machines known)."""

from __future__ import annotations

import ctypes
import os
import platform
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

NR_BPF = {"x86_64": 321, "aarch64": 280}  # the bpf system call's number, by machine
BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
CGROUP_SKB, CGROUP_SOCK_ADDR = 8, 18  # program types
INET_INGRESS, INET_EGRESS, INET4_BIND, INET6_BIND, INET4_CONNECT, INET6_CONNECT = 0, 1, 8, 9, 10, 11  # attach types
ATTR_SIZE = 128  # bytes of ``union bpf_attr`` passed: the kernel reads what it knows, the rest must be zero
LDX_W, MOV64_K, JNE32_K, JA, EXIT = 0x61, 0xB7, 0x56, 0x05, 0x95
Insn = tuple[int, int, int, "int | str", int]  # (opcode, dst, src, offset or the label jumped to, immediate)
Allowed = frozenset[tuple[int, bytes, int]]  # (family, packed address, port)


class BpfError(OSError):
    """The kernel refused a program or its attachment: its errno, and the verifier's words where it gave some."""


@dataclass(frozen=True)
class Layout:
    """Where a program's context holds the family, the IPv4 address, the IPv6 address's first word and the port,
    and how its port reads (``__sk_buff.remote_port``: network order in the upper half; ``bpf_sock_addr``'s
    ``user_port``: network order in the lower half)."""

    family: int
    ip4: int
    ip6: int
    port: int
    port_shift: int


SKB = Layout(family=88, ip4=92, ip6=100, port=132, port_shift=16)  # the socket's peer
SOCK_ADDR = Layout(family=0, ip4=4, ip6=8, port=24, port_shift=0)  # the address connect() was given


def _word(raw: bytes) -> int:
    """Four bytes of network order as a 32-bit load sees them, as a signed immediate."""
    return struct.unpack("<i", raw)[0]


def _port(port: int, shift: int) -> int:
    return struct.unpack("<i", struct.pack("<I", struct.unpack("<H", struct.pack(">H", port))[0] << shift))[0]


def peer_filter(allowed: Allowed, layout: Layout, families: tuple[int, ...] = (socket.AF_INET, socket.AF_INET6)
                ) -> bytes:
    """r2 = family, r3 = port, r4-r7 = the address's words (one for IPv4, four for IPv6); for each entry of that
    family, compare and jump to the pass on a match; fall through to the refusal. ``families``: those whose address
    the program reads (a ``connect`` program of one family may read that family's address alone). With no entry of
    them, everything is refused (the verifier refuses code no jump reaches)."""
    entries = sorted(e for e in allowed if e[0] in families)
    if not entries:
        return refuse_all()
    code: list[Insn | str] = [(LDX_W, 2, 1, layout.family, 0), (LDX_W, 3, 1, layout.port, 0)]
    for family in families:
        words = 1 if family == socket.AF_INET else 4
        start = layout.ip4 if family == socket.AF_INET else layout.ip6
        code += [(JNE32_K, 2, 0, f"not-{family}", family)]
        code += [(LDX_W, 4 + i, 1, start + 4 * i, 0) for i in range(words)]
        for _, raw, port in (e for e in entries if e[0] == family):
            code += [(JNE32_K, 4 + i, 0, words + 1 - i, _word(raw[4 * i:4 * i + 4])) for i in range(words)]
            code += [(JNE32_K, 3, 0, 1, _port(port, layout.port_shift)), (JA, 0, 0, "pass", 0)]
        code += [(JA, 0, 0, "refuse", 0), f"not-{family}"]
    code += ["refuse", (MOV64_K, 0, 0, 0, 0), (EXIT, 0, 0, 0, 0), "pass", (MOV64_K, 0, 0, 0, 1), (EXIT, 0, 0, 0, 0)]
    return assemble(code)


def refuse_all() -> bytes:
    return assemble([(MOV64_K, 0, 0, 0, 0), (EXIT, 0, 0, 0, 0)])


def assemble(code: list[Insn | str]) -> bytes:
    """Instructions, with their labels (the strings between them) resolved to relative jumps."""
    labels: dict[str, int] = {}
    real: list[Insn] = []
    for item in code:
        if isinstance(item, str):
            labels[item] = len(real)
        else:
            real.append(item)
    return b"".join(struct.pack("<BBhi", op, (src << 4) | dst, labels[off] - at - 1 if isinstance(off, str) else off,
                                imm) for at, (op, dst, src, off, imm) in enumerate(real))


def _bpf(command: int, attr: bytes) -> int:
    number = NR_BPF.get(platform.machine())
    if number is None:
        raise BpfError(0, f"no bpf system call known for {platform.machine()}")
    buffer = ctypes.create_string_buffer(attr, ATTR_SIZE)
    found = ctypes.CDLL(None, use_errno=True).syscall(number, command, buffer, ATTR_SIZE)
    if found < 0:
        error = ctypes.get_errno()
        raise BpfError(error, os.strerror(error))
    return int(found)


def load(code: bytes, prog_type: int, attach_type: int) -> int:
    """``code`` loaded as a program of ``prog_type`` for ``attach_type``: its file descriptor. Loaded without the
    verifier's log first (a log longer than its buffer fails a good program); when refused, again with it."""
    text, license_ = ctypes.create_string_buffer(code, len(code)), ctypes.create_string_buffer(b"GPL")

    def attr(level: int, log: ctypes.Array[ctypes.c_char] | None) -> bytes:
        return struct.pack("<IIQQIIQII16sII", prog_type, len(code) // 8, ctypes.addressof(text),
                           ctypes.addressof(license_), level, len(log) if log is not None else 0,
                           ctypes.addressof(log) if log is not None else 0, 0, 0, b"ember_doors", 0, attach_type)

    try:
        return _bpf(BPF_PROG_LOAD, attr(0, None))
    except BpfError as exc:
        if exc.errno not in (13, 22):  # EACCES, EINVAL: the verifier's refusals, which its log explains
            raise
    log = ctypes.create_string_buffer(1 << 20)
    try:
        return _bpf(BPF_PROG_LOAD, attr(1, log))
    except BpfError as exc:
        said = log.value.decode(errors="replace").strip()[-600:]
        raise BpfError(exc.errno, f"{exc.strerror}: {said}") from None


def attach(group: Path, code: bytes, prog_type: int, attach_type: int) -> None:
    """Load ``code`` and attach it to cgroup ``group`` at ``attach_type``, replacing the program there at once."""
    prog = load(code, prog_type, attach_type)
    try:
        target = os.open(group, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _bpf(BPF_PROG_ATTACH, struct.pack("<IIIII", target, prog, attach_type, 0, 0))
        finally:
            os.close(target)
    finally:
        os.close(prog)
