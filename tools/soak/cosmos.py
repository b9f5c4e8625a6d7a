"""A Cosmos DB REST client in the standard library only (no code of the processor): master-key
signatures, document upserts that follow the write region, and reads of a container's documents.

Used by the soak (`tools/soak/soak.py`) to write the monitored container and to read the lease
container; it speaks the service's REST API as documented by Microsoft, so it needs nothing of
`cfp` but an endpoint.
"""
import base64
import collections
import email.utils
import hashlib
import hmac
import http.client
import json
import time
import urllib.parse

EMULATOR_KEY = "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw=="
API_VERSION = "2018-12-31"


class CosmosError(Exception):
    """A request the account answered with an error (or did not answer)."""

    def __init__(self, status, substatus, message):
        super().__init__(f"{status}/{substatus}: {message}")
        self.status = status
        self.substatus = substatus


def signature(key, verb, resource_type, resource_link, date):
    """The `authorization` header of a request, as the service's master-key scheme defines it."""
    text = f"{verb.lower()}\n{resource_type.lower()}\n{resource_link}\n{date.lower()}\n\n"
    digest = hmac.new(base64.b64decode(key), text.encode(), hashlib.sha256).digest()
    token = f"type=master&ver=1.0&sig={base64.b64encode(digest).decode()}"
    return urllib.parse.quote(token, safe="")


class Connection:
    """One keep-alive HTTP connection to one endpoint (`http://host:port/`)."""

    def __init__(self, endpoint, key=EMULATOR_KEY, timeout=10.0):
        parsed = urllib.parse.urlparse(endpoint)
        self.endpoint = endpoint
        self.host, self.port = parsed.hostname, parsed.port
        self.key, self.timeout = key, timeout
        self.conn = None

    def request(self, verb, path, resource_type, resource_link, body=None, headers=None):
        """Sends one request; returns (status, headers dict, parsed JSON body or None)."""
        date = email.utils.formatdate(usegmt=True)
        all_headers = {
            "authorization": signature(self.key, verb, resource_type, resource_link, date),
            "x-ms-date": date,
            "x-ms-version": API_VERSION,
            "accept": "application/json",
        }
        all_headers.update(headers or {})
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            all_headers["content-type"] = "application/json"
        for attempt in range(2):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                self.conn.request(verb, path, body=data, headers=all_headers)
                response = self.conn.getresponse()
                raw = response.read()
                answer = {k.lower(): v for k, v in response.getheaders()}
                parsed = json.loads(raw) if raw else None
                return response.status, answer, parsed
            except (OSError, http.client.HTTPException, ValueError) as error:
                self.close()
                if attempt == 1:
                    raise CosmosError(0, 0, f"{verb} {path}: {error}") from error
        raise CosmosError(0, 0, "unreachable")

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def session_lsn(token):
    """(partition key range id, LSN) of a response's session token `1:0#8#0=8`, or (None, None)."""
    try:
        range_id, rest = token.split(":", 1)
        return range_id, int(rest.split("#")[1])
    except (AttributeError, ValueError, IndexError):
        return None, None


RETRIED = {408, 410, 429, 449, 500, 503}


class Account:
    """The account at `endpoint`: follows its write region (from the account metadata) and retries
    what the service says to retry, for at most `patience` seconds per operation."""

    def __init__(self, endpoint, key=EMULATOR_KEY, patience=120.0):
        self.key, self.patience = key, patience
        self.retried = collections.Counter()  # "status/substatus" -> answers retried
        self.known = [endpoint]
        self.write = Connection(endpoint, key)
        self.read = Connection(endpoint, key)

    def refresh_write_region(self):
        """Asks any known endpoint for the account's write region and writes there from now on."""
        for endpoint in list(self.known):
            probe = Connection(endpoint, self.key, timeout=5.0)
            try:
                status, _, account = probe.request("GET", "/", "", "")
            except CosmosError:
                continue
            finally:
                probe.close()
            if status != 200 or not account:
                continue
            for location in account.get("readableLocations", []):
                if location["databaseAccountEndpoint"] not in self.known:
                    self.known.append(location["databaseAccountEndpoint"])
            writable = account.get("writableLocations") or []
            if writable and writable[0]["databaseAccountEndpoint"] != self.write.endpoint:
                self.write.close()
                self.write = Connection(writable[0]["databaseAccountEndpoint"], self.key)
            return

    def upsert(self, database, container, pk, document):
        """Upserts `document` (partition key value `pk`); returns the write's (range id, LSN) and
        how many requests it took (a request that failed may still have been applied: the
        document is then written twice, with two LSNs)."""
        link = f"dbs/{database}/colls/{container}"
        headers = {"x-ms-documentdb-partitionkey": json.dumps([pk]), "x-ms-documentdb-is-upsert": "True"}
        deadline = time.monotonic() + self.patience
        last, tries = None, 0
        while time.monotonic() < deadline:
            tries += 1
            try:
                status, answer, _ = self.write.request("POST", f"/{link}/docs", "docs", link, document, headers)
            except CosmosError as error:
                last = error
                self.retried["connection"] += 1
                self.refresh_write_region()
                time.sleep(0.05)
                continue
            if status in (200, 201):
                return (*session_lsn(answer.get("x-ms-session-token")), tries)
            last = CosmosError(status, answer.get("x-ms-substatus", 0), f"upsert {document['id']}")
            self.retried[f"{status}/{answer.get('x-ms-substatus', 0)}"] += 1
            if status == 403:
                self.refresh_write_region()
            elif status not in RETRIED:
                raise last
            time.sleep(min(float(answer.get("x-ms-retry-after-ms", 50)), 1000.0) / 1000.0)
        raise last or CosmosError(0, 0, "no attempt")

    def documents(self, database, container):
        """Every document of a one-partition container (the read feed, page by page)."""
        link = f"dbs/{database}/colls/{container}"
        found, continuation = [], None
        deadline = time.monotonic() + self.patience
        while time.monotonic() < deadline:
            headers = {"x-ms-max-item-count": "1000"}
            if continuation:
                headers["x-ms-continuation"] = continuation
            try:
                status, answer, body = self.read.request("GET", f"/{link}/docs", "docs", link, None, headers)
            except CosmosError:
                time.sleep(0.1)
                continue
            if status != 200:
                time.sleep(0.1)
                continue
            found.extend(body.get("Documents", []))
            continuation = answer.get("x-ms-continuation")
            if not continuation:
                return found
        raise CosmosError(0, 0, f"reading {link} took more than {self.patience} s")
