"""cdi-shim-runtime with real runc: each request source injects the device, its env, the bind
mount and the hooks, for `run` and for `create` + `start` + `delete`; requests for nothing leave
config.json alone.

The container (busybox-static rootfs) reports `ls -l /dev`, its env, the mounted file, the
startContainer hook's file, the createContainer hook's file and its devices cgroup; the
createContainer hook also records the state JSON it got on the host (bundle/hook-createContainer.json).
"""
import json
import os

import pytest

import runtime_helpers as rh

pytestmark = pytest.mark.runtime_e2e
RESIDENT_TOO = True  # every test also through `cdi-shim runtime serve` (conftest.py)

DEVICE_MOUNT = {"destination": f"{rh.DEVICE_MOUNT_ROOT}/1", "type": "bind", "source": "/dev/null",
                "options": ["bind", "ro"]}

# source -> (bundle kwargs, extra global options, expected GPU minors, expected device env var)
SOURCES = {
    "annotation": (dict(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=0"}), [], {0}, "E2E_GPU_0"),
    "env-index": (dict(env=["NVIDIA_VISIBLE_DEVICES=0"]), [], {0}, "E2E_GPU_0"),
    "env-uuid": (dict(env=[f"NVIDIA_VISIBLE_DEVICES={rh.GPU_UUIDS[1]}"]), [], {1}, "E2E_GPU_UUID1"),
    "env-all": (dict(env=["NVIDIA_VISIBLE_DEVICES=all"]), [], {0, 1}, "E2E_GPU_ALL"),
    "env-list": (dict(env=["NVIDIA_VISIBLE_DEVICES=0,1"]), [], {0, 1}, "E2E_GPU_1"),
    "env-qualified": (dict(env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1"]), [], {1}, "E2E_GPU_1"),
    "device-option": (dict(), ["--device", "nvidia.com/gpu=1"], {1}, "E2E_GPU_1"),
    "device-plugin-mount": (dict(mounts=[DEVICE_MOUNT]), [], {1}, "E2E_GPU_1"),
}


def run_container(world, bundle, mode, global_opts=(), command_opts=()):
    """Start the bundle's container through the shim; returns the container's stdout text."""
    out_path = os.path.join(world.base, f"out-{bundle.id}.txt")
    with open(out_path, "wb") as out:
        if mode == "run":
            result = world.shim(*global_opts, "run", *command_opts, "--bundle", bundle.path, bundle.id,
                                stdout=out, stderr=None, capture_output=False)
            assert result.returncode == 0, f"run exited {result.returncode}"
            assert world.state(bundle.id) is None, "runc run (foreground) should have deleted the container"
        else:
            result = world.shim(*global_opts, "create", *command_opts, "--bundle", bundle.path, bundle.id,
                                stdout=out, stderr=None, capture_output=False)
            assert result.returncode == 0, f"create exited {result.returncode}"
            state = world.state(bundle.id)
            assert state is not None and state["status"] == "created", state
            started = world.shim("start", bundle.id)
            assert started.returncode == 0, started.stderr
            world.wait_stopped(bundle.id)
            deleted = world.shim("delete", bundle.id)
            assert deleted.returncode == 0, deleted.stderr
            assert world.state(bundle.id) is None
    with open(out_path) as f:
        return f.read()


def check_injected(world, bundle, report, minors, env_var):
    assert report["complete"], report
    dev = report["dev"]
    for minor in (0, 1):
        if minor in minors:
            assert dev.get(f"/dev/nvidia{minor}") == ("c", 195, minor), dev
        else:
            assert f"/dev/nvidia{minor}" not in dev, dev
    assert dev.get("/dev/nvidiactl") == ("c", 1, 3), dev        # /dev/null-backed node
    assert dev.get("/dev/nvidia-uvm") == ("c", 1, 3), dev
    assert report["env"].get("E2E_COMMON") == "1", report["env"]
    assert report["env"].get(env_var) == "1", report["env"]
    assert report["mount"] == rh.HOST_FILE_TEXT.strip()
    assert report["hook-start"] == "start-hook-ran"
    assert report["hook-create"] == "ran createContainer mark=e2e-mark"
    for minor in minors:
        assert any(line.startswith(f"c 195:{minor} rw") for line in report["cgroup"]), report["cgroup"]
    # The createContainer hook really ran on the host, for this container.
    state = json.loads(bundle.host_file("hook-createContainer.json"))
    assert state["id"] == bundle.id and state["bundle"] == bundle.path
    # config.json was rewritten: valid, same mode, device added, nothing else left in the bundle.
    config = bundle.config()
    paths = [d["path"] for d in config["linux"].get("devices", [])]
    for minor in minors:
        assert f"/dev/nvidia{minor}" in paths
    assert config["process"]["args"] == bundle_args(bundle)
    assert os.stat(bundle.config_path).st_mode & 0o7777 == 0o640
    assert set(os.listdir(bundle.path)) == {"config.json", "rootfs", "hook-createContainer.json"}


def bundle_args(bundle):
    return json.loads(bundle.original)["process"]["args"]


@pytest.mark.parametrize("mode", ["run", "create-start"])
@pytest.mark.parametrize("source", list(SOURCES))
def test_request_source_injects(world, source, mode):
    kwargs, opts, minors, env_var = SOURCES[source]
    bundle = world.bundle(mode=0o640, **kwargs)
    text = run_container(world, bundle, mode, opts)
    check_injected(world, bundle, rh.parse_report(text), minors, env_var)


def test_repeated_device_options(world):
    """--device is repeatable, in both `--device NAME` and `--device=NAME` spellings."""
    bundle = world.bundle(mode=0o640)
    text = run_container(world, bundle, "run", ["--device", "nvidia.com/gpu=0", "--device=nvidia.com/gpu=1"])
    report = rh.parse_report(text)
    assert report["dev"].get("/dev/nvidia0") == ("c", 195, 0)
    assert report["dev"].get("/dev/nvidia1") == ("c", 195, 1)
    assert report["env"].get("E2E_GPU_0") == "1" and report["env"].get("E2E_GPU_1") == "1"


@pytest.mark.parametrize("mode", ["run", "create-start"])
@pytest.mark.parametrize("spelling", ["--device NAME", "--device=NAME", "-device NAME"])
def test_device_option_after_the_command(world, mode, spelling):
    """`cdi-shim-runtime run --device NAME --bundle B ID`: the front end's probe sees the request
    (config.json asks for nothing), and runc never sees the option."""
    bundle = world.bundle(mode=0o640)
    option, _, _ = spelling.partition(" ")
    opts = ["--device=nvidia.com/gpu=1"] if "=" in spelling else [option, "nvidia.com/gpu=1"]
    text = run_container(world, bundle, mode, command_opts=opts)
    check_injected(world, bundle, rh.parse_report(text), {1}, "E2E_GPU_1")


NOTHING = {
    "void": ["NVIDIA_VISIBLE_DEVICES=void"],
    "none": ["NVIDIA_VISIBLE_DEVICES=none"],
    "empty": ["NVIDIA_VISIBLE_DEVICES="],
    "list-then-void": ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=void"],
    "all-then-none": ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=none"],
    "none-then-all": ["NVIDIA_VISIBLE_DEVICES=none", "NVIDIA_VISIBLE_DEVICES=all"],
    "no-request": [],
}


@pytest.mark.parametrize("case", list(NOTHING))
def test_nothing_requested_leaves_config_untouched(world, case):
    bundle = world.bundle(env=NOTHING[case], annotations={"example.org/other": "nvidia.com/gpu=0"})
    before = os.stat(bundle.config_path)
    text = run_container(world, bundle, "run")
    report = rh.parse_report(text)
    assert "/dev/nvidia0" not in report["dev"] and "/dev/nvidia1" not in report["dev"], report["dev"]
    assert "E2E_COMMON" not in report["env"]
    assert bundle.unchanged(), "config.json changed although nothing was requested"
    after = os.stat(bundle.config_path)
    assert (after.st_ino, after.st_mtime_ns, after.st_mode) == (before.st_ino, before.st_mtime_ns, before.st_mode), \
        "config.json was rewritten (new inode or mtime) although nothing was requested"
    assert bundle.extra_files() == []


@pytest.mark.parametrize("values,minors", [
    (["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=all"], {0, 1}),   # all beats a list
    (["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=1"], {0, 1}),
    ([f"NVIDIA_VISIBLE_DEVICES={rh.GPU_UUIDS[0]},1"], {0, 1}),
])
def test_env_precedence_on_create(world, values, minors):
    bundle = world.bundle(env=values)
    result = world.shim("create", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    devices = {d["path"] for d in bundle.config()["linux"].get("devices", [])}
    assert {p for p in devices if p.startswith("/dev/nvidia") and p[-1].isdigit()} == \
        {f"/dev/nvidia{m}" for m in minors}
    assert world.shim("delete", "--force", bundle.id).returncode == 0


def test_env_requests_off_for_unprivileged(world):
    """accept-env-unprivileged = false: an env request of a container without CAP_SYS_ADMIN is
    ignored (and said so), one with CAP_SYS_ADMIN in its bounding set is honoured; annotations
    still work."""
    world.write_config(accept_env_unprivileged=False)
    plain = world.bundle(env=["NVIDIA_VISIBLE_DEVICES=all"])
    result = world.shim("create", "--bundle", plain.path, plain.id)
    assert result.returncode == 0, result.stderr
    assert plain.unchanged()
    assert "NVIDIA_VISIBLE_DEVICES" in result.stderr, "an ignored env request must be logged"
    assert world.shim("delete", "--force", plain.id).returncode == 0

    caps = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_SYS_ADMIN"]
    admin = world.bundle(env=["NVIDIA_VISIBLE_DEVICES=all"], caps=caps)
    result = world.shim("create", "--bundle", admin.path, admin.id)
    assert result.returncode == 0, result.stderr
    assert any(d["path"] == "/dev/nvidia1" for d in admin.config()["linux"]["devices"])
    assert world.shim("delete", "--force", admin.id).returncode == 0

    annotated = world.bundle(annotations={"cdi.k8s.io/x": "nvidia.com/gpu=0"})
    result = world.shim("create", "--bundle", annotated.path, annotated.id)
    assert result.returncode == 0, result.stderr
    assert any(d["path"] == "/dev/nvidia0" for d in annotated.config()["linux"]["devices"])
    assert world.shim("delete", "--force", annotated.id).returncode == 0


def test_custom_prefix_env_and_kind(world):
    """annotation-prefixes, device-env and default-kind from config.toml are honoured."""
    world.write_spec("other.yaml", 'cdiVersion: "0.5.0"\nkind: example.com/acc\ndevices:\n'
                     f'  - name: "3"\n    containerEdits:\n      deviceNodes:\n'
                     f'        - path: /dev/acc3\n          hostPath: {world.node(1)}\n')
    world.write_config(annotation_prefixes=["devices.example.org/"], device_env="ACC_DEVICES",
                       default_kind="example.com/acc")
    bundle = world.bundle(env=["ACC_DEVICES=3", "NVIDIA_VISIBLE_DEVICES=0"],
                          annotations={"devices.example.org/a": "nvidia.com/gpu=1", "cdi.k8s.io/b": "nvidia.com/gpu=0"})
    result = world.shim("create", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    paths = {d["path"] for d in bundle.config()["linux"]["devices"]}
    assert {"/dev/acc3", "/dev/nvidia1"} <= paths
    assert "/dev/nvidia0" not in paths, "the default prefix / env var must not apply when reconfigured"
    assert world.shim("delete", "--force", bundle.id).returncode == 0


def test_debug_phase_timings(world):
    """log-level = "debug" writes one line per phase with its duration to the log file; runc's
    --debug does the same into runc's --log."""
    own_log = os.path.join(world.base, "cdi-shim.log")
    world.write_config(log_level="debug", log_file=own_log)
    bundle = world.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=0"})
    result = world.shim("create", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    with open(own_log) as f:
        text = f.read()
    for phase in ("config", "requests", "resolve", "apply", "write", "exec"):
        assert any(phase in line and "ms" in line for line in text.splitlines()), f"no {phase} phase in:\n{text}"
    assert world.shim("delete", "--force", bundle.id).returncode == 0

    world.write_config()
    runc_log = os.path.join(world.base, "runc-debug.json")
    bundle = world.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=0"})
    result = world.shim("--debug", "--log", runc_log, "--log-format", "json", "create", "--bundle", bundle.path,
                        bundle.id)
    assert result.returncode == 0, result.stderr
    messages = [msg for level, msg in rh.read_log(runc_log, "json") if level == "debug"]
    for phase in ("config", "requests", "resolve", "apply", "write"):
        assert any(phase in m and "ms" in m for m in messages), f"no {phase} phase in {messages}"
    assert world.shim("delete", "--force", bundle.id).returncode == 0


@pytest.mark.parametrize("with_log", [False, True], ids=["no-log", "log"])
def test_debug_prints_phases_on_stderr(world, with_log):
    """--debug shows cdi-shim's phase lines on stderr (and in --log when one is given)."""
    bundle = world.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=0"})
    runc_log = os.path.join(world.base, "runc-debug.log")
    log_opts = ["--log", runc_log] if with_log else []
    result = world.shim("--debug", *log_opts, "create", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("cdi-shim: phase=")]
    for phase in ("config", "requests", "resolve", "apply", "linker", "write", "total"):
        assert any(line.startswith(f"cdi-shim: phase={phase} took=") for line in lines), result.stderr
    if with_log:
        messages = [msg for level, msg in rh.read_log(runc_log, "text")
                    if level == "debug" and msg.startswith("cdi-shim: phase=")]  # (runc's own follow)
        assert messages == lines
    assert world.shim("delete", "--force", bundle.id).returncode == 0
    # log-level = "debug" alone keeps them in the log files (a container's stderr may be where ours goes)
    world.write_config(log_level="debug")
    bundle = world.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=0"})
    result = world.shim("create", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0 and "phase=" not in result.stderr, result.stderr
    assert world.shim("delete", "--force", bundle.id).returncode == 0


@pytest.mark.parametrize("escape", ["slash", "unicode-key", "unicode-env"])
def test_json_escaped_requests_are_seen(world, escape):
    """A request spelled with JSON escapes is still a request (a fast "nothing requested" check
    on the raw bytes must not miss it)."""
    if escape == "unicode-env":
        bundle = world.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"])
        raw = bundle.original.replace(b'"NVIDIA_VISIBLE_DEVICES=0"', b'"NVIDIA_VISIBLE_DEVICES\\u003d0"')
    else:
        bundle = world.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=0"})
        new = b'"cdi.k8s.io\\/e2e"' if escape == "slash" else b'"\\u0063di.k8s.io/e2e"'
        raw = bundle.original.replace(b'"cdi.k8s.io/e2e"', new)
    assert raw != bundle.original
    with open(bundle.config_path, "wb") as f:
        f.write(raw)
    result = world.shim("create", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    assert any(d["path"] == "/dev/nvidia0" for d in bundle.config()["linux"].get("devices", [])), \
        f"escaped request ({escape}) was not injected"
    assert world.shim("delete", "--force", bundle.id).returncode == 0


def test_go_escaped_commands_without_a_request_pass_straight_to_runc(world):
    """containerd's Go encoder writes <, > and & as \\u escapes: a pod's `sh -c "a && b"` asks
    for nothing, and the front end hands it to runc without the Python side (no phase line)."""
    bundle = world.bundle(args=("sh", "-c", "test 1 -lt 2 && echo ran > /dev/null && echo 'a<b&c>d'"),
                          env=["URL=https://example.com/?a=1&b=2"])
    with open(bundle.config_path) as f:
        text = f.read()
    escaped = text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    assert escaped.count("\\u00") == 9
    with open(bundle.config_path, "w") as out:
        out.write(escaped)
    result = world.shim("--debug", "run", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0 and result.stdout.strip() == "a<b&c>d", (result.stdout, result.stderr)
    assert "phase=" not in result.stderr, result.stderr
    with open(bundle.config_path) as f:
        assert f.read() == escaped


def test_device_env_off(world):
    """device-env = "" turns env requests off: the variable is ignored, config.json untouched."""
    world.write_config(device_env="")
    bundle = world.bundle(args=("true",), env=["NVIDIA_VISIBLE_DEVICES=0"])
    before = os.stat(bundle.config_path)
    result = world.shim("create", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    assert bundle.unchanged() and os.stat(bundle.config_path).st_ino == before.st_ino
    assert world.shim("delete", "--force", bundle.id).returncode == 0


def test_mount_of_an_ordinary_directory_requests_nothing(world):
    """Issue 14, finding 2: with accept-env-unprivileged = false, a container without
    CAP_SYS_ADMIN got nvidia0, nvidia1 and nvidiactl from a bind mount of an ordinary directory
    (what an emptyDir volumeMount gives) onto /var/run/nvidia-container-devices/all. Only a
    /dev/null source (what the device plugin mounts) is a request, as in the toolkit; with
    volume-mount-requests = "off" not even that."""
    world.write_config(accept_env_unprivileged=False)
    empty_dir = os.path.join(world.base, "empty-dir")
    os.makedirs(empty_dir, exist_ok=True)
    hostile = world.bundle(mounts=[{"destination": f"{rh.DEVICE_MOUNT_ROOT}/all", "type": "bind",
                                    "source": empty_dir, "options": ["rbind", "rw"]}])
    result = world.shim("create", "--bundle", hostile.path, hostile.id)
    assert result.returncode == 0, result.stderr
    assert hostile.unchanged(), "a mount of an ordinary directory must request no device"
    assert world.shim("delete", "--force", hostile.id).returncode == 0

    plugin = world.bundle(mounts=[DEVICE_MOUNT])
    result = world.shim("create", "--bundle", plugin.path, plugin.id)
    assert result.returncode == 0, result.stderr
    assert any(d["path"] == "/dev/nvidia1" for d in plugin.config()["linux"]["devices"])
    assert world.shim("delete", "--force", plugin.id).returncode == 0

    world.write_config(accept_env_unprivileged=False, volume_mount_requests="off")
    off = world.bundle(mounts=[DEVICE_MOUNT])
    result = world.shim("create", "--bundle", off.path, off.id)
    assert result.returncode == 0, result.stderr
    assert off.unchanged(), 'volume-mount-requests = "off" must ignore the device-plugin mount'
    assert world.shim("delete", "--force", off.id).returncode == 0
