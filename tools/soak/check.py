"""The soak's checker: reads the logs of a soak (see soak.py) and verifies, with no code of the
processor, what at-least-once delivery under faults promises. Standard library only.

Definitions:
- A *delivery* is a batch the receiver answered 200 (twins' batches are counted apart).
- A *delivery run* is a maximal sequence of one lease's batches, in the order they arrived, all
  delivered by one worker process, with no other process delivering that lease in between, and
  whose change feed positions move forward: a batch whose first `_lsn` is at or before the last
  `_lsn` of a batch of the run answered before it arrived is a *rewind* and starts a new run.
  (Batches in flight together, `--max-in-flight-batches 2`, may arrive in any order: a batch is
  compared with those answered before it arrived.)
- A *fault window* is a fault of the schedule from its start to its end plus `--grace` seconds
  (default three lease expirations and 5 s): the time a crash, a pause or an outage takes to be
  noticed, taken over and replayed. A write of a worker that the lease container's request-unit
  budget refused (429/3200, as the worker logged it) is a fault too (`budget`), from its time.

Checks (each a list of violations; the soak fails on any):
1. lost: every document's latest written version was delivered, and before the drain ended (a
   version delivered only once the workers were being stopped sat on a lease that did not move).
   Across merges too: the service keeps a merged partition's LSNs, and `cfp emulator`
   translates the SDK emulator's renumbering from 1.
2. phantom: every delivered version was written.
3. order: within each delivery run, per partition key, documents arrive in the order they were
   written (the writer's per-key sequence `s` strictly increases), also inside one batch. A
   version the writer sent more than once (a failed request may have been applied) has two
   LSNs: it may arrive twice.
4. rewinds: every rewind, and every redelivery of a version (a duplicate) is within a fault window.
   They are counted per kind of fault.
5. checkpoints: a lease's checkpoint (its continuation LSN, read about every second) never moves
   backwards, across merges and splits too.
8. renumbered: every version is delivered with the LSN its write was acknowledged with (its
   `_lsn` within `CONCURRENT_WRITES` below the write's session token: the partition's LSN when
   the answer was made) — also after merges.
6. twins: every second process started under a live worker's name exited non-zero and delivered
   nothing.
7. fencing: once another process acquired a lease (its log says so), the previous owner delivers
   at most the batches it had in flight (its `--max-in-flight-batches`) — unless its log says it
   acquired the lease again since.

Usage: check.py OUT_DIR [--grace SECONDS]
"""
import argparse
import collections
import glob
import json
import heapq
import os
import re
import sys


def jsonl(out, name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def lease_range(token):
    """(min, max) of a lease token `<min>-<max>`."""
    low, _, high = token.partition("-")
    return low, high


def overlaps(a, b):
    """Whether EPK ranges a and b (pairs of hex strings, "" lowest, "FF" highest) overlap."""
    return a[0] < b[1] and b[0] < a[1]


class Faults:
    """The schedule's faults and their windows."""

    def __init__(self, faults, grace):
        self.faults, self.grace = sorted(faults, key=lambda f: f["start"]), grace

    def around(self, t):
        """The kind of the latest fault of the schedule whose window holds `t`, else `budget` when
        a budget refusal's does, else None."""
        found = None
        for fault in self.faults:
            if fault["start"] - 1.0 <= t <= fault["end"] + self.grace:
                if found is None or found == "budget" or fault["kind"] != "budget":
                    found = fault["kind"]
        return found

def check_lost(writes, deliveries, stopping):
    """(lost, delivered only after `stopping`, phantom, delivered versions, latest write per id)."""
    latest, written = {}, set()
    for w in writes:
        written.add((w["id"], w["v"]))
        latest[w["id"]] = w
    first = {}
    for b in deliveries:
        for d in b["docs"]:
            key = (d[0], d[2])
            first[key] = min(first.get(key, b["arrived"]), b["arrived"])
    lost = [w for i, w in sorted(latest.items()) if (i, w["v"]) not in first]
    late = [w for i, w in sorted(latest.items()) if first.get((i, w["v"]), 0) > stopping]
    phantom = sorted(set(first) - written)
    return lost, late, phantom, set(first), latest


# A write's session token names the partition's LSN when the answer was made: other writes to
# the partition (the writer's other threads) may have come in between, so a version's `_lsn` is
# at most this much below it without any renumbering.
CONCURRENT_WRITES = 16


def renumbered(acknowledged, lsn):
    """Whether a version delivered with `_lsn` `lsn` was numbered otherwise than when its write
    was acknowledged at `acknowledged` (None: unknown)."""
    if not isinstance(acknowledged, int) or not isinstance(lsn, int):
        return False
    return not acknowledged - CONCURRENT_WRITES <= lsn <= acknowledged


class Run:
    """The run being walked: its batches waiting for their answer (a heap by answer time), and
    what the answered ones reached (the last LSN, per partition key the highest sequence)."""

    def __init__(self, first):
        self.process, self.last, self.batches = first["process"], first, 0
        self.waiting, self.lsn, self.keys = [], None, {}

    def settle(self, until):
        """Counts the batches answered before `until` as done."""
        while self.waiting and self.waiting[0][0] < until:
            _, _, b = heapq.heappop(self.waiting)
            for d in b["docs"]:
                self.keys[d[1]] = max(self.keys.get(d[1], 0), d[3])
                if isinstance(d[4], int):
                    self.lsn = d[4] if self.lsn is None else max(self.lsn, d[4])

    def add(self, b):
        heapq.heappush(self.waiting, (b["answered"], self.batches, b))
        self.batches, self.last = self.batches + 1, b


def break_reason(run, b, faults):
    """Why `b` does not continue `run` (None: it does)."""
    if run is None:
        return "first"
    if run.process != b["process"]:
        return "another process"
    mine = [d[4] for d in b["docs"] if isinstance(d[4], int)]
    if run.lsn is not None and mine and min(mine) <= run.lsn:
        return "rewind"
    return None


def order_violations(run, b):
    """Documents of `b` whose key's sequence does not move past what the run had reached."""
    found, inside = [], {}
    for d, twice in zip(b["docs"], b.get("twice") or [False] * len(b["docs"])):
        pk, seq = d[1], d[3]
        if d[2] < 0:
            continue
        floor = max(run.keys.get(pk, 0), inside.get(pk, 0))
        if seq < floor or (seq == floor and not twice):
            found.append({"lease": b["lease"], "process": b["process"], "pk": pk, "s": seq, "after": floor,
                          "arrived": b["arrived"], "batch": b["batch"]})
        inside[pk] = max(inside.get(pk, 0), seq)
    return found


def walk(deliveries, faults):
    """Splits each lease's deliveries into runs (see the module's definitions) and checks the
    order within them; returns (runs as (lease, process, batches), rewinds, order violations)."""
    by_lease = collections.defaultdict(list)
    for b in deliveries:
        by_lease[b["lease"]].append(b)
    runs, rewinds, disorder = [], [], []
    for lease, batches in sorted(by_lease.items()):
        batches.sort(key=lambda b: b["arrived"])
        run = None
        for b in batches:
            if run is not None:
                run.settle(b["arrived"])
            reason = break_reason(run, b, faults)
            if reason == "rewind":
                rewinds.append(b)
            if reason:
                if run is not None:
                    runs.append((lease, run.process, run.batches))
                run = Run(b)
            disorder.extend(order_violations(run, b))
            run.add(b)
        runs.append((lease, run.process, run.batches))
    return runs, rewinds, disorder


def check_duplicates(deliveries, faults):
    """Every redelivery of a version: (count per fault kind, those outside any fault window)."""
    seen, per_kind, outside = set(), collections.Counter(), []
    for b in sorted(deliveries, key=lambda b: b["arrived"]):
        for d in b["docs"]:
            key = (d[0], d[2])
            if key in seen:
                kind = faults.around(b["arrived"])
                per_kind[kind or "none"] += 1
                if kind is None:
                    outside.append({"id": d[0], "v": d[2], "lease": b["lease"], "process": b["process"],
                                    "arrived": b["arrived"]})
            seen.add(key)
    return per_kind, outside


def check_checkpoints(snapshots):
    """Per lease, continuation LSNs that moved backwards."""
    last, backwards = {}, []
    for snap in snapshots:
        for token, (owner, lsn, _, _) in snap["leases"].items():
            previous = last.get(token)
            if previous and lsn is not None and previous[1] is not None and lsn < previous[1]:
                backwards.append({"lease": token, "from": previous[1], "to": lsn, "after": previous[0],
                                  "at": snap["t"], "owner": owner})
            last[token] = (snap["t"], lsn)
    return backwards


# Dated by when its write was sent (`sent_ms_ago`; older logs: when it was logged): the answer
# to a write sent before a freeze is only logged after the thaw.
ACQUIRED = re.compile(r"^(\d+\.\d+) .*lease acquired .*lease=(\S+)(?:.* sent_ms_ago=(\d+))?")
TAKEN = re.compile(r'^(\d+\.\d+) .*lease taken by another instance .*lease="?([^"\s]+)')
# The lease task found the lease another's itself (its confirmation before a batch).
LOST = re.compile(r'^(\d+\.\d+) .*lease closed lease="?([^"\s]+)"? reason="?lease_lost')
# How soon after a thaw a logged acquisition may be one written before the freeze (and how
# soon its task finds the lease taken: the confirmation before its first batch, the next listing).
STALE_AFTER_THAW = 5.0
# A thawed process may log before the soak has noted the thaw's time.
THAW_CLOCK_SLACK = 0.5
BUDGET = re.compile(r"^(\d+\.\d+) .*WARN.*429/3200")


def worker_logs(out):
    """(process tag, path) of every worker's log."""
    for path in sorted(glob.glob(os.path.join(out, "workers", "*.log"))):
        name, number = os.path.basename(path)[:-len(".log")].rsplit(".", 1)
        yield f"{name}/{number}", path


def budget_refusals(out):
    """Lease writes the budget refused (429/3200) after the SDK's own retries, as faults."""
    found = []
    for _, path in worker_logs(out):
        with open(path, encoding="utf-8", errors="replace") as log:
            for line in log:
                match = BUDGET.match(line)
                if match:
                    found.append({"kind": "budget", "start": float(match.group(1)), "end": float(match.group(1))})
    return found


def acquisitions(out, fault_log=()):
    """(process tag, lease) -> times the process acquired the lease (its write sent, by its
    log; older logs only say when the answer came). Of such older logs, an acquisition logged
    just after the process was thawed (`fault_log`'s freezes) and found taken by another at once
    is left out: its write was made before the freeze, another took the lease over while the
    process was frozen past the expiration, and it owned nothing after the thaw — its log line is
    only late."""
    thawed = collections.defaultdict(list)
    for f in fault_log:
        # When SIGCONT was sent (older logs: the freeze's end, taken just after it).
        if "thawed" in f or (f.get("kind") == "freeze" and "target" in f):
            thawed[f["target"]].append(f.get("thawed", f["end"]))
    found = collections.defaultdict(list)
    for process, path in worker_logs(out):
        acquired, taken = [], collections.defaultdict(list)
        with open(path, encoding="utf-8", errors="replace") as log:
            for line in log:
                match = ACQUIRED.match(line)
                if match:
                    sent_ago = int(match.group(3) or 0) / 1000
                    acquired.append((float(match.group(1)) - sent_ago, match.group(2)))
                match = TAKEN.match(line) or LOST.match(line)
                if match:
                    taken[match.group(2)].append(float(match.group(1)))
        ends = thawed[process.split("/")[0]]
        for t, lease in acquired:
            just_thawed = any(end - THAW_CLOCK_SLACK <= t <= end + STALE_AFTER_THAW for end in ends)
            found_taken = any(t <= at <= t + STALE_AFTER_THAW for at in taken[lease])
            if not (just_thawed and found_taken):
                found[(process, lease)].append(t)
    return found


def owner_at(acquisitions, t):
    """Of `acquisitions` (time, process) sorted by time, the process that acquired last by `t`."""
    owner = None
    for at, process in acquisitions:
        if at > t:
            break
        owner = process
    return owner


def check_fencing(deliveries, processes, acquired):
    """Late deliveries (see the module's check 7): a batch is late when another process acquired
    its lease after its own process did (by their logs); the late batches of one process in a row
    are an episode, tolerated up to its batches in flight. Answers (tolerated, violations)."""
    in_flight = {p["process"]: p["in_flight"] for p in processes}
    by_lease = collections.defaultdict(list)
    for (process, lease), times in acquired.items():
        by_lease[lease].extend((t, process) for t in times)
    episodes = {}  # (lease, process, new owner) -> [first arrival, batches]
    for b in sorted(deliveries, key=lambda b: b["arrived"]):
        owner = owner_at(sorted(by_lease.get(b["lease"], [])), b["arrived"])
        key = (b["lease"], b["process"], owner)
        if owner is None or owner == b["process"]:
            continue
        episodes.setdefault(key, [b["arrived"], 0])[1] += 1
    tolerated, violations = [], []
    for (lease, process, owner), (at, count) in sorted(episodes.items()):
        entry = {"lease": lease, "process": process, "batches": count, "after": owner, "at": at}
        (tolerated if count <= in_flight.get(process, 1) else violations).append(entry)
    return tolerated, violations


def check_twins(faults, twin_batches):
    ran = [f for f in faults if f["kind"] == "twin" and "skipped" not in f and not f.get("refused")]
    return ran, twin_batches


def lost_detail(lost, faults):
    """What the report says of a lost version: the write and the merges and splits after it."""
    shown = []
    for w in lost[:20]:
        near = [{"kind": f["kind"], "start": round(f["start"] - w["t"], 1), **{k: f[k] for k in ("into", "partition") if k in f}}
                for f in faults.faults if f["kind"] in ("merge", "split") and w["t"] - 30 < f["start"] < w["t"] + 120]
        shown.append({"id": w["id"], "pk": w["pk"], "v": w["v"], "s": w["s"], "written": w["t"], "range": w["range"],
                      "lsn": w["lsn"], "mergesAndSplitsNear": near})
    return shown


def check(out, grace=None):
    """Runs every check over the logs in `out`; answers the report (with `violations`)."""
    summary = {}
    if os.path.exists(os.path.join(out, "summary.json")):
        with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
    grace = grace if grace is not None else 3 * summary.get("expiration", 5.0) + 5.0
    writes, batches = jsonl(out, "writes.jsonl"), jsonl(out, "deliveries.jsonl")
    fault_log, processes = jsonl(out, "faults.jsonl"), jsonl(out, "processes.jsonl")
    throttled = budget_refusals(out)
    faults = Faults(fault_log + throttled, grace)
    for b in batches:  # a document the writer did not write (no version or sequence) is a phantom
        b["docs"] = [d for d in b["docs"] if isinstance(d[2], int) and isinstance(d[3], int)] + \
            [[d[0], d[1], -1, 0, d[4]] for d in b["docs"] if not (isinstance(d[2], int) and isinstance(d[3], int))]
    deliveries = [b for b in batches if not b["twin"]]
    # A version written by more than one request may have two LSNs (the first attempt applied,
    # its answer lost): its `_lsn` may be either's, and it may arrive twice in one run.
    twice = {(w["id"], w["v"]) for w in writes if w.get("tries", 1) > 1}
    acknowledged = {(w["id"], w["v"]): w["lsn"] for w in writes if (w["id"], w["v"]) not in twice}
    for b in deliveries:
        b["renumbered"] = any(renumbered(acknowledged.get((d[0], d[2])), d[4]) for d in b["docs"])
        b["twice"] = [(d[0], d[2]) in twice for d in b["docs"]]
    lost, stuck, phantom, delivered, latest = check_lost(writes, deliveries, summary.get("stopping", float("inf")))
    snapshots = jsonl(out, "leases.jsonl")
    runs, rewinds, disorder = walk(deliveries, faults)
    duplicates, unexplained = check_duplicates(deliveries, faults)
    rewind_kinds = collections.Counter(faults.around(b["arrived"]) or "none" for b in rewinds)
    renumbered_batches = [{"lease": b["lease"], "process": b["process"], "arrived": b["arrived"], "batch": b["batch"]}
                          for b in deliveries if b["renumbered"]]
    backwards = check_checkpoints(snapshots)
    twins_ran, twin_batches = check_twins(fault_log, [b for b in batches if b["twin"]])
    tolerated, late = check_fencing(deliveries, processes, acquisitions(out, fault_log))
    violations = {
        "lost": lost_detail(lost, faults), "phantom": phantom[:20],
        "deliveredOnlyAfterDrain": lost_detail(stuck, faults),
        "order": disorder[:20], "duplicatesOutsideFaults": unexplained[:20],
        "rewindsOutsideFaults": [{"lease": b["lease"], "process": b["process"], "arrived": b["arrived"],
                                  "attempt": b["attempt"]} for b in rewinds if faults.around(b["arrived"]) is None][:20],
        "checkpointsBackwards": backwards[:20], "renumbered": renumbered_batches[:20],
        "twinsThatRan": twins_ran, "twinBatches": len(twin_batches),
        "lateDeliveriesPastInFlight": late[:20],
    }
    counts = {
        "lost": len(lost), "deliveredOnlyAfterDrain": len(stuck), "order": len(disorder), "duplicatesOutsideFaults": len(unexplained),
        "checkpointsBackwards": len(backwards), "lateDeliveriesPastInFlight": len(late),
        "renumbered": len(renumbered_batches),
    }
    report = {
        "seed": summary.get("seed"), "durationSeconds": summary.get("duration"), "wallSeconds": summary.get("wallSeconds"),
        "writes": len(writes), "documents": len(latest), "versionsDelivered": len(delivered),
        "batches": len(deliveries), "documentsDelivered": sum(len(b["docs"]) for b in deliveries),
        "duplicates": sum(duplicates.values()), "duplicatesByFault": dict(duplicates),
        "rewinds": len(rewinds), "rewindsByFault": dict(rewind_kinds), "runs": len(runs),
        "lateWithinInFlight": len(tolerated),
        "faults": dict(collections.Counter(f["kind"] for f in fault_log)), "budgetRefusals": len(throttled),
        "writesRetried": summary.get("writesRetried"),
        "processes": len(processes), "workerExits": jsonl(out, "exits.jsonl"),
        "twins": sum(1 for f in fault_log if f["kind"] == "twin" and "skipped" not in f),
        "counts": counts, "summary": summary,
        "violations": {k: v for k, v in violations.items() if v},
    }
    return report


def main(argv):
    parser = argparse.ArgumentParser(description="Checks the logs of a soak (see the module's doc).")
    parser.add_argument("out")
    parser.add_argument("--grace", type=float, help="seconds after a fault's end its window lasts")
    args = parser.parse_args(argv)
    report = check(args.out, args.grace)
    with open(os.path.join(args.out, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    shown = {k: v for k, v in report.items() if k not in ("violations", "summary")}
    shown["workerExits"] = len(report["workerExits"])
    print("soak report " + json.dumps(shown), flush=True)
    if report["violations"]:
        print("soak VIOLATIONS " + json.dumps(report["violations"], indent=1)[:20000], flush=True)
        return 1
    print(f"soak passed: seed {report['seed']}, nothing lost, order kept, duplicates only around faults",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
