"""What flows during a soak besides the workers: the writer (documents created and replaced at a
steady rate), the lease snapshots (the lease container read about every second), and the
deliveries as the receiver logged them (read back while the soak drains).
"""
import collections
import json
import random
import threading
import time

import cosmos

DB, ITEMS, LEASES = "db", "items", "leases"


class Writer:
    """Writes `config.rate` documents a second over `config.keys` partition keys, two creates for
    one replace of a document of the same key, from `config.writers` threads that each own the
    keys `k` with `k % writers` = their number (so one key's writes are one thread's, one at a
    time). A document is `{"id", "pk", "v", "s"}`: `v` counts the writes of that id, `s` those of
    that partition key (so the order of a key's writes is the order of their `s`). Each write is
    logged once the account acknowledged it, with the partition key range and LSN of its session
    token."""

    def __init__(self, endpoint, log_path, config):
        self.config, self.latest, self.error = config, {}, None
        self.stopped = threading.Event()
        self.log = open(log_path, "a", encoding="utf-8", buffering=1)
        self.lock = threading.Lock()
        self.accounts = [cosmos.Account(endpoint) for _ in range(config.writers)]
        self.threads = [threading.Thread(target=self.run, args=(n, account), daemon=True)
                        for n, account in enumerate(self.accounts)]

    def retried(self):
        """The answers the writes were retried after, by `status/substatus`, all threads together."""
        total = collections.Counter()
        for account in self.accounts:
            total.update(account.retried)
        return dict(total)

    def start(self):
        for thread in self.threads:
            thread.start()

    def stop(self):
        self.stopped.set()
        for thread in self.threads:
            thread.join(150)
        with self.lock:
            self.log.close()

    def run(self, number, account):
        config = self.config
        rng = random.Random(config.seed * 7919 + number)
        ids, sequence = {}, {}
        interval = config.writers / config.rate
        next_at = time.monotonic()
        try:
            while not self.stopped.is_set():
                doc = self.next_document(rng, number, ids, sequence)
                sent = time.time()
                range_id, lsn, tries = account.upsert(DB, ITEMS, doc["pk"], doc)
                self.latest[doc["id"]] = doc["v"]
                line = json.dumps({"sent": sent, "t": time.time(), **doc, "range": range_id, "lsn": lsn,
                                   "tries": tries},
                                  separators=(",", ":"))
                with self.lock:
                    if not self.log.closed:
                        self.log.write(line + "\n")
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))
        except Exception as error:  # noqa: BLE001 (reported by the soak, which then fails)
            self.error = repr(error)
            self.stopped.set()

    def next_document(self, rng, number, ids, sequence):
        writers = self.config.writers
        key = rng.randrange(self.config.keys // writers) * writers + number
        pk = f"pk{key}"
        sequence[pk] = sequence.get(pk, 0) + 1
        existing = ids.get(pk, [])
        if existing and rng.randrange(3) == 0:
            doc_id = rng.choice(existing)
        else:
            doc_id = f"{pk}-d{len(existing)}"
            ids.setdefault(pk, []).append(doc_id)
        return {"id": doc_id, "pk": pk, "v": self.latest.get(doc_id, 0) + 1, "s": sequence[pk]}


def continuation_lsn(token):
    """The LSN of a lease's continuation (`"12"`, quoted as the service's ETags are), or None."""
    try:
        return int(str(token).strip('"'))
    except ValueError:
        return None


class Snapshots(threading.Thread):
    """Reads the lease container about every second; logs what changed: `{"t", "leases":
    {lease token: [owner, continuation LSN, min, max]}, "gone": [lease tokens]}`. `latest` is the
    last reading (token → (owner, LSN))."""

    def __init__(self, account, log_path):
        super().__init__(daemon=True)
        self.account, self.log_path = account, log_path
        self.latest = {}
        self.stopped = threading.Event()

    def stop(self):
        self.stopped.set()
        self.join(self.account.patience + 10)
        self.read_once()

    def read_once(self, log=None):
        try:
            docs = self.account.documents(DB, LEASES)
        except Exception:  # noqa: BLE001 (the next reading tries again)
            return
        at, now = time.time(), {}
        for doc in docs:
            if "LeaseToken" in doc:
                rng = (doc.get("FeedRange") or {}).get("Range") or {}
                now[doc["LeaseToken"]] = [doc.get("Owner"), continuation_lsn(doc.get("ContinuationToken")),
                                          rng.get("min"), rng.get("max")]
        previous = getattr(self, "_previous", {})
        changed = {k: v for k, v in now.items() if previous.get(k) != v}
        gone = [k for k in previous if k not in now]
        self._previous = now
        self.latest = {k: (v[0], v[1]) for k, v in now.items()}
        if changed or gone:
            with open(self.log_path, "a", encoding="utf-8") as out:
                out.write(json.dumps({"t": at, "leases": changed, "gone": gone}, separators=(",", ":")) + "\n")

    def run(self):
        while not self.stopped.is_set():
            started = time.monotonic()
            self.read_once()
            self.stopped.wait(max(0.0, 1.0 - (time.monotonic() - started)))


class Deliveries:
    """The receiver's log read as it grows: which (id, version) arrived."""

    def __init__(self, path):
        self.path, self.offset, self.seen = path, 0, set()

    def refresh(self):
        try:
            with open(self.path, "rb") as log:
                log.seek(self.offset)
                data = log.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            entry = json.loads(line)
            if not entry["twin"]:
                self.seen.update((d[0], d[2]) for d in entry["docs"])

    def missing(self, latest):
        """Of `latest` (id → version), the ids whose version has not arrived."""
        self.refresh()
        return [i for i, v in list(latest.items()) if (i, v) not in self.seen]
