"""Summarises make realworld's runs (bench/realworld.sh) as Markdown.

runs/SUITE-RECORDER/ holds, per run: outcomes ("test pass|fail|skip" lines),
results ("test status seconds" lines, one per wrapped command) and
reports/*.json (hooktrace's JSON reports). SUITE-untraced is the baseline.
"""
import collections
import glob
import json
import os
import sys


def read_lines(path):
    try:
        with open(path) as f:
            return [line.split() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def run_of(d):
    outcomes = {}
    for parts in read_lines(os.path.join(d, "outcomes")):
        if len(parts) >= 2:
            outcomes[parts[0]] = parts[1]
    times = [(p[0], float(p[2])) for p in read_lines(os.path.join(d, "results")) if len(p) >= 3]
    kinds = collections.Counter()
    titles = collections.Counter()
    incomplete, lost, reports, unrecorded = [], 0, 0, 0
    for path in sorted(glob.glob(os.path.join(d, "reports", "*.json"))):
        try:
            with open(path) as f:
                rep = json.load(f)
        except (OSError, ValueError) as e:
            incomplete.append("%s (unreadable report: %s)" % (os.path.basename(path), e))
            continue
        reports += 1
        st = rep.get("stats", {})
        lost += st.get("lost_events", 0)
        unrecorded += st.get("unrecorded_processes", 0)
        if not st.get("complete", True):
            incomplete.append("%s (%s)" % (os.path.basename(path)[:-5], st.get("incomplete", "incomplete")))
        for fd in rep.get("findings") or []:
            kinds["%s %s" % (fd.get("severity", "?"), fd.get("kind", "?"))] += 1
            titles[fd.get("title") or fd.get("summary") or fd.get("kind", "?")] += 1
    return {"outcomes": outcomes, "times": times, "kinds": kinds, "titles": titles,
            "incomplete": incomplete, "lost": lost, "reports": reports, "unrecorded": unrecorded}


def counts(outcomes):
    c = collections.Counter(outcomes.values())
    return "%d pass, %d fail, %d skip" % (c["pass"], c["fail"], c["skip"])


def main(root):
    runs = collections.defaultdict(dict)
    for d in sorted(glob.glob(os.path.join(root, "*-*"))):
        suite, recorder = os.path.basename(d).split("-", 1)
        runs[suite][recorder] = run_of(d)
    print("| suite | run | tests | outcomes | changed vs untraced | findings | lost events | wall (s) | x untraced |")
    print("|---|---|---|---|---|---|---|---|---|")
    notes = []
    for suite, by in runs.items():
        base = by.get("untraced")
        base_wall = sum(t for _, t in base["times"]) if base else 0
        for recorder in ["untraced"] + sorted(r for r in by if r != "untraced"):
            r = by.get(recorder)
            if not r:
                continue
            wall = sum(t for _, t in r["times"])
            changed = []
            if base and recorder != "untraced":
                for name, res in sorted(r["outcomes"].items()):
                    was = base["outcomes"].get(name)
                    if was and was != res:
                        changed.append("%s %s→%s" % (name, was, res))
            findings = ", ".join("%d %s" % (n, k) for k, n in sorted(r["kinds"].items())) or (
                "0" if recorder != "untraced" else "")
            ratio = "%.2fx" % (wall / base_wall) if base_wall and recorder != "untraced" else ""
            print("| %s | %s | %d | %s | %s | %s | %s | %.1f | %s |" % (
                suite, recorder, len(r["outcomes"]), counts(r["outcomes"]),
                "; ".join(changed) if changed else ("none" if recorder != "untraced" else ""),
                findings, r["lost"] if recorder != "untraced" else "", wall, ratio))
            if r["incomplete"]:
                notes.append("- %s under %s: %d incomplete traces: %s" % (
                    suite, recorder, len(r["incomplete"]), "; ".join(r["incomplete"][:5])))
            if r["unrecorded"]:
                notes.append("- %s under %s: %d processes could not record" % (suite, recorder, r["unrecorded"]))
            for title, n in r["titles"].most_common(5):
                notes.append("- %s under %s: %dx %s" % (suite, recorder, n, title))
            slow = sorted(r["times"], key=lambda x: -x[1])[:3]
            if recorder != "untraced" and base and len(r["times"]) > 1:
                bt = dict(base["times"])
                notes.append("- %s under %s, slowest: %s" % (suite, recorder, ", ".join(
                    "%s %.1f s (untraced %.1f s)" % (n, t, bt.get(n, 0)) for n, t in slow)))
    if notes:
        print()
        print("\n".join(notes))


if __name__ == "__main__":
    main(sys.argv[1])
