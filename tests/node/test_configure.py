"""`cdi-shim runtime configure` and `cdi-shim runtimeclass` on real containerd configs.

Golden inputs: tests/node/data/containerd-1.6-default.toml is the output of this machine's
`containerd config default` (Debian's 1.6.20); containerd-2.x-default.toml is a version-3 sample
written from containerd 2.x's documented defaults. The version-2 results are loaded by the
installed containerd 1.6 (`containerd --config F config dump`); at the end, real containerd 1.7 and
2.1 (Debian trixie / forky, fetched once into $CDI_SHIM_TEST_CACHE: cdi_shim_lab/releases.py) load
version 2 and 3 results, and a version-4 sample (containerd 2.3, which no Debian suite serves)
is checked by reading only.
"""
import glob
import os
import shlex
import shutil
import subprocess

import pytest
import yaml

from shim.node.containerd import pid1_init
from tests.helpers import need, read, run_cli, toml_loads

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def data(name):
    return os.path.join(DATA, name)


V2_DEFAULT = data("containerd-1.6-default.toml")
V3_DEFAULT = data("containerd-2.x-default.toml")
CRI2 = "io.containerd.grpc.v1.cri"
CRI3 = "io.containerd.cri.v1.runtime"


def containerd():
    return need("containerd", "containerd")


def dump(path):
    out = subprocess.run([containerd(), "--config", str(path), "config", "dump"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return toml_loads(out.stdout)


def dumped_runtimes(path):
    section = dump(path)["plugins"][CRI2]
    return section, section["containerd"]["runtimes"]


def configure(path, binary, *extra, env, check=True, containerd_binary=None):
    args = ["runtime", "configure", "--config", str(path), "--runtime-binary", binary,
            "--containerd-binary", containerd_binary or containerd()] + list(extra)
    return run_cli(*args, env=env, check=check)


def copy(src, tmp_path, name="config.toml"):
    path = tmp_path / name
    shutil.copy(src, path)
    return path


def backups(path):
    return sorted(glob.glob(f"{path}.bak-*"))


# --- golden files -------------------------------------------------------------------------------

def test_v2_golden_from_containerd_1_6_default(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    out = configure(path, fake_binary, env=shim_env)
    assert read(path) == read(data("golden-v2.toml")).replace("@BINARY@", fake_binary)
    assert "config version 2 (containerd 1.x), from the file's version key" in out.stderr
    assert 'SystemdCgroup = false: copied from the "runc" runtime' in out.stderr
    assert "loaded and checked by the installed containerd" in out.stderr
    assert backups(path) and read(backups(path)[0]) == read(V2_DEFAULT)


def test_v3_golden_from_containerd_2_sample(tmp_path, shim_env, fake_binary):
    """Our edit of a fixed 2.x sample, byte for byte (a node without containerd installed: the
    result is written, and said to be unchecked). The real 2.1's own `config default`, edited
    and loaded by that 2.1, is test_v3_loaded_by_real_containerd_2_1_with_cdi_dirs_made_ours."""
    path = copy(V3_DEFAULT, tmp_path)
    out = configure(path, fake_binary, env=shim_env, containerd_binary="/nonexistent/containerd")
    assert read(path) == read(data("golden-v3.toml")).replace("@BINARY@", fake_binary)
    assert "config version 3 (containerd 2.x)" in out.stderr
    assert "not checked: containerd is not installed here" in out.stderr
    entry = toml_loads(read(path))["plugins"][CRI3]["containerd"]["runtimes"]["nvidia"]
    assert entry["runtime_type"] == "io.containerd.runc.v2"
    assert entry["options"]["BinaryName"] == fake_binary
    assert entry["container_annotations"] == ["cdi.k8s.io/*"]
    assert "pod_annotations" not in entry


def test_v3_config_refused_for_the_installed_containerd_1_x(tmp_path, shim_env, fake_binary):
    path = copy(V3_DEFAULT, tmp_path)
    out = configure(path, fake_binary, env=shim_env, check=False)
    assert "version 3 needs containerd 2.0 or later" in out.stderr
    assert read(path) == read(V3_DEFAULT)


def test_stored_default_is_this_machines_containerd_config_default(tmp_path, shim_env, fake_binary):
    live = subprocess.run([containerd(), "config", "default"], capture_output=True, text=True, timeout=60).stdout
    path = tmp_path / "config.toml"
    path.write_text(live)
    configure(path, fake_binary, env=shim_env)
    if live == read(V2_DEFAULT):
        assert read(path) == read(data("golden-v2.toml")).replace("@BINARY@", fake_binary)
    section, runtimes = dumped_runtimes(path)  # whatever the version, containerd loads the result
    assert runtimes["nvidia"]["options"]["BinaryName"] == fake_binary


def test_v2_result_loaded_by_real_containerd(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    configure(path, fake_binary, env=shim_env)
    section, runtimes = dumped_runtimes(path)
    assert set(runtimes) == {"runc", "nvidia"}
    nvidia = runtimes["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == fake_binary
    assert nvidia["options"]["SystemdCgroup"] is False
    assert nvidia["container_annotations"] == ["cdi.k8s.io/*"]
    assert nvidia["pod_annotations"] == []
    assert section["containerd"]["default_runtime_name"] == "runc"


# --- behaviour ------------------------------------------------------------------------------------

def test_second_run_changes_nothing(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    configure(path, fake_binary, env=shim_env)
    first, first_backups = read(path), backups(path)
    stat = os.stat(path)
    out = configure(path, fake_binary, env=shim_env)
    assert "nothing changed" in out.stderr
    assert read(path) == first and backups(path) == first_backups
    assert os.stat(path).st_ino == stat.st_ino  # not even rewritten


def test_binary_change_updates_only_that_line(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    configure(path, fake_binary, env=shim_env)
    before = read(path)
    other = tmp_path / "other-runtime"
    shutil.copy(fake_binary, other)
    configure(path, str(other), env=shim_env)
    assert read(path) == before.replace(f'BinaryName = "{fake_binary}"', f'BinaryName = "{other}"')


COMMENTED = '''\
# containerd config of node-7, kept by hand
version = 2
root = "/var/lib/containerd"   # big disk

[plugins."io.containerd.grpc.v1.cri"]
  # mirrored pause image
  sandbox_image = "mirror.local/pause:3.6"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"   # do not touch

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true   # kubelet uses the systemd driver
        Root = "/run/containerd/runc-custom"

[metrics]
  address = "127.0.0.1:1338"
'''


def test_comments_order_and_other_settings_kept(tmp_path, shim_env, fake_binary):
    path = tmp_path / "config.toml"
    path.write_text(COMMENTED)
    out = configure(path, fake_binary, env=shim_env)
    new = read(path)
    # every original line is still there, in order: the edit only adds lines
    old_lines, new_lines = COMMENTED.splitlines(), new.splitlines()
    it = iter(new_lines)
    assert all(any(line == candidate for candidate in it) for line in old_lines), new
    entry = toml_loads(new)["plugins"][CRI2]["containerd"]["runtimes"]["nvidia"]
    # SystemdCgroup and the other runc options follow the runc entry
    assert entry["options"] == {"SystemdCgroup": True, "Root": "/run/containerd/runc-custom",
                                "BinaryName": fake_binary}
    assert 'SystemdCgroup = true: copied from the "runc" runtime' in out.stderr
    assert dumped_runtimes(path)[1]["nvidia"]["options"]["SystemdCgroup"] is True


def test_systemd_cgroup_from_pid1_when_runc_sets_none(tmp_path, shim_env, fake_binary):
    path = tmp_path / "config.toml"
    path.write_text("version = 2\n")
    out = configure(path, fake_binary, env=shim_env)
    with open("/proc/1/comm") as stream:
        init = stream.read().strip()
    entry = toml_loads(read(path))["plugins"][CRI2]["containerd"]["runtimes"]
    assert entry["nvidia"]["options"]["SystemdCgroup"] is (init == "systemd")
    assert f'PID 1 is "{init}", not systemd' in out.stderr or init == "systemd"
    # a file defining any runtime replaces containerd 1.x's built-in list: runc must stay defined
    assert entry["runc"] == {"runtime_type": "io.containerd.runc.v2"}
    section, runtimes = dumped_runtimes(path)
    assert section["containerd"]["default_runtime_name"] in runtimes


def test_missing_file_takes_the_installed_containerds_version(tmp_path, shim_env, fake_binary):
    path = tmp_path / "etc" / "containerd" / "config.toml"
    out = configure(path, fake_binary, env=shim_env)
    assert "from the installed containerd 1." in out.stderr
    assert toml_loads(read(path))["version"] == 2
    assert dumped_runtimes(path)[1]["nvidia"]["options"]["BinaryName"] == fake_binary


def test_missing_file_without_containerd_needs_a_version(tmp_path, shim_env, fake_binary):
    path = tmp_path / "config.toml"
    out = configure(path, fake_binary, env=shim_env, check=False, containerd_binary="/nonexistent/containerd")
    assert "pass --config-version 2 (containerd 1.x), 3 (containerd 2.0-2.2) or 4 (containerd 2.3+)" in out.stderr
    assert not path.exists()
    configure(path, fake_binary, "--config-version", "3", env=shim_env, containerd_binary="/nonexistent/containerd")
    assert toml_loads(read(path))["plugins"][CRI3]["containerd"]["runtimes"]["nvidia"]


@pytest.mark.parametrize("text", ['root = "/var/lib/containerd"\n[plugins.cri]\n  sandbox_image = "x"\n',
                                  'version = 1\nroot = "/var/lib/containerd"\n'])
def test_version_1_refused_with_migrate_hint(tmp_path, shim_env, fake_binary, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    out = configure(path, fake_binary, env=shim_env, check=False)
    assert out.returncode == 1
    assert "containerd config migrate" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert read(path) == text and not backups(path)


def test_unknown_version_refused(tmp_path, shim_env, fake_binary):
    path = tmp_path / "config.toml"
    path.write_text("version = 5\n")
    out = configure(path, fake_binary, env=shim_env, check=False)
    assert "config version 5, which cdi-shim does not know" in out.stderr
    assert read(path) == "version = 5\n"


def test_explicit_version_must_match_the_file(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    out = configure(path, fake_binary, "--config-version", "3", env=shim_env, check=False)
    assert "is a version 2 config, but --config-version 3 was given" in out.stderr
    assert read(path) == read(V2_DEFAULT)


def test_dry_run_prints_the_diff_and_writes_nothing(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    out = configure(path, fake_binary, "--dry-run", env=shim_env)
    assert out.stdout.startswith(f"--- {path}\n+++ {path}\n")
    assert '+        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]' in out.stdout
    assert f'+            BinaryName = "{fake_binary}"' in out.stdout
    assert read(path) == read(V2_DEFAULT) and not backups(path)
    assert sorted(os.listdir(tmp_path)) == sorted(["config.toml", "cdi-shim.toml", "bin"])


def test_default_runtime_untouched_unless_asked(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    out = configure(path, fake_binary, "--set-as-default=false", env=shim_env)
    assert "default_runtime_name" not in out.stderr
    assert dumped_runtimes(path)[0]["containerd"]["default_runtime_name"] == "runc"
    out = configure(path, fake_binary, "--set-as-default", env=shim_env)
    assert 'warning: default_runtime_name = "nvidia": every pod without a RuntimeClass now goes through' \
        in out.stderr
    assert dumped_runtimes(path)[0]["containerd"]["default_runtime_name"] == "nvidia"


def test_configured_prefixes_become_the_allow_list(tmp_path, shim_env, fake_binary):
    (tmp_path / "cdi-shim.toml").write_text('annotation-prefixes = ["cdi.k8s.io/", "example.com/cdi-"]\n')
    path = copy(V2_DEFAULT, tmp_path)
    configure(path, fake_binary, env=shim_env)
    nvidia = dumped_runtimes(path)[1]["nvidia"]
    assert nvidia["container_annotations"] == ["cdi.k8s.io/*", "example.com/cdi-*"]
    assert nvidia["pod_annotations"] == []


def test_pod_annotations_on_our_entry_warned(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    configure(path, fake_binary, env=shim_env)
    path.write_text(read(path).replace('          container_annotations = ["cdi.k8s.io/*"]',
                                       '          container_annotations = ["cdi.k8s.io/*"]\n'
                                       '          pod_annotations = ["cdi.k8s.io/*"]'))
    out = configure(path, fake_binary, env=shim_env)
    assert "any pod could then request any device past the device plugin" in out.stderr


def test_a_config_containerd_refuses_is_never_installed(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    text = read(path).replace("imports = []", f'imports = ["{tmp_path}/missing.toml"]')
    path.write_text(text)
    out = configure(path, fake_binary, env=shim_env, check=False)
    assert "containerd refuses the new config" in out.stderr and "nothing was changed" in out.stderr
    assert read(path) == text and not backups(path)
    assert sorted(os.listdir(tmp_path)) == sorted(["config.toml", "cdi-shim.toml", "bin"])  # no candidates left


def test_an_import_that_hides_our_runtime_is_caught(tmp_path, shim_env, fake_binary):
    # containerd 1.x: a later imported file's CRI section replaces ours whole
    later = tmp_path / "later.toml"
    later.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "x/pause:1"\n')
    path = copy(V2_DEFAULT, tmp_path)
    text = read(path).replace("imports = []", f'imports = ["{later}"]')
    path.write_text(text)
    out = configure(path, fake_binary, env=shim_env, check=False)
    assert 'containerd does not see runtime "nvidia"' in out.stderr
    assert read(path) == text


# --- drop-in --------------------------------------------------------------------------------------

def test_why_a_v2_drop_in_carries_the_cri_section(tmp_path):
    """containerd 1.6 itself: a drop-in with only a runtime entry wipes the main file's CRI section."""
    main = copy(V2_DEFAULT, tmp_path)
    naive = tmp_path / "naive.toml"
    naive.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
                     '  runtime_type = "io.containerd.runc.v2"\n')
    main.write_text(read(main).replace("imports = []", f'imports = ["{naive}"]')
                    .replace('sandbox_image = "registry.k8s.io/pause:3.6"', 'sandbox_image = "mirror/pause:1"'))
    section, runtimes = dumped_runtimes(main)
    assert set(runtimes) == {"nvidia"}  # runc is gone: default_runtime_name = "runc" names nothing
    assert section["sandbox_image"] == "registry.k8s.io/pause:3.6"  # the main file's setting is gone


def test_v2_drop_in(tmp_path, shim_env, fake_binary):
    main = copy(V2_DEFAULT, tmp_path)
    main.write_text(read(main).replace('sandbox_image = "registry.k8s.io/pause:3.6"',
                                       'sandbox_image = "mirror/pause:1"'))
    original = read(main)
    conf_d = tmp_path / "conf.d"
    out = configure(main, fake_binary, "--drop-in", str(conf_d), env=shim_env)
    drop_in = conf_d / "99-cdi-shim.toml"
    assert toml_loads(read(main))["imports"] == [str(drop_in)]
    # the main file only gained the import
    assert read(main) == original.replace("imports = []", f'imports = ["{drop_in}"]')
    parsed = toml_loads(read(drop_in))
    assert parsed["version"] == 2
    assert parsed["plugins"][CRI2]["sandbox_image"] == "mirror/pause:1"  # the copy of the CRI section
    section, runtimes = dumped_runtimes(main)
    assert set(runtimes) == {"runc", "nvidia"}
    assert section["sandbox_image"] == "mirror/pause:1"
    assert runtimes["nvidia"]["options"]["BinaryName"] == fake_binary
    assert "copy of the main file's CRI plugin section" in out.stderr
    # idempotent
    before = (read(main), read(drop_in))
    out = configure(main, fake_binary, "--drop-in", str(conf_d), env=shim_env)
    assert "nothing changed" in out.stderr and (read(main), read(drop_in)) == before
    assert sorted(os.listdir(conf_d)) == ["99-cdi-shim.toml"]


def test_v2_drop_in_with_an_existing_glob_import(tmp_path, shim_env, fake_binary):
    main = copy(V2_DEFAULT, tmp_path)
    conf_d = tmp_path / "conf.d"
    main.write_text(read(main).replace("imports = []", f'imports = ["{conf_d}/*.toml"]'))
    before = read(main)
    configure(main, fake_binary, "--drop-in", str(conf_d), env=shim_env)
    assert read(main) == before  # already imported by the glob
    assert dumped_runtimes(main)[1]["nvidia"]["options"]["BinaryName"] == fake_binary


def test_v3_drop_in_holds_only_our_entry(tmp_path, shim_env, fake_binary):
    main = copy(V3_DEFAULT, tmp_path)
    conf_d = tmp_path / "conf.d"
    configure(main, fake_binary, "--drop-in", str(conf_d), env=shim_env,
              containerd_binary="/nonexistent/containerd")
    drop_in = conf_d / "99-cdi-shim.toml"
    assert toml_loads(read(main))["imports"] == [str(drop_in)]
    parsed = toml_loads(read(drop_in))
    assert parsed["version"] == 3
    assert list(parsed["plugins"]) == [CRI3]
    assert list(parsed["plugins"][CRI3]) == ["containerd"]
    assert list(parsed["plugins"][CRI3]["containerd"]["runtimes"]) == ["nvidia"]
    assert "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]" in read(drop_in)
    before = (read(main), read(drop_in))
    configure(main, fake_binary, "--drop-in", str(conf_d), env=shim_env, containerd_binary="/nonexistent/containerd")
    assert (read(main), read(drop_in)) == before


def test_bad_runtime_name_refused(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    out = configure(path, fake_binary, "--runtime-name", "NVIDIA_gpu", env=shim_env, check=False)
    assert "is not a DNS label" in out.stderr and read(path) == read(V2_DEFAULT)


def test_restart_only_when_asked_and_possible(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    out = configure(path, fake_binary, env=shim_env)
    assert "restart containerd to apply it (or pass --restart)" in out.stderr
    systemd, init = pid1_init()
    if not systemd:
        path2 = copy(V2_DEFAULT, tmp_path, "two.toml")
        out = configure(path2, fake_binary, "--restart", env=shim_env, check=False)
        assert f'cannot restart containerd: PID 1 is "{init}", not systemd' in out.stderr
        assert read(path2) != read(V2_DEFAULT)  # the config itself was written before


def test_binary_defaults_to_the_installed_runtime(tmp_path, shim_env):
    path = copy(V2_DEFAULT, tmp_path)
    run_cli("runtime", "configure", "--config", str(path), env=shim_env, check=True)
    binary = dumped_runtimes(path)[1]["nvidia"]["options"]["BinaryName"]
    assert os.path.isabs(binary) and os.path.basename(binary) == "cdi-shim-runtime" and os.access(binary, os.X_OK)


def test_help_shows_set_as_default_false(shim_env):
    out = run_cli("runtime", "configure", "--help", env=shim_env, check=True)
    text = " ".join(out.stdout.split())
    assert "--set-as-default [true|false] Also make it the default runtime (containerd's default_runtime_name, " \
        "docker's default-runtime, podman's engine.runtime): every container then goes through it. " \
        "[default: false]" in text, out.stdout


def hinted_runtimeclass(stderr):
    """The arguments of the `cdi-shim runtimeclass` command that configure's last line suggests."""
    last = stderr.splitlines()[-1]
    prefix = "cdi-shim: next, select it with a RuntimeClass: "
    assert last.startswith(prefix) and last.endswith(" | kubectl apply -f -"), stderr
    words = shlex.split(last[len(prefix):-len(" | kubectl apply -f -")])
    assert os.path.basename(words[0]) == "cdi-shim" and words[1] == "runtimeclass", words
    return words[2:]


@pytest.mark.parametrize("extra, expected", [
    ((), []),
    (("--runtime-name", "cdi", "--drop-in", "conf.d"), ["--name", "cdi", "--handler", "cdi"]),
])
def test_hint_names_the_runtimeclass_command_with_the_config_given(tmp_path, shim_env, fake_binary, extra, expected):
    path = copy(V2_DEFAULT, tmp_path, name="my containerd.toml")
    extra = [str(tmp_path / word) if word == "conf.d" else word for word in extra]
    for _ in range(2):  # written, then "nothing changed": the same next step
        out = configure(path, fake_binary, *extra, env=shim_env)
        args = hinted_runtimeclass(out.stderr)
        assert args == expected + ["--config", str(path)]
        runtime_class = yaml.safe_load(run_cli(*["runtimeclass", *args], env=shim_env, check=True).stdout)
        assert runtime_class["handler"] == (expected[-1] if expected else "nvidia")


# --- runtimeclass -------------------------------------------------------------------------------

def test_runtimeclass_yaml(shim_env):
    out = run_cli("runtimeclass", env=shim_env, check=True)
    assert yaml.safe_load(out.stdout) == {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                          "metadata": {"name": "nvidia"}, "handler": "nvidia"}
    out = run_cli("runtimeclass", "--name", "gpu", "--handler", "cdi", env=shim_env, check=True)
    assert yaml.safe_load(out.stdout)["metadata"]["name"] == "gpu"
    assert yaml.safe_load(out.stdout)["handler"] == "cdi"


def test_runtimeclass_example_pod(shim_env):
    out = run_cli("runtimeclass", "--example-pod", env=shim_env, check=True)
    runtime_class, pod = list(yaml.safe_load_all(out.stdout))
    assert runtime_class["kind"] == "RuntimeClass"
    assert pod["kind"] == "Pod" and pod["spec"]["runtimeClassName"] == "nvidia"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    # the CDI annotation is the device plugin's, on the container; pod annotations never pass
    assert "cdi.k8s.io/nvidia-device-plugin_<uid>: nvidia.com/gpu=<index or UUID>" in out.stdout
    assert "annotations" not in pod["metadata"]


def test_runtimeclass_handler_checked_against_the_config(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    configure(path, fake_binary, env=shim_env)
    run_cli("runtimeclass", "--handler", "nvidia", "--config", str(path), env=shim_env, check=True)
    out = run_cli("runtimeclass", "--handler", "nvidia-gpu", "--config", str(path), env=shim_env, check=False)
    assert 'no runtime for "nvidia-gpu" is configured' in out.stderr
    assert "configures nvidia, runc" in out.stderr
    assert out.stdout == ""


def test_runtimeclass_handler_seen_through_a_drop_in(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    configure(path, fake_binary, "--drop-in", str(tmp_path / "conf.d"), "--runtime-name", "cdi", env=shim_env)
    run_cli("runtimeclass", "--handler", "cdi", "--config", str(path), env=shim_env, check=True)


def test_runtimeclass_rejects_names_the_api_server_would(shim_env):
    out = run_cli("runtimeclass", "--handler", "Bad_Handler", env=shim_env, check=False)
    assert "is not a DNS label" in out.stderr


# --- issue 14, finding 7: parallel runs lose no update -----------------------------------------

def test_parallel_runs_with_different_names_all_end_up_in_the_file(tmp_path, shim_env, fake_binary):
    """3 parallel runs, several rounds: each must report success only when its entry is in the
    final file (before the lock, up to 19 of 20 rounds lost one; the shared candidate name gave
    raw ENOENT errors or a misleading "containerd does not see runtime")."""
    import concurrent.futures

    path = copy(V2_DEFAULT, tmp_path)
    names = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        for round_ in range(4):
            batch = [f"r{round_}-{letter}" for letter in "abc"]
            results = list(pool.map(lambda name: configure(path, fake_binary, "--runtime-name", name,
                                                          env=shim_env, check=None), batch))
            for name, result in zip(batch, results):
                assert result.returncode == 0, f"{name}: {result.stderr}"
            names += batch
    _, runtimes = dumped_runtimes(path)
    assert sorted(set(names) - set(runtimes)) == [], "runs reported success but their entry is gone"
    leftovers = [n for n in os.listdir(tmp_path) if "cdi-shim-new" in n]
    assert leftovers == []


# --- issue 14, finding 8: valid configs containerd loads, written in other shapes ---------------

INLINE_RUNTIMES = f"""version = 2

[plugins."{CRI2}".containerd]
  default_runtime_name = "runc"
  runtimes = {{ runc = {{ runtime_type = "io.containerd.runc.v2", options = {{ SystemdCgroup = true }} }} }}
"""

INLINE_RUNC = f"""version = 2

[plugins."{CRI2}".containerd.runtimes]
  runc = {{ runtime_type = "io.containerd.runc.v2", options = {{ SystemdCgroup = true }} }}
"""

RUNTIMES_HEADER_AFTER_RUNC = f"""version = 2

[plugins."{CRI2}".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."{CRI2}".containerd.runtimes.runc.options]
  SystemdCgroup = true

[plugins."{CRI2}".containerd.runtimes]

[plugins."{CRI2}".containerd]
  default_runtime_name = "runc"
"""


@pytest.mark.parametrize("text", [INLINE_RUNTIMES, INLINE_RUNC, RUNTIMES_HEADER_AFTER_RUNC],
                         ids=["runtimes-inline", "runc-inline", "runtimes-header-after-runc"])
def test_other_valid_shapes_of_the_runtimes_table(tmp_path, shim_env, fake_binary, text):
    """Runtimes written as an inline table gave `ValueError: Inline tables cannot contain a
    table`; a [...containerd.runtimes] header after [...runtimes.runc] gave AttributeError.
    containerd loads both; so must we, keeping runc's settings (SystemdCgroup copied)."""
    path = tmp_path / "config.toml"
    path.write_text(text)
    dump(path)  # containerd itself loads the original
    out = configure(path, fake_binary, env=shim_env, check=None)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    section, runtimes = dumped_runtimes(path)
    assert runtimes["nvidia"]["options"]["BinaryName"] == fake_binary
    assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True
    assert runtimes["nvidia"]["container_annotations"] == ["cdi.k8s.io/*"]
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True
    assert section["containerd"]["default_runtime_name"] == "runc"
    written = read(path)
    again = configure(path, fake_binary, env=shim_env, check=True)
    assert "nothing changed" in again.stderr and read(path) == written
    # an update of the entry in that shape (a new BinaryName) works as well
    other = tmp_path / "bin" / "other-runtime"
    shutil.copy(fake_binary, other)
    configure(path, str(other), env=shim_env, check=True)
    assert dumped_runtimes(path)[1]["nvidia"]["options"]["BinaryName"] == str(other)


# --- containerd 1.7, 2.1 (real, from Debian trixie / forky) and version 4 ---------------------------

V4_SAMPLE = data("containerd-2.3-sample.toml")


def release_dump(binary, path):
    out = subprocess.run([binary, "--config", str(path), "config", "dump"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return toml_loads(out.stdout)


def live_default(binary, tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(subprocess.run([binary, "config", "default"], capture_output=True, text=True, timeout=60,
                                   check=True).stdout)
    return path


@pytest.fixture
def our_dirs(tmp_path, shim_env):
    """cdi-shim spec-dirs other than containerd's default ones."""
    dirs = [str(tmp_path / "cdi-a"), str(tmp_path / "cdi-b")]
    with open(shim_env["CDI_SHIM_CONFIG"], "a") as stream:
        stream.write(f"spec-dirs = {dirs!r}\n".replace("'", '"'))
    return dirs


def test_v3_loaded_by_real_containerd_2_1_with_cdi_dirs_made_ours(tmp_path, shim_env, fake_binary, our_dirs,
                                                                 containerd_release):
    c21 = containerd_release("2.1")
    path = live_default(c21, tmp_path)
    out = configure(path, fake_binary, env=shim_env, containerd_binary=c21)
    assert "config version 3 (containerd 2.x), from the file's version key" in out.stderr
    assert "loaded and checked by the installed containerd" in out.stderr
    # the default dirs differ from ours: told, and made ours
    assert f"cdi_spec_dirs = {our_dirs}, cdi-shim's spec-dirs (was ['/etc/cdi', '/var/run/cdi'])" \
        in out.stderr
    assert "containerd injects the CDI devices a pod asks for" in out.stderr
    assert "cdi-shim-runtime then does the hooks of the injected edits" in out.stderr
    section = release_dump(c21, path)["plugins"][CRI3]
    assert section["enable_cdi"] is True and section["cdi_spec_dirs"] == our_dirs
    nvidia = section["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"]["BinaryName"] == fake_binary
    assert nvidia["container_annotations"] == ["cdi.k8s.io/*"]
    before = read(path)
    assert "nothing changed" in configure(path, fake_binary, env=shim_env, containerd_binary=c21).stderr
    assert read(path) == before


def test_v3_cdi_off_on_containerd_2_1_is_warned(tmp_path, shim_env, fake_binary, our_dirs, containerd_release):
    c21 = containerd_release("2.1")
    path = live_default(c21, tmp_path)
    out = configure(path, fake_binary, "--enable-cdi", "false", env=shim_env, containerd_binary=c21)
    assert "enable_cdi = false (was true)" in out.stderr
    assert "containerd leaves CDI to cdi-shim-runtime" in out.stderr
    assert "warning: enable_cdi = false on containerd 2.x" in out.stderr
    assert f"cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi'] differ from cdi-shim's spec-dirs {our_dirs}; unused " \
        "while enable_cdi is off" in out.stderr
    section = release_dump(c21, path)["plugins"][CRI3]
    assert section["enable_cdi"] is False
    assert section["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]  # unused while off: left as it was


def test_v2_loaded_by_real_containerd_1_7_cdi_off_by_default(tmp_path, shim_env, fake_binary, our_dirs,
                                                             containerd_release):
    c17 = containerd_release("1.7")
    path = live_default(c17, tmp_path)
    default = read(path)
    out = configure(path, fake_binary, env=shim_env, containerd_binary=c17)
    assert "config version 2 (containerd 1.x)" in out.stderr
    assert "loaded and checked by the installed containerd" in out.stderr
    assert "enable_cdi = false: containerd leaves CDI to cdi-shim-runtime" in out.stderr
    assert "CDIDevices field is dropped" in out.stderr
    section = release_dump(c17, path)["plugins"][CRI2]
    assert section["enable_cdi"] is False
    assert section["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == fake_binary
    # turned on: containerd 1.7 then reads our spec dirs
    out = configure(path, fake_binary, "--enable-cdi", "true", env=shim_env, containerd_binary=c17)
    assert "enable_cdi = true (was false)" in out.stderr
    section = release_dump(c17, path)["plugins"][CRI2]
    assert section["enable_cdi"] is True and section["cdi_spec_dirs"] == our_dirs
    changed = [line for line in read(path).splitlines() if line not in default.splitlines()]
    assert [line.strip() for line in changed if line.strip().startswith(("cdi_", "enable_cdi"))] == \
        [f'cdi_spec_dirs = ["{our_dirs[0]}", "{our_dirs[1]}"]', "enable_cdi = true"]


def test_v2_1_6_default_loaded_by_real_containerd_1_7(tmp_path, shim_env, fake_binary, containerd_release):
    """A node upgraded from 1.6 to 1.7 keeps its version-2 file: 1.7 loads our edit of it."""
    c17 = containerd_release("1.7")
    path = copy(V2_DEFAULT, tmp_path)
    configure(path, fake_binary, env=shim_env, containerd_binary=c17)
    assert read(path) == read(data("golden-v2.toml")).replace("@BINARY@", fake_binary)  # no CDI key needed
    runtimes = release_dump(c17, path)["plugins"][CRI2]["containerd"]["runtimes"]
    assert set(runtimes) == {"runc", "nvidia"}


def test_v3_refused_for_real_containerd_1_7(tmp_path, shim_env, fake_binary, containerd_release):
    path = copy(V3_DEFAULT, tmp_path)
    out = configure(path, fake_binary, env=shim_env, check=False, containerd_binary=containerd_release("1.7"))
    assert "the installed containerd 1.7 cannot load (version 3 needs containerd 2.0 or later)" in out.stderr
    assert read(path) == read(V3_DEFAULT)


def test_enable_cdi_refused_on_containerd_1_6(tmp_path, shim_env, fake_binary):
    path = copy(V2_DEFAULT, tmp_path)
    out = configure(path, fake_binary, "--enable-cdi", "true", env=shim_env, check=False)
    assert "containerd 1.6 has no CDI support of its own (enable_cdi needs 1.7)" in out.stderr
    assert read(path) == read(V2_DEFAULT)


def test_v4_refused_for_real_containerd_2_1(tmp_path, shim_env, fake_binary, containerd_release):
    """containerd 2.0-2.2 refuse version 4 ("expected containerd config version equal to or less than
    `3`"): so does configure, before writing anything."""
    c21 = containerd_release("2.1")
    path = copy(V4_SAMPLE, tmp_path)
    out = configure(path, fake_binary, env=shim_env, check=False, containerd_binary=c21)
    assert "the installed containerd 2.1 cannot load (version 4 needs containerd 2.3 or later" in out.stderr
    assert read(path) == read(V4_SAMPLE) and not backups(path)
    dumped = subprocess.run([c21, "--config", str(path), "config", "dump"], capture_output=True, text=True, timeout=60)
    assert "expected containerd config version equal to or less than `3`, got `4`" in dumped.stderr


def test_v4_sample_unchecked_because_no_containerd_2_3_binary_is_fetched(tmp_path, shim_env, fake_binary, our_dirs):
    """Version 4 (containerd 2.3) on a hand-made sample: Debian serves containerd 2.1 at most (forky),
    and the tests fetch only Debian packages, so no real containerd loads the result here; the CRI
    sections of version 4 are version 3's (2.3's migration moves only server settings)."""
    path = copy(V4_SAMPLE, tmp_path)
    out = configure(path, fake_binary, env=shim_env, containerd_binary="/nonexistent/containerd")
    assert "config version 4 (containerd 2.3+), from the file's version key" in out.stderr
    assert "not checked: containerd is not installed here" in out.stderr
    new = read(path)
    assert new.startswith(read(V4_SAMPLE).split("version = 4", 1)[0] + "version = 4\n")
    section = toml_loads(new)["plugins"][CRI3]
    assert section["cdi_spec_dirs"] == our_dirs and section["enable_cdi"] is True
    entry = section["containerd"]["runtimes"]["nvidia"]
    assert entry["options"]["BinaryName"] == fake_binary and entry["container_annotations"] == ["cdi.k8s.io/*"]
    assert "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]" in new
    # a missing file on a 2.3 node would be written as version 4 too
    fresh = tmp_path / "fresh" / "config.toml"
    configure(fresh, fake_binary, "--config-version", "4", env=shim_env, containerd_binary="/nonexistent/containerd")
    assert toml_loads(read(fresh))["version"] == 4


def test_v3_drop_in_carries_cdi_dirs_and_containerd_2_1_merges_it(tmp_path, shim_env, fake_binary, our_dirs,
                                                                  containerd_release):
    c21 = containerd_release("2.1")
    path = live_default(c21, tmp_path)
    main_before = read(path)
    out = configure(path, fake_binary, "--drop-in", str(tmp_path / "conf.d"), env=shim_env, containerd_binary=c21)
    assert "loaded and checked by the installed containerd" in out.stderr
    dropin = toml_loads(read(tmp_path / "conf.d" / "99-cdi-shim.toml"))
    assert dropin["plugins"][CRI3]["cdi_spec_dirs"] == our_dirs
    assert "cdi_spec_dirs" in main_before and f"'{our_dirs[0]}'" not in read(path)  # the main file keeps its own
    section = release_dump(c21, path)["plugins"][CRI3]
    assert section["cdi_spec_dirs"] == our_dirs and set(section["containerd"]["runtimes"]) == {"runc", "nvidia"}


# --- issue 31: a new user's first hour -----------------------------------------------------------

@pytest.mark.parametrize("release, text, cri", [("1.7", "version = 2\n", CRI2),
                                                ("1.7", f'version = 2\n\n[plugins."{CRI2}"]\n  sandbox_image = "p:1"\n',
                                                 CRI2),
                                                ("2.1", "version = 3\n", CRI3)],
                         ids=["v2-bare", "v2-cri-section", "v3-bare"])
@pytest.mark.parametrize("enable", ["true", "false"])
def test_enable_cdi_on_a_config_without_an_enable_cdi_line(tmp_path, shim_env, fake_binary, containerd_release,
                                                           release, text, cri, enable):
    """A hand-written config naming no enable_cdi: --enable-cdi wrote the key, then crashed
    (`'bool' object has no attribute 'trivia'`: tomlkit hands a boolean out as a plain bool)."""
    binary = containerd_release(release)
    path = tmp_path / "config.toml"
    path.write_text(text)
    out = configure(path, fake_binary, "--enable-cdi", enable, env=shim_env, containerd_binary=binary, check=None)
    assert "Traceback" not in out.stderr, out.stderr
    if (release, enable) in (("1.7", "false"), ("2.1", "true")):  # each version's default: nothing to set
        assert out.returncode == 0 and "enable_cdi = " + enable + " (was " not in out.stderr, out.stderr
    else:
        assert out.returncode == 0 and f"enable_cdi = {enable} (was " in out.stderr, out.stderr
    assert "loaded and checked by the installed containerd" in out.stderr
    assert release_dump(binary, path)["plugins"][cri]["enable_cdi"] is (enable == "true")
    again = configure(path, fake_binary, "--enable-cdi", enable, env=shim_env, containerd_binary=binary)
    assert "nothing changed" in again.stderr


def test_v2_config_under_containerd_2_1_refused_with_doctors_cause(tmp_path, shim_env, fake_binary,
                                                                   containerd_release):
    """What every 1.7 -> 2.x upgrade leaves: a version-2 file. configure said `containerd sees
    enable_cdi = true, not false` and announced "containerd 1.x"; it now says what doctor says
    (migrated in memory at every start; `containerd config migrate`) and offers --migrate."""
    c21 = containerd_release("2.1")
    path = copy(V2_DEFAULT, tmp_path)
    out = configure(path, fake_binary, env=shim_env, containerd_binary=c21, check=False)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "containerd 1.x" not in out.stderr and "enable_cdi" not in out.stderr
    assert f"{path} is a version 2 config; the installed containerd 2.1 reads version 3" in out.stderr
    assert "--migrate" in out.stderr
    assert read(path) == read(V2_DEFAULT) and not backups(path)
    doctor = run_cli("doctor", "--config", str(path), "--containerd-binary", c21, "--json", env=shim_env)
    line = next(c for c in yaml.safe_load(doctor.stdout) if c["check"] == "containerd.config")
    from shim.node.containerd import MIGRATE_BY_HAND
    for said in ("migrated to version 3 in memory at every start", MIGRATE_BY_HAND,
                 f"cdi-shim runtime configure --runtime=containerd --config {path} --migrate"):
        assert said in line["saw"] + line["fix"], (said, line)
    for said in ("migrated to version 3 in memory at every start", MIGRATE_BY_HAND, "--migrate"):
        assert said in out.stderr, (said, out.stderr)


def test_v2_config_migrated_by_real_containerd_2_1(tmp_path, shim_env, fake_binary, containerd_release):
    c21 = containerd_release("2.1")
    path = copy(V2_DEFAULT, tmp_path)
    out = configure(path, fake_binary, "--migrate", env=shim_env, containerd_binary=c21)
    assert "config version 3 (containerd 2.x), from `containerd config migrate` of the file's version 2; " \
        "installed: containerd 2.1" in out.stderr
    assert "loaded and checked by the installed containerd" in out.stderr
    assert backups(path) and read(backups(path)[0]) == read(V2_DEFAULT)
    assert toml_loads(read(path))["version"] == 3
    section = release_dump(c21, path)["plugins"][CRI3]
    nvidia = section["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"]["BinaryName"] == fake_binary and nvidia["container_annotations"] == ["cdi.k8s.io/*"]
    assert section["enable_cdi"] is True
    # the 1.6 default's sandbox image survives the migration
    assert release_dump(c21, path)["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == \
        toml_loads(read(V2_DEFAULT))["plugins"][CRI2]["sandbox_image"]
    before = read(path)
    again = configure(path, fake_binary, "--migrate", env=shim_env, containerd_binary=c21)
    assert "nothing changed" in again.stderr and read(path) == before


def test_migrate_needs_containerd_2(tmp_path, shim_env, fake_binary, containerd_release):
    path = copy(V2_DEFAULT, tmp_path)
    out = configure(path, fake_binary, "--migrate", env=shim_env, containerd_binary=containerd_release("1.7"),
                    check=False)
    assert "which containerd 2.0 and later have; here there is containerd 1.7" in out.stderr
    assert read(path) == read(V2_DEFAULT)
    out = configure(path, fake_binary, env=shim_env, containerd_binary=containerd_release("1.7"))
    assert "config version 2 (containerd 1.x), from the file's version key; installed: containerd 1.7" in out.stderr


@pytest.mark.parametrize("shape", ["fifo", "loop"])
def test_configure_on_a_config_path_that_is_no_regular_file(tmp_path, shim_env, fake_binary, shape):
    """configure (and install, through the same read) opened the file with a blocking open."""
    path = tmp_path / "config.toml"
    if shape == "fifo":
        os.mkfifo(path)
        why = "a FIFO, not a regular file"
    else:
        os.symlink(tmp_path / "other.toml", path)
        os.symlink(path, tmp_path / "other.toml")
        why = "a link loop (too many levels of symbolic links)"
    try:
        out = run_cli("runtime", "configure", "--config", str(path), "--runtime-binary", fake_binary,
                      "--containerd-binary", containerd(), env=shim_env, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("configure hung")
    assert out.stderr.splitlines()[-1].startswith("Error: cannot read ") and out.stderr.strip().endswith(why), \
        out.stderr
    assert "Traceback" not in out.stderr


# --- links root follows (issue 43, finding 7) -----------------------------------------------------

def _planted(tmp_path, how):
    """A root-owned containerd config at etc/config.toml and a link to it at the path given to
    --config, planted as HOW says; (the link, the target)."""
    target = copy(V2_DEFAULT, tmp_path, "target.toml")
    folder = tmp_path / "theirs"
    folder.mkdir()
    link = folder / "config.toml"
    os.symlink(target, link)
    if how == "a link another user owns":
        os.lchown(link, 1000, 1000)
    elif how == "a link in a folder others can write":
        os.chmod(folder, 0o777)
    elif how == "a link in a sticky folder others can write":
        os.chmod(folder, 0o1777)
    elif how == "a link under another user's folder":
        os.chown(folder, 1000, 1000)
    elif how == "a folder link another user owns":
        os.unlink(link)
        os.rmdir(folder)
        os.symlink(tmp_path, folder)
        os.lchown(folder, 1000, 1000)
        link = folder / "target.toml"
    return link, target


@pytest.mark.parametrize("how, said", [
    ("a link another user owns", "config.toml: it is owned by uid 1000"),
    ("a link in a folder others can write", "theirs is writable by group or others (mode 777)"),
    ("a link in a sticky folder others can write", "theirs is writable by group or others (mode 1777)"),
    ("a link under another user's folder", "theirs is owned by uid 1000"),
    ("a folder link another user owns", "theirs: it is owned by uid 1000")])
def test_configure_follows_no_link_another_user_controls(tmp_path, shim_env, fake_binary, how, said):
    """--config naming a link another user owns, or one in a folder another user can write:
    root would rewrite the root-owned file it leads to (a link that user chose). Refused,
    naming the link and its owner; nothing is written."""
    link, target = _planted(tmp_path, how)
    out = configure(link, fake_binary, env=shim_env, check=False)
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("Error: ") and said in out.stderr and "will not follow" in out.stderr, out.stderr
    assert read(target) == read(V2_DEFAULT) and not backups(target)
    assert sorted(os.listdir(tmp_path / "theirs")) == sorted(os.listdir(link.parent))


def test_configure_follows_a_link_root_owns_in_a_private_folder(tmp_path, shim_env, fake_binary):
    link, target = _planted(tmp_path, "root's own link")
    configure(link, fake_binary, env=shim_env)
    assert os.path.islink(link) and "cdi-shim-runtime" in read(target)       # a linked config stays linked


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_docker_and_podman_configure_take_the_same_rule(tmp_path, engine, runtime_binary):
    from shim.node import docker_config, podman_config

    link, _ = _planted(tmp_path, "a link another user owns")
    module, error = (docker_config, docker_config.DockerConfigError) if engine == "docker" else \
        (podman_config, podman_config.PodmanConfigError)
    with pytest.raises(error, match="will not follow the link .*config.toml: it is owned by uid 1000"):
        module.plan_configure(str(link), binary=runtime_binary)
