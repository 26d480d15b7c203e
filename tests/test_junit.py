"""`harness run --junit FILE` / `harness report RUN_DIR --junit FILE`: the record as JUnit XML that a JUnit
schema accepts (the Surefire/Jenkins junit-10.xsd, tests/data/junit/SOURCE.md), one case per check and claim."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.cli import main

etree = pytest.importorskip("lxml.etree")
SCHEMA = Path(__file__).parent / "data" / "junit" / "junit-10.xsd"


def _valid(path: Path):
    schema = etree.XMLSchema(etree.parse(str(SCHEMA)))
    doc = etree.parse(str(path))
    assert schema.validate(doc), schema.error_log
    return doc.getroot()


@pytest.fixture(scope="module")
def run(falsify_run) -> tuple[Path, Path]:
    """The main job's shape, small (conftest's falsify_run), and the JUnit file its run wrote."""
    return falsify_run


def test_a_runs_junit_file_is_schema_valid_and_has_a_case_per_check_and_claim(run):
    run_dir, junit = run
    root = _valid(junit)
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    verdict = json.loads((run_dir / "verdict.json").read_text())
    checks = [c for s in summary["steps"].values() for c in s["checks"]]
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert {"measure", "verdict", "claims", "run"} <= set(suites)
    assert [c.get("name") for c in suites["measure"].findall("testcase")] == \
        [c["name"] for c in summary["steps"]["measure"]["checks"]]
    claims = {c.get("name"): c for c in suites["claims"].findall("testcase")}
    assert set(claims) == {c["id"] for c in verdict["claims"]}
    for c in verdict["claims"]:
        outcome = [child.tag for child in claims[c["id"]]]
        expected = [] if c["verdict"] == "holds" else ["failure"] if c["verdict"] == "falsified" else ["skipped"]
        assert outcome == expected, (c["id"], c["verdict"])
    assert int(root.get("tests")) == sum(int(s.get("tests")) for s in suites.values()) >= len(checks) + len(claims)
    assert int(root.get("failures")) == 0  # every check passed, no claim falsified


def test_failed_checks_and_falsified_claims_are_failures_and_the_report_writes_the_same(run, tmp_path, capsys):
    run_dir, junit = run
    again = tmp_path / "again.xml"
    assert main(["report", str(run_dir), "--junit", str(again)]) == 0
    assert again.read_text() == junit.read_text()  # from the record alone
    broken = tmp_path / "run"
    shutil.copytree(run_dir, broken)
    record = json.loads((broken / "summary.json").read_text())
    record["summary"]["steps"]["measure"]["checks"][0].update(ok=False, detail="1/2 ok")
    record["outcome"] = "failed"
    (broken / "summary.json").write_text(json.dumps(record))
    verdict = json.loads((broken / "verdict.json").read_text())
    verdict["claims"][0]["verdict"] = "falsified"
    (broken / "verdict.json").write_text(json.dumps(verdict))
    out = tmp_path / "broken.xml"
    assert main(["report", str(broken), "--junit", str(out)]) == 0
    root = _valid(out)
    failed = {(c.getparent().get("name"), c.get("name")) for c in root.iter("testcase") if c.find("failure") is not None}
    assert failed == {("measure", record["summary"]["steps"]["measure"]["checks"][0]["name"]),
                      ("claims", verdict["claims"][0]["id"]), ("run", "completed")}
    assert int(root.get("failures")) == 3
    assert main(["report", str(tmp_path), "--junit", str(out)]) == 2  # not a run record: exit 2, one line
    assert "Traceback" not in capsys.readouterr().err


def test_summary_and_verdict_follow_their_versioned_schemas(run):
    """summary.json and verdict.json validate against schemas/ (what CI and dashboards may rely on), and the
    schemas are not vacuous: a record without its version or a claim without its verdict is refused."""
    jsonschema = pytest.importorskip("jsonschema")
    run_dir, _ = run
    root = Path(__file__).resolve().parents[1] / "schemas"
    for name in ("summary", "verdict"):
        schema = json.loads((root / f"{name}.schema.json").read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        record = json.loads((run_dir / f"{name}.json").read_text())
        jsonschema.validate(record, schema)
        assert record["schema_version"] == 1
        broken = {k: v for k, v in record.items() if k != "schema_version"}
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    verdict["claims"][0].pop("verdict")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(verdict, json.loads((root / "verdict.schema.json").read_text()))
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["summary"]["delays_ms"]["turnaround"]["mean_ci95"] = [1.0]  # an interval has two ends
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(summary, json.loads((root / "summary.schema.json").read_text()))
