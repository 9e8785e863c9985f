"""Two "hosts" on one machine: network namespaces joined by a veth pair (root only).

    with NetnsPair() as net:
        subprocess.Popen(net.command(0, ["python", "-m", "dlscale", "run", ...]), env=net.env(0))

Node i lives in namespace ``net.ns[i]`` with address ``net.addrs[i]`` (10.200.0.1, 10.200.0.2 on
/24) on interface ``net.ifnames[i]``, loopback up. Each command also runs in its own UTS
namespace (``unshare --uts``) with hostname ``net.hostnames[i]``, so the two nodes differ by
hostname as real machines would; ``/etc/netns/NS/hosts`` (which ``ip netns exec`` mounts over
/etc/hosts inside the namespace only) makes both names resolve. Nothing outside the two
namespaces is touched: the veth pair is created and moved into them at once, deleting the
namespaces removes it, and the /etc/netns/NS directories are removed with them.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Sequence

SUBNET = "10.200.0"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    probe = f"dlsprobe{os.getpid()}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"`ip netns add` fails here: {r.stderr.strip()[:200]}"
    try:
        u = subprocess.run(["ip", "netns", "exec", probe, "unshare", "--uts", "true"], capture_output=True,
                           text=True, timeout=30)
        if u.returncode != 0:
            return f"`unshare --uts` fails here: {u.stderr.strip()[:200]}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


class NetnsPair:
    def __init__(self, tag: str | None = None):
        tag = tag or str(os.getpid() % 100000)
        self.ns = [f"dlsA{tag}", f"dlsB{tag}"]
        self.ifnames = [f"dlvA{tag}"[:15], f"dlvB{tag}"[:15]]
        self.addrs = [f"{SUBNET}.1", f"{SUBNET}.2"]
        self.hostnames = [f"dlnode-a-{tag}", f"dlnode-b-{tag}"]

    def __enter__(self) -> "NetnsPair":
        try:
            for ns in self.ns:
                _ip("netns", "add", ns)
            # created in namespace 0 and the peer moved at creation: never in the root namespace
            _ip("-n", self.ns[0], "link", "add", self.ifnames[0], "type", "veth", "peer", "name",
                self.ifnames[1], "netns", self.ns[1])
            for ns, ifname, addr in zip(self.ns, self.ifnames, self.addrs):
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
                _ip("-n", ns, "link", "set", ifname, "up")
            # `ip netns exec` bind-mounts /etc/netns/NS/hosts over /etc/hosts inside the namespace:
            # the two hostnames resolve there (torchrun's c10d rendezvous advertises hostnames)
            hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {h}\n" for a, h in zip(self.addrs, self.hostnames))
            for ns in self.ns:
                d = Path("/etc/netns") / ns
                d.mkdir(parents=True, exist_ok=True)
                (d / "hosts").write_text(hosts)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def pids(self, node: int) -> list[int]:
        """Processes inside node ``node``'s namespace (all started by the test)."""
        r = _ip("netns", "pids", self.ns[node], check=False)
        return [int(x) for x in r.stdout.split() if x.isdigit()]

    def close(self) -> None:
        for node, ns in enumerate(self.ns):
            for pid in self.pids(node):  # leftovers of this test's own commands
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        try:
            Path("/etc/netns").rmdir()  # only when empty (nobody else's namespace config)
        except OSError:
            pass

    def command(self, node: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside node ``node``'s network namespace under its own hostname."""
        return ["ip", "netns", "exec", self.ns[node], "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.hostnames[node], *argv]

    def env(self, node: int, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["GLOO_SOCKET_IFNAME"] = self.ifnames[node]
        env.pop("MASTER_ADDR", None)
        env.pop("MASTER_PORT", None)
        return env
