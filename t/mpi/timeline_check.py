#!/usr/bin/env python3
"""timeline_check.py - checks a timeline hvd wrote (Chrome trace JSON).

    timeline_check.py FILE [--rank R] [--size N] [--no-ready]
        [--allreduce NAME:COUNT,...] [--fused NAME,...] [--direct NAME,...]
        [--broadcast NAME:COUNT,...] [--allgather NAME:COUNT,...]
        [--cycles]

Always: FILE is a JSON array of objects, each with a string "name" and a
"ph"; a process_name record and a CYCLE track (tid 0); every span ("X") has
numeric ts >= 0 and dur >= 0 and sits on the track (thread_name) of its
tensor; every instant ("i") has a numeric ts.
--rank R: every record has pid R (and process_name says "hvd rank R").
--allreduce NAME:COUNT: NAME has one track and exactly COUNT spans each of
  NEGOTIATE, QUEUE and ALLREDUCE; in every round QUEUE starts where
  NEGOTIATE ends and ALLREDUCE starts no earlier than QUEUE.
--broadcast / --allgather NAME:COUNT: the same with BROADCAST / ALLGATHER.
--size N (unless --no-ready): every NEGOTIATE has args.ready_ms, an object
  with exactly the keys "0".."N-1" and numbers >= 0 as values.
--fused NAME: NAME has MEMCPY_IN_FUSION_BUFFER and MEMCPY_OUT_FUSION_BUFFER
  spans, as many of each.
--direct NAME: NAME has no MEMCPY_* span (reduced in place).
--cycles: at least one CYCLE_START instant on tid 0 with an integer
  args.cycle.

Prints "# ..." for each problem and exits 1, or exits 0 silently.
"""
import json
import sys

problems = []


def problem(msg):
    problems.append(msg)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def pairs(arg):
    out = []
    for item in arg.split(","):
        if not item:
            continue
        name, _, count = item.rpartition(":")
        out.append((name, int(count)))
    return out


def main(argv):
    args = {"--rank": None, "--size": None, "--allreduce": "", "--fused": "",
            "--direct": "", "--broadcast": "", "--allgather": ""}
    flags = set()
    path = None
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("--no-ready", "--cycles"):
            flags.add(a)
        elif a in args:
            i += 1
            args[a] = argv[i]
        elif path is None:
            path = a
        else:
            print("usage: see the comment at the top", file=sys.stderr)
            return 2
        i += 1
    rank = None if args["--rank"] is None else int(args["--rank"])
    size = None if args["--size"] is None else int(args["--size"])

    try:
        with open(path) as f:
            events = json.load(f)
    except (OSError, ValueError) as e:
        print("# %s is not valid JSON: %s" % (path, e))
        try:
            with open(path) as f:
                text = f.read()
            print("# its last 200 characters: %r" % text[-200:])
        except OSError:
            pass
        return 1
    if not isinstance(events, list):
        print("# %s is not a JSON array" % path)
        return 1

    tracks = {}  # (pid, tid) -> name
    spans = {}  # name -> phase -> [event]
    cycles = 0
    procs = 0
    for e in events:
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) \
                or not isinstance(e.get("ph"), str):
            problem("a record without name/ph: %r" % (e,))
            continue
        if rank is not None and e.get("pid") != rank:
            problem("pid %r, not %d: %r" % (e.get("pid"), rank, e))
        ph, name = e["ph"], e["name"]
        if ph == "M":
            if name == "thread_name":
                key = (e.get("pid"), e.get("tid"))
                tname = e.get("args", {}).get("name")
                if key in tracks:
                    problem("track %r named twice: %r, %r"
                            % (key, tracks[key], tname))
                tracks[key] = tname
            elif name == "process_name":
                procs += 1
                if rank is not None and \
                        e.get("args", {}).get("name") != "hvd rank %d" % rank:
                    problem("process_name %r" % (e,))
        elif ph == "X":
            if not is_num(e.get("ts")) or not is_num(e.get("dur")):
                problem("a span without numeric ts/dur: %r" % (e,))
                continue
            if e["ts"] < 0 or e["dur"] < 0:
                problem("a span with negative ts/dur: %r" % (e,))
            tname = tracks.get((e.get("pid"), e.get("tid")))
            if tname is None:
                problem("a span on an unnamed track: %r" % (e,))
                continue
            spans.setdefault(tname, {}).setdefault(name, []).append(e)
        elif ph == "i":
            if not is_num(e.get("ts")):
                problem("an instant without numeric ts: %r" % (e,))
            elif name == "CYCLE_START" and e.get("tid") == 0 and \
                    isinstance(e.get("args", {}).get("cycle"), int):
                cycles += 1
        else:
            problem("unexpected ph %r: %r" % (ph, e))
    if procs != 1:
        problem("%d process_name records, not 1" % procs)
    if "CYCLE" not in tracks.values():
        problem("no CYCLE track")
    names = list(tracks.values())
    for n in set(names):
        if names.count(n) > 1:
            problem("tensor %r has %d tracks" % (n, names.count(n)))

    def collective(name, count, kind):
        if name not in names:
            problem("no track for %r" % name)
            return
        got = spans.get(name, {})
        for phase in ("NEGOTIATE", "QUEUE", kind):
            k = len(got.get(phase, []))
            if k != count:
                problem("%r: %d %s spans, expected %d" % (name, k, phase,
                                                          count))
        neg = sorted(got.get("NEGOTIATE", []), key=lambda e: e["ts"])
        que = sorted(got.get("QUEUE", []), key=lambda e: e["ts"])
        run = sorted(got.get(kind, []), key=lambda e: e["ts"])
        for n_, q, r in zip(neg, que, run):
            if abs(n_["ts"] + n_["dur"] - q["ts"]) > 0.005:
                problem("%r: QUEUE at %r does not start where NEGOTIATE "
                        "(%r + %r) ends" % (name, q["ts"], n_["ts"],
                                            n_["dur"]))
            if r["ts"] + 0.005 < q["ts"]:
                problem("%r: %s at %r before QUEUE at %r"
                        % (name, kind, r["ts"], q["ts"]))
        if size is not None and "--no-ready" not in flags:
            want = sorted(str(k) for k in range(size))
            for n_ in neg:
                ready = n_.get("args", {}).get("ready_ms")
                if not isinstance(ready, dict) or sorted(ready) != want:
                    problem("%r: NEGOTIATE without ready_ms for ranks "
                            "0..%d: %r" % (name, size - 1, n_))
                elif not all(is_num(v) and v >= 0 for v in ready.values()):
                    problem("%r: ready_ms values not numbers >= 0: %r"
                            % (name, ready))

    for name, count in pairs(args["--allreduce"]):
        collective(name, count, "ALLREDUCE")
    for name, count in pairs(args["--broadcast"]):
        collective(name, count, "BROADCAST")
    for name, count in pairs(args["--allgather"]):
        collective(name, count, "ALLGATHER")
    for name in filter(None, args["--fused"].split(",")):
        got = spans.get(name, {})
        a = len(got.get("MEMCPY_IN_FUSION_BUFFER", []))
        b = len(got.get("MEMCPY_OUT_FUSION_BUFFER", []))
        if a == 0 or a != b:
            problem("%r: %d MEMCPY_IN_FUSION_BUFFER and %d "
                    "MEMCPY_OUT_FUSION_BUFFER spans" % (name, a, b))
    for name in filter(None, args["--direct"].split(",")):
        got = spans.get(name, {})
        k = sum(len(v) for p, v in got.items() if p.startswith("MEMCPY"))
        if k:
            problem("%r: %d MEMCPY spans; expected it reduced in place"
                    % (name, k))
    if "--cycles" in flags and cycles == 0:
        problem("no CYCLE_START instant")

    for p in problems[:20]:
        print("# " + p)
    if len(problems) > 20:
        print("# ... and %d more" % (len(problems) - 20))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
