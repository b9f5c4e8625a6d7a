"""Reads an HTTP body the worker sent in CloudEvents mode (a JSON Batch: an array of JSON-format
events) and validates every event with the CloudEvents Python SDK. Prints one id per line."""
import json
import sys

from cloudevents.core.formats.json import JSONFormat

with open(sys.argv[1], "rb") as body:
    batch = json.load(body)
if not isinstance(batch, list):
    sys.exit("not a CloudEvents JSON batch (an array)")
for item in batch:
    event = JSONFormat().read(None, json.dumps(item))
    print(event.get_id())
