"""A client nobody here wrote: the Python azure-cosmos SDK against `cfp emulator`.

Usage: emulator_client.py <endpoint> <key> <count>
Creates database `py` and container `docs` (partition key /pk), upserts <count> documents, reads
one back, queries them all, and prints `ok <count>`.
"""
import sys

from azure.cosmos import CosmosClient, PartitionKey


def main() -> None:
    endpoint, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    client = CosmosClient(endpoint, credential=key)
    database = client.create_database_if_not_exists("py")
    container = database.create_container_if_not_exists("docs", partition_key=PartitionKey(path="/pk"))
    for n in range(count):
        container.upsert_item({"id": f"py-{n}", "pk": f"pk-{n % 7}", "n": n})
    item = container.read_item("py-1", partition_key="pk-1")
    assert item["n"] == 1, item
    found = list(container.query_items("SELECT c.id FROM c", enable_cross_partition_query=True))
    assert len(found) == count, len(found)
    print(f"ok {len(found)}")


if __name__ == "__main__":
    main()
