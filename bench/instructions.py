"""Benchmark: machine instructions per admission, counted rather than timed.

On a shared machine a timing moves by several percent from one run to the
next, as much as most single changes to the hot path; the number of
instructions a piece of code executes does not move at all. This counts
them with valgrind's cachegrind (Debian: valgrind; `make bench-instructions`
installs it) for what one admission costs in-process, per payload of
`make bench-server`:

- ours: the review's JSON objects counted, the review parsed, evaluated (in
  place, as the server does), the answer built and encoded, and the line
  per admission made as `serve` makes it at its default log level (INFO: a
  line for a denial; for a patch too with ``--log-mutations``, as
  `serve --log-mutations` does) and written as `serve` writes it (its
  writer thread included; ``--log-level WARNING``: no line);
- null: what the null webhook of `make bench-server` does in-process: the
  body parsed with ``json.loads``, the "allowed" answer dumped.

TLS, HTTP and the event loop (the same for both servers, and most of a
request's cost) are not in it; ``--server`` counts them too: each server
(`serve` as `make bench-server` starts it, and the orjson floor) runs
under callgrind, h2load sends it the review (20 connections), and the
count of the server's whole process over those requests, warm-up left out
(callgrind_control zeroes it, then dumps it), is divided by their number.
What the two servers do around an admission is then in the difference, to
the last instruction of TLS, HTTP, the event loop and the log writer. Each count is the difference of two runs of
the same loop, ``--small`` and ``--large`` admissions long, divided by the
difference: start-up and imports cancel out (each run with the same hash
seed, and no garbage collection during the loop). Instructions are not time
(a cache miss costs hundreds of them, and the server's caches are colder
than a loop's), but a change that removes instructions from the hot path
shows here to the last one; `make bench-server` says what it is worth.

    make bench-instructions      # or: python bench/instructions.py [--small N --large M --only PAYLOAD --log-level WARNING --log-mutations]
    python bench/instructions.py --server [--requests N --only PAYLOAD]   # the whole server per request (also h2load)
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.server import certificates, floor_command, h2load, null_answer, payloads, serve_command, wait_ready  # noqa: E402
from webhook import compiled  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def loop(side: str, file: Path, admissions: int, level: str, mutations: bool) -> None:
    """Admit the review in ``file`` ``admissions`` times, as ``side`` ("ours" or "null") does, logging at
    ``level``, a patch too with ``mutations`` (run under valgrind)."""
    body = file.read_bytes()
    if side == "null":
        _quiet()
        for _ in range(admissions):
            json.dumps(null_answer(body))  # (as web.json_response dumps it)
        return
    from webhook import logs
    from webhook import review as reviews
    from webhook.policy.loader import load_directory
    from webhook.server import evaluation, handlers
    from webhook.server.limits import Limits
    from webhook.view.snapshot import EMPTY_VIEW

    policies, limits = load_directory(REPO / "policies"), Limits()
    logging.getLogger().setLevel(level)
    # the lines written once, at the end: how many batches a run takes would depend on valgrind's speed
    output = logs.Output(logs.JsonFormatter(), os.open(os.devnull, os.O_WRONLY), batch=3600)
    _quiet()
    for _ in range(admissions):
        objects, read = handlers._read_objects(body, limits.max_objects)
        parsed = reviews.parse_review(read)
        outcome = evaluation.decide(policies, parsed, EMPTY_VIEW, "mutate", limits, objects)
        decision, answer = handlers._answer(parsed, outcome.decision, "mutate", limits.max_patch_bytes)
        reviews.encode(answer)
        handlers.log_decision(output, "/mutate", parsed, decision, handlers._outcome(decision, outcome.refused), mutations)
    output.close()


def _quiet() -> None:
    """No collection of the garbage collector during the loop: when one falls in the longer run and
    not in the shorter one, it adds millions of instructions to a difference of a few hundred
    admissions (their objects are freed as they go, by reference counting)."""
    gc.collect()
    gc.disable()


def instructions(side: str, file: Path, admissions: int, level: str, mutations: bool) -> int:
    """Instructions the whole process executes for ``admissions`` admissions (start-up included)."""
    out = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, __file__, "--loop", side, str(file), str(admissions), level, "mutations" if mutations else "-"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # the same dict layouts in every run
    ).stderr
    found = re.search(r"I\s+refs:\s+([\d,]+)", out)
    if found is None:
        raise SystemExit(f"valgrind printed no instruction count:\n{out}")
    return int(found.group(1).replace(",", ""))


def per_request(command: list[str], port: int, file: Path, requests: int, out: Path) -> float:
    """Instructions a whole server process (``command``, listening on ``port``) executes per request of
    ``requests`` for the review in ``file``, warmed up first (run under callgrind)."""
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    try:
        wait_ready(port, server, 600)  # under callgrind, start-up takes ~50 times as long (~60 s)
        h2load(port, file, 200, out.with_suffix(".log"))  # warm: caches, the allocator's pools
        subprocess.run(["callgrind_control", "--zero", str(server.pid)], check=True, capture_output=True)
        h2load(port, file, requests, out.with_suffix(".log"))
        subprocess.run(["callgrind_control", "--dump", str(server.pid)], check=True, capture_output=True)
    finally:
        server.terminate()
        server.wait(60)
    dumped = Path(f"{out}.1")  # (the first dump after the zeroing)
    found = re.search(r"^summary: (\d+)$", dumped.read_text(), re.M)
    if found is None:
        raise SystemExit(f"no instruction count in {dumped}")
    return int(found.group(1)) / requests


def servers(tmp: Path, requests: int, only: str | None, log_mutations: bool) -> None:
    """``--server``: ours and the orjson floor, whole processes, per request."""
    from tests.support import free_ports

    cert, key = certificates(tmp)
    print(f"{'payload':18} {'bytes':>7} {'ours':>12} {'floor':>12} {'ratio':>6}   (instructions per request, whole server)")
    for n, (case, review) in enumerate(payloads().items()):
        if only and case != only:
            continue
        file = tmp / f"{n}.json"
        file.write_text(json.dumps(review))
        ours_port, floor_port = free_ports(2)
        ours = per_request(serve_command(ours_port, cert, key, log_mutations=log_mutations), ours_port, file, requests, tmp / f"ours-{n}.out")
        floor = per_request(floor_command(floor_port, cert, key), floor_port, file, requests, tmp / f"floor-{n}.out")
        print(f"{case:18} {file.stat().st_size:7} {ours:12,.0f} {floor:12,.0f} {floor / ours:5.2f}x")
    print(f"{requests} requests per count (20 connections, after 200 to warm up); ratio: floor / ours, as "
          f"make bench-server's; log level INFO{', --log-mutations' if log_mutations else ''}; policy core: {compiled.policy_core()}")


def per_admission(side: str, file: Path, small: int, large: int, level: str, mutations: bool) -> float:
    return (instructions(side, file, large, level, mutations) - instructions(side, file, small, level, mutations)) / (large - small)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", type=int, default=50)
    parser.add_argument("--large", type=int, default=250)
    parser.add_argument("--only", help="one payload (e.g. 'training pod')")
    parser.add_argument("--log-level", default="INFO", choices=["INFO", "WARNING"], help="ours: INFO (the default) or WARNING")
    parser.add_argument("--log-mutations", action="store_true", help="ours: a line per patch too (serve --log-mutations)")
    parser.add_argument("--server", action="store_true", help="whole servers per request, ours and the orjson floor")
    parser.add_argument("--requests", type=int, default=2000, help="--server: requests per count")
    parser.add_argument("--loop", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop:
        loop(args.loop[0], Path(args.loop[1]), int(args.loop[2]), args.loop[3], args.loop[4] == "mutations")
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found: apt-get install valgrind (make bench-instructions does it)")
    if args.server:
        if shutil.which("h2load") is None:
            raise SystemExit("h2load not found: apt-get install nghttp2-client (make bench-server does it)")
        with tempfile.TemporaryDirectory() as tmp:
            servers(Path(tmp), args.requests, args.only, args.log_mutations)
        return
    if not args.small < args.large:
        raise SystemExit("--small must be below --large")
    print(f"{'payload':18} {'bytes':>7} {'ours':>12} {'null':>12} {'ratio':>6}   (instructions per admission)")
    with tempfile.TemporaryDirectory() as tmp:
        for n, (case, review) in enumerate(payloads().items()):
            if args.only and case != args.only:
                continue
            file = Path(tmp) / f"{n}.json"
            file.write_text(json.dumps(review))
            ours = per_admission("ours", file, args.small, args.large, args.log_level, args.log_mutations)
            null = per_admission("null", file, args.small, args.large, args.log_level, False)
            print(f"{case:18} {file.stat().st_size:7} {ours:12,.0f} {null:12,.0f} {ours / null:5.2f}x")
    print(f"admissions {args.large} - {args.small} per count; log level {args.log_level}"
          f"{', --log-mutations' if args.log_mutations else ''}; policy core: {compiled.policy_core()}")


if __name__ == "__main__":
    main()
