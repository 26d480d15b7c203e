"""Inventory / playbook loading: file:line errors, templating, includes, schema checks."""
from __future__ import annotations

import textwrap

import pytest

from harness import config
from harness.cli import main
from harness.config import RegistrationError, StepType, load_inventory, load_playbook, load_yaml, register_step
from harness.errors import InputError
from harness.specs import Positive, Spec

INVENTORY = """\
bench: {name: lab-a, emulated: false}
ocs:
  ocs1:
    protocol: polatis-tl1
    url: tcp://192.0.2.10:3082
    size: [16, 16]
    allowed_ports: ["1-8", 17, "18-24"]
    user: admin
    password_env: OCS_PASSWORD
hosts:
  gpu1:
    address: 192.0.2.21
    port: ${GPU1_SSH_PORT:-22}
    user: lab
    nics:
      - {netdev: ens1f0np0, rdma_dev: mlx5_0, rdma_port: 1, ocs: ocs1, tx: 1, rx: 17}
      - {netdev: ens1f1np1, rdma_dev: mlx5_1, rdma_port: 1, ocs: ocs1, tx: 2, rx: 18}
  gpu2:
    address: 192.0.2.22
    nics:
      - {netdev: ens1f0np0, rdma_dev: mlx5_0, ocs: ocs1, tx: 3, rx: 19}
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def expect_error(fn, *args, line=None, match=None):
    with pytest.raises(InputError) as info:
        fn(*args)
    # A file's problems are reported together: the expected one must be among them, at its line.
    found = [e for e in getattr(info.value, "errors", [info.value])
             if (line is None or e.line == line) and (not match or match in e.message)]
    assert found and all(e.file for e in found), info.value.format()
    return found[0]


@pytest.fixture(autouse=True)
def _password(monkeypatch):
    monkeypatch.setenv("OCS_PASSWORD", "s3cret")
    monkeypatch.delenv("GPU1_SSH_PORT", raising=False)


def test_inventory_builds_bench(tmp_path):
    bench = load_inventory(write(tmp_path, "inv.yaml", INVENTORY))
    assert bench.name == "lab-a" and not bench.emulated
    ocs = bench.ocs["ocs1"]
    assert ocs.allowed_ports == frozenset(range(1, 9)) | frozenset(range(17, 25))
    assert ocs.password == "s3cret" and "s3cret" not in repr(ocs)
    assert bench.hosts["gpu1"].port == 22 and bench.hosts["gpu2"].user == "root"
    assert bench.hosts["gpu1"].strict_host_key
    assert [p.key for p in bench.ports_of("gpu1")] == ["gpu1:ens1f0np0", "gpu1:ens1f1np1"]
    assert bench.nic_ports[2].rdma_port == 1 and bench.nic_ports[2].ocs_rx == 19


def test_env_template_retypes_unquoted_values(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU1_SSH_PORT", "2222")
    bench = load_inventory(write(tmp_path, "inv.yaml", INVENTORY))
    assert bench.hosts["gpu1"].port == 2222
    path = write(tmp_path, "t.yaml", 'a: "${GPU1_SSH_PORT}"\nb: x-${GPU1_SSH_PORT}-$${HOME}\n')
    data = load_yaml(path).data
    assert data == {"a": "2222", "b": "x-2222-${HOME}"}


def test_unset_env_without_default_names_line(tmp_path, monkeypatch):
    monkeypatch.delenv("NOPE_NOT_SET", raising=False)
    path = write(tmp_path, "t.yaml", "a: 1\nb:\n  c: ${NOPE_NOT_SET}\n")
    expect_error(load_yaml, path, line=3, match="NOPE_NOT_SET")


def test_password_env_unset_and_inline_password(tmp_path, monkeypatch):
    monkeypatch.delenv("OCS_PASSWORD")
    expect_error(load_inventory, write(tmp_path, "inv.yaml", INVENTORY), line=9, match="OCS_PASSWORD")
    text = INVENTORY.replace("    password_env: OCS_PASSWORD\n", "    password: hunter2\n")
    err = expect_error(load_inventory, write(tmp_path, "inv2.yaml", text), line=9, match="password_env")
    assert "hunter2" not in err.format()


def test_duplicate_key_rejected_with_both_lines(tmp_path):
    err = expect_error(load_yaml, write(tmp_path, "d.yaml", "a: 1\nb:\n  x: 1\n  x: 2\n"), line=4)
    assert "first defined on line 3" in err.message


@pytest.mark.parametrize("old,new,line,match", [
    ("rx: 18}", "rx: 17}", 17, "already used by gpu1:ens1f0np0"),
    ("tx: 3,", "tx: 9,", 21, "not in ocs1.allowed_ports"),
    ("tx: 3,", "tx: 20,", 21, "not an ingress port"),
    ("rx: 19}", "rx: 40}", 21, "not an egress port"),
    ("ocs: ocs1, tx: 3", "ocs: ocs9, tx: 3", 21, "no switch named 'ocs9'"),
    ("ens1f1np1, rdma_dev: mlx5_1", "ens1f0np0, rdma_dev: mlx5_1", 17, "appears twice"),
    ('"18-24"]', '"18-40"]', 7, "outside 1..32"),
    ('"18-24"]', '"24-18"]', 7, "empty"),
    ('"18-24"]', '"eighteen"]', 7, "range"),
    ("size: [16, 16]", "size: [16]", 6, "ingress_count"),
    ("protocol: polatis-tl1", "protocol: cisco", 4, "polatis-tl1"),
    ("    user: lab\n", "    user: lab\n    colour: red\n", 15, "unknown key 'colour'"),
    ("address: 192.0.2.22", "adress: 192.0.2.22", 19, "unknown key 'adress'"),
    ("    port: ${GPU1_SSH_PORT:-22}", "    port: 70000", 13, "1..65535"),
    ("    port: ${GPU1_SSH_PORT:-22}", "    port: twenty", 13, "expected an integer"),
    ("bench: {name: lab-a, emulated: false}", "bench: {name: lab-a, emulated: 1}", 1, "true/false"),
    ("    user: admin\n", "    user: admin\n    plan_from_confirmed_read: often\n", 9, "true/false"),
])
def test_inventory_errors_point_at_line(tmp_path, old, new, line, match):
    assert old in INVENTORY
    path = write(tmp_path, "inv.yaml", INVENTORY.replace(old, new, 1))
    expect_error(load_inventory, path, line=line, match=match)


def test_emulated_bench_relaxes_host_keys(tmp_path):
    path = write(tmp_path, "inv.yaml", INVENTORY.replace("emulated: false", "emulated: true"))
    assert not load_inventory(path).hosts["gpu1"].strict_host_key


@pytest.mark.parametrize("emulated,setting,planned", [
    ("false", None, False), ("true", None, True), ("true", "false", False), ("false", "true", True)])
def test_plan_from_confirmed_read_is_off_on_a_real_bench_unless_the_switch_says_so(tmp_path, emulated, setting,
                                                                                   planned):
    text = INVENTORY.replace("emulated: false", f"emulated: {emulated}")
    if setting is not None:
        text = text.replace("    user: admin\n", f"    user: admin\n    plan_from_confirmed_read: {setting}\n")
    assert load_inventory(write(tmp_path, "inv.yaml", text)).ocs["ocs1"].plan_from_confirmed_read is planned


def test_include_merges_relative_and_overrides(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path, "sub/ocs.yaml", INVENTORY.split("hosts:")[0].split("\n", 1)[1])
    write(tmp_path, "sub/base.yaml", "include: ocs.yaml\nbench: {name: base, emulated: true}\n")
    hosts = "hosts:" + INVENTORY.split("hosts:")[1]
    path = write(tmp_path, "inv.yaml", "include: sub/base.yaml\nbench: {name: lab-b}\n" + hosts)
    loaded = load_yaml(path)
    assert [f.name for f in loaded.files] == ["inv.yaml", "base.yaml", "ocs.yaml"]
    bench = load_inventory(path)
    assert bench.name == "lab-b" and bench.emulated  # nested mappings merge; own keys win
    assert set(bench.ocs) == {"ocs1"}


def test_include_errors(tmp_path):
    write(tmp_path, "a.yaml", "include: b.yaml\nx: 1\n")
    write(tmp_path, "b.yaml", "y: 2\ninclude: [a.yaml]\n")
    expect_error(load_yaml, tmp_path / "a.yaml", line=2, match="include cycle")
    expect_error(load_yaml, write(tmp_path, "c.yaml", "x: 1\ninclude: missing.yaml\n"), line=2,
                 match="not found")
    write(tmp_path, "list.yaml", "- 1\n")
    expect_error(load_yaml, write(tmp_path, "d.yaml", "include: list.yaml\n"), line=1, match="mapping")
    err = expect_error(load_yaml, write(tmp_path, "e.yaml", "include: bad.yaml\n"))
    write(tmp_path, "bad.yaml", "a: 1\na: 2\n")
    err = expect_error(load_yaml, tmp_path / "e.yaml", line=2)
    assert err.file.endswith("bad.yaml")


@pytest.mark.parametrize("raw,line,match", [
    (b"a: [1, 2\nb: 3\n", 2, "invalid YAML"),
    (b"a: 1\n\xff\xfe: 2\n", 2, "not UTF-8"),
    (b"a: 1\nb: \x07\n", 2, "unacceptable character"),
    (b"", 1, "empty file"),
    (b"- 1\n- 2\n", 1, "found a YamlList"),
    (b"a: !!python/object:os.system x\n", 1, "invalid YAML"),
    (b"a: 2020-02-30\n", 1, "invalid value"),
    (b"a: " + b"9" * 5000 + b"\n", 1, "invalid value"),
    (b"? [1, 2]\n: x\n", 1, "scalars"),
])
def test_malformed_yaml(tmp_path, raw, line, match):
    path = tmp_path / "bad.yaml"
    path.write_bytes(raw)
    expect_error(load_yaml, path, line=line, match=match)


PLAYBOOK = """\
name: smoke
seed: 7
cycles: 3
steps:
  - type: reconfigure
    name: first
    mapping: {1: 17}
  - type: wait
    seconds: 1.5
"""


class ReconfigureParams(Spec):
    mapping: dict
    exclusive: bool = False


class WaitParams(Spec):
    seconds: float


@pytest.fixture
def registry():
    reg: dict[str, StepType] = {}

    @register_step("reconfigure", ReconfigureParams, registry=reg)
    def reconfigure():  # pragma: no cover - never called
        pass

    register_step("wait", WaitParams, registry=reg)
    assert reg["reconfigure"].impl is reconfigure and reg["wait"].impl is None
    return reg


def test_playbook_loads(tmp_path, registry):
    path = write(tmp_path, "pb.yaml", PLAYBOOK)
    pb = load_playbook(path, registry)
    assert (pb.name, pb.bench, pb.seed, pb.cycles) == ("smoke", config.DEFAULT_BENCH, 7, 3)
    assert [(s.type, s.name, s.line) for s in pb.steps] == [("reconfigure", "first", 5), ("wait", "wait-2", 8)]
    assert pb.steps[0].params == {"mapping": {1: 17}, "exclusive": False}
    assert pb.steps[1].params == {"seconds": 1.5}
    assert len(pb.sha256) == 64
    assert load_playbook(write(tmp_path, "pb2.yaml", PLAYBOOK + "\n"), registry).sha256 != pb.sha256


@pytest.mark.parametrize("old,new,line,match", [
    ("type: wait", "type: sleep", 8, "unknown step type 'sleep'"),
    ("    seconds: 1.5", "    seconds: soon", 9, "expected a number"),
    ("    seconds: 1.5", "    secs: 1.5", 9, "unknown key 'secs'"),
    ("    mapping: {1: 17}\n", "", 5, "missing required key 'mapping'"),
    ("    name: first\n", "    name: wait-2\n", 8, "already used on line 5"),
    ("cycles: 3", "cycles: 0", 3, "cycles"),
    ("cycles: 3", "cycles: 3.5", 3, "expected an integer"),
    ("seed: 7", "seed: 7\ncolour: red", 3, "unknown key 'colour'"),
    ("name: smoke", "name: 'a b'", 1, "name"),
    # Issue 38, reproduction 2: step names become file names (`srv.a` and `srv.b` both wrote replay_srv.*)
    ("    name: first\n", "    name: srv.a\n", 6, "expected a letter, then up to 63 letters"),
    ("    name: first\n", "    name: ../escape\n", 6, "expected a letter"),
    ("    name: first\n", "    name: a/b\n", 6, "expected a letter"),
    ("    name: first\n", "    name: Wait-2\n", 8, "already used on line 5"),
])
def test_playbook_errors(tmp_path, registry, old, new, line, match):
    assert old in PLAYBOOK
    path = write(tmp_path, "pb.yaml", PLAYBOOK.replace(old, new, 1))
    expect_error(load_playbook, path, registry, line=line, match=match)


def test_a_labs_playbook_options_are_declared_as_a_spec(tmp_path, registry, monkeypatch):
    class LabOptions(Spec):
        shift: str = "day"
        budget_s: Positive = 60.0

    monkeypatch.setattr(config, "PLAYBOOK_OPTIONS", [LabOptions])
    pb = load_playbook(write(tmp_path, "pb.yaml", PLAYBOOK.replace("seed: 7", "seed: 7\nbudget_s: 90")), registry)
    assert pb.options == {"shift": "day", "budget_s": 90.0}
    bad = write(tmp_path, "bad.yaml", PLAYBOOK.replace("seed: 7", "seed: 7\nbudget_s: -1\ncolour: red"))
    expect_error(load_playbook, bad, registry, line=3, match="budget_s: expected a value > 0, found -1")
    expect_error(load_playbook, bad, registry, line=4, match="unknown key 'colour'")
    monkeypatch.setattr(config, "discover_steps", lambda: registry)
    from harness.commands.schema import playbook_schema

    assert playbook_schema()["properties"]["budget_s"]["exclusiveMinimum"] == 0  # editors see the option too


def test_register_step_rejects_bad_schema():
    with pytest.raises(TypeError, match="must be a Spec class"):
        register_step("x", {"a": (int, 1)}, registry={})  # the parameters are declared one way only

    class Named(Spec):
        name: str = ""

    with pytest.raises(TypeError, match="name are reserved"):
        register_step("x", Named, registry={})
    registry = {}
    register_step("x", registry=registry)  # no parameters: any key is refused
    assert registry["x"].model.model_fields == {}


def test_duplicate_step_registration_is_refused(registry):
    with pytest.raises(RegistrationError, match="'wait' is already registered"):
        register_step("wait", ReconfigureParams, registry=registry)
    attach = register_step("nap", registry=registry)
    attach(lambda ctx, step: None)
    with pytest.raises(RegistrationError, match="already has an implementation"):
        attach(lambda ctx, step: None)
    assert registry["wait"].model is WaitParams  # the first registration stands


def test_validate_command(tmp_path, capsys, monkeypatch):
    good = write(tmp_path, "inv.yaml", INVENTORY)
    bad = write(tmp_path, "bad.yaml", INVENTORY.replace("tx: 3,", "tx: 9,"))
    other = write(tmp_path, "other.yaml", "colour: red\n")
    assert main(["validate", str(good)]) == 0
    out = capsys.readouterr()
    assert out.out.startswith(f"{good}: ok (inventory 'lab-a': 1 OCS, 2 hosts, 3 NIC ports")
    assert main(["validate", str(good), str(bad), str(other)]) == 2
    out = capsys.readouterr()
    assert f"{bad}:21: " in out.err and f"{other}:1: cannot tell" in out.err and "Traceback" not in out.err
    monkeypatch.setattr(config, "discover_steps", lambda: {"wait": StepType("wait", WaitParams)})
    import harness.commands.validate as validate
    monkeypatch.setattr(validate, "discover_steps", config.discover_steps)
    pb = write(tmp_path, "pb.yaml", "name: p\nsteps:\n  - {type: wait, seconds: 1}\n")
    assert main(["validate", str(pb)]) == 0
    assert "playbook 'p': 1 steps, 1 cycles" in capsys.readouterr().out


def test_anchor_bombs_are_refused_and_aliases_are_walked_once(tmp_path):
    from harness.config import load_yaml

    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"] + [
        f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip("abcdefg", "bcdefgh")]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(["name: bomb", *levels, "i: {include: inc.yaml, v: *h}", "steps: []"]) + "\n")
    (tmp_path / "inc.yaml").write_text("k: 1\n")
    with pytest.raises(InputError, match="anchor bomb") as info:
        load_yaml(bomb)
    assert info.value.line == 1
    # a shared mapping with an include, reached through three aliases, is resolved once and stays shared
    ok = tmp_path / "ok.yaml"
    ok.write_text("base: &base {include: inc.yaml, j: 2}\nx: *base\ny: *base\nsteps: []\nname: ok\n")
    data = load_yaml(ok).data
    assert data["x"] == data["y"] == data["base"] == {"k": 1, "j": 2}


@pytest.mark.parametrize("param,value,needle", [
    ("udp_port", 70000, "a port number in 1..65535"), ("udp_port", 0, "a port number in 1..65535"),
    ("watch_interval_us", 0, "a positive interval"), ("teardown_s", -1, "a value >= 0"),
    ("cycle_timeout_s", -0.5, "a value >= 0"), ("retries", -1, "a value >= 0"),
])
def test_parameters_have_semantic_ranges(tmp_path, param, value, needle):
    path = tmp_path / "pb.yaml"
    path.write_text(f"name: p\nsteps:\n  - type: turnaround\n    {param}: {value}\n")
    with pytest.raises(InputError, match=needle) as info:
        load_playbook(path)
    assert info.value.line == 4


def test_a_step_cannot_carry_a_name_that_leaves_the_run_directory():
    """Steps built in code are held to the playbook's rule: no step name reaches a path unchecked."""
    for bad in ("../x", "a/b", "srv.a", "", "x" * 65):
        with pytest.raises(ValueError, match="step name"):
            config.Step("wait", bad, {}, None)
