"""What a JSON body takes once decoded into Python objects, by the kind of value it is made of:
the figures behind boxd/broker/model/request.py's bounds (MAX_VALUES values of each kind).

Run from the repository: `python -m bench.json_decoded` (`--values`). Measured with tracemalloc
in this process, one kind at a time.
"""

import argparse
import json
import tracemalloc

from boxd.broker.model.request import MAX_VALUES

KINDS = {
    "empty objects": "{}",
    "empty arrays": "[]",
    "small numbers": "1",
    "floats": "1.5",
    "short strings": '"ab"',
    'one-entry objects {"a":1}': '{"a":1}',
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=MAX_VALUES)
    arguments = parser.parse_args()
    print(f"an array of {arguments.values:,} values of one kind")
    for name, one in KINDS.items():
        text = "[" + ",".join([one] * arguments.values) + "]"
        tracemalloc.start()
        value = json.loads(text)
        decoded = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del value
        print(
            f"  {name:28} {len(text) / 2**20:6.2f} MiB of JSON, {decoded / 2**20:6.1f} MiB "
            f"decoded ({decoded / len(text):.0f} times)"
        )


if __name__ == "__main__":
    main()
