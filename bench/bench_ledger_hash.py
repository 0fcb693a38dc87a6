"""What keying the ledger costs an append: the hash of one entry, plain SHA-256 (the format of
entries written before the chain was keyed) against the HMAC every entry is written with now.

The append's other work (the INSERT, one statement either way, now with two more parameters)
is unchanged, so this is the whole difference on the stop's and every transition's path.

    .venv/bin/python bench/bench_ledger_hash.py [--n 200000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200_000)
    n = parser.parse_args().n
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    import hashlib
    import json

    from django.core.serializers.json import DjangoJSONEncoder
    from django.utils import timezone

    from runs.ledger import _timestamp, entry_hash
    from runs.ledger_keys import signing_key

    # A stop's entry: the shape `run_stop` writes.
    columns = {
        "run_id": "run_01jfq5m7w8x9y0z1a2b3c4d5e6",
        "run_seq": 7,
        "at": _timestamp(timezone.now()),
        "actor_kind": "user",
        "actor_id": "12",
        "actor": "alice",
        "action": "run.stop_requested",
        "reason": "user_stop",
        "payload": {"from": "running", "to": "cancel_requested", "epoch": 2, "note": "pause"},
        "prev_hash": "ab" * 32,
    }
    key = signing_key()

    def before() -> str:
        """The hash as appends made it before the chain was keyed."""
        body = json.dumps(columns, sort_keys=True, separators=(",", ":"), cls=DjangoJSONEncoder)
        return hashlib.sha256(body.encode()).hexdigest()

    for name, call in (
        ("plain SHA-256 (before)", before),
        (
            "HMAC-SHA256, every column (now)",
            lambda: entry_hash(key=key, team_slug="acme", **columns),
        ),
        (
            "key lookup + HMAC (as ledger_append)",
            lambda: entry_hash(key=signing_key(), team_slug="acme", **columns),
        ),
    ):
        rounds = []
        for _round in range(3):  # the best of three: the machine is shared
            started = time.perf_counter()
            for _ in range(n):
                call()
            rounds.append((time.perf_counter() - started) / n * 1e6)
        micros = min(rounds)
        print(f"{name:40s} {micros:6.2f} µs per entry ({n:,} entries)")


if __name__ == "__main__":
    main()
