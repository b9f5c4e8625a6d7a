"""The checker finds each kind of violation in logs made for it, and nothing in clean ones
(`python3 -m unittest test_check` in tools/soak; run by `overlapping_faults_soak::the_soak_checker_finds…`)."""
import json
import os
import tempfile
import unittest

import check

LEASE = "00-10"
T0 = 1000.0


def batch(t, process, docs, lease=LEASE, twin=False, answered=None):
    """A delivery: docs as (id, pk, v, s, lsn)."""
    return {"arrived": t, "answered": answered if answered is not None else t + 0.01, "twin": twin,
            "instance": process.split("/")[0], "process": process, "lease": lease, "batch": f"b{t}",
            "attempt": 1, "docs": [list(d) for d in docs]}


class Logs:
    """A soak's log directory, made up."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory()
        self.out = self.dir.name
        os.makedirs(os.path.join(self.out, "workers"))
        self.files = {name: [] for name in ("writes", "deliveries", "leases", "faults", "processes")}
        self.summary = {"seed": 1, "expiration": 5.0, "stopping": T0 + 1000}
        for name in ("w0/1", "w1/2"):
            self.files["processes"].append({"process": name, "in_flight": 1})

    def write(self, t, doc_id, pk, v, s, lsn):
        self.files["writes"].append({"t": t, "sent": t, "id": doc_id, "pk": pk, "v": v, "s": s,
                                     "range": "0", "lsn": lsn})

    def report(self):
        for name, entries in self.files.items():
            with open(os.path.join(self.out, f"{name}.jsonl"), "w", encoding="utf-8") as f:
                f.writelines(json.dumps(e) + "\n" for e in entries)
        with open(os.path.join(self.out, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(self.summary, f)
        return check.check(self.out)


def clean():
    """Two writes of one key delivered once each, in order, by one process."""
    logs = Logs()
    CLEANUPS.append(logs.dir.cleanup)
    logs.write(T0, "a", "k", 1, 1, 1)
    logs.write(T0 + 1, "b", "k", 1, 2, 2)
    logs.files["deliveries"] += [batch(T0 + 2, "w0/1", [("a", "k", 1, 1, 1)]),
                                 batch(T0 + 3, "w0/1", [("b", "k", 1, 2, 2)])]
    return logs


CLEANUPS = []


class CheckerTest(unittest.TestCase):
    def tearDown(self):
        while CLEANUPS:
            CLEANUPS.pop()()

    def test_clean_logs_pass(self):
        report = clean().report()
        self.assertEqual(report["violations"], {})
        self.assertEqual((report["writes"], report["batches"], report["duplicates"]), (2, 2, 0))

    def test_a_latest_version_never_delivered_is_lost(self):
        logs = clean()
        logs.write(T0 + 4, "a", "k", 2, 3, 3)
        self.assertEqual([w["id"] for w in logs.report()["violations"]["lost"]], ["a"])

    def test_a_version_delivered_only_while_stopping_is_reported(self):
        logs = clean()
        logs.summary["stopping"] = T0 + 2.5
        self.assertEqual([w["id"] for w in logs.report()["violations"]["deliveredOnlyAfterDrain"]], ["b"])

    def test_a_key_going_back_within_a_run_breaks_the_order(self):
        logs = clean()
        logs.files["writes"][0]["lsn"] = 3
        logs.files["deliveries"] = [batch(T0 + 2, "w0/1", [("b", "k", 1, 2, 2)]),
                                    batch(T0 + 3, "w0/1", [("a", "k", 1, 1, 3)])]
        self.assertEqual(len(logs.report()["violations"]["order"]), 1)

    def test_batches_in_flight_together_may_arrive_in_any_order(self):
        logs = clean()
        logs.files["deliveries"] = [batch(T0 + 2, "w0/1", [("b", "k", 1, 2, 2)], answered=T0 + 5),
                                    batch(T0 + 3, "w0/1", [("a", "k", 1, 1, 1)])]
        self.assertNotIn("order", logs.report()["violations"])

    def test_a_duplicate_counts_around_a_fault_and_fails_outside_one(self):
        logs = clean()
        logs.files["deliveries"].append(batch(T0 + 60, "w1/2", [("a", "k", 1, 1, 1)]))
        self.assertEqual(len(logs.report()["violations"]["duplicatesOutsideFaults"]), 1)
        logs.files["faults"].append({"kind": "kill", "start": T0 + 50, "end": T0 + 51})
        report = logs.report()
        self.assertEqual(report["violations"], {})
        self.assertEqual(report["duplicatesByFault"], {"kill": 1})

    def test_a_version_written_twice_may_arrive_twice_in_a_run(self):
        logs = clean()
        logs.files["writes"][1]["tries"] = 2
        logs.files["deliveries"].append(batch(T0 + 4, "w0/1", [("b", "k", 1, 2, 3)]))
        logs.files["faults"].append({"kind": "flaky", "start": T0, "end": T0 + 1})
        report = logs.report()
        self.assertEqual(report["violations"], {})
        self.assertEqual(report["duplicatesByFault"], {"flaky": 1})

    def test_a_rewind_outside_a_fault_fails(self):
        logs = clean()
        logs.files["deliveries"].append(batch(T0 + 60, "w0/1", [("b", "k", 1, 2, 2)]))
        violations = logs.report()["violations"]
        self.assertEqual(len(violations["rewindsOutsideFaults"]), 1)
        self.assertNotIn("order", violations)

    def test_a_version_read_at_another_lsn_than_its_write_fails_even_after_a_merge(self):
        # The service keeps a merged partition's LSNs (and `cfp emulator` translates the SDK
        # emulator's renumbering): a version delivered with another LSN is a violation.
        logs = clean()
        logs.files["faults"].append({"kind": "merge", "start": T0 + 50, "end": T0 + 51,
                                     "into": {"id": "9", "min": "", "max": "20"}})
        logs.files["deliveries"].append(batch(T0 + 60, "w0/1", [("a", "k", 1, 1, 7), ("b", "k", 1, 2, 8)]))
        report = logs.report()
        self.assertEqual(len(report["violations"]["renumbered"]), 1)
        self.assertEqual(report["duplicatesByFault"], {"merge": 2})

    def test_a_replay_around_a_merge_is_the_merge_s(self):
        logs = clean()
        logs.files["faults"].append({"kind": "merge", "start": T0 + 50, "end": T0 + 51,
                                     "into": {"id": "9", "min": "", "max": "20"}})
        logs.files["deliveries"].append(batch(T0 + 60, "w0/1", [("b", "k", 1, 2, 2)]))
        report = logs.report()
        self.assertEqual(report["violations"], {})
        self.assertEqual(report["duplicatesByFault"], {"merge": 1})

    def test_a_version_lost_in_a_merged_partition_is_lost(self):
        logs = clean()
        logs.files["writes"].append({"t": T0 + 10, "sent": T0 + 10, "id": "c", "pk": "j", "v": 1, "s": 1,
                                     "range": "9", "lsn": 5})
        logs.files["leases"] = [{"t": T0 + 1, "leases": {LEASE: ["w0", 9, "00", "10"]}, "gone": []}]
        logs.files["faults"].append({"kind": "merge", "start": T0 + 5, "end": T0 + 5.5, "merged": [],
                                     "into": {"id": "9", "min": "", "max": "20"}})
        self.assertEqual(len(logs.report()["violations"]["lost"]), 1)

    def test_a_checkpoint_going_back_across_a_merge_fails(self):
        logs = clean()
        logs.files["leases"] = [{"t": T0 + 1, "leases": {LEASE: ["w0", 9, "00", "10"]}, "gone": []},
                                {"t": T0 + 9, "leases": {LEASE: ["w0", 4, "00", "10"]}, "gone": []}]
        logs.files["faults"].append({"kind": "merge", "start": T0 + 5, "end": T0 + 5.5,
                                     "into": {"id": "9", "min": "", "max": "20"}})
        self.assertEqual(len(logs.report()["violations"]["checkpointsBackwards"]), 1)

    def test_a_twin_that_ran_or_delivered_fails(self):
        logs = clean()
        logs.files["faults"].append({"kind": "twin", "start": T0, "end": T0 + 1, "exit": None, "refused": False})
        logs.files["deliveries"].append(batch(T0 + 2, "w0/9", [("a", "k", 1, 1, 1)], twin=True))
        violations = logs.report()["violations"]
        self.assertEqual((len(violations["twinsThatRan"]), violations["twinBatches"]), (1, 1))

    def test_a_deposed_owner_delivers_no_more_than_its_batches_in_flight(self):
        logs = clean()
        logs.write(T0 + 1, "c", "j", 1, 1, 3)
        logs.write(T0 + 1, "d", "i", 1, 1, 4)
        logs.files["deliveries"] += [batch(T0 + 4, "w1/2", [("c", "j", 1, 1, 3)]),
                                     batch(T0 + 5, "w0/1", [("c", "j", 1, 1, 3)]),
                                     batch(T0 + 6, "w0/1", [("d", "i", 1, 1, 4)])]
        logs.files["faults"].append({"kind": "freeze", "start": T0, "end": T0 + 2})
        acquired("w0.1", T0 - 10, logs)
        acquired("w1.2", T0 + 3.5, logs)
        self.assertEqual(len(logs.report()["violations"]["lateDeliveriesPastInFlight"]), 1)
        acquired("w0.1", T0 + 4.5, logs)
        self.assertEqual(logs.report()["violations"], {})


    def test_an_acquisition_logged_after_a_freeze_and_found_taken_at_once_owns_nothing(self):
        # w0 wrote its acquisition before it was frozen and logged it after the thaw, when w1 had
        # long taken the lease over (w0 was silent past the expiration): w0 finds it taken at
        # once and delivers nothing, so w1's batches after that log line are not late.
        logs = clean()
        logs.write(T0 + 1, "c", "j", 1, 1, 3)
        logs.files["faults"].append({"kind": "freeze", "start": T0, "end": T0 + 7, "target": "w0"})
        acquired("w1.2", T0 + 6, logs)
        acquired("w0.1", T0 + 7.01, logs)
        lost("w0.1", T0 + 7.02, logs)
        logs.files["deliveries"].append(batch(T0 + 8, "w1/2", [("c", "j", 1, 1, 3)]))
        logs.files["deliveries"].append(batch(T0 + 9, "w1/2", [("c", "j", 1, 1, 3)]))
        self.assertEqual(logs.report()["violations"], {})
        # A freeze across a split, logged as thawed a moment after the process logged its line.
        logs.files["faults"][-1] = {"kind": "freeze_split", "start": T0, "end": T0 + 8, "target": "w0",
                                    "thawed": T0 + 7.02}
        self.assertEqual(logs.report()["violations"], {})
        # Without the freeze the same lines are a late delivery: w0 acquired after w1.
        logs.files["faults"].pop()
        self.assertEqual(len(logs.report()["violations"]["lateDeliveriesPastInFlight"]), 1)

    def test_an_acquisition_is_dated_by_when_its_write_was_sent(self):
        # As in soak seed 40 on CI: w0 sent its write, was frozen, and logged the answer after the
        # thaw; w1 had taken the lease meanwhile. w0's task found it taken before any batch, but
        # the line saying so came 9 s later (its exit waited for a read in flight).
        logs = clean()
        logs.write(T0 + 1, "c", "j", 1, 1, 3)
        logs.files["faults"].append({"kind": "freeze", "start": T0, "end": T0 + 7, "target": "w0",
                                     "thawed": T0 + 7})
        acquired("w1.2", T0 + 6, logs)
        acquired("w0.1", T0 + 7.01, logs, sent_ms_ago=7200)
        lost("w0.1", T0 + 16, logs)
        logs.files["deliveries"].append(batch(T0 + 8, "w1/2", [("c", "j", 1, 1, 3)]))
        logs.files["deliveries"].append(batch(T0 + 9, "w1/2", [("c", "j", 1, 1, 3)]))
        self.assertEqual(logs.report()["violations"], {})
        # Had w0 delivered after w1 took the lease, that is late whenever its write went out.
        logs.files["deliveries"] += [batch(T0 + 10, "w0/1", [("c", "j", 1, 1, 3)]),
                                     batch(T0 + 11, "w0/1", [("c", "j", 1, 1, 3)])]
        self.assertEqual(len(logs.report()["violations"]["lateDeliveriesPastInFlight"]), 1)


def lost(log, t, logs):
    """Appends a `lease closed … reason="lease_lost"` line at `t` to worker log `log` (the task
    found the lease another's before its first batch)."""
    with open(os.path.join(logs.out, "workers", f"{log}.log"), "a", encoding="utf-8") as out:
        out.write(f'{t} 2026-01-01T00:00:00Z INFO lease closed lease="{LEASE}" reason="lease_lost"\n')


def acquired(log, t, logs, sent_ms_ago=None):
    """Appends a `lease acquired` line at `t` to worker log `log` (`<name>.<n>`), its write sent
    `sent_ms_ago` before (older logs do not say)."""
    sent = f" cycle=3 sent_ms_ago={sent_ms_ago}" if sent_ms_ago is not None else ""
    with open(os.path.join(logs.out, "workers", f"{log}.log"), "a", encoding="utf-8") as out:
        out.write(f"{t} 2026-01-01T00:00:00Z INFO lease acquired lease={LEASE} previous_owner=None{sent}\n")


if __name__ == "__main__":
    unittest.main()
