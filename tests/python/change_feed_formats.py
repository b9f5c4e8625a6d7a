"""A client nobody here wrote reads `cfp emulator`'s change feed as it reads the service's.

Usage: change_feed_formats.py <endpoint> <key> <database> <container> <count>
Writes <count> documents (partition key /pk) into an existing container, then reads every feed
range's change feed one document at a time (`max_item_count=1`), each page resumed from the
continuation the previous one returned, and checks the service's formats:
- every change feed document carries `_lsn`, and a range's `_lsn`s increase;
- a page holds at most one document, and nothing is skipped or repeated (resuming from each
  continuation delivers every written document exactly once);
- the range continuation the SDK keeps (the response ETag it sends back as `If-None-Match`) is
  the service's quoted LSN, `"<lsn>"`, the `_lsn` of the page's document;
- the session token names only the range read (`<range id>:<...>`, no other range's token);
- a page of several documents carries each one's `_lsn`, its continuation the last one's;
- the estimator's formula (session LSN - first unread `_lsn` + 1) gives the writes of the range.
Prints `ok <count>` (and what it saw on stderr), or fails with the first difference.
"""
import base64
import json
import re
import sys

from azure.cosmos import CosmosClient


def raw_continuations(token):
    """The per-range server continuations inside the Python SDK's change feed continuation."""
    state = json.loads(base64.b64decode(token))
    return [entry["token"] for entry in state["continuation"]["continuation"]]


def read_one_page(container, start, max_items=1):
    """Reads one page of at most `max_items` documents: (documents, continuation, session token)."""
    iterator = container.query_items_change_feed(max_item_count=max_items, **start)
    pages = iterator.by_page()
    try:
        documents = list(next(pages))
    except StopIteration:
        documents = []
    headers = container.client_connection.last_response_headers
    return documents, pages.continuation_token, headers.get("x-ms-session-token", "")


def read_range(container, feed_range):
    """Reads one range to its end, one document per page; returns the documents read."""
    documents, token, session = read_one_page(container, {"feed_range": feed_range, "start_time": "Beginning"})
    read = []
    first_estimate = None
    while documents:
        assert len(documents) == 1, f"max_item_count=1 returned {len(documents)} documents"
        document = documents[0]
        assert isinstance(document.get("_lsn"), int), f"no _lsn on a change feed document: {document}"
        assert not read or read[-1]["_lsn"] < document["_lsn"], "the _lsn of a range must increase"
        (raw,) = raw_continuations(token)
        assert re.fullmatch(r'"\d+"', raw), f"the range continuation is not a quoted LSN: {raw!r}"
        assert int(raw.strip('"')) == document["_lsn"], f"continuation {raw} after a document of _lsn {document['_lsn']}"
        ranges = [part.split(":", 1)[0] for part in session.split(",")]
        assert len(ranges) == 1, f"a read of one range returned the session tokens of {ranges}: {session}"
        if first_estimate is None:
            latest = session.split(":", 1)[1].split("#")
            latest = int(latest[1] if len(latest) > 1 else latest[0])
            first_estimate = latest - document["_lsn"] + 1
        read.append(document)
        documents, token, session = read_one_page(container, {"continuation": token})
    return read, first_estimate


def main() -> None:
    endpoint, key, database, name, count = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    container = CosmosClient(endpoint, credential=key).get_database_client(database).get_container_client(name)
    for n in range(count):
        container.upsert_item({"id": f"fmt-{n}", "pk": f"pk-{n % 5}", "n": n})
    ids = []
    for feed_range in container.read_feed_ranges():
        read, estimate = read_range(container, feed_range)
        print(f"range {feed_range}: {[d['_lsn'] for d in read]}, first estimate {estimate}", file=sys.stderr)
        assert estimate in (None, len(read)), f"the estimator's formula gave {estimate} for {len(read)} writes"
        ids.extend(d["id"] for d in read)
        page, token, _ = read_one_page(container, {"feed_range": feed_range, "start_time": "Beginning"}, 4)
        lsns = [d.get("_lsn") for d in page]
        assert lsns == [d["_lsn"] for d in read[:4]], f"a page of 4 has _lsn {lsns}, one at a time {read[:4]}"
        if page:
            assert raw_continuations(token) == [f'"{lsns[-1]}"'], f"after {lsns}: {raw_continuations(token)}"
    assert sorted(ids) == sorted(f"fmt-{n}" for n in range(count)), f"read {sorted(ids)}"
    print(f"ok {len(ids)}")


if __name__ == "__main__":
    main()
