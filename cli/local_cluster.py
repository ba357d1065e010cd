"""A control plane and N agents as processes on this machine: what `drover up`
runs its job on, and what the system tests start."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from drover.control_plane.identity import make_credentials
from drover.planner.ports import free_port

from .client import Target, connect, jobs_pb2, submit_job
from .daemons import STOP_WITH_PARENT

DROVER = [sys.executable, "-m", "drover.cli"]


class LocalClusterError(RuntimeError):
    """A process of the local cluster exited, or what was waited for did not happen in time."""


class LocalCluster:
    """`drover server` (SQLite at WORK_DIR/drover.db, or the database given) and `drover agent` processes node-0 ..
    node-N-1 with K CPU devices each, or the nodes of an emulated cluster (a cluster file:
    paced devices, its NICs and links), started, and waited for until every agent is connected.
    Everything runs over TLS with credentials made in WORK_DIR/certs (the agents with their
    node certificates, this object's calls with the admin token). Logs go to WORK_DIR/logs,
    job inboxes to WORK_DIR/agents, and DATA_ROOT (default WORK_DIR) is the agents' data
    root, where jobs' inputs and outputs lie. `stop()` (or leaving a `with` block) sends SIGTERM to all, as docker does,
    and kills what has not exited 15 s later."""

    def __init__(
        self,
        work_dir: Path,
        nodes: int = 2,
        devices_per_node: int = 2,
        telemetry_interval_s: float = 0.5,
        connect_timeout_s: float = 120.0,
        data_root: Path | None = None,
        spare_nodes: tuple[str, ...] = (),
        model_modules: tuple[str, ...] = (),
        python_path: tuple[str, ...] = (),
        emulate: Path | None = None,
        network=None,
        metrics_port: int = 0,
        log_format: str = "text",
        database: str | None = None,
    ):
        """model_modules and python_path: what custom models' entry points import, and the
        folders they are imported from (cli/models.py's ModelReader found both). emulate: a
        cluster file whose nodes the agents are (nodes and devices_per_node unused). network: a
        NetworkEmulation (cli/netem.py) made from that file: each agent runs in its node's
        namespace and reaches the control plane over the emulated Ethernet. metrics_port: serve
        Prometheus metrics, the server's at 127.0.0.1:PORT and each agent's at the next ports
        in node order (none for agents in network namespaces); `metrics` maps "server" and
        each node to its address. log_format: the daemons' --log-format (text or json).
        database: the server's --db (a SQLAlchemy URL, e.g. PostgreSQL's); default SQLite at
        WORK_DIR/drover.db."""
        self.network = network
        self.work_dir = Path(work_dir)
        self.emulate = Path(emulate).resolve() if emulate else None
        if self.emulate is not None:
            from drover.planner.cluster import load_cluster

            self.nodes = [n.name for n in load_cluster(self.emulate).nodes]
        else:
            self.nodes = [f"node-{i}" for i in range(nodes)]
        self.model_modules, self.python_path = tuple(model_modules), tuple(python_path)
        self.data_root = Path(data_root or work_dir).resolve()
        self.logs = self.work_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.address = f"127.0.0.1:{free_port()}"  # clients
        agent_host = network.control_plane_host if network is not None else "127.0.0.1"
        self.agent_address = f"{agent_host}:{free_port()}"
        # The secure path is the one run: a fresh CA, certificates for the server and every node,
        # and the admin token this cluster's own calls use.
        self.certs = self.work_dir / "certs"
        if self.certs.exists():
            shutil.rmtree(self.certs)
        self.devices_per_node, self.telemetry_interval_s = devices_per_node, telemetry_interval_s
        self.metrics: dict[str, str] = {}
        self.log_format = log_format
        self.database = database or str(self.work_dir / "drover.db")
        if metrics_port:
            self.metrics["server"] = f"127.0.0.1:{metrics_port}"
            if network is None:
                self.metrics |= {name: f"127.0.0.1:{metrics_port + 1 + i}" for i, name in enumerate(self.nodes)}
        names = self.nodes + [n for n in spare_nodes if n not in self.nodes]
        make_credentials(self.certs, names, sorted({"localhost", "127.0.0.1", agent_host}))
        self.target = Target.from_files(self.address, self.certs / "ca.pem", self.certs / "admin.token")
        self._log_files = []
        self.server = self._start_server(log_mode="w")
        self.agents: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()  # nodes killed on purpose (kill_node)
        try:
            for name in self.nodes:
                self.agents[name] = self._start_agent(name, "w")
            self.client = connect(self.target)
            self.stub = self.client.stub  # the raw JobService, for tests that call RPCs directly
            self.wait_until(
                lambda: self.connected_nodes() >= len(self.nodes),
                connect_timeout_s,
                what=f"{len(self.nodes)} agents to connect",
            )
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def connected_nodes(self) -> int:
        return sum(n.connected for n in self.stub.ListNodes(jobs_pb2.ListNodesRequest(), timeout=2).nodes)

    def submit(self, job_file: Path, out_dir: str = ".", resume: str | None = None, reader=None) -> jobs_pb2.Job:
        """Submit a job; its output goes to DATA_ROOT/out_dir (the agents' data root: WORK_DIR
        unless given)."""
        return submit_job(self.client, Path(job_file), out_dir, resume, reader)

    def job(self, job_id: str) -> jobs_pb2.Job:
        return self.client.get(job_id)

    def wait_until(self, predicate, timeout_s: float = 120.0, what: str = "the condition"):
        """Poll `predicate` until it returns something truthy and return that. RPC errors count
        as not yet (the control plane may be starting or restarting); a process of the cluster
        that exits, or the deadline, raises LocalClusterError."""
        deadline = time.time() + timeout_s
        last = "nothing"  # what the last poll saw: in the error, it tells a slow cluster from a broken one
        while time.time() < deadline:
            exited = [(name, p.returncode) for name, p in self._processes() if p.poll() is not None]
            if exited:
                raise LocalClusterError(
                    ", ".join(f"the {name} exited with code {code}" for name, code in exited)
                    + f" while waiting for {what}; logs in {self.logs}"
                )
            try:
                value = predicate()
                if value:
                    return value
                last = repr(value)
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {(exc.details() or '')[:200]}"
            time.sleep(0.2)
        raise LocalClusterError(
            f"timed out after {timeout_s:.0f} s waiting for {what} (last seen: {last}); logs in {self.logs}"
        )

    def restart_server(self) -> None:
        """Kill the control plane (SIGKILL: no clean-up) and start it again on the same address and database."""
        self.server.send_signal(signal.SIGKILL)
        self.server.wait()
        self.server = self._start_server(log_mode="a")

    def stop(self) -> list[int | None]:
        """SIGTERM the agents, then the control plane; their exit codes in that order (None: had to be killed)."""
        processes = [a for name, a in self.agents.items() if name not in self.killed] + [self.server]
        for proc in processes:
            proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in processes:
            try:
                codes.append(proc.wait(timeout=15))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes.append(None)
        for log in self._log_files:
            log.close()
        return codes

    def _processes(self) -> list[tuple[str, subprocess.Popen]]:
        agents = [(f"agent of {name}", a) for name, a in self.agents.items() if name not in self.killed]
        return [("control plane", self.server)] + agents

    def _start_server(self, log_mode: str) -> subprocess.Popen:
        # The database through the environment: a URL may hold a password, and argv is public.
        return self._start(
            [
                "server",
                "--listen",
                self.address,
                "--agent-listen",
                self.agent_address,
                "--tls-dir",
                str(self.certs),
                "--emulation",
                "--log-format",
                self.log_format,
                *(["--metrics", self.metrics["server"]] if "server" in self.metrics else []),
            ],
            "server.log",
            log_mode,
            # Out of the terminal's process group: Ctrl-C reaches drover up alone, which cancels
            # its job through the server before stopping it (the server had stopped first).
            own_group=True,
            env={**os.environ, "DROVER_DB": self.database},
        )

    def _start(
        self,
        args: list[str],
        log_name: str,
        log_mode: str,
        own_group: bool = False,
        env: dict | None = None,
        prefix: tuple[str, ...] = (),
    ) -> subprocess.Popen:
        log = open(self.logs / log_name, log_mode)
        self._log_files.append(log)
        env = {**(os.environ if env is None else env), STOP_WITH_PARENT: str(os.getpid())}  # gone with us
        return subprocess.Popen(
            [*prefix, *DROVER, *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=own_group, env=env
        )

    def _start_agent(self, name: str, log_mode: str) -> subprocess.Popen:
        args = ["agent", "--control-plane", self.agent_address, "--tls-dir", str(self.certs), "--node", name]
        if self.emulate is not None:
            args += ["--emulate", str(self.emulate)]
        else:
            args += ["--cpu-devices", str(self.devices_per_node)]
        args += ["--interval", str(self.telemetry_interval_s), "--log-format", self.log_format]
        if name in self.metrics:
            args += ["--metrics", self.metrics[name]]
        args += ["--work-dir", str(self.work_dir / "agents"), "--data-root", str(self.data_root)]
        env, prefix = dict(os.environ), ()
        if self.model_modules:
            args += ["--model-modules", ",".join(self.model_modules)]
            paths = [*self.python_path, os.environ.get("PYTHONPATH", "")]
            env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        if self.network is not None:  # in the node's namespace (ip netns exec execs: the same process)
            env |= self.network.environment()
            prefix = tuple(self.network.command(name))
        log = f"agent-{name.removeprefix('node-')}.log"
        # In a process group of its own: kill_node takes the agent with its workers.
        return self._start(args, log, log_mode, own_group=True, env=env, prefix=prefix)

    def start_node(self, name: str) -> None:
        """Start (or start again, after kill_node) the agent of node NAME; it must have had a
        certificate made at start-up (a node of the cluster, or one of spare_nodes)."""
        if name in self.agents and name not in self.killed:
            raise LocalClusterError(f"{name} is running")
        mode = "a" if name in self.agents else "w"
        self.killed.discard(name)
        self.agents[name] = self._start_agent(name, mode)

    def kill_node(self, name: str) -> None:
        """Emulate a node failing: SIGKILL its agent and, with it, every worker it started."""
        agent = self.agents[name]
        try:
            os.killpg(agent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        agent.wait()
        self.killed.add(name)
