#!/usr/bin/env python3
"""Where a `start` run's time went, round by round, from its JSON Lines with their arrival times (the
`events.tsv` the benches write: `<unix time>\\t<JSON line>` per event).

    python3 benches/rounds.py EVENTS.tsv

A round is the probes that started together (each within a second of the one before); probes stopped
because their answer no longer mattered are counted apart. Its last answer is when its last answered probe
finished. Prints one Markdown row per round (probes, how they ran, the longest probe, when the round
began and when its last answer came), the cross-check, and when each stage began and ended, every time
from the run's start.
"""

import json
import sys

# Probes of one round start within this many seconds of one another (the driver hands them out at once).
GAP = 1.0


def load(path):
    events = []
    with open(path) as f:
        for line in f:
            stamp, _, text = line.rstrip("\n").partition("\t")
            if text:
                events.append((float(stamp), json.loads(text)))
    return events


def main():
    events = load(sys.argv[1])
    if not events:
        sys.exit("no events")
    t0 = events[0][0]
    rounds, started, cross, stages, said = [], {}, [], [], []
    last_start = None
    for stamp, e in events:
        at, kind, data = stamp - t0, e["type"], e.get("data", {})
        if kind == "phase_started" and data.get("phase") == "checkout":
            if data.get("role") == "verify":
                continue
            if last_start is None or at - last_start > GAP:
                rounds.append({"start": at, "probes": [], "stopped": 0, "end": at})
            last_start = at
            started[data["step"]] = rounds[-1]
        elif kind == "probe_finished":
            record = data["record"]
            row = {
                "duration": record.get("duration_s") or 0.0,
                "runner": (record.get("runner") or "-").split(":")[0],
                "at": at,
            }
            if record["role"] == "verify":
                cross.append(row)
                continue
            r = started.get(data["step"])
            if r is not None:
                r["probes"].append(row)
                r["end"] = max(r["end"], at)
        elif kind == "probe_abandoned":
            r = started.get(data["step"])
            if r is not None:
                r["stopped"] += 1
        elif kind in (
            "stage_began",
            "triage_finished",
            "shrink_finished",
            "bundle_written",
        ):
            stage = data.get("stage")
            stages.append(
                (at, kind, stage.get("kind", "") if isinstance(stage, dict) else "")
            )
        elif kind == "finished":
            said.append((at, data["report"].get("message", "")))
    print(
        "| round | probes answered (stopped) | ran | longest probe | began | last answer |"
    )
    print("|---|---|---|---|---|---|")
    for n, r in enumerate(rounds, 1):
        runners = sorted({p["runner"] for p in r["probes"]})
        longest = max((p["duration"] for p in r["probes"]), default=0.0)
        print(
            f"| {n} | {len(r['probes'])} ({r['stopped']}) | {', '.join(runners) or '-'} | {longest:.1f} s "
            f"| {r['start']:.1f} s | {r['end']:.1f} s |"
        )
    if cross:
        print(
            f"| cross-check | {len(cross)} | {', '.join(sorted({c['runner'] for c in cross}))} "
            f"| {max(c['duration'] for c in cross):.1f} s | {min(c['at'] - c['duration'] for c in cross):.1f} s "
            f"| {max(c['at'] for c in cross):.1f} s |"
        )
    for at, kind, what in stages:
        print(f"{at:7.1f} s  {kind} {what}".rstrip())
    for at, message in said:
        print(f"{at:7.1f} s  finished: {message}")


if __name__ == "__main__":
    main()
