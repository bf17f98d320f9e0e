"""Request collection and runc argv handling of the runtime (no runc needed here)."""
import pytest

from shim.config import Config, load_config, ConfigError
from shim.runtime.requests import RequestError, collect_requests, env_devices
from shim.runtime.runc_args import ArgvError, parse_runc_argv

SETTINGS = Config()


@pytest.mark.parametrize("values, expected", [
    (["0"], ["nvidia.com/gpu=0"]),
    (["0,1"], ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]),
    (["GPU-8f6e1c2a-0000-1111-2222-333344445555"], ["nvidia.com/gpu=GPU-8f6e1c2a-0000-1111-2222-333344445555"]),
    (["all"], ["nvidia.com/gpu=all"]),
    (["none"], []), (["void"], []), ([""], []),
    (["0", "all"], ["nvidia.com/gpu=all"]),           # all beats a list
    (["all", "none"], []),                             # none beats everything else
    (["none", "void", "0"], []),                       # void (and none) beat the rest
    (["vendor.com/fpga=a,1"], ["vendor.com/fpga=a", "nvidia.com/gpu=1"]),
])
def test_env_semantics(values, expected):
    assert env_devices(values, "nvidia.com/gpu") == expected


def config(**process):
    return {"process": dict({"env": []}, **process)}


def test_sources_in_order_and_deduplicated():
    cfg = {"annotations": {"cdi.k8s.io/b": "v.com/c=ann2", "cdi.k8s.io/a": "v.com/c=ann1,v.com/c=shared",
                           "other/x": "ignored"},
           "process": {"env": ["NVIDIA_VISIBLE_DEVICES=3"]},
           "mounts": [{"destination": "/var/run/nvidia-container-devices/GPU-1", "source": "/dev/null"},
                      {"destination": "/var/run/nvidia-container-devices", "source": "/dev/null"}]}
    assert collect_requests(cfg, SETTINGS, ["v.com/c=shared", "v.com/c=cli"]) == [
        "v.com/c=ann1", "v.com/c=shared", "v.com/c=ann2", "nvidia.com/gpu=3", "nvidia.com/gpu=GPU-1", "v.com/c=cli"]


def test_malformed_annotation_is_an_error():
    with pytest.raises(RequestError, match='invalid CDI device name "gpu0"'):
        collect_requests({"annotations": {"cdi.k8s.io/x": "gpu0"}}, SETTINGS)


def test_malformed_cli_device_is_an_error():
    with pytest.raises(RequestError, match="vendor.com/class=name"):
        collect_requests({}, SETTINGS, ["gpu0"])


def test_env_requests_of_unprivileged_containers_can_be_refused():
    strict = Config(accept_env_unprivileged=False)
    warnings = []
    cfg = config(env=["NVIDIA_VISIBLE_DEVICES=all"])
    assert collect_requests(cfg, strict, warn=warnings.append) == []
    assert "lacks CAP_SYS_ADMIN" in warnings[0] and "NVIDIA_VISIBLE_DEVICES=all" in warnings[0]
    cfg["process"]["capabilities"] = {"bounding": ["CAP_SYS_ADMIN"]}
    assert collect_requests(cfg, strict) == ["nvidia.com/gpu=all"]
    assert collect_requests(config(env=["NVIDIA_VISIBLE_DEVICES=all"]), SETTINGS) == ["nvidia.com/gpu=all"]


def test_configured_names_are_used():
    custom = Config(annotation_prefixes=("example.org/",), device_env="", default_kind="acme.com/npu")
    cfg = {"annotations": {"cdi.k8s.io/x": "v.com/c=a", "example.org/y": "v.com/c=b"},
           "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]},
           "mounts": [{"destination": "/var/run/nvidia-container-devices/2", "source": "/dev/null"}]}
    assert collect_requests(cfg, custom) == ["v.com/c=b", "acme.com/npu=2"]


def test_runc_argv_parsing_keeps_everything_but_our_options():
    args = parse_runc_argv(["--root", "/r", "--log=/l.json", "--log-format", "json", "--device", "v.com/c=a",
                            "--systemd-cgroup", "--device=v.com/c=b", "create", "--bundle", "/b",
                            "--pid-file", "/p", "id1"])
    assert args.runc_argv == ["--root", "/r", "--log=/l.json", "--log-format", "json", "--systemd-cgroup",
                              "create", "--bundle", "/b", "--pid-file", "/p", "id1"]
    assert (args.command, args.bundle, args.container_id, args.log_file, args.log_format) == \
        ("create", "/b", "id1", "/l.json", "json")
    assert args.devices == ["v.com/c=a", "v.com/c=b"]
    assert parse_runc_argv(["run", "-b", "x", "-d", "c"]).bundle == "x"
    assert parse_runc_argv(["run", "c"]).bundle == "."


def test_runc_argv_device_after_the_command_is_ours():
    args = parse_runc_argv(["--root", "/r", "run", "--device", "v.com/c=a", "-b", "/b", "--device=v.com/c=b",
                            "-device", "v.com/c=c", "--detach", "id1", "--device", "not-ours"])
    assert args.devices == ["v.com/c=a", "v.com/c=b", "v.com/c=c"]
    assert args.runc_argv == ["--root", "/r", "run", "-b", "/b", "--detach", "id1", "--device", "not-ours"]
    assert (args.bundle, args.container_id, args.help) == ("/b", "id1", False)


@pytest.mark.parametrize("argv", [["--help"], ["-h"], [], ["--root", "/r"], ["help"], ["--device", "--help"],
                                  ["--device"], ["--help", "create", "c"], ["create", "--help"],
                                  ["run", "-h", "--bundle", "/b"], ["run", "c", "--help"],
                                  ["run", "--device", "--help"], ["create", "--device", "v.com/c=a", "-help"]])
def test_runc_argv_help_prepares_nothing(argv):
    args = parse_runc_argv(argv)
    assert args.help
    assert "--device" not in args.runc_argv and "v.com/c=a" not in args.runc_argv


@pytest.mark.parametrize("argv", [["create", "--device"], ["--device", "--log", "l", "state"],
                                  ["run", "--device", "--bundle", "/b", "c"]])
def test_runc_argv_device_without_a_value_is_an_error(argv):
    with pytest.raises(ArgvError, match="option --device needs a value: a CDI device name"):
        parse_runc_argv(argv)


def test_runc_argv_no_help_for_commands():
    for argv in (["--version"], ["state", "c"], ["help", "create"], ["run", "c", "--", "--help"]):
        assert not parse_runc_argv(argv).help, argv


def test_named_config_file_must_exist_the_default_need_not(tmp_path, monkeypatch):
    import shim.config

    missing = str(tmp_path / "missing.toml")
    monkeypatch.setenv("CDI_SHIM_CONFIG", missing)
    message = rf"^cdi-shim config {missing} does not exist \(named by \$CDI_SHIM_CONFIG\)$"
    with pytest.raises(ConfigError, match=message):
        load_config()
    monkeypatch.delenv("CDI_SHIM_CONFIG")
    monkeypatch.setattr(shim.config, "DEFAULT_CONFIG_PATH", missing)
    assert load_config() == Config()
    monkeypatch.setenv("CDI_SHIM_CONFIG", "")
    assert load_config() == Config()


def test_config_file_errors_name_file_and_key(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('runtime = "runc"\nspec_dirs = ["/x"]\n')
    with pytest.raises(ConfigError, match=rf'{path}: unknown key "spec_dirs"'):
        load_config(str(path))
    path.write_text("runtime = [\n")
    with pytest.raises(ConfigError, match=f"malformed cdi-shim config {path}"):
        load_config(str(path))
    path.write_text('log-level = "loud"\n')
    with pytest.raises(ConfigError, match='"log-level" must be one of'):
        load_config(str(path))
    assert load_config(str(tmp_path / "missing.toml")) == Config()
    path.write_text('spec-dirs = ["/a", "/b"]  # ours\nannotation-prefixes = [\n  "x/",\n]\n')
    loaded = load_config(str(path))
    assert loaded.spec_dirs == ("/a", "/b") and loaded.annotation_prefixes == ("x/",)


def test_settings_follow_the_file(tmp_path):
    """Every load reads the file (a resident worker's too): a change, an error or the file's
    removal is seen by the next create."""
    path = tmp_path / "config.toml"
    path.write_text('runtime = "runc"\n')
    assert load_config(str(path)).runtime == "runc"
    path.write_text('runtime = "crun"\n')
    assert load_config(str(path)).runtime == "crun"
    path.write_text("runtime = [\n")
    with pytest.raises(ConfigError, match=f"malformed cdi-shim config {path}"):
        load_config(str(path))
    path.unlink()
    assert load_config(str(path)) == Config()


# --- issue 14, finding 1: the device env var's size is bounded and costs linear work ----------

_MEASURE = r"""
import resource, sys, time
from shim.config import Config
from shim.runtime.requests import RequestError, collect_requests
value = sys.stdin.read()
cfg = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=" + value]}}
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.process_time()
try:
    outcome = "devices %d" % len(collect_requests(cfg, Config()))
except RequestError as err:
    outcome = "error " + str(err)
used = time.process_time() - start
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
print("%d %.3f %s" % (grown, used, outcome[:300]))
"""


def _measure(value):
    import resource
    import subprocess
    import sys

    def limit():  # 1 GiB of address space: the quadratic origin text needed 3.1 GB for 80 KB
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    out = subprocess.run([sys.executable, "-c", _MEASURE], input=value, capture_output=True, text=True,
                         timeout=120, preexec_fn=limit)
    assert out.returncode == 0, out.stderr[-2000:]
    grown_kib, cpu, outcome = out.stdout.split(" ", 2)
    return int(grown_kib), float(cpu), outcome.strip()


def test_a_long_device_env_value_is_refused_in_bounded_time_and_memory():
    from shim.runtime.requests import MAX_ENV_CHARS

    value = ",".join(["0"] * 40_000)  # 80 KB: the review's case (3.1 GB, larger values: the OOM killer)
    assert len(value) > MAX_ENV_CHARS
    grown_kib, cpu, outcome = _measure(value)
    assert outcome.startswith("error NVIDIA_VISIBLE_DEVICES: "), outcome
    assert f"at most {MAX_ENV_CHARS}" in outcome
    assert grown_kib < 20 * 1024 and cpu < 2, (grown_kib, cpu)


def test_device_env_at_its_caps_costs_linear_work():
    from shim.runtime.requests import MAX_ENV_CHARS, MAX_REQUESTS

    # as many distinct UUID-like names as allowed, padded with blanks up to the length cap
    names = [f"GPU-{index:08x}-0000-1111-2222-333344445555" for index in range(MAX_REQUESTS)]
    value = ",".join(names)
    value += "," * (MAX_ENV_CHARS - len(value))
    grown_kib, cpu, outcome = _measure(value)
    assert outcome == f"devices {MAX_REQUESTS}"
    assert grown_kib < 20 * 1024 and cpu < 2, (grown_kib, cpu)
    # one item more than the request cap: a clear error naming the env var
    grown_kib, cpu, outcome = _measure(",".join(["0"] * (MAX_REQUESTS + 1)))
    assert outcome.startswith("error NVIDIA_VISIBLE_DEVICES: "), outcome
    assert f"at most {MAX_REQUESTS} devices" in outcome


# --- issue 14, finding 2: a volume mount requests devices only when its source is /dev/null ----

def _mount(destination, source):
    return {"destination": destination, "type": "bind", "source": source, "options": ["rbind", "rw"]}


def test_volume_mount_requests_need_a_dev_null_source():
    root = "/var/run/nvidia-container-devices/"
    cfg = {"mounts": [_mount(root + "all", "/var/lib/kubelet/pods/p/volumes/kubernetes.io~empty-dir/x"),
                      _mount(root + "0", "/dev/../dev/null"),   # the toolkit cleans the source path
                      _mount(root + "1", "/dev/null"),
                      _mount(root + "2", "/tmp/null"),
                      {"destination": root + "3"}]}             # no source at all
    assert collect_requests(cfg, SETTINGS) == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert Config().volume_mount_requests == "dev-null"
    assert collect_requests(cfg, Config(volume_mount_requests="off")) == []


def test_volume_mount_requests_config_key(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('volume-mount-requests = "off"\n')
    assert load_config(str(path)).volume_mount_requests == "off"
    path.write_text('volume-mount-requests = "any"\n')
    with pytest.raises(ConfigError, match=rf'{path}: "volume-mount-requests" must be one of "dev-null", "off", '
                                          r'not "any"'):
        load_config(str(path))


# --- issue 14, finding 12a: env requests name only devices of allowed vendors ------------------

def test_env_request_of_another_vendors_device_is_refused():
    cfg = config(env=["NVIDIA_VISIBLE_DEVICES=0,example.com/secret=key"])
    with pytest.raises(RequestError) as info:
        collect_requests(cfg, SETTINGS)
    message = str(info.value)
    assert message.startswith("NVIDIA_VISIBLE_DEVICES names example.com/secret=key"), message
    assert "nvidia.com" in message and "env-vendors" in message
    # the same device by annotation (the device plugin's way) or --device is fine
    assert collect_requests({"annotations": {"cdi.k8s.io/x": "example.com/secret=key"}}, SETTINGS) == \
        ["example.com/secret=key"]
    assert collect_requests({}, SETTINGS, ["example.com/secret=key"]) == ["example.com/secret=key"]


def test_env_request_of_another_class_of_the_default_vendor_is_fine():
    cfg = config(env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/mig=0:1,1"])
    assert collect_requests(cfg, SETTINGS) == ["nvidia.com/mig=0:1", "nvidia.com/gpu=1"]


def test_env_vendors_lists_the_vendors_env_requests_may_name(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('env-vendors = ["example.com", "nvidia.com"]\n')
    settings = load_config(str(path))
    assert settings.env_vendors == ("example.com", "nvidia.com") and Config().env_vendors == ()
    cfg = config(env=["NVIDIA_VISIBLE_DEVICES=example.com/secret=key,0"])
    assert collect_requests(cfg, settings) == ["example.com/secret=key", "nvidia.com/gpu=0"]
    only_example = Config(env_vendors=("example.com",))
    with pytest.raises(RequestError, match="NVIDIA_VISIBLE_DEVICES names nvidia.com/gpu=0"):
        collect_requests(cfg, only_example)


# --- Docker's --gpus: NVIDIA_VISIBLE_DEVICES plus the legacy prestart hook ---------------------

def gpus_config(*env, hook_path="/usr/local/bin/nvidia-container-runtime-hook", other_hooks=()):
    hooks = list(other_hooks) + [{"path": hook_path, "args": ["nvidia-container-runtime-hook", "prestart"]}]
    return {"process": {"env": list(env)}, "hooks": {"prestart": hooks}}


def test_drop_legacy_hook_keeps_other_hooks_and_the_input():
    from shim.runtime.requests import drop_legacy_hook

    other = {"path": "/usr/bin/other-hook", "args": ["other-hook"]}
    cfg = gpus_config("NVIDIA_VISIBLE_DEVICES=all", other_hooks=[other])
    dropped, found = drop_legacy_hook(cfg)
    assert found and dropped["hooks"]["prestart"] == [other]
    assert len(cfg["hooks"]["prestart"]) == 2                       # the input is not changed
    alone, found = drop_legacy_hook(gpus_config("NVIDIA_VISIBLE_DEVICES=0"))
    assert found and "prestart" not in alone["hooks"]
    plain = {"hooks": {"prestart": [other]}}
    assert drop_legacy_hook(plain) == (plain, False)
    # a name that only ends like it is not it
    assert drop_legacy_hook(gpus_config(hook_path="/bin/my-nvidia-container-runtime-hook"))[1] is False


def test_gpus_request_is_the_daemons_last_value_whatever_device_env_says():
    # docker appends its NVIDIA_VISIBLE_DEVICES after the image's and the user's
    cfg = gpus_config("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=1")
    assert collect_requests(cfg, SETTINGS, legacy_hook=True) == ["nvidia.com/gpu=1"]
    off = Config(device_env="", accept_env_unprivileged=False)
    assert collect_requests(cfg, off, legacy_hook=True) == ["nvidia.com/gpu=1"]
    assert collect_requests(cfg, off) == []
    assert collect_requests(gpus_config("NVIDIA_VISIBLE_DEVICES=void"), SETTINGS, legacy_hook=True) == []
    with pytest.raises(RequestError, match="vendor example.com"):
        collect_requests(gpus_config("NVIDIA_VISIBLE_DEVICES=example.com/x=1"), SETTINGS, legacy_hook=True)
