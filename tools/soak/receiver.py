"""The soak's receiver: the user's service the workers POST their batches to, in the standard
library only (nothing of the processor's code). Workers POST to `/w/<instance>/<process>`
(`<process>` numbers the processes of one instance name); twins (second processes under a live
name) to `/twin/<instance>/<process>`.

Every request is answered 200 and written, once answered, as one JSON line to `--log`:
`{"arrived", "answered", "instance", "process", "twin", "lease", "batch", "attempt", "docs"}`
with `docs` = `[[id, pk, v, s, _lsn], ...]` in the order of the body. `arrived` is taken when the
request's headers were read, `answered` just before the answer is sent, both on the wall clock
(seconds since the epoch).

Slow handlers: every `--slow-every`th batch is answered after `--slow-ms`; `POST /_control/slow
?ms=N&seconds=S` answers every batch after N ms for S seconds. `GET /_control/stats` answers
`{"batches", "documents"}`.

Usage: receiver.py --port-file FILE --log FILE [--slow-every 25] [--slow-ms 6000]
"""
import argparse
import http.server
import json
import os
import threading
import time
import urllib.parse


class State:
    """What the handlers share: the log, the counters and the slow window."""

    def __init__(self, log_path, slow_every, slow_ms):
        self.log = open(log_path, "a", encoding="utf-8", buffering=1)
        self.lock = threading.Lock()
        self.slow_every, self.slow_ms = slow_every, slow_ms
        self.batches = self.documents = 0
        self.slow_until, self.window_ms = 0.0, 0

    def admit(self, documents):
        """Counts a batch; returns how long to hold its answer, in seconds."""
        with self.lock:
            self.batches += 1
            self.documents += documents
            count, window = self.batches, self.slow_until > time.time()
        if window:
            return self.window_ms / 1000.0
        if self.slow_every and count % self.slow_every == 0:
            return self.slow_ms / 1000.0
        return 0.0

    def record(self, entry):
        line = json.dumps(entry, separators=(",", ":"))
        with self.lock:
            self.log.write(line + "\n")


def documents_of(body):
    """`[[id, pk, v, s, _lsn], ...]` of a batch body."""
    out = []
    for doc in body.get("documents") or []:
        if isinstance(doc, dict):
            out.append([doc.get("id"), doc.get("pk"), doc.get("v"), doc.get("s"), doc.get("_lsn")])
    return out


class Handler(http.server.BaseHTTPRequestHandler):
    """One connection's requests."""

    protocol_version = "HTTP/1.1"
    state = None

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        with self.state.lock:
            stats = {"batches": self.state.batches, "documents": self.state.documents}
        self.answer(200, stats)

    def do_POST(self):
        arrived = time.time()
        url = urllib.parse.urlparse(self.path)
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if url.path == "/_control/slow":
            query = urllib.parse.parse_qs(url.query)
            with self.state.lock:
                self.state.window_ms = int(query["ms"][0])
                self.state.slow_until = time.time() + float(query["seconds"][0])
            self.answer(200, {})
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        parts = url.path.strip("/").split("/")
        docs = documents_of(body if isinstance(body, dict) else {})
        hold = self.state.admit(len(docs))
        if hold:
            time.sleep(hold)
        answered = time.time()
        self.answer(200, {})
        self.state.record({
            "arrived": arrived,
            "answered": answered,
            "twin": parts[0] == "twin",
            "instance": parts[1] if len(parts) > 1 else "",
            "process": "/".join(parts[1:3]),
            "lease": body.get("lease", "") if isinstance(body, dict) else "",
            "batch": self.headers.get("x-cfp-batch", ""),
            "attempt": int(self.headers.get("x-cfp-attempt") or 1),
            "docs": docs,
        })


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--slow-every", type=int, default=25)
    parser.add_argument("--slow-ms", type=int, default=6000)
    args = parser.parse_args()
    Handler.state = State(args.log, args.slow_every, args.slow_ms)
    http.server.ThreadingHTTPServer.request_queue_size = 1024
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with open(args.port_file + ".tmp", "w", encoding="utf-8") as out:
        out.write(str(server.server_address[1]))
    os.replace(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
