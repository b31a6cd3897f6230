"""The published PyPI client `ticketing` 0.3.0 (module `saro_ticketing`, line
dialect) against real `ticketing serve` processes this driver starts itself
on free loopback ports.

Usage: python line_client.py --bin target/release/ticketing [--only NAME ...]

Every check waits for an observable (a reply, a status line, a process exit)
with a deadline; none sleeps to let something happen. Exit status 0 when all
checks passed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

from saro_ticketing import TicketBroker, TicketError

# Bounds a check that would otherwise hang on a missing reply.
CHECK_DEADLINE_S = 60.0
READY_S = 10.0
LEASE_S = 30.0

# Our loopback port span, as in runtime-tokio/tests/common/ports.rs: below
# the kernel's ephemeral range, so an outbound connection cannot take a port
# between our probe and the server's bind.
_FIRST_PORT = 20_000
_SPAN = 12_000
_next_port = 0


def free_port() -> int:
    global _next_port
    start = (os.getpid() * 61 + 3_001) % _SPAN
    while _next_port < _SPAN:
        port = _FIRST_PORT + (start + _next_port * 7) % _SPAN
        _next_port += 1
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port")


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


async def until(
    what: str,
    probe: Callable[[], bool],
    deadline_s: float = READY_S,
    seen: Callable[[], object] | None = None,
) -> None:
    """Polls `probe` until it holds; fails with `what` (and `seen()`, what
    was observed instead) at the deadline."""
    deadline = time.monotonic() + deadline_s
    while not probe():
        if time.monotonic() >= deadline:
            observed = f"; seen: {seen()}" if seen else ""
            raise AssertionError(f"timed out after {deadline_s} s waiting for {what}{observed}")
        await asyncio.sleep(0.02)


class Server:
    """One `ticketing serve` child process and its log."""

    def __init__(self, bin_path: str, workdir: Path, name: str, args: list[str], env: dict[str, str] | None = None):
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self.state_dir = workdir / f"{name}-state"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("TICKETING_")}
        full_env.update(env or {})
        self.args = [bin_path, "serve", "--log-level", "warn", "--state-dir", str(self.state_dir), *args]
        self.env = full_env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env)
        log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def wait_listening(self, port: int) -> None:
        def probe() -> bool:
            if not self.alive():
                raise AssertionError(f"{self.name} exited at start: {self.log()}")
            return port_open(port)

        await until(f"{self.name} to listen on {port}", probe)

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    async def stop(self) -> int:
        """SIGTERM, then the exit status (the process is killed after 10 s)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await until(f"{self.name} to exit", lambda: self.proc.poll() is not None)
            finally:
                self.kill()
        return self.proc.returncode

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


class Logs:
    """What a broker logs (the client surfaces `E` lines only here)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)

    def count(self, needle: str) -> int:
        return sum(needle in line for line in self.lines)


async def ready_broker(addrs: list[str], **kwargs: object) -> TicketBroker:
    broker = TicketBroker(addrs, **kwargs)
    assert await broker.wait_ready(READY_S), f"broker for {addrs} not ready"
    return broker


async def expect_error(kind: str, call: Awaitable[object]) -> TicketError:
    try:
        value = await call
    except TicketError as err:
        assert err.kind == kind, f"expected TicketError {kind}, got {err.kind}: {err}"
        return err
    raise AssertionError(f"expected TicketError {kind}, got {value!r}")


# --- checks against one plain loopback server --------------------------------


async def acquire_release(ctx: Context) -> None:
    broker = await ready_broker([ctx.addr])
    first = await broker.acquire("py-basic", 5, LEASE_S)
    assert first.key == "py-basic"
    assert first.token > 0, first
    assert await first.release() is True, "release of the current token"
    second = await broker.acquire("py-basic", 5, LEASE_S)
    assert second.token > first.token, (first, second)
    # The first token is no longer current: the server answers N -> False.
    stale = type(first)(broker, "py-basic", first.token, LEASE_S)
    assert await stale.release() is False, "a stale token must not release"
    assert await second.release() is True
    # Released once: a second release of the same ticket is not sent.
    assert await second.release() is False
    # The `with` form releases on exit: the key is free again at once.
    async with await broker.acquire("py-basic", 5, LEASE_S) as third:
        assert third.token > second.token
    fourth = await broker.acquire("py-basic", 1, LEASE_S)
    assert fourth.token > third.token
    assert await fourth.release() is True
    # The longest lease the server grants on the line dialect.
    longest = await broker.acquire("py-basic", 5, 250)
    assert await longest.release() is True


async def contention(ctx: Context) -> None:
    brokers = [await ready_broker([ctx.addr]) for _ in range(4)]
    tasks_per_broker, ops_per_task = 8, 25
    holder: list[int] = []
    grants: list[int] = []

    async def worker(broker: TicketBroker) -> None:
        for _ in range(ops_per_task):
            ticket = await broker.acquire("py-contended", 30, LEASE_S)
            assert not holder, f"token {ticket.token} granted while {holder} holds py-contended"
            holder.append(ticket.token)
            grants.append(ticket.token)
            # Let every other task run while we hold the key.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            holder.pop()
            assert await ticket.release() is True

    await asyncio.gather(*(worker(b) for b in brokers for _ in range(tasks_per_broker)))
    total = len(brokers) * tasks_per_broker * ops_per_task
    assert len(grants) == total, f"{len(grants)} grants, expected {total}"
    for before, after in zip(grants, grants[1:]):
        assert after > before, f"token {after} granted after {before}"


async def wait_timeout(ctx: Context) -> None:
    holder_broker = await ready_broker([ctx.addr])
    waiter_broker = await ready_broker([ctx.addr])
    held = await holder_broker.acquire("py-timeout", 5, LEASE_S)
    started = time.monotonic()
    await expect_error("timeout", waiter_broker.acquire("py-timeout", 2, LEASE_S))
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 4.0, f"a 2 s wait ended after {elapsed:.2f} s"
    # The timed-out waiter took nothing: the holder still holds.
    assert await held.release() is True
    after = await waiter_broker.acquire("py-timeout", 2, LEASE_S)
    assert after.token > held.token
    assert await after.release() is True


async def lease_expiry(ctx: Context) -> None:
    holder_broker = await ready_broker([ctx.addr])
    waiter_broker = await ready_broker([ctx.addr])
    held = await holder_broker.acquire("py-expiry", 5, 1)
    started = time.monotonic()
    # The holder never releases: its 1 s lease ends (swept within 5 s) and
    # the key goes to the waiter.
    taken = await waiter_broker.acquire("py-expiry", 15, LEASE_S)
    elapsed = time.monotonic() - started
    assert taken.token > held.token, (held, taken)
    assert 0.5 <= elapsed < 10.0, f"hand-over after {elapsed:.2f} s"
    assert await held.release() is False, "an expired lease's token must not release"
    assert await taken.release() is True


async def wait_zero_waits(ctx: Context) -> None:
    # To the 0.3.0 clients wait 0 means "without limit": on a held key it
    # must queue (here until the holder's 1 s lease expires), not fail at once.
    holder_broker = await ready_broker([ctx.addr])
    waiter_broker = await ready_broker([ctx.addr])
    held = await holder_broker.acquire("py-wait-zero", 5, 1)
    taken = await waiter_broker.acquire("py-wait-zero", 0, LEASE_S)
    assert taken.token > held.token, (held, taken)
    assert await taken.release() is True


async def lease_too_long(ctx: Context) -> None:
    logs = Logs()
    broker = await ready_broker([ctx.addr], logger=logs)
    started = time.monotonic()
    # The server answers `Ebad_lease` then `T`: the client raises a timeout
    # at once (well inside the 10 s wait) and logs the reason.
    await expect_error("timeout", broker.acquire("py-lease", 10, 300))
    elapsed = time.monotonic() - started
    assert elapsed < 2.0, f"lease 300 answered after {elapsed:.2f} s"
    await until("the bad_lease line in the client log", lambda: logs.count("bad_lease") >= 1)
    # Nothing was granted or queued: the key is free.
    ticket = await broker.acquire("py-lease", 1, LEASE_S)
    assert await ticket.release() is True


# --- checks against servers of their own -------------------------------------


async def wrong_token(ctx: Context) -> None:
    right = "py-right-token-0123456789"
    port = free_port()
    addr = f"127.0.0.1:{port}"
    server = ctx.server("auth", ["--listen", addr, "--client-token", right])
    server.start()
    try:
        await server.wait_listening(port)
        good = await ready_broker([addr], token=right)
        for token in ("py-wrong-token-0123456789", ""):
            logs = Logs()
            bad = TicketBroker([addr], token=token, logger=logs)
            started = time.monotonic()
            attempt = asyncio.ensure_future(bad.acquire("py-auth", 3, LEASE_S))
            # While the wrong client keeps trying, the key stays free.
            while not attempt.done():
                ticket = await good.acquire("py-auth", 2, LEASE_S)
                assert await ticket.release() is True
                await asyncio.sleep(0.05)
            err = await expect_error("timeout", attempt)
            elapsed = time.monotonic() - started
            rejected = logs.count("auth_failed")
            assert rejected >= 1, f"token {token!r}: no auth_failed seen ({logs.lines[-5:]}; {err})"
            # The server holds each failed handshake for 1 s, so two
            # connections make a few attempts in 3 s, not thousands.
            assert rejected <= 4 * (elapsed + 1), f"token {token!r}: {rejected} rejections in {elapsed:.1f} s"
        last = await good.acquire("py-auth", 2, LEASE_S)
        assert await last.release() is True
    finally:
        assert await server.stop() == 0, server.log()


async def graceful_shutdown(ctx: Context) -> None:
    port = free_port()
    addr = f"127.0.0.1:{port}"
    server = ctx.server("shutdown", ["--listen", addr])
    server.start()
    await server.wait_listening(port)
    logs = Logs()
    broker = await ready_broker([addr], logger=logs)
    ticket = await broker.acquire("py-shutdown", 5, LEASE_S)
    assert ticket.token > 0
    # SIGTERM: each line connection is told `Enot_active`, then closed.
    assert await server.stop() == 0, server.log()
    await until(
        "not_active on both connections",
        lambda: logs.count("not_active") >= 2,
        seen=lambda: logs.lines[-6:],
    )


async def old_client_release_refused(ctx: Context) -> None:
    # A 0.1.0-or-older client releases with `R` + key (no token), so the
    # first 8 key bytes read as a token never issued: `N`, and the server
    # warns (rate-limited) that such clients are unsupported. Played with a
    # raw socket: the published 0.3.0 client cannot send that shape.
    port = free_port()
    addr = f"127.0.0.1:{port}"
    server = ctx.server("old-client", ["--listen", addr])
    server.start()
    try:
        await server.wait_listening(port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        challenge = await reader.readuntil(b"\n")
        nonce = challenge[challenge.index(b" ") + 1 : -1]
        answer = base64.urlsafe_b64encode(hashlib.sha256(nonce).digest()).rstrip(b"=")
        key = b"zzzzzzzz-old-client"
        writer.write(answer + b"\n" + b"R" + key + b"\n")
        await writer.drain()
        reply = await asyncio.wait_for(reader.readuntil(b"\n"), READY_S)
        assert reply == b"N" + key + b"\n", reply
        writer.close()
        await until(
            "the unsupported-client warning in the server log",
            lambda: "0.1.0-or-older client" in server.log(),
            seen=server.log,
        )
    finally:
        assert await server.stop() == 0, server.log()


class Cluster:
    def __init__(self, ctx: Context, token: str) -> None:
        self.ctx = ctx
        self.client_ports = [free_port() for _ in range(3)]
        self.peer_ports = [free_port() for _ in range(3)]
        self.status_ports = [free_port() for _ in range(3)]
        self.addrs = [f"127.0.0.1:{p}" for p in self.client_ports]
        identity = subprocess.run([ctx.bin, "identity"], check=True, capture_output=True, text=True).stdout.strip()
        slots: list[str] = []
        for c, p in zip(self.client_ports, self.peer_ports):
            slots += ["--slot", f"127.0.0.1:{c},127.0.0.1:{p}"]
        env = {"TICKETING_PEER_TOKENS": f"py-peer-{identity[:24]}", "TICKETING_CLIENT_TOKENS": token}
        self.nodes = [
            ctx.server(
                f"node{i}",
                [
                    "--cluster-identity",
                    identity,
                    "--self-slot",
                    str(i),
                    *slots,
                    "--status-listen",
                    f"127.0.0.1:{self.status_ports[i]}",
                    "--profile",
                    "fast",
                    "--bootstrap",
                ],
                env,
            )
            for i in range(3)
        ]

    def status(self, slot: int) -> dict[str, str]:
        if not self.nodes[slot].alive():
            return {}
        try:
            with socket.create_connection(("127.0.0.1", self.status_ports[slot]), timeout=1) as s:
                data = b""
                while chunk := s.recv(4096):
                    data += chunk
        except OSError:
            return {}
        return dict(field.split("=", 1) for field in data.decode().split() if "=" in field)

    def leader(self) -> int | None:
        """The slot every live node names as leader, once they agree."""
        named = {self.status(i).get("leader") for i in range(3) if self.nodes[i].alive()}
        if len(named) == 1:
            (leader,) = named
            if leader not in (None, "none") and self.status(int(leader)).get("role") == "leader":
                return int(leader)
        return None

    async def start(self) -> None:
        for node in self.nodes:
            node.start()
        for node, port in zip(self.nodes, self.status_ports):
            await node.wait_listening(port)
        await until("a cluster leader", lambda: self.leader() is not None, 20)

    async def stop(self) -> None:
        for node in self.nodes:
            await node.stop()


async def cluster_failover(ctx: Context) -> None:
    token = "py-cluster-token-0123456789"
    cluster = Cluster(ctx, token)
    await cluster.start()
    try:
        logs = Logs()
        broker = await ready_broker(cluster.addrs, token=token, logger=logs)
        old = cluster.leader()
        assert old is not None
        # Every node names the leader right after the handshake (`L`).
        await until(
            "an L notice naming the leader",
            lambda: logs.count(f"leader changed: {cluster.addrs[old]} ") >= 1,
            seen=lambda: logs.lines[-6:],
        )
        last = 0
        for _ in range(5):
            ticket = await broker.acquire("py-cluster", 5, LEASE_S)
            assert ticket.token > last
            last = ticket.token
            assert await ticket.release() is True
        held = await broker.acquire("py-cluster-held", 5, LEASE_S)
        assert held.token > last
        last = held.token
        assert cluster.leader() == old
        cluster.nodes[old].kill()
        started = time.monotonic()
        # The client finds the new leader by itself; its tokens keep growing.
        ticket = await broker.acquire("py-cluster", 15, LEASE_S)
        failover_s = time.monotonic() - started
        assert ticket.token > last, f"token {ticket.token} after {last} across failover"
        last = ticket.token
        assert await ticket.release() is True
        new = cluster.leader()
        assert new is not None and new != old, (old, new)
        await until(
            "an L notice naming the new leader",
            lambda: logs.count(f"leader changed: {cluster.addrs[new]} ") >= 1,
            seen=lambda: logs.lines[-6:],
        )
        # The grant made before the failover survived it.
        await expect_error("timeout", broker.acquire("py-cluster-held", 1, LEASE_S))
        assert await held.release() is True
        for _ in range(5):
            ticket = await broker.acquire("py-cluster-held", 5, LEASE_S)
            assert ticket.token > last
            last = ticket.token
            assert await ticket.release() is True
        print(f"    leader {old} killed; first grant after {failover_s:.2f} s from leader {new}")
    finally:
        await cluster.stop()


class Context:
    def __init__(self, bin_path: str, workdir: Path) -> None:
        self.bin = bin_path
        self.workdir = workdir
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.servers: list[Server] = []

    def server(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Server:
        server = Server(self.bin, self.workdir, name, args, env)
        self.servers.append(server)
        return server


CHECKS: list[Callable[[Context], Awaitable[None]]] = [
    acquire_release,
    contention,
    wait_timeout,
    lease_expiry,
    wait_zero_waits,
    lease_too_long,
    wrong_token,
    graceful_shutdown,
    old_client_release_refused,
    cluster_failover,
]


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True, help="the ticketing binary")
    parser.add_argument("--only", nargs="*", default=None, help="run only these checks")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="ticketing-pyline."))
    ctx = Context(args.bin, workdir)
    main_server = ctx.server("single", ["--listen", ctx.addr])
    main_server.start()
    failed: list[str] = []
    try:
        await main_server.wait_listening(ctx.port)
        for check in CHECKS:
            if args.only and check.__name__ not in args.only:
                continue
            started = time.monotonic()
            try:
                async with asyncio.timeout(CHECK_DEADLINE_S):
                    await check(ctx)
            except BaseException as err:  # noqa: BLE001 - report and go on
                if isinstance(err, KeyboardInterrupt):
                    raise
                failed.append(check.__name__)
                print(f"FAIL {check.__name__} ({time.monotonic() - started:.2f} s)")
                traceback.print_exc(file=sys.stdout)
            else:
                print(f"ok   {check.__name__} ({time.monotonic() - started:.2f} s)")
        status = await main_server.stop()
        if status != 0:
            failed.append("single server clean exit")
            print(f"FAIL the single server exited with {status}")
    finally:
        for server in ctx.servers:
            server.kill()
    for server in ctx.servers:
        log = server.log().strip()
        if log:
            print(f"--- {server.name} log (warnings and above, last lines)")
            print(log)
    if failed:
        print(f"python line-client checks FAILED: {', '.join(failed)}; logs in {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    print("python line-client checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
