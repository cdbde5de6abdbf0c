"""The GPU suite's report (benchmarks/gpu_suite.sh): results.json and summary.md from the steps recorded so far.

    python benchmarks/gpu_checks/report.py OUT WORK

Reads WORK/suite.tsv (the suite's settings), WORK/steps.tsv (one line a step: name, status, exit code, seconds,
budget, command) and each step's result (WORK/NAME.xml, pytest's JUnit XML, else WORK/NAME.json) and output
(WORK/NAME.out); writes OUT/results.json (every step with its result and the end of its output) and
OUT/summary.md (the same, readable). The suite runs it after every step, so a run cut short still has a report.
"""
import json, os, sys, xml.etree.ElementTree as ET

out, work = sys.argv[1], sys.argv[2]
suite = dict(line.rstrip("\n").split("\t", 1) for line in open(os.path.join(work, "suite.tsv")))

def read_json(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None

def junit(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = dict(tests=0, failures=0, errors=0, skipped=0, time=0.0)
    failed, slowest = [], []
    for suite_el in root.iter("testsuite"):
        for key in counts:
            counts[key] += float(suite_el.get(key, 0)) if key == "time" else int(suite_el.get(key, 0))
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        slowest.append((float(case.get("time", 0)), name))
        for tag in ("failure", "error"):
            for el in case.findall(tag):
                failed.append(dict(test=name, kind=tag, message=(el.get("message") or "")[:500]))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["failed"] = failed[:50]
    counts["slowest"] = [dict(test=n, seconds=round(t, 2)) for t, n in sorted(slowest, reverse=True)[:10]]
    return counts

steps = []
for line in open(os.path.join(work, "steps.tsv")):
    name, status, rc, seconds, budget, command = line.rstrip("\n").split("\t")
    step = dict(name=name, status=status, rc=int(rc), seconds=int(seconds), budget=int(budget), command=command)
    step["result"] = junit(os.path.join(work, name + ".xml")) or read_json(os.path.join(work, name + ".json"))
    try:
        tail = open(os.path.join(work, name + ".out"), errors="replace").read().splitlines()[-40:]
        step["output_tail"] = [l[:300] for l in tail]
    except OSError:
        step["output_tail"] = []
    steps.append(step)
ok = all(s["status"].startswith(("ok", "skipped")) for s in steps)
results = dict(suite=dict(suite, ok=ok), steps=steps)
json.dump(results, open(os.path.join(out, "results.json"), "w"), indent=1)

md = [f"# GPU suite {suite['started']}{' (dry run)' if suite['dry_run'] == '1' else ''}", "",
      "| step | status | seconds | budget |", "| --- | --- | --- | --- |"]
md += [f"| {s['name']} | {s['status']} | {s['seconds']} | {s['budget']} |" for s in steps]
for s in steps:
    r = s["result"]
    if s["name"] == "info" or (s["status"] != "ok" and not s["status"].startswith("skipped")):
        md += ["", f"## {s['name']}: {s['status']}", "", "```", *s["output_tail"][-25:], "```"]
    if isinstance(r, dict) and "tests" in r:
        md += ["", f"## {s['name']}: {r['passed']} passed, {r['failures']} failed, {r['errors']} errors, "
                   f"{r['skipped']} skipped in {r['time']:.0f} s"]
        md += [f"- {f['kind']}: {f['test']}: {f['message'][:200]}" for f in r["failed"]]
    elif isinstance(r, dict) and isinstance(r.get("results"), list):
        md += ["", f"## {s['name']} on {r.get('device')}", ""]
        md += [f"- {c['status']}: {c['check']} ({c['seconds']:.1f} s): {c['detail'].splitlines()[0] if c['detail'] else ''}"
               for c in r["results"]]
    elif isinstance(r, dict) and isinstance(r.get("rows"), list) and r["rows"]:
        rows = [row for row in r["rows"] if isinstance(row, dict)]
        cols = []
        for row in rows:
            cols += [c for c in row if c not in cols and not isinstance(row[c], (dict, list))]
        md += ["", f"## {r.get('title', s['name'])}", ""]
        if isinstance(r.get("conditions"), dict):
            md += [" ".join(f"{k}={v}" for k, v in r["conditions"].items()), ""]
        md += ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
        md += ["| " + " | ".join(f"{row[c]:.4g}" if isinstance(row.get(c), float) else str(row.get(c, ""))
                                 for c in cols) + " |" for row in rows]
    elif isinstance(r, dict) and s["name"].startswith("bench"):
        md += ["", f"## {s['name']}", "", "```", json.dumps(r, indent=1)[:4000], "```"]
md += ["", f"Suite {'passed' if ok else 'FAILED'}; budget {suite['budget']} s."]
open(os.path.join(out, "summary.md"), "w").write("\n".join(md) + "\n")
