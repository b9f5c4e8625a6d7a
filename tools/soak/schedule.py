"""The faults of a soak, one function each, and the seeded schedule that mixes them: every round
runs each kind once in an order drawn from the seed, with a pause drawn from it between two;
rounds follow each other until the duration is over (the last one runs to its end).

Each fault takes the soak and the schedule's random generator, does what it says with real parts
(signals to real processes, the emulator's control API, the receiver's), waits for what it needs
with a bound, and answers a dict of details for the fault log.
"""
import signal
import time

KINDS = [
    "kill", "freeze", "throttle", "outage", "flaky", "split", "merge", "failover",
    "slow_handler", "twin", "rolling_restart", "replace", "slow_store", "hang",
    "slow_scale_out", "freeze_split", "newcomer_crash", "throttled_handoff",
]
FAULT_SECONDS = 4.0


def kill(soak, rng):
    """`kill -9` of a worker, restarted under its name 300 ms later."""
    slot = rng.choice(soak.slots)
    slot.process.kill()
    time.sleep(0.3)
    soak.start_worker(slot)
    return {"target": slot.name}


def freeze(soak, rng):
    """SIGSTOP of a worker for longer than the lease expiration, then SIGCONT."""
    slot = rng.choice(soak.slots)
    slot.process.signal(signal.SIGSTOP)
    time.sleep(soak.config.expiration + 2.0)
    thawed = time.time()
    slot.process.signal(signal.SIGCONT)
    return {"target": slot.name, "thawed": thawed}


def _faults_for(soak, query, seconds, during=None):
    """Injects `query`'s faults for `seconds` (or as long as `during` runs, when longer); the
    faults injected meanwhile, by kind (the emulator counts them from its start)."""
    before = soak.control("GET", "faults").get("injected") or {}
    soak.control("POST", f"faults?{query}")
    started = time.monotonic()
    if during is not None:
        during()
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    totals = soak.control("DELETE", "faults").get("injected") or {}
    return {kind: n - before.get(kind, 0) for kind, n in totals.items() if n > before.get(kind, 0)}


def throttle(soak, rng):
    """A third of the requests answered 429 (and 429/3212) for a while: a spent budget."""
    return {"injected": _faults_for(soak, "rate=0.3&kinds=429,429/3212", FAULT_SECONDS)}


def outage(soak, rng):
    """Every request answered 503 for 3 s."""
    soak.control("POST", "outage?ms=3000")
    time.sleep(3.0)
    return {"ms": 3000}


def flaky(soak, rng):
    """10 % of the requests failed (503, 408, connection resets) for a while."""
    return {"injected": _faults_for(soak, "rate=0.1&kinds=503,408,reset", FAULT_SECONDS)}


def slow_store(soak, rng):
    """Every request answered after 450 to 1,350 ms for a while."""
    _faults_for(soak, "rate=0&kinds=429&latencyMs=900", FAULT_SECONDS)
    return {"latencyMs": 900}


def split(soak, rng):
    """A split of a physical partition of the monitored container."""
    partitions = soak.partitions()
    chosen = rng.choice(partitions)
    after = soak.control("POST", f"split?database=db&container=items&partition={chosen['id']}")
    before = {p["id"] for p in partitions}
    children = [p for p in after.get("partitions", []) if p["id"] not in before]
    return {"partition": chosen, "children": children, "partitions": len(after.get("partitions", []))}


def merge(soak, rng):
    """A merge of two neighbouring physical partitions."""
    partitions = sorted(soak.partitions(), key=lambda p: p["min"])
    if len(partitions) < 2:
        return {"skipped": "one partition"}
    at = rng.randrange(len(partitions) - 1)
    lower, upper = partitions[at], partitions[at + 1]
    after = soak.control("POST", f"merge?database=db&container=items&partitions={lower['id']},{upper['id']}")
    merged = [p for p in after.get("partitions", []) if p["min"] == lower["min"] and p["max"] == upper["max"]]
    return {"merged": [lower, upper], "into": merged[0] if merged else None, "partitions": len(after.get("partitions", []))}


def failover(soak, rng):
    """The write region moves to the other region (both writable for 1 s)."""
    regions = soak.control("GET", "regions")
    other = [r["name"] for r in regions["regions"] if r["name"] != regions["writeRegion"]][0]
    soak.control("POST", f"failover?region={other.replace(' ', '%20')}&windowMs=1000")
    return {"from": regions["writeRegion"], "to": other}


def slow_handler(soak, rng):
    """The receiver answers every batch after 1.5 s for 5 s."""
    soak.receiver_control("slow?ms=1500&seconds=5")
    time.sleep(5.0)
    return {"ms": 1500}


def twin(soak, rng):
    """A second process under the name of a worker that has run for three expirations (one still
    taking its name over after a restart may lose it to the twin, which is right but not what is
    tested here): it must refuse to start (exit non-zero within four expirations) and deliver
    nothing."""
    settled_after = 3 * soak.config.expiration
    oldest = min(s.since for s in soak.slots)
    time.sleep(max(0.0, oldest + settled_after - time.monotonic()))
    slot = rng.choice([s for s in soak.slots if time.monotonic() - s.since >= settled_after] or soak.slots)
    if not slot.process.running():
        return {"skipped": f"{slot.name} is not running"}
    code = soak.run_twin(slot, 4 * soak.config.expiration)
    return {"target": slot.name, "exit": code, "refused": code not in (None, 0)}


def rolling_restart(soak, rng):
    """Every worker in turn replaced as a Deployment's rolling update replaces pods: a new
    process under a new name is started, and once it is ready (`/readyz` answers 200, at most
    30 s) the old one is stopped (SIGTERM; `kill -9` if it has not exited 30 s later)."""
    steps = []
    for slot in soak.slots:
        started, old, old_name = time.monotonic(), slot.process, slot.name
        soak.rename(slot)
        soak.start_worker(slot)
        ready = soak.wait_ready(slot, 30.0)
        soak.stop_later(old)
        steps.append({"old": old_name, "new": slot.name, "ready": ready,
                      "readySeconds": round(time.monotonic() - started, 1)})
    return {"workers": steps}


def replace(soak, rng):
    """A worker stopped (SIGTERM) and replaced by one under a new name."""
    slot = rng.choice(soak.slots)
    old = slot.name
    graceful = slot.process.terminate(30.0)
    soak.rename(slot)
    soak.start_worker(slot)
    return {"target": old, "new": slot.name, "graceful": graceful}


def hang(soak, rng):
    """Change feed reads of one physical partition hang unanswered for longer than the stall
    timeout: the leases over it are found stalled, their readers restarted, then released."""
    chosen = rng.choice(soak.partitions())
    soak.control("POST", f"hang?partition={chosen['id']}&container=items")
    time.sleep(soak.config.stall + 3.0)
    soak.control("DELETE", "hang")
    return {"partition": chosen["id"]}


def slow_scale_out(soak, rng):
    """A worker more joins while every batch takes longer than the lease expiration (the receiver
    answers after the expiration + 2 s, within the handler timeout, for the expiration + 4 s):
    owners hand it leases only once their batch is checkpointed. Then it is stopped (SIGTERM)."""
    ms = int((soak.config.expiration + 2.0) * 1000)
    seconds = soak.config.expiration + 4.0
    soak.receiver_control(f"slow?ms={ms}&seconds={seconds:g}")
    extra = soak.start_extra()
    time.sleep(seconds)
    ready = soak.wait_ready(extra, 30.0)
    graceful = extra.process.terminate(30.0)
    return {"target": extra.name, "ms": ms, "ready": ready, "graceful": graceful}


def freeze_split(soak, rng):
    """A worker frozen (SIGSTOP) past the lease expiration, a partition split meanwhile, then
    SIGCONT: its readers find the split of leases it lost and must split none of them."""
    slot = rng.choice(soak.slots)
    slot.process.signal(signal.SIGSTOP)
    time.sleep(soak.config.expiration + 1.0)
    detail = split(soak, rng)
    time.sleep(1.0)
    thawed = time.time()
    slot.process.signal(signal.SIGCONT)
    return {"target": slot.name, "thawed": thawed, **detail}


def newcomer_crash(soak, rng):
    """`kill -9` of a worker and, within the expiration, one under a new name in its place (a
    replica autoscaling adds as the lag grows): the crashed worker's leases are taken as they
    expire, not held back by the newcomer."""
    slot = rng.choice(soak.slots)
    old = slot.name
    slot.process.kill()
    after = rng.uniform(0.2, 0.9) * soak.config.expiration
    time.sleep(after)
    soak.rename(slot)
    soak.start_worker(slot)
    return {"target": old, "new": slot.name, "after": round(after, 2)}


def throttled_handoff(soak, rng):
    """Half of all requests answered 429 while a worker is replaced (SIGTERM, then one under a
    new name): the releases, the last checkpoints and the takes are paced by the throttling."""
    replaced = {}
    injected = _faults_for(soak, "rate=0.5&kinds=429", FAULT_SECONDS,
                           during=lambda: replaced.update(replace(soak, rng)))
    return {"injected": injected, **replaced}


FAULTS = {name: globals()[name] for name in KINDS}


def run(soak, rng, until, most=None):
    """Runs whole rounds of every kind while the monotonic time is before `until` (at least one:
    the last round runs to its end), at most `most` of them; answers the number of rounds."""
    rounds = 0
    while rounds == 0 or (time.monotonic() < until and (most is None or rounds < most)):
        order = list(KINDS)
        rng.shuffle(order)
        for kind in order:
            soak.fault(kind, FAULTS[kind], rng)
            time.sleep(rng.uniform(soak.config.gap, 2.5 * soak.config.gap))
        rounds += 1
    return rounds
