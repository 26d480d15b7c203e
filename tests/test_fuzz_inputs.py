"""Hostile input (issue 7): whatever the file holds, `harness validate` answers `file:line: message`
with exit 2 (or ok with exit 0), never a traceback, and writes nothing."""
from __future__ import annotations

import contextlib
import io
import json
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

import harness.commands.validate as validate
from harness.cli import main
from harness.config import StepType
from harness.specs import Spec

INVENTORY = {
    "bench": {"name": "lab", "emulated": True},
    "ocs": {"ocs1": {"protocol": "polatis-tl1", "url": "tcp://127.0.0.1:3082", "size": [8, 8],
                     "allowed_ports": ["1-4", 9, "10-12"], "user": "admin", "password_env": "FUZZ_OCS_PW"}},
    "hosts": {"gpu1": {"address": "127.0.0.1", "port": 22, "user": "lab",
                       "nics": [{"netdev": "eth0", "rdma_dev": "mlx5_0", "rdma_port": 1, "ocs": "ocs1",
                                 "tx": 1, "rx": 9}]}},
}
PLAYBOOK = {"name": "fuzz", "seed": 1, "cycles": 2,
            "steps": [{"type": "wait", "name": "w", "seconds": 1.5}, {"type": "turn", "count": 3}]}
PROFILE = {"name": "fuzz", "source": "a test", "ocs": {"switch": {"dist": "lognormal", "mean_ms": 44.0, "p99_ms": 64.0}},
           "nic": {"phy_up": {"dist": "uniform", "low_ms": 0.2, "high_ms": 0.8},
                   "cdr_lock": {"dist": "empirical", "quantiles_ms": [0.1, 0.2, 0.5]}},
           "topology": {"hosts": 2, "nics_per_host": 2, "ocs_size": [8, 8]}, "tools": {"ethtool": "6.1"},
           "faults": {"miscable": [[9, 10]], "inject": [{"kind": "port_flap", "probability": 0.1, "flaps": 2}]}}


class WaitParams(Spec):
    seconds: float


class TurnParams(Spec):
    count: int = 1
    pattern: str = "ring"


REGISTRY = {"wait": StepType("wait", WaitParams), "turn": StepType("turn", TurnParams)}

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
MESSAGE = re.compile(r"^harness: (?P<file>.+?):(?P<line>\d+): \S")

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=10**30),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
                    st.sampled_from(["${UNSET_FUZZ_VAR}", "${X:-1}", "$${", "1-200", "polatis-scpi", "~"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=4)),
    max_leaves=12)


@pytest.fixture(autouse=True)
def _registry(monkeypatch):
    monkeypatch.setattr(validate, "discover_steps", lambda: REGISTRY)
    monkeypatch.setenv("FUZZ_OCS_PW", "pw")
    monkeypatch.delenv("UNSET_FUZZ_VAR", raising=False)


def run_validate(raw: bytes, extra_files: dict[str, bytes] | None = None) -> tuple[int, str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, content in (extra_files or {}).items():
            (tmp / name).write_bytes(content)
        target = tmp / "input.yaml"
        target.write_bytes(raw)
        before = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in tmp.iterdir())
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["validate", str(target)])
        after = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in tmp.iterdir())
    assert before == after, "validate must write nothing"
    out_text, err_text = out.getvalue(), err.getvalue()
    assert "Traceback" not in err_text
    if code == 0:
        assert out_text.startswith(f"{target}: ok (") and not err_text
    else:
        assert code == 2, (code, err_text)
        lines = err_text.rstrip("\n").split("\n")  # not splitlines(): a key may hold \x1c-\x1e
        assert lines and err_text.endswith("\n"), err_text
        for line in lines:  # every problem of the file, one line each, each naming file:line
            match = MESSAGE.match(line + "\n")
            assert match, err_text
            assert match["file"].startswith(str(tmp)) and int(match["line"]) >= 1
    return code, out_text, err_text


def test_the_seeds_are_valid():
    assert run_validate(yaml.safe_dump(INVENTORY).encode())[0] == 0
    assert run_validate(yaml.safe_dump(PLAYBOOK).encode())[0] == 0
    assert run_validate(yaml.safe_dump(PROFILE).encode())[0] == 0


@FUZZ
@given(raw=st.binary(max_size=300))
def test_binary_garbage(raw):
    run_validate(raw)


@FUZZ
@given(text=st.text(alphabet=st.sampled_from(list(":-[]{}&*!|>'\"%@`#,?\n\t ab1$")), max_size=120))
def test_yaml_punctuation_soup(text):
    run_validate(text.encode())


@FUZZ
@given(doc=values)
def test_random_documents(doc):
    run_validate(yaml.safe_dump(doc).encode())


def mutate(base, data):
    """Replace, delete or add one node somewhere in `base` (a deep copy)."""
    doc = yaml.safe_load(yaml.safe_dump(base))
    node, path = doc, []
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(list(node) if isinstance(node, dict) else range(len(node))))
        path.append((node, key))
        node = node[key]
    if not path:
        doc[data.draw(st.text(min_size=1, max_size=6))] = data.draw(values)
        return doc
    parent, key = path[-1]
    action = data.draw(st.sampled_from(["replace", "delete", "add"]))
    if action == "replace":
        parent[key] = data.draw(values)
    elif action == "delete":
        del parent[key]
    elif isinstance(parent, dict):
        parent[data.draw(st.text(min_size=1, max_size=6))] = data.draw(values)
    else:
        parent.append(data.draw(values))
    return doc


@FUZZ
@given(data=st.data())
def test_mutated_inventories(data):
    run_validate(yaml.safe_dump(mutate(INVENTORY, data)).encode())


def test_a_switch_named_by_a_number_is_an_input_error_not_a_traceback():
    """Found by test_mutated_inventories: `ocs: {0: null}` with a NIC naming another switch listed the known switch
    names with str.join over an int key (TypeError)."""
    inventory = json.loads(json.dumps(INVENTORY))
    inventory["ocs"] = {0: None}
    code, _, err = run_validate(yaml.safe_dump(inventory).encode())
    assert code == 2 and "no switch named" in err and "known: 0" in err


@FUZZ
@given(data=st.data())
def test_mutated_playbooks(data):
    run_validate(yaml.safe_dump(mutate(PLAYBOOK, data)).encode())


@FUZZ
@given(data=st.data())
def test_mutated_profiles(data):
    run_validate(yaml.safe_dump(mutate(PROFILE, data)).encode())


@pytest.mark.parametrize("fault, said", [
    ([], "faults.inject[0]: expected a mapping with key 'kind', found a list"),  # hypothesis found it: a traceback, not exit 2
    ({}, "faults.inject[0]: missing required key 'kind'"),
    ({"kind": "nope"}, "faults.inject[0]: kind: expected one of 'ssh_drop', 'ocs_deny'"),
])
def test_a_fault_without_a_kind_is_named_with_its_line(fault, said):
    code, _, err = run_validate(yaml.safe_dump(dict(PROFILE, faults={"inject": [fault]})).encode())
    assert code == 2 and said in err and "input.yaml:" in err, err


@FUZZ
@given(include=st.one_of(st.text(max_size=12), st.sampled_from(["input.yaml", "other.yaml", "missing.yaml",
                                                                  "/", ".", "../x"])),
       other=st.binary(max_size=60))
def test_includes(include, other):
    doc = dict(PLAYBOOK, include=include)
    run_validate(yaml.safe_dump(doc).encode(), {"other.yaml": other})


def test_include_cycle_and_self_include_are_errors():
    code, _, err = run_validate(b"include: input.yaml\nname: x\n")
    assert code == 2 and "include cycle" in err
