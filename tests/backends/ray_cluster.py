"""A real multi-node Ray cluster on this machine, for tests: started and stopped by process id.

Each node is a ``ray start --block`` subprocess on its own loopback address (127.0.0.2 for
the head, 127.0.0.3 and up for the others; Ray rewrites 127.0.0.1 to the external address, so
it is never used), with its own ports, its own temp dir and fake GPUs. ``--block`` keeps the
``ray start`` process as the parent of everything the node runs, so stopping a node means
signalling that process tree by pid: never ``ray stop``, which kills every Ray process on
the machine, other users' included.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HEAD_IP = "127.0.0.2"
#: the lowest worker port handed out: clear of Ray's default ports (10001, 8265, 6379)
RANGE_FLOOR = 10100


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct free ports: every socket stays bound until all are chosen, since
    a port the kernel has just handed out and seen closed may be handed out again (Ray
    refuses to start a node that names one port for two of its components)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def free_range(host: str, size: int) -> int:
    """The first port of ``size`` free ports below the ephemeral range (no clash with the
    single ports above, which the kernel picks from that range), and above Ray's fixed
    defaults (a worker node checks its range against the client server's 10001 even though
    only the head runs one)."""
    for _ in range(50):
        base = RANGE_FLOOR + secrets.randbelow(219) * 100
        try:
            socks = []
            for port in range(base, base + size):
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {size} free ports in a row on {host}")


def _ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


#: what a node's log says when starting it again may work: a port it was given is taken (or
#: given twice), or its raylet did not register within the 30 s Ray waits (fixed in Ray's
#: node.py), which a loaded 2-core machine once took, failing a whole group of tests
START_AGAIN = (
    "is trying to use a port number",
    "Address already in use",
    "The node registration may not be complete yet",
)


class NodeExited(RuntimeError):
    """A node's ``ray start`` ended while the cluster was starting; its log's tail says why."""

    def __init__(self, ip: str, log: str) -> None:
        super().__init__(f"ray node {ip} exited early:\n{log}")
        self.log = log


@dataclass
class RayNode:
    ip: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def kill_tree(procs: list[psutil.Process], grace_s: float, sig: int = signal.SIGTERM) -> None:
    """Signal the root of a tree (``ray start --block`` then stops its node) or, for SIGKILL,
    every process; wait, then SIGKILL whatever is left."""
    for proc in procs if sig == signal.SIGKILL else procs[:1]:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
    _gone, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)


@dataclass
class LocalRayCluster:
    """A head and worker nodes on loopback addresses, all under ``root``."""

    root: Path
    cpus_per_node: int = 2
    gpus_per_node: int = 2
    object_store_bytes: int = 150 * 1024 * 1024
    nodes: list[RayNode] = field(default_factory=list)
    port: int = 0
    env: dict[str, str] = field(default_factory=dict)
    #: where the pids of node processes are recorded while they run (tests' leftover check)
    registry: set[int] = field(default_factory=set)

    @property
    def address(self) -> str:
        return f"{HEAD_IP}:{self.port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        return env

    def _start(self, ip: str, head: bool, gpus: int | None = None) -> RayNode:
        temp = self.root / "ray"  # one temp root: session dirs are per cluster below it
        temp.mkdir(parents=True, exist_ok=True)
        log = self.root / f"node-{ip}.log"
        ports = free_ports(ip, 8 if head else 6)  # distinct: Ray checks
        args = [
            _ray_cli(),
            "start",
            "--block",
            f"--node-ip-address={ip}",
            f"--num-cpus={self.cpus_per_node}",
            f"--num-gpus={self.gpus_per_node if gpus is None else gpus}",
            f'--resources={{"node-{ip}": 1}}',
            f"--temp-dir={temp}",
            f"--object-store-memory={self.object_store_bytes}",
            f"--node-manager-port={ports[0]}",
            f"--object-manager-port={ports[1]}",
            f"--dashboard-agent-listen-port={ports[2]}",
            f"--dashboard-agent-grpc-port={ports[3]}",
            f"--metrics-export-port={ports[4]}",
            f"--runtime-env-agent-port={ports[5]}",
            "--disable-usage-stats",
            "--include-log-monitor=false",
        ]
        base = free_range(ip, 100)
        args += [f"--min-worker-port={base}", f"--max-worker-port={base + 99}"]
        if head:
            self.port = ports[6]
            args += [
                "--head",
                f"--port={self.port}",
                f"--ray-client-server-port={ports[7]}",
                "--include-dashboard=false",
                # notice a lost node within about a second, not the default ~30 s
                '--system-config={"health_check_period_ms": 500, '
                '"health_check_failure_threshold": 3, "health_check_timeout_ms": 500}',
            ]
        else:
            args += [f"--address={self.address}"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=self._env(), cwd=self.root
            )
        node = RayNode(ip, proc, log)
        self.nodes.append(node)
        self.registry.add(proc.pid)
        return node

    def _wait_nodes(self, count: int, timeout_s: float = 90.0) -> None:
        """Wait until ``count`` nodes are alive, asking the head through the ``ray`` CLI."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc.poll() is not None:
                    raise NodeExited(node.ip, node.log.read_text()[-3000:])
            if self.alive_nodes() >= count:
                return
            time.sleep(0.5)
        raise TimeoutError(f"Ray cluster at {self.address} did not reach {count} nodes")

    def alive_nodes(self) -> int:
        code = (
            "import ray, sys;"
            f"ray.init(address={self.address!r}, _node_ip_address={HEAD_IP!r},"
            " logging_level='ERROR', log_to_driver=False);"
            "print(sum(1 for n in ray.nodes() if n['Alive']))"
        )
        try:
            out = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                timeout=60,
                env=self._env(),
                check=False,
            )
        except subprocess.TimeoutExpired:
            return 0
        lines = out.stdout.strip().splitlines()
        return int(lines[-1]) if lines and lines[-1].isdigit() else 0

    def start(self, workers: int = 1, tries: int = 2) -> LocalRayCluster:
        """Start the nodes; where one exits because a port chosen for it was taken before
        it bound it (by another cluster on this machine), or because its raylet registered
        too slowly, start them all again (on other ports)."""
        try:
            self._start(HEAD_IP, head=True)
            for i in range(workers):
                self._start(f"127.0.0.{3 + i}", head=False)
            self._wait_nodes(1 + workers)
        except NodeExited as exc:
            self.stop()
            if tries <= 1 or not any(m in exc.log for m in START_AGAIN):
                raise
            return self.start(workers, tries - 1)
        return self

    def add_node(self, ip: str, gpus: int | None = None) -> RayNode:
        node = self._start(ip, head=False, gpus=gpus)
        self._wait_nodes(len(self.nodes))
        return node

    def remove_node(self, node: RayNode, sig: int = signal.SIGKILL) -> None:
        """Take a node away abruptly (``SIGKILL`` to its whole process tree by default)."""
        kill_tree(node.tree(), grace_s=5, sig=sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.proc.wait(timeout=5)
        self.nodes.remove(node)
        self.registry.discard(node.pid)

    def pids(self) -> set[int]:
        return {node.pid for node in self.nodes}

    def stop(self) -> None:
        """Stop worker nodes first, then the head; by pid, SIGTERM then SIGKILL."""
        for node in reversed(list(self.nodes)):
            kill_tree(node.tree(), grace_s=5)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=5)
            self.registry.discard(node.pid)
        self.nodes.clear()
