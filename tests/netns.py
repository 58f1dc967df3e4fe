"""Hosts on this machine: Linux network namespaces on one bridge, for tests of what crosses a
network (several machines' commands, a lost link). Needs root (``ip netns``); the test skips
without it, saying so.

Each host is a namespace with its loopback up and one veth to the bridge ``rsbr<id>`` in the
caller's namespace, which has the address ``.1`` of a ``10.77.x.0/24`` of its own (the test
process reaches every host through it); host ``i`` is ``.{11 + i}``. :meth:`Hosts.link` cuts or restores one host's
link (its veth's bridge end). Everything is removed on :meth:`Hosts.close`, processes first.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def require_netns() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make network namespaces")


_made = itertools.count()


class Hosts:
    def __init__(self, names: list[str]) -> None:  # at most 10 hosts
        require_netns()
        n = next(_made)
        self.tag = f"{os.getpid() % 10000}{n % 10}"
        self.bridge = f"rsbr{self.tag}"
        subnet = self.subnet = f"10.77.{(os.getpid() + n) % 250}"  # its own, beside others
        self.names = names
        self.procs: list[subprocess.Popen[bytes]] = []
        self._made: list[str] = []
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{subnet}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, name in enumerate(names):
                ns, outer = self.ns(name), self.veth(name)
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip("link", "add", outer, "type", "veth", "peer", "name", f"in{self.tag}{i}")
                _ip("link", "set", f"in{self.tag}{i}", "netns", ns)
                _ip("link", "set", outer, "master", self.bridge)
                _ip("link", "set", outer, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "link", "set", f"in{self.tag}{i}", "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise

    def ns(self, name: str) -> str:
        return f"rs{self.tag}-{name}"

    def veth(self, name: str) -> str:
        return f"rv{self.tag}{self.names.index(name)}"

    def address(self, name: str) -> str:
        return f"{self.subnet}.{11 + self.names.index(name)}"

    def run(self, name: str, cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
        """``cmd`` on host ``name``, its output to ``log``, in a process group of its own."""
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns(name), *cmd],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def link(self, name: str, up: bool) -> None:
        _ip("link", "set", self.veth(name), "up" if up else "down")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)
        for ns in self._made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for i in range(len(self.names)):
            subprocess.run(
                ["ip", "link", "del", f"rv{self.tag}{i}"], capture_output=True, timeout=30
            )
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)
