"""Extension without forking (devices/plugins.py): the example plugin package installed as a distribution would be
(its dist-info with the entry points its pyproject.toml declares) and run from a fresh harness process; `imports:`
in a playbook or inventory; duplicate and broken plugins refused with a clear error naming them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from devices.ocs.registry import OcsProtocol, get_protocol, register_protocol
from devices.plugins import PluginError, import_module, load_group
from harness.cli import main
from harness.config import RegistrationError, load_playbook, register_step

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "plugin"


def installed(site: Path, package_dir: Path, entry_points: dict[str, dict[str, str]], name: str) -> Path:
    """What `pip install --target site` leaves of a distribution: the package and a dist-info whose
    entry_points.txt importlib.metadata reads."""
    site.mkdir(parents=True, exist_ok=True)
    shutil.copytree(package_dir, site / package_dir.name, ignore=shutil.ignore_patterns("__pycache__"))
    info = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
        for group, entries in entry_points.items()))
    return site


def harness(site: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    return subprocess.run([sys.executable, "-m", "harness", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=240)


def test_the_example_plugin_adds_a_step_and_a_switch_protocol(tmp_path):
    declared = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]["entry-points"]
    assert set(declared) == {"ocs_hil.steps", "ocs_hil.ocs"}
    site = installed(tmp_path / "site", PLUGIN / "ocs_hil_example", declared, "ocs-hil-example-plugin")
    playbook = tmp_path / "plugin.yaml"
    playbook.write_text(textwrap.dedent("""\
        name: plugin-demo
        cycles: 2
        steps:
          - {type: turnaround, name: measure, cycle_timeout_s: 20}
          - {type: cross_connect_census, name: census}
        """))
    result = harness(site, "run", str(playbook), "--bench", "emulated:instant?ocs=example-tl1-single", "--json",
                     "-q", "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["summary"]
    inventory = (tmp_path / "run" / "bench" / "inventory.yaml").read_text()
    assert "protocol: example-tl1-single" in inventory
    # the census read the last cycle's circuits back through the plugin's driver: every NIC port's (4 x 2)
    assert summary["results"]["census"] == {"ocs1_patches": 8}
    assert summary["steps"]["census"]["ok"] and summary["steps"]["measure"]["ok"]
    assert summary["lost_events"]["in_ok_cycles"] == 0
    # without the plugin on the path the same playbook is refused as input, naming what is unknown
    bare = harness(tmp_path / "nothing", "run", str(playbook), "--dry-run", cwd=tmp_path)
    assert bare.returncode == 2 and "unknown step type 'cross_connect_census'" in bare.stderr


def test_a_broken_installed_plugin_is_named_in_a_one_line_error(tmp_path):
    broken = tmp_path / "src" / "lab_broken"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("")
    (broken / "steps.py").write_text("import not_a_module_anywhere\n")
    site = installed(tmp_path / "site", broken, {"ocs_hil.steps": {"labsteps": "lab_broken.steps"}}, "lab-broken")
    playbook = tmp_path / "p.yaml"
    playbook.write_text("name: p\nsteps:\n  - {type: turnaround}\n")
    result = harness(site, "run", str(playbook), "--dry-run", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "plugin 'labsteps' (lab_broken.steps, from lab-broken, entry point group ocs_hil.steps): " \
           "ModuleNotFoundError: No module named 'not_a_module_anywhere'" in result.stderr


def test_imports_in_a_playbook_register_before_its_steps_are_checked(tmp_path, monkeypatch):
    from harness import config

    # the type registered here must not outlive the test (the playbook schema lists every registered type)
    monkeypatch.setitem(config.STEP_TYPES, "lab_noop_for_test_plugins", None)  # undone last: the key removed
    monkeypatch.delitem(config.STEP_TYPES, "lab_noop_for_test_plugins")
    module = tmp_path / "lab" / "noop_step.py"
    module.parent.mkdir()
    module.write_text(textwrap.dedent("""\
        from harness.config import register_step
        from harness.steps import StepOutcome

        @register_step("lab_noop_for_test_plugins")
        def noop(ctx, step):
            return StepOutcome(summary={"ran": 1})
        """))
    playbook = tmp_path / "p.yaml"
    playbook.write_text("name: p\nimports: [lab/noop_step.py]\nsteps:\n  - {type: lab_noop_for_test_plugins}\n")
    loaded = load_playbook(playbook)
    assert [s.type for s in loaded.steps] == ["lab_noop_for_test_plugins"]
    assert loaded.imports == (str(tmp_path / "lab" / "noop_step.py"),)  # absolute: the run's copy finds it too
    # named again (a second playbook, a copy, the inventory): imported once, not registered twice
    assert load_playbook(playbook).steps[0].type == "lab_noop_for_test_plugins"


@pytest.mark.parametrize("source, fragment", [
    ("from harness.config import register_step\nregister_step('turnaround')\n",
     "RegistrationError: step type 'turnaround' is already registered"),
    ("from devices.ocs.registry import OcsProtocol, register_protocol\n"
     "register_protocol(OcsProtocol(name='polatis-tl1', driver='x:y', schemes=('tcp',), default_port=1, "
     "permanent='x:y', emulator='x:y'))\n",
     "ValueError: OCS protocol 'polatis-tl1' is already registered"),
    ("raise RuntimeError('lab config missing')\n", "RuntimeError: lab config missing"),
])
def test_a_duplicate_or_broken_import_is_refused_at_its_line(tmp_path, source, fragment, capsys):
    (tmp_path / "bad_plugin.py").write_text(source)
    playbook = tmp_path / "p.yaml"
    playbook.write_text("name: p\nimports:\n  - bad_plugin.py\nsteps:\n  - {type: turnaround}\n")
    assert main(["run", str(playbook), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{playbook}:3" in err and "imports[0]: plugin 'bad_plugin.py'" in err and fragment in err
    assert "Traceback" not in err


def test_an_inventory_imports_the_protocol_it_names(tmp_path, capsys):
    (tmp_path / "missing.py").write_text("")
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(textwrap.dedent("""\
        bench: {name: lab}
        imports: [no_such_lab_module]
        ocs:
          ocs1: {protocol: polatis-tl1, url: "tcp://127.0.0.1:3082", size: [4, 4], allowed_ports: ["1-8"]}
        hosts: {}
        """))
    assert main(["validate", str(inventory)]) == 2
    err = capsys.readouterr().err
    assert f"{inventory}:2" in err and "plugin 'no_such_lab_module': ModuleNotFoundError" in err


def test_registries_refuse_a_name_twice():
    with pytest.raises(RegistrationError, match="already registered"):
        register_step("turnaround")
    with pytest.raises(ValueError, match="already registered"):
        register_protocol(get_protocol("polatis-scpi"))
    with pytest.raises(PluginError, match="no such file"):
        import_module("nowhere/plugin.py")
    assert load_group("ocs_hil.no_such_group_for_tests") == []
    assert OcsProtocol  # the type a plugin registers with


def test_harness_parse_reads_a_real_capture_with_a_project_parser(capsys):
    capture = ROOT / "tests" / "data" / "real" / "ethtool-m" / "sff8636-qsfp-40g-sr4-cx3-ethtool6-los-nolol.txt"
    assert main(["parse", "ethtool-module", str(capture)]) == 0
    assert json.loads(capsys.readouterr().out)["vendor_name"] == "AVAGO"
    assert main(["parse", "mlxlink", str(capture)]) == 2  # not what mlxlink prints: its parser says so
    assert "mlxlink: expected" in capsys.readouterr().err
    assert main(["parse", "no-such-parser", str(capture)]) == 2
    assert "unknown tool parser 'no-such-parser' (known: ethtool-module" in capsys.readouterr().err


def test_a_lab_parser_from_an_installed_package_reads_its_tool(tmp_path):
    """A parser for a tool the project does not read, installed as an entry point `ocs_hil.parsers`, read through
    `harness parse` from a fresh process — against this machine's own /proc/uptime (proc(5): the seconds since
    boot and the seconds idle, summed over CPUs)."""
    package = tmp_path / "src" / "lab_uptime"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "parsers.py").write_text(textwrap.dedent("""\
        from devices.parsers import ParseError
        from devices.parsers.registry import ToolParser, register_parser

        def parse_uptime(text):
            try:
                up, idle = (float(x) for x in text.split())
            except ValueError:
                raise ParseError("two numbers (seconds up, seconds idle)", text) from None
            return {"up_s": up, "idle_s": idle}

        register_parser(ToolParser("proc-uptime", "lab_uptime.parsers:parse_uptime", "cat /proc/uptime"))
        """))
    site = installed(tmp_path / "site", package, {"ocs_hil.parsers": {"uptime": "lab_uptime.parsers"}}, "lab-uptime")
    result = harness(site, "parse", "proc-uptime", "/proc/uptime", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    value = json.loads(result.stdout)
    assert value["up_s"] > 0 and value["idle_s"] >= 0
    listed = harness(site, "parse", "--list", cwd=tmp_path)
    assert "proc-uptime          cat /proc/uptime" in listed.stdout
    bad = harness(site, "parse", "proc-uptime", str(package / "__init__.py"), cwd=tmp_path)
    assert bad.returncode == 2 and "proc-uptime: expected two numbers" in bad.stderr
