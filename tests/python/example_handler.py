"""A minimal change feed handler (the example of `docs/http-handler.md`): `cfp worker --handler http` POSTs every
batch here; answering 2xx means handled, and the worker checkpoints. Run: python3 tests/python/example_handler.py 8080"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

output = threading.Lock()  # batches of different leases arrive concurrently


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the worker reuses its connection

    def do_POST(self):
        batch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with output:
            for document in batch["documents"]:
                # Your work here. Raise (or answer 5xx) and the worker retries the batch.
                print(json.dumps({"lease": batch["lease"], "id": document["id"]}), flush=True)
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):  # readiness (handler.http.readinessPath)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
