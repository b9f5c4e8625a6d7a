"""A long soak with an independent checker (issue 40 §6).

Runs `cfp emulator` (two regions, the lease container on a 400 RU/s budget), a receiver (the
user's service, `receiver.py`), a writer and `--workers` `cfp worker` processes over
`--partitions` × `--leases-per-partition` leases for `--duration`, while a schedule drawn from
`--seed` mixes every fault we can make (`schedule.py`). Then it waits (bounded) until every
document's latest version arrived, stops everything and runs the checker (`check.py`) over the
logs it kept in `--out`:

- `writes.jsonl`     every acknowledged write: id, partition key, version, sequence, range, LSN
- `deliveries.jsonl` every batch the receiver answered (see receiver.py)
- `leases.jsonl`     the lease container, read about every second (changes only)
- `faults.jsonl`     the schedule: kind, start, end, details
- `processes.jsonl`  every worker process: name, process tag, skew, in-flight batches, start
- `exits.jsonl`      every worker that exited by itself (restarted then, as Kubernetes would)
- `workers/`, `emulator.log`   their logs, each line prefixed with the soak's wall-clock time

Exit code 0 when the checker found nothing, 1 when it did, 2 when the soak itself failed.
Usage: soak.py --cfp PATH [--seed N] [--duration 30m] [--out DIR]
"""
import argparse
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check  # noqa: E402
import cosmos  # noqa: E402
import schedule  # noqa: E402
from processes import Process, SoakError, libfaketime, start_emulator  # noqa: E402
from traffic import Deliveries, Snapshots, Writer  # noqa: E402

DB, ITEMS, LEASES = "db", "items", "leases"


def free_port():
    """A loopback port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def seconds(text):
    """`90s`, `2m`, `1h` or a number of seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    if text and text[-1] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text)


class Slot:
    """One of the `--workers` places: the process that runs there now and how it runs."""

    def __init__(self, index, skew, in_flight):
        self.index, self.name, self.skew, self.in_flight = index, f"w{index}", skew, in_flight
        self.process, self.since, self.renames, self.port = None, 0.0, 0, 0
        self.acquired = threading.Event()


class Soak:
    """The parts of one soak and the operations the schedule uses."""

    def __init__(self, config):
        self.config = config
        self.out = config.out
        self.processes = 0
        self.stopping = []
        self.extras = []
        self.log_lock = threading.Lock()
        os.makedirs(os.path.join(self.out, "workers"), exist_ok=True)
        skews = {0: "+8s", 1: "-8s"}
        self.slots = [Slot(i, skews.get(i), 2 if i % 2 == 0 else 1) for i in range(config.workers)]

    def log(self, name, entry):
        with self.log_lock, open(os.path.join(self.out, name), "a", encoding="utf-8") as out:
            out.write(json.dumps(entry, separators=(",", ":")) + "\n")

    def control(self, method, action):
        """The emulator's control API: `method` `/_emulator/<action>`, its JSON answer."""
        request = urllib.request.Request(f"{self.endpoint}_emulator/{action}", method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                raw = answer.read()
        except OSError as error:
            raise SoakError(f"{method} _emulator/{action}: {error}") from error
        return json.loads(raw) if raw else {}

    def receiver_control(self, action):
        request = urllib.request.Request(f"{self.receiver_url}_control/{action}", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()

    def partitions(self):
        return self.control("GET", f"ranges?database={DB}&container={ITEMS}")["partitions"]

    def worker_args(self, slot, name, url):
        c = self.config
        return [
            c.cfp, "worker", "--endpoint", self.endpoint, "--database", DB, "--container", ITEMS,
            "--processor", "soak", "--instance", name, "--handler", "http", "--handler-url", url,
            "--leases-per-partition", str(c.leases_per_partition), "--max-items", "50",
            "--poll-interval", c.poll, "--max-in-flight-batches", str(slot.in_flight),
            "--stall-timeout", f"{c.stall:g}s", "--handler-timeout", "10s", "--metrics-port", str(slot.port),
            "--lease-acquire-interval", "1s", "--lease-renew-interval", "1s",
            "--lease-expiration", f"{c.expiration:g}s",
        ]

    def spawn(self, slot, name, kind):
        """A `cfp worker` named `name` in `slot`'s clock, posting to `/<kind>/<name>/<process>`."""
        self.processes += 1
        tag = f"{name}/{self.processes}"
        env = {"RUST_LOG": os.environ.get("CFP_SOAK_RUST_LOG", "warn,changefeed_operator::processor::run::coordinator=info")}
        if slot.skew:
            env.update({"LD_PRELOAD": libfaketime(), "FAKETIME": slot.skew, "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
        acquired = threading.Event()
        on_line = (lambda line: acquired.set() if "lease acquired" in line else None)
        log = os.path.join(self.out, "workers", f"{name}.{self.processes}.log")
        process = Process(self.worker_args(slot, name, f"{self.receiver_url}{kind}/{tag}"), log, env, on_line)
        self.log("processes.jsonl", {"t": time.time(), "name": name, "process": tag, "kind": kind,
                                     "skew": slot.skew, "in_flight": slot.in_flight, "pid": process.pid})
        return process, acquired

    def start_worker(self, slot):
        slot.port = free_port()
        slot.process, slot.acquired = self.spawn(slot, slot.name, "w")
        slot.since = time.monotonic()

    def start_extra(self):
        """A worker more, under a new name, beside the `--workers` slots (a replica autoscaling
        adds); `stop` stops it when the schedule did not."""
        extra = Slot(len(self.slots) + len(self.extras), None, 1)
        extra.name = f"x{len(self.extras) + 1}"
        self.extras.append(extra)
        self.start_worker(extra)
        return extra

    def wait_ready(self, slot, timeout):
        """Whether `slot`'s worker answered 200 on `/readyz` within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and slot.process.running():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{slot.port}/readyz", timeout=2) as answer:
                    if answer.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def stop_later(self, process):
        """Stops `process` (SIGTERM, `kill -9` after 30 s) without waiting; `stop` reaps it."""
        self.stopping.append(process)
        threading.Thread(target=process.terminate, args=(30.0,), daemon=True).start()

    def rename(self, slot):
        slot.renames += 1
        slot.name = f"w{slot.index}-r{slot.renames}"

    def run_twin(self, slot, timeout):
        """Starts a second process under `slot`'s name; its exit code (None: it still ran after
        `timeout` seconds, and was killed)."""
        port, slot.port = slot.port, free_port()
        twin, _ = self.spawn(slot, slot.name, "twin")
        slot.port = port
        code = twin.wait(timeout)
        if code is None:
            twin.kill()
        return code

    def supervise(self):
        """Restarts, as Kubernetes restarts a pod's container, every worker whose process exited
        by itself (not by a fault: those are restarted by the fault); logs each exit with the last
        line of its log."""
        for slot in self.slots:
            code = slot.process.popen.poll() if slot.process is not None else None
            if code is None:
                continue
            last = ""
            with open(slot.process.log_path, encoding="utf-8", errors="replace") as log:
                for line in log:
                    last = line.strip()
            self.log("exits.jsonl", {"t": time.time(), "name": slot.name, "exit": code, "last": last[-300:]})
            print(f"{time.time() - self.started_at:7.1f}s worker {slot.name} exited ({code}): {last[-160:]}",
                  flush=True)
            self.start_worker(slot)

    def fault(self, kind, action, rng):
        """Runs one fault of the schedule (after restarting workers that exited) and logs it."""
        self.supervise()
        start = time.time()
        try:
            detail = action(self, rng)
        except (SoakError, OSError, KeyError, IndexError, ValueError) as error:
            detail = {"error": str(error)}
        self.log("faults.jsonl", {"kind": kind, "start": start, "end": time.time(), **detail})
        print(f"{start - self.started_at:7.1f}s {kind} {json.dumps(detail)[:160]}", flush=True)

    def start(self):
        """The emulator, the receiver, the writer, the lease snapshots and the workers."""
        c = self.config
        self.emulator, regions = start_emulator(c.cfp, self.out, [
            "--container", f"{DB}/{ITEMS}:/pk:{c.partitions}", "--container", f"{DB}/{LEASES}:/id:1",
            "--throughput", f"{DB}/{LEASES}={c.lease_budget}", "--throughput", f"{DB}/{ITEMS}=800", "--region", "East US", "--region", "West US",
        ])
        self.endpoint = regions["East US"]
        port_file = os.path.join(self.out, "receiver.port")
        here = os.path.dirname(os.path.abspath(__file__))
        self.receiver = Process([sys.executable, os.path.join(here, "receiver.py"), "--port-file", port_file,
                                 "--log", os.path.join(self.out, "deliveries.jsonl")],
                                os.path.join(self.out, "receiver.log"))
        deadline = time.monotonic() + 20
        while not os.path.exists(port_file):
            if time.monotonic() > deadline or not self.receiver.running():
                raise SoakError("the receiver did not start within 20 s")
            time.sleep(0.05)
        with open(port_file, encoding="utf-8") as f:
            self.receiver_url = f"http://127.0.0.1:{f.read().strip()}/"
        self.started_at = time.time()
        self.writer = Writer(self.endpoint, os.path.join(self.out, "writes.jsonl"), c)
        self.snapshots = Snapshots(cosmos.Account(self.endpoint), os.path.join(self.out, "leases.jsonl"))
        self.writer.start()
        self.snapshots.start()
        for slot in self.slots:
            self.start_worker(slot)

    def wait_for_owners(self, timeout):
        """Waits until every lease has an owner (the processor's start); seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            leases = self.snapshots.latest
            if len(leases) >= self.config.partitions * self.config.leases_per_partition and all(
                    owner for owner, _ in leases.values()):
                return time.monotonic() - started
            time.sleep(0.5)
        raise SoakError(f"the leases did not all get an owner within {timeout:.0f} s")

    def drain(self, timeout):
        """Stops writing, ends every fault still on, and waits until every document's latest
        version was delivered; answers (seconds waited, versions still missing)."""
        self.writer.stop()
        self.supervise()
        for slot in self.slots:
            slot.process.signal(signal.SIGCONT)  # a worker a failed fault left frozen
        for action in ("faults", "hang"):
            try:
                self.control("DELETE", action)
            except SoakError:
                pass
        deliveries = Deliveries(os.path.join(self.out, "deliveries.jsonl"))
        started = time.monotonic()
        while True:
            missing = deliveries.missing(self.writer.latest)
            waited = time.monotonic() - started
            if not missing or waited > timeout:
                return waited, len(missing)
            time.sleep(1.0)

    def stop(self):
        """Stops the workers (SIGTERM), the writer, the snapshots, the receiver and the emulator."""
        for slot in self.slots:
            if slot.process is not None:
                slot.process.terminate()
        for process in self.stopping + [extra.process for extra in self.extras]:
            process.terminate()
        for part in ("writer", "snapshots"):
            if hasattr(self, part):
                getattr(self, part).stop()
        for part in ("receiver", "emulator"):
            if hasattr(self, part):
                getattr(self, part).terminate(10)


def arguments(argv):
    parser = argparse.ArgumentParser(description="A long soak of cfp worker under every fault, with an independent checker.")
    parser.add_argument("--cfp", required=True, help="the cfp binary")
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--duration", type=seconds, default=seconds("30m"), help="how long faults are made (90s, 2m, 1h)")
    parser.add_argument("--rounds", type=int, help="at most this many rounds of the schedule")
    parser.add_argument("--out", help="where the logs go (default /tmp/soak-<seed>-<time>)")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--leases-per-partition", type=int, default=16)
    parser.add_argument("--rate", type=float, default=20.0, help="writes per second")
    parser.add_argument("--keys", type=int, default=4096, help="partition key values")
    parser.add_argument("--writers", type=int, default=4, help="writing threads (each its own keys)")
    parser.add_argument("--poll", default="2s", help="the workers' --poll-interval")
    parser.add_argument("--expiration", type=float, default=5.0, help="the workers' --lease-expiration, seconds")
    parser.add_argument("--stall", type=float, default=8.0, help="the workers' --stall-timeout, seconds")
    parser.add_argument("--lease-budget", type=int, default=1000, help="the lease container's RU/s")
    parser.add_argument("--gap", type=float, default=1.0,
                        help="the shortest pause between two faults, seconds (the longest is 2.5 times it)")
    parser.add_argument("--drain", type=seconds, default=seconds("3m"), help="longest wait for the last deliveries")
    config = parser.parse_args(argv)
    config.out = config.out or f"/tmp/soak-{config.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    return config


def main(argv):
    config = arguments(argv)
    os.makedirs(config.out, exist_ok=True)
    print(f"soak seed {config.seed}, {config.duration:.0f} s, logs in {config.out}", flush=True)
    soak = Soak(config)
    summary = {"seed": config.seed, "duration": config.duration, "workers": config.workers,
               "partitions": config.partitions, "leasesPerPartition": config.leases_per_partition,
               "rate": config.rate, "writers": config.writers, "poll": config.poll,
               "expiration": config.expiration, "stall": config.stall, "load": os.getloadavg()}
    try:
        soak.start()
        summary["ownedAfter"] = round(soak.wait_for_owners(120), 1)
        summary["rounds"] = schedule.run(soak, random.Random(config.seed), time.monotonic() + config.duration,
                                          config.rounds)
        summary["drainSeconds"], summary["missingAtDrain"] = soak.drain(config.drain)
        summary["stopping"] = time.time()
        summary["writesRetried"] = soak.writer.retried()
        if soak.writer.error:
            raise SoakError(f"the writer failed: {soak.writer.error}")
    except SoakError as error:
        print(f"soak failed: {error} (logs in {config.out})", flush=True)
        return 2
    finally:
        summary["wallSeconds"] = round(time.time() - soak.started_at, 1) if hasattr(soak, "started_at") else 0
        summary["loadAfter"] = os.getloadavg()
        soak.stop()
        with open(os.path.join(config.out, "summary.json"), "w", encoding="utf-8") as out:
            json.dump(summary, out, indent=1)
    return check.main([config.out])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
