"""Compare two run folders' JSON results apart from what changes run to run (times, rates, cache paths).

    .venv/bin/python tools/compare_runs.py runs/before runs/after      # exit 0: the same results, 1: they differ
    .venv/bin/python tools/compare_runs.py A B --rename portkit/adapters.py=portkit/models/adapters.py

Keys that hold times, rates, cache state or figures derived from measured compile times are left out; numbers with
a unit of time inside strings are masked; lists of records are compared as sorted sets; --rename maps a moved
file's path in the first run to its path in the second. Used to check that a change that moves code changes no
result.
"""
import argparse
import json
import re
import sys
from pathlib import Path

TIMES = re.compile(r"(seconds|_s$|time|created|started|ended|_ms|elapsed|duration|pid|host|measured_at|median|"
                   r"wall|cpu|run_dir|out_dir|per_second|share$|^ms$|^run$|^compile$|cached|cost_by_k|warmup_by_k|"
                   r"compile_cost|compile s|verdict_cache)", re.I)
TIME_IN_TEXT = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?\s?(s|ms|ms each|seconds)\b")


def normalised(value, renames=()):
    if isinstance(value, dict):
        return {k: normalised(v, renames) for k, v in value.items() if not TIMES.search(k)}
    if isinstance(value, list):
        items = [normalised(v, renames) for v in value]
        if items and all(isinstance(v, dict) for v in items):
            items.sort(key=lambda v: json.dumps(v, sort_keys=True))
        return items
    if isinstance(value, str):
        for old, new in renames:
            value = value.replace(old, new)
        return TIME_IN_TEXT.sub("<time>", value)
    return round(value, 9) if isinstance(value, float) else value


def differences(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [line for k in sorted(set(a) | set(b))
                for line in ([f"{path}/{k}: only in {'the second' if k in b else 'the first'}"]
                             if k not in a or k not in b else differences(a[k], b[k], f"{path}/{k}"))]
    if isinstance(a, list) and isinstance(b, list):
        head = [f"{path}: {len(a)} items against {len(b)}"] if len(a) != len(b) else []
        return head + [line for i, (x, y) in enumerate(zip(a, b)) for line in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:160]!r} against {str(b)[:160]!r}"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                        help="a moved file: its path in the first run, then in the second")
    args = parser.parse_args(argv)
    for folder in (args.first, args.second):
        if not folder.is_dir():
            parser.error(f"invalid run folder '{folder}': no such folder")
    if bad := [r for r in args.rename if r.count("=") != 1]:
        parser.error(f"invalid --rename '{bad[0]}': give OLD=NEW")
    renames = [tuple(r.split("=")) for r in args.rename]
    first, second = args.first, args.second
    total = 0
    for file in sorted(first.glob("*.json")):
        other = second / file.name
        found = (differences(normalised(json.loads(file.read_text()), renames),
                             normalised(json.loads(other.read_text()), renames))
                 if other.exists() else [f"{file.name} is missing from {second}"])
        total += len(found)
        print(f"{file.name}: {len(found)} difference(s)")
        for line in found[:25]:
            print(f"  {line}")
    print(f"{total} difference(s) apart from times")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
