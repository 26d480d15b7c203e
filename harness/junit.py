"""A run record as JUnit XML, for CI dashboards: one test suite per step, one test case per check; one suite
of claims, one test case per claim a verdict judged (falsified: a failure; inconclusive or not applicable:
skipped with the reason; holds: a pass). Built from the record's files alone (summary.json and the step
artifacts that carry `claims`), so `harness report RUN_DIR --junit FILE` gives the same file later."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

PASSING = ("holds", "consistent")  # a claim verdict that starts with one of these passed


def _claims(run_dir: Path, summary: dict) -> list[tuple[str, dict]]:
    """(artifact, claim) for every claim of every JSON artifact the steps declared."""
    out = []
    for step in (summary.get("steps") or {}).values():
        for name in step.get("artifacts") or []:
            path = run_dir / name
            if not name.endswith(".json") or not path.is_file():
                continue
            try:
                claims = json.loads(path.read_text()).get("claims")
            except (ValueError, AttributeError):
                continue
            out += [(name, c) for c in claims or [] if isinstance(c, dict) and "id" in c and "verdict" in c]
    return out


def junit_xml(run_dir: Path) -> str:
    """The record in `run_dir` as a JUnit XML document (testsuites)."""
    record = json.loads((run_dir / "summary.json").read_text())
    root = ET.Element("testsuites", name=str(record.get("playbook", "")),
                      time=f"{float((record.get('summary') or {}).get('wall_s') or 0.0):.3f}")
    return _document(root, _run_suites(root, run_dir))


def sweep_junit_xml(name: str, points: list[tuple[str, Path]]) -> str:
    """A sweep as one JUnit XML document: every point's suites, named `POINT/SUITE`; a point without a run record
    is one failed case (it never ran to a record)."""
    root = ET.Element("testsuites", name=name)
    totals = [0, 0]
    for point, run_dir in points:
        if (run_dir / "summary.json").is_file():
            tests, failures = _run_suites(root, run_dir, prefix=f"{point}/")
        else:
            tests, failures = _suite(root, f"{point}/run", "", [(f"{name}.{point}", "completed", "failure",
                                                                 "no run record (summary.json)")])
        totals[0] += tests
        totals[1] += failures
    return _document(root, tuple(totals))


def _document(root: ET.Element, totals: tuple[int, int]) -> str:
    root.set("tests", str(totals[0]))
    root.set("failures", str(totals[1]))
    root.set("errors", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _suite(root: ET.Element, name: str, timestamp: str,
           cases: list[tuple[str, str, str | None, str | None]]) -> tuple[int, int]:
    """cases: (classname, name, outcome None|'failure'|'skipped', message). Returns (tests, failures)."""
    failures = sum(c[2] == "failure" for c in cases)
    skipped = sum(c[2] == "skipped" for c in cases)
    el = ET.SubElement(root, "testsuite", name=name, tests=str(len(cases)), failures=str(failures), errors="0",
                       skipped=str(skipped), timestamp=timestamp)
    for classname, case, outcome, message in cases:
        tc = ET.SubElement(el, "testcase", classname=classname, name=case, time="0")
        if outcome is not None:
            ET.SubElement(tc, outcome, message=message or "", type=outcome).text = message or ""
    return len(cases), failures


def _run_suites(root: ET.Element, run_dir: Path, prefix: str = "") -> tuple[int, int]:
    """One run record's suites (steps, claims, run) added to `root`, names prefixed. Returns (tests, failures)."""
    record = json.loads((run_dir / "summary.json").read_text())
    summary = record.get("summary") or {}
    stamp = str(record.get("started_utc", ""))
    playbook = record.get("playbook", "run")
    counts = []
    for step, result in (summary.get("steps") or {}).items():
        cases = [(f"{playbook}.{step}", str(c.get("name", "check")),
                  None if c.get("ok") else "failure", None if c.get("ok") else str(c.get("detail", "")))
                 for c in result.get("checks") or []]
        if not cases:  # a step without checks still ran (or did not): one case for the step itself
            cases = [(f"{playbook}.{step}", "step",
                      None if result.get("ok") else "failure", None if result.get("ok") else "step not ok")]
        counts.append(_suite(root, prefix + step, stamp, cases))
    claims = _claims(run_dir, summary)
    if claims:
        cases = []
        for artifact, c in claims:
            verdict = str(c["verdict"])
            why = str(c.get("summary") or c.get("criterion") or verdict)
            outcome = None if verdict.startswith(PASSING) else "failure" if verdict.startswith("falsified") \
                or verdict.startswith("inconsistent") else "skipped"
            cases.append((f"claims.{Path(artifact).stem}", str(c["id"]), outcome,
                          None if outcome is None else why if why.startswith(verdict) else f"{verdict}: {why}"))
        counts.append(_suite(root, prefix + "claims", stamp, cases))
    outcome = record.get("outcome")
    counts.append(_suite(root, prefix + "run", stamp, [(f"{playbook}.run", "completed",  # a run stopped early fails
                                                       None if outcome in (None, "completed") else "failure",
                                                       None if outcome in (None, "completed") else
                                                       f"{outcome}: {record.get('error') or ''}".rstrip(": "))]))
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def write_junit(run_dir: Path, path: Path) -> Path:
    from harness.record import write_text_atomic

    write_text_atomic(path, junit_xml(run_dir))
    return path
