"""The `cdi-shim cdi` commands, run as the installed executable."""
import json
import os
import subprocess

import pytest

from tests.conftest import simple_spec, tool, write_spec


def cdi_shim(*args, env=None):
    return subprocess.run([tool("cdi-shim"), *args], capture_output=True, text=True, env=env)


@pytest.fixture
def specs(tmp_path, cache_dir):
    directory = str(tmp_path / "specs")
    write_spec(directory, "gpu.yaml", simple_spec(kind="nvidia.com/gpu", devices=("0", "1")))
    return directory


def test_list_plain_and_json(specs):
    result = cdi_shim("cdi", "list", "--spec-dir", specs)
    assert result.returncode == 0 and result.stdout.splitlines() == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    rows = json.loads(cdi_shim("cdi", "list", "--spec-dir", specs, "--json").stdout)
    assert rows[0] == {"name": "nvidia.com/gpu=0", "kind": "nvidia.com/gpu",
                       "spec": os.path.join(specs, "gpu.yaml")}


def test_list_reports_broken_files_on_stderr(specs):
    """`error: <file>: <error>`, the file first (the registry's own texts stay the library's); the
    good devices still listed, and exit status 1 (it was 0: a script took the partial list)."""
    broken = write_spec(specs, "broken.yaml", "kind: x.com/y\n")
    unparsable = write_spec(specs, "unparsable.json", "{")
    write_spec(specs, "twin.yaml", simple_spec(kind="nvidia.com/gpu", devices=("1",)))
    result = cdi_shim("cdi", "list", "--spec-dir", specs)
    assert result.returncode == 1 and result.stdout == "nvidia.com/gpu=0\n"
    lines = result.stderr.splitlines()
    assert f'error: {broken}: invalid CDI Spec: cdiVersion: invalid version ""' in lines
    assert any(line.startswith(f"error: {unparsable}: failed to parse CDI Spec: ") for line in lines), lines
    assert f'error: {os.path.join(specs, "twin.yaml")}: conflicting device "nvidia.com/gpu=1" (specs ' \
        f'"{os.path.join(specs, "twin.yaml")}", "{os.path.join(specs, "gpu.yaml")}")' in lines, lines
    assert "failed to load" not in result.stderr and f'"{broken}"' not in result.stderr


def test_list_exits_1_on_one_unparsable_spec_and_yaml_errors_name_the_file(specs):
    bad = write_spec(specs, "bad.yaml", 'cdiVersion: "0.5.0"\nkind: x.com/y\ndevices: [\n')
    result = cdi_shim("cdi", "list", "--spec-dir", specs)
    assert result.returncode == 1 and result.stdout == "nvidia.com/gpu=0\nnvidia.com/gpu=1\n"
    assert "<byte string>" not in result.stderr
    assert f'error: {bad}: failed to parse CDI Spec: failed to unmarshal CDI Spec: yaml: ' in result.stderr
    assert f'did not find expected node content in "{bad}", line 4, column 1' in result.stderr, result.stderr
    validated = cdi_shim("cdi", "validate", "--spec-dir", specs, bad)
    assert validated.returncode == 1 and f'in "{bad}", line 4' in validated.stdout
    assert "<byte string>" not in validated.stdout


def test_list_and_validate_without_specs_say_where_they_looked(tmp_path, cache_dir):
    empty, missing = str(tmp_path / "empty"), str(tmp_path / "missing")
    os.makedirs(empty)
    config = tmp_path / "cdi-shim.toml"
    config.write_text(f'spec-dirs = ["{empty}", "{missing}"]\n')
    env = dict(os.environ, CDI_SHIM_CONFIG=str(config))
    listed = cdi_shim("cdi", "list", env=env)
    assert (listed.returncode, listed.stdout) == (0, "")
    assert listed.stderr == f"no CDI devices found (no spec files); searched {empty}, {missing} (does not exist)\n"
    validated = cdi_shim("cdi", "validate", env=env)
    assert (validated.returncode, validated.stdout) == (0, "")
    assert validated.stderr.splitlines() == [f"no CDI spec files found; searched {empty}, {missing} (does not exist)",
                                             "0 spec file(s) checked, 0 error(s)"]
    assert cdi_shim("cdi", "list", "--json", "--spec-dir", missing).stderr == \
        f"no CDI devices found (no spec files); searched {missing} (does not exist)\n"


def test_inject_prints_edited_config_and_leaves_input(specs, tmp_path):
    config = tmp_path / "config.json"
    original = b'{"process": {"env": ["PATH=/bin"]}}'
    config.write_bytes(original)
    result = cdi_shim("cdi", "inject", "--spec-dir", specs, "--device", "nvidia.com/gpu=1", str(config))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["process"]["env"] == ["PATH=/bin", "X_1=1"]
    assert config.read_bytes() == original


def test_inject_reads_stdin(specs):
    result = subprocess.run([tool("cdi-shim"), "cdi", "inject", "--spec-dir", specs, "--device",
                             "nvidia.com/gpu=0", "-"], input="{}", capture_output=True, text=True)
    assert result.returncode == 0 and json.loads(result.stdout)["process"]["env"] == ["X_0=1"]


def test_inject_unresolvable_uses_reference_message(specs, tmp_path):
    (tmp_path / "c.json").write_text("{}")
    result = cdi_shim("cdi", "inject", "--spec-dir", specs, "--device", "nvidia.com/gpu=7", str(tmp_path / "c.json"))
    assert result.returncode == 1 and result.stdout == ""
    assert "Error: unresolvable CDI devices nvidia.com/gpu=7; nvidia.com/gpu has only \"0\", \"1\"" in result.stderr


@pytest.mark.parametrize("device, text", [
    ("nvidia.com/gpu", 'unqualified device "nvidia.com/gpu", missing vendor'),
    ("gpu=0", 'unqualified device "gpu=0", missing vendor'),
    ("nvidia.com/gpu=-0", "invalid class \"-0\", should start with a letter or digit"),
])
def test_device_argument_is_validated_with_expected_form(specs, tmp_path, device, text):
    (tmp_path / "c.json").write_text("{}")
    result = cdi_shim("cdi", "inject", "--spec-dir", specs, "--device", device, str(tmp_path / "c.json"))
    assert result.returncode == 2
    assert text in result.stderr and "vendor.com/class=name" in result.stderr


def test_inject_rejects_non_json_config(specs, tmp_path):
    (tmp_path / "c.json").write_text("not json")
    result = cdi_shim("cdi", "inject", "--spec-dir", specs, "--device", "nvidia.com/gpu=0", str(tmp_path / "c.json"))
    assert result.returncode == 1 and "cannot read OCI config" in result.stderr


def test_validate_reports_each_problem_and_placement(specs, tmp_path):
    write_spec(specs, "bad.json", '{"cdiVersion": "0.3.0", "kind": "v.com/c", "devices": [{"name": "a"}]}')
    write_spec(specs, "old.yml", simple_spec(kind="v.com/yml"))
    write_spec(os.path.join(specs, "nested"), "n.yaml", simple_spec(kind="v.com/n"))
    write_spec(specs, "dup.yaml", simple_spec(kind="nvidia.com/gpu", devices=("1",)))
    result = cdi_shim("cdi", "validate", "--spec-dir", specs, specs)
    lines = result.stdout.splitlines()
    assert result.returncode == 1
    assert any(line.startswith("error: invalid CDI Spec \"") and "bad.json" in line
               and "invalid device, empty device edits" in line for line in lines)
    assert any(line.startswith("warning:") and "old.yml" in line and ".yml" in line for line in lines)
    assert any(line.startswith("warning:") and "sub-directory" in line for line in lines)
    assert any(line.startswith('error: conflicting device "nvidia.com/gpu=1"') for line in lines)


def test_validate_warns_about_file_outside_spec_dirs(specs, tmp_path):
    path = write_spec(str(tmp_path / "elsewhere"), "ok.yaml", simple_spec())
    result = cdi_shim("cdi", "validate", "--spec-dir", specs, path)
    assert result.returncode == 0
    assert "is outside the spec directories" in result.stdout


def test_validate_good_dir_exits_zero(specs):
    result = cdi_shim("cdi", "validate", "--spec-dir", specs)
    assert result.returncode == 0 and result.stdout == ""
    assert "1 spec file(s) checked, 0 error(s)" in result.stderr


def test_malformed_config_file_is_an_error(specs, tmp_path):
    bad = tmp_path / "config.toml"
    bad.write_text("spec-dirs = 3\n")
    result = cdi_shim("cdi", "list", env=dict(os.environ, CDI_SHIM_CONFIG=str(bad)))
    assert result.returncode == 1 and '"spec-dirs" must be a list of strings' in result.stderr


def test_config_file_named_by_env_must_exist(specs, tmp_path):
    missing = str(tmp_path / "nowhere" / "config.toml")
    result = cdi_shim("cdi", "list", env=dict(os.environ, CDI_SHIM_CONFIG=missing))
    assert result.returncode == 1 and result.stdout == ""
    assert f"Error: cdi-shim config {missing} does not exist (named by $CDI_SHIM_CONFIG)" in result.stderr


def test_help_explains(specs):
    result = cdi_shim("cdi", "inject", "--help")
    assert result.returncode == 0 and "Nothing is written" in result.stdout
