"""cdi-shim-runtime failure safety and hostile input, with real runc.

* Every failure on create (malformed request, unresolvable device, broken spec, missing host
  device, malformed config.toml, unusable config.json) exits non-zero, leaves config.json
  byte-identical, creates no container, and says why on stderr and in runc's --log file in the
  requested --log-format (json and text).
* Hostile config.json (symlink to a host file or to /dev/zero, FIFO, directory, not JSON, huge,
  wrong types): a clear error, nothing written anywhere, no hang.
* SIGKILL at random points of create never leaves a torn config.json.
* 20 containers created in parallel each get their own device.
"""
import concurrent.futures
import json
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import time
import warnings

import pytest

import runtime_helpers as rh

pytestmark = pytest.mark.runtime_e2e
RESIDENT_TOO = True  # every test also through `cdi-shim runtime serve` (conftest.py)

GPU0 = {"cdi.k8s.io/e2e": "nvidia.com/gpu=0"}


def _set(path, value):
    def edit(config):
        node = config
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return edit


def _huge(world):
    """Valid JSON over 64 MiB that requests a device."""
    config = json.loads(json.dumps(world._template))
    config["annotations"] = dict(GPU0)
    config["padding"] = "x" * ((64 << 20) + 4096)
    return json.dumps(config).encode()


# case -> setup(world) returning (bundle, extra global options, message fragments)
def case_malformed_annotation(w):
    return w.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu"}), [], ["nvidia.com/gpu"]


def case_malformed_annotation_name(w):
    return w.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=bad name!"}), [], ["bad name!"]


def case_malformed_env(w):
    return w.bundle(env=["NVIDIA_VISIBLE_DEVICES=0,bad name!"]), [], ["bad name!"]


def case_malformed_device_option(w):
    return w.bundle(), ["--device", "gpu0"], ["gpu0"]


def case_unresolvable(w):
    return w.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=7"}), [], [
        "unresolvable CDI devices nvidia.com/gpu=7", w.spec_dir, w.spec_dir_low]


def case_unresolvable_vendor(w):
    return w.bundle(annotations={"cdi.k8s.io/e2e": "example.com/nothing=a"}), [], [
        "unresolvable CDI devices example.com/nothing=a", w.spec_dir]


def case_broken_spec(w):
    path = w.write_spec("broken.yaml", 'cdiVersion: "0.5.0"\nkind: example.com/broken\ndevices:\n'
                        '  - name: "a"\n    containerEdits:\n      deviceNodes:\n        - hostPath: /dev/null\n')
    return w.bundle(annotations={"cdi.k8s.io/e2e": "example.com/broken=a"}), [], ["example.com/broken=a", path]


def case_broken_spec_syntax(w):
    path = w.write_spec("broken2.yaml", 'cdiVersion: "0.5.0"\nkind: example.com/broken2\ndevices: [\n')
    return w.bundle(annotations={"cdi.k8s.io/e2e": "example.com/broken2=a"}), [], ["example.com/broken2=a", path]


def case_host_device_missing(w):
    missing = os.path.join(w.dev_dir, "nvidia9-missing")
    w.write_spec("missing.yaml", 'cdiVersion: "0.5.0"\nkind: example.com/missing\ndevices:\n'
                 f'  - name: "a"\n    containerEdits:\n      deviceNodes:\n'
                 f'        - path: /dev/nvidia9\n          hostPath: {missing}\n')
    return w.bundle(annotations={"cdi.k8s.io/e2e": "example.com/missing=a"}), [], [missing]


def case_device_env_too_long(w):
    # issue 14, finding 1: bounded, with an error naming the variable
    return w.bundle(env=["NVIDIA_VISIBLE_DEVICES=" + ",".join(["0"] * 40000)]), [], [
        "NVIDIA_VISIBLE_DEVICES: its value is 79999 characters long; at most 65536 are accepted"]


def case_relative_hook_path_diverges_from_cncf_library(w):
    # issue 14, finding 4: runc runs createContainer hooks with the rootfs as cwd; the CNCF
    # library accepts a relative path, we refuse it (naming spec, device and hook)
    path = w.write_spec("relhook.yaml", 'cdiVersion: "0.5.0"\nkind: example.com/relhook\ndevices:\n'
                        '  - name: "a"\n    containerEdits:\n      env: ["A=1"]\n      hooks:\n'
                        '        - {hookName: createContainer, path: bin/hookrel}\n')
    return w.bundle(annotations={"cdi.k8s.io/e2e": "example.com/relhook=a"}), [], [
        "example.com/relhook=a", path, 'device "a"', 'hook "createContainer": path "bin/hookrel" is not absolute']


def case_env_names_another_vendors_device(w):
    # issue 14, finding 12a: env requests may name only default-kind's vendor's devices
    w.write_spec("secret.yaml", 'cdiVersion: "0.5.0"\nkind: example.com/secret\ndevices:\n'
                 f'  - name: "key"\n    containerEdits:\n      deviceNodes:\n'
                 f'        - path: /dev/secret\n          hostPath: {w.node(1)}\n')
    return w.bundle(env=["NVIDIA_VISIBLE_DEVICES=example.com/secret=key"]), [], [
        "NVIDIA_VISIBLE_DEVICES names example.com/secret=key", "only devices of nvidia.com"]


def case_malformed_config_toml(w):
    with open(w.config_toml, "w") as f:
        f.write('spec-dirs = ["/etc/cdi"\nruntime = \n')
    return w.bundle(annotations=GPU0), [], [w.config_toml]


def case_config_toml_wrong_type(w):
    with open(w.config_toml, "w") as f:
        f.write('spec-dirs = "/etc/cdi"\n')
    return w.bundle(annotations=GPU0), [], [w.config_toml, "spec-dirs"]


def case_config_toml_unknown_key(w):
    with open(w.config_toml, "w") as f:
        f.write('spec-dir = ["/etc/cdi"]\n')
    return w.bundle(annotations=GPU0), [], [w.config_toml, "spec-dir"]


def case_config_toml_is_directory(w):
    os.unlink(w.config_toml)
    os.mkdir(w.config_toml)
    return w.bundle(annotations=GPU0), [], [w.config_toml]


def case_config_json_not_json(w):
    raw = b'{"ociVersion": "1.0.2", "annotations": {"cdi.k8s.io/e2e": "nvidia.com/gpu=0"}, "process": '
    return w.bundle(raw=raw), [], ["config.json"]


def case_config_json_not_object(w):
    return w.bundle(raw=b'["cdi.k8s.io/e2e", "nvidia.com/gpu=0"]\n'), [], ["config.json"]


def case_config_json_huge(w):
    return w.bundle(raw=_huge(w)), [], ["config.json"]


def case_config_json_deeply_nested(w):
    # Go's encoding/json (runc) stops at depth 10000; a request-bearing document this deep must
    # get a clear error, not a crash of the parser.
    raw = (b'{"annotations": {"cdi.k8s.io/e2e": "nvidia.com/gpu=0"}, "x": ' + b"[" * 200000 + b"]" * 200000 + b"}")
    return w.bundle(raw=raw), [], ["config.json"]


def case_env_is_string(w):
    return w.bundle(annotations=GPU0, edit=_set(["process", "env"], "NVIDIA_VISIBLE_DEVICES=0")), [], ["env"]


def case_annotations_is_list(w):
    return w.bundle(edit=_set(["annotations"], ["cdi.k8s.io/e2e=nvidia.com/gpu=0"])), [], ["annotations"]


def case_mounts_is_object(w):
    return w.bundle(annotations=GPU0, edit=_set(["mounts"], {"destination": "/x"})), [], ["mounts"]


def case_linux_devices_is_string(w):
    return w.bundle(annotations=GPU0, edit=_set(["linux", "devices"], "/dev/nvidia0")), [], ["devices"]


def case_process_is_list(w):
    return w.bundle(annotations=GPU0, edit=_set(["process"], ["NVIDIA_VISIBLE_DEVICES=0"])), [], ["process"]


FAILURES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}


def check_failure(world, bundle, result, log_path, log_format, fragments, what):
    assert result.returncode != 0, f"{what}: exit 0\nstderr: {result.stderr}"
    assert bundle.unchanged(), f"{what}: config.json changed"
    assert bundle.extra_files() == [], f"{what}: left {bundle.extra_files()} in the bundle"
    assert world.state(bundle.id) is None, f"{what}: a container was created"
    assert "Traceback" not in result.stderr, f"{what}: crashed instead of a clear error:\n{result.stderr}"
    for fragment in fragments:
        assert fragment in result.stderr, f"{what}: {fragment!r} not on stderr:\n{result.stderr}"
    records = rh.read_log(log_path, log_format)
    errors = [msg for level, msg in records if level in ("error", "fatal")]
    assert errors, f"{what}: no error in the runc {log_format} log {log_path}: {records}"
    for fragment in fragments:
        assert any(fragment in msg for msg in errors), \
            f"{what}: {fragment!r} not in the {log_format} log's errors: {errors}"


@pytest.mark.parametrize("log_format", ["json", "text"])
@pytest.mark.parametrize("case", list(FAILURES))
def test_failure_leaves_config_and_reports(world, case, log_format):
    bundle, opts, fragments = FAILURES[case](world)
    log_path = os.path.join(world.base, f"runc-log.{log_format}")
    with open(log_path, "w") as f:  # runc's log usually exists already: we must append
        f.write(rh.format_runc_line("info", "earlier line", log_format))
    result = world.shim("--log", log_path, "--log-format", log_format, *opts, "create", "--bundle",
                        bundle.path, bundle.id)
    check_failure(world, bundle, result, log_path, log_format, fragments, case)
    assert rh.read_log(log_path, log_format)[0] == ("info", "earlier line"), "the runc log was not appended to"


def test_unresolvable_names_existing_devices(world):
    """The unresolvable message starts with the names, lists (a few of) the existing devices of the
    kind and the searched spec dirs."""
    bundle = world.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=7"})
    result = world.shim("create", "--bundle", bundle.path, bundle.id)
    assert result.returncode != 0
    line = next(text for text in result.stderr.splitlines() if "unresolvable" in text)
    reason = line[line.index("unresolvable"):]
    assert reason.startswith("unresolvable CDI devices nvidia.com/gpu=7"), line
    rest = reason[len("unresolvable CDI devices nvidia.com/gpu=7"):]
    assert re.search(r'\ball\b', rest) and re.search(r'\b0\b', rest), f"existing devices not named: {line}"
    assert world.spec_dir in rest and world.spec_dir_low in rest, line
    assert bundle.unchanged()


def test_failure_on_run_command(world):
    bundle = world.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=7"})
    log_path = os.path.join(world.base, "runc-log.json")
    result = world.shim("--log", log_path, "--log-format", "json", "run", "--bundle", bundle.path, bundle.id)
    check_failure(world, bundle, result, log_path, "json", ["unresolvable CDI devices nvidia.com/gpu=7"], "run")


def test_failure_without_log_option(world):
    """No --log: the reason still reaches stderr, and nothing is written next to the bundle."""
    bundle = world.bundle(annotations={"cdi.k8s.io/e2e": "nvidia.com/gpu=7"})
    result = world.shim("create", "--bundle", bundle.path, bundle.id, cwd=world.base)
    assert result.returncode != 0 and "unresolvable CDI devices nvidia.com/gpu=7" in result.stderr
    assert bundle.unchanged() and bundle.extra_files() == []


def test_bundle_defaults_to_cwd(world):
    """Without --bundle the bundle is the current directory (as runc)."""
    bundle = world.bundle(annotations=GPU0)
    result = world.shim("create", bundle.id, cwd=bundle.path)
    assert result.returncode == 0, result.stderr
    assert any(d["path"] == "/dev/nvidia0" for d in bundle.config()["linux"]["devices"])
    assert world.state(bundle.id)["status"] == "created"
    assert world.shim("delete", "--force", bundle.id).returncode == 0


# --- hostile config.json ----------------------------------------------------------------------

def _replace_config(bundle, make):
    os.unlink(bundle.config_path)
    make(bundle.config_path)


@pytest.mark.parametrize("kind", ["symlink-to-host-file", "symlink-to-dev-zero", "fifo", "directory",
                                  "dangling-symlink"])
def test_hostile_config_json_object(world, kind):
    host_file = os.path.join(world.base, "host-config.json")
    bundle = world.bundle(annotations=GPU0)
    with open(host_file, "wb") as f:
        f.write(bundle.original)
    host_before = os.stat(host_file)
    makers = {
        "symlink-to-host-file": lambda p: os.symlink(host_file, p),
        "symlink-to-dev-zero": lambda p: os.symlink("/dev/zero", p),
        "dangling-symlink": lambda p: os.symlink(os.path.join(world.base, "nowhere.json"), p),
        "fifo": lambda p: os.mkfifo(p, 0o644),
        "directory": lambda p: os.mkdir(p),
    }
    _replace_config(bundle, makers[kind])
    before = os.lstat(bundle.config_path)
    log_path = os.path.join(world.base, "runc-log.json")
    started = time.monotonic()
    try:
        result = world.shim("--log", log_path, "--log-format", "json", "create", "--bundle", bundle.path,
                            bundle.id, timeout=20)
    except subprocess.TimeoutExpired:
        if kind == "fifo":  # unblock whatever waits on it
            fd = os.open(bundle.config_path, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        pytest.fail(f"cdi-shim-runtime hung on a config.json that is a {kind}")
    took = time.monotonic() - started
    assert result.returncode != 0, f"{kind}: exit 0"
    assert "config.json" in result.stderr, f"{kind}: no clear error on stderr: {result.stderr!r}"
    errors = [msg for level, msg in rh.read_log(log_path, "json") if level == "error"]
    assert any("config.json" in msg for msg in errors), errors
    after = os.lstat(bundle.config_path)
    assert (after.st_mode, after.st_ino, after.st_mtime_ns) == (before.st_mode, before.st_ino, before.st_mtime_ns), \
        f"{kind}: config.json was replaced"
    host_after = os.stat(host_file)
    assert (host_after.st_ino, host_after.st_mtime_ns) == (host_before.st_ino, host_before.st_mtime_ns)
    with open(host_file, "rb") as f:
        assert f.read() == bundle.original, "the host file behind the symlink was written"
    assert sorted(set(os.listdir(bundle.path)) - {"config.json", "rootfs"}) == []
    assert world.state(bundle.id) is None
    assert took < 15


@pytest.mark.parametrize("raw", [b"", b"\x00\xff garbage", b"null", b"{" * 100000 + b"}" * 100000],
                         ids=["empty", "binary", "null", "deep-nesting"])
def test_hostile_config_json_no_request_text(world, raw):
    """Garbage that cannot be asking for a device: either we reject it (our message on stderr and
    in the runc log) or we pass it through and runc rejects it exactly as it does without us.
    Either way the create fails and config.json stays as it was."""
    bundle = world.bundle(raw=raw)
    log_path = os.path.join(world.base, "runc-log.json")
    result = world.shim("--log", log_path, "--log-format", "json", "create", "--bundle", bundle.path, bundle.id)
    assert result.returncode != 0
    assert bundle.unchanged() and bundle.extra_files() == []
    assert "Traceback" not in result.stderr, result.stderr
    assert world.state(bundle.id) is None
    if "cdi-shim" in result.stderr:
        errors = [msg for level, msg in rh.read_log(log_path, "json") if level == "error"]
        assert any("config.json" in msg for msg in errors), errors
    else:  # passed through: runc's own verdict
        plain = world.bundle(raw=raw)
        direct = world.runc_cmd("create", "--bundle", plain.path, plain.id)
        assert result.returncode == direct.returncode, (result.stderr, direct.stderr)
        assert world.state(plain.id) is None


# --- SIGKILL during create ------------------------------------------------------------------

SLOW_SPECS = 300


def _write_slow_specs(world):
    for index in range(SLOW_SPECS):
        devices = "".join(f'  - name: "d{d}"\n    containerEdits:\n      env: ["SLOW_{index}_{d}=1"]\n'
                          for d in range(8))
        world.write_spec(f"slow-{index:04d}.yaml", f'cdiVersion: "0.5.0"\nkind: slow{index}.example.com/dev\n'
                         f"devices:\n{devices}", directory=world.spec_dir_low)


def _restore(bundle):
    tmp = bundle.config_path + ".restore"
    with open(tmp, "wb") as f:
        f.write(bundle.original)
    os.chmod(tmp, 0o644)
    os.rename(tmp, bundle.config_path)


def test_sigkill_during_create_never_tears_config(world):
    _write_slow_specs(world)
    fake_runc = shutil.which("true") or "/bin/true"
    world.write_config(runtime=fake_runc)
    bundle = world.bundle(annotations=GPU0)
    original = json.loads(bundle.original)

    def start(cache):
        return subprocess.Popen([world.runtime, "--root", world.runc_root, "create", "--bundle", bundle.path,
                                 bundle.id], env=world.env(CDI_SHIM_CACHE_DIR=cache),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    # How long does an uncached create take here?
    durations = []
    for attempt in range(2):
        began = time.monotonic()
        proc = start(os.path.join(world.base, f"cache-probe-{attempt}"))
        _, err = proc.communicate(timeout=120)
        durations.append(time.monotonic() - began)
        assert proc.returncode == 0, err.decode()
        assert any(d["path"] == "/dev/nvidia0" for d in bundle.config()["linux"]["devices"])
        _restore(bundle)
    full = max(durations)

    rng = random.Random(int(os.environ.get("CDI_SHIM_E2E_SEED", "1234")))
    outcomes = {"original": 0, "injected": 0}
    killed = 0
    temp_leftovers, other_leftovers = [], []
    cache = None
    # 30 runs, and more (up to 90) until 10 of them were killed mid-create: how many kills land
    # before the create ends depends on how this machine's timing varies from the probe's.
    runs = 0
    for iteration in range(90):
        if iteration >= 30 and killed >= 10:
            break
        runs += 1
        if cache is None or iteration % 3 != 2:   # every third run reuses the cache a kill may have torn
            cache = os.path.join(world.base, f"cache-{iteration}")
        # Through a resident process, the front end injects a request a worker recorded (a few
        # ms): every fourth run keeps the recipes and is killed within that; the others go
        # without, to the worker, whose create the probe timed. Without it the interpreter keeps
        # recipes too (beside the configured socket): each run goes without, as the probe's did.
        resident = os.path.exists(world.resident_socket)
        fast = resident and iteration % 4 == 3
        if not fast:
            shutil.rmtree(os.path.join(os.path.dirname(world.resident_socket), "steps"), ignore_errors=True)
        proc = start(cache)
        # half the kills anywhere, half in the last stretch where the write and rename happen
        low = 0.0 if iteration % 2 else 0.6 * full
        time.sleep(rng.uniform(0, 0.004) if fast else rng.uniform(low, full * 1.05))
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        if resident:
            # A resident worker that had the create's permit finishes it after its caller died
            # (resident.py: the claim): what it leaves is judged once it is done.
            time.sleep(full)
        if proc.returncode == -signal.SIGKILL:
            killed += 1
        else:
            assert proc.returncode == 0, f"iteration {iteration}: exit {proc.returncode}: {err.decode()}"
        data = bundle.read_bytes()
        if data == bundle.original:
            outcomes["original"] += 1
        else:
            try:
                config = json.loads(data)
            except ValueError:
                pytest.fail(f"iteration {iteration}: torn config.json after SIGKILL ({len(data)} bytes)")
            assert any(d.get("path") == "/dev/nvidia0" for d in config["linux"].get("devices", [])), \
                f"iteration {iteration}: config.json changed but has no device"
            assert config["process"]["args"] == original["process"]["args"]
            outcomes["injected"] += 1
        for name in bundle.extra_files():
            (temp_leftovers if re.fullmatch(r"\.config\.json\.cdi-shim\.\d+", name) else other_leftovers).append(name)
            os.unlink(os.path.join(bundle.path, name))
        _restore(bundle)
    assert other_leftovers == [], f"unexpected files left in the bundle: {other_leftovers}"
    assert killed >= 10, f"only {killed} of {runs} runs were killed mid-create (full create {full:.3f}s)"
    if temp_leftovers:
        warnings.warn(f"SIGKILL left {len(temp_leftovers)} temp files in the bundle (removed by the test): "
                      f"{temp_leftovers}")

    # Afterwards a real create through the (possibly torn) cache still works.
    world.write_config()
    result = world.shim("create", "--bundle", bundle.path, bundle.id, env=world.env(CDI_SHIM_CACHE_DIR=cache))
    assert result.returncode == 0, result.stderr
    assert any(d["path"] == "/dev/nvidia0" for d in bundle.config()["linux"]["devices"])
    assert world.state(bundle.id)["status"] == "created"
    assert world.shim("delete", "--force", bundle.id).returncode == 0
    print(f"sigkill loop: full create {full:.3f}s, killed {killed}/{runs}, outcomes {outcomes}, "
          f"temp leftovers {temp_leftovers}")


def test_stale_temp_file_does_not_block_create(world):
    """A `.config.json.cdi-shim.<pid>` left by a killed run (any pid, even a live one's) must not
    make a later create fail, and must not be used as config.json."""
    bundle = world.bundle(annotations=GPU0)
    reaped = subprocess.Popen(["true"])
    reaped.wait()
    dead_pid = reaped.pid
    for pid in (os.getpid(), 1, dead_pid):
        with open(os.path.join(bundle.path, f".config.json.cdi-shim.{pid}"), "w") as f:
            f.write('{"torn": ')
    result = world.shim("create", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    config = bundle.config()
    assert any(d["path"] == "/dev/nvidia0" for d in config["linux"]["devices"])
    assert world.shim("delete", "--force", bundle.id).returncode == 0
    # A live pid's file may be another create's work in progress and must stay; a dead pid's
    # file is garbage that a later create may remove.
    left = set(bundle.extra_files())
    assert {f".config.json.cdi-shim.{os.getpid()}", ".config.json.cdi-shim.1"} <= left, \
        f"a live process's temp file was removed: {left}"
    if f".config.json.cdi-shim.{dead_pid}" in left:
        warnings.warn(f"the temp file of a dead pid ({dead_pid}) is not cleaned up by a later create")


# --- parallel creates ---------------------------------------------------------------------------

PARALLEL = 20


def test_parallel_creates_get_their_own_devices(world):
    nodes = []
    for index in range(PARALLEL):
        node = os.path.join(world.dev_dir, f"par{index}")
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(195, 100 + index))
        nodes.append(node)
    devices = "".join(f'  - name: "p{i}"\n    containerEdits:\n      env: ["PAR_DEVICE=p{i}"]\n'
                      f"      deviceNodes:\n        - path: /dev/par{i}\n          hostPath: {nodes[i]}\n"
                      for i in range(PARALLEL))
    world.write_spec("par.yaml", f'cdiVersion: "0.5.0"\nkind: example.com/par\ndevices:\n{devices}')
    script = "ls -l /dev/par* 2>/dev/null; echo PAR_DEVICE=$PAR_DEVICE"
    bundles, opts = [], []
    for index in range(PARALLEL):
        if index % 2:
            bundles.append(world.bundle(args=("sh", "-c", script),
                                        annotations={"cdi.k8s.io/p": f"example.com/par=p{index}"}))
            opts.append([])
        else:
            bundles.append(world.bundle(args=("sh", "-c", script)))
            opts.append(["--device", f"example.com/par=p{index}"])
    outputs = [os.path.join(world.base, f"par-out-{i}.txt") for i in range(PARALLEL)]

    def create(index):
        with open(outputs[index], "wb") as out:
            return world.shim(*opts[index], "create", "--bundle", bundles[index].path, bundles[index].id,
                              stdout=out)

    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(create, range(PARALLEL)))
    for index, result in enumerate(results):
        assert result.returncode == 0, f"create {index}: {result.stderr}"
    for bundle in bundles:
        assert world.shim("start", bundle.id).returncode == 0
    for index, bundle in enumerate(bundles):
        world.wait_stopped(bundle.id)
        assert world.shim("delete", bundle.id).returncode == 0
        with open(outputs[index]) as f:
            text = f.read()
        report = rh.parse_report("== dev\n" + text)
        assert report["dev"] == {f"/dev/par{index}": ("c", 195, 100 + index)}, (index, text)
        assert f"PAR_DEVICE=p{index}" in text
        config = bundle.config()
        paths = [d["path"] for d in config["linux"]["devices"]]
        assert [path for path in paths if path.startswith("/dev/par")] == [f"/dev/par{index}"]


# --- issue 14, finding 10: JSON edge cases go back to runc as they came ------------------------

def test_unusual_json_values_reach_runc_unchanged(world):
    """A lone surrogate in an env entry gave a traceback; an unknown field 1e400 was written back
    as Infinity (which runc refuses, though it accepted the original). Both, and other numbers
    Python would change (a 5000-digit integer, 1E+2, -0.0, 1.10), go back exactly as given."""
    fields = {"x-huge": "1e400", "x-digits": "1" * 5000, "x-exp": "1E+2", "x-negzero": "-0.0", "x-tenths": "1.10"}
    marker = '"@SURROGATE@"'
    config = json.loads(json.dumps(world._template))
    config["annotations"] = dict(GPU0)
    config["process"]["args"] = ["sh", "-c", "true"]
    config["process"]["terminal"] = False
    config["process"]["env"] = ["PATH=/bin", "X=@SURROGATE@"]
    config["root"] = {"path": "rootfs"}
    for name in fields:
        config[name] = f"@{name}@"
    text = json.dumps(config).replace('"X=@SURROGATE@"', r'"X=\ud800"')
    for name, number in fields.items():
        text = text.replace(f'"@{name}@"', number)
    assert marker not in text
    runc_alone = world.bundle(raw=text.encode())
    assert world.runc_cmd("create", "--bundle", runc_alone.path, runc_alone.id).returncode == 0, \
        "runc itself must accept this config"
    assert world.runc_cmd("delete", "--force", runc_alone.id).returncode == 0

    bundle = world.bundle(raw=text.encode())
    result = world.shim("create", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    written = bundle.read_bytes()
    for name, number in fields.items():
        assert f'"{name}":{number}'.encode() in written, name
    assert rb'"X=\ud800"' in written
    from shim import fastjson  # json.loads refuses 5000 digits

    assert any(d["path"] == "/dev/nvidia0" for d in fastjson.loads(written)["linux"]["devices"])
    assert world.shim("delete", "--force", bundle.id).returncode == 0


def test_lone_surrogate_in_the_device_env_is_a_clear_error(world):
    config = json.loads(json.dumps(world._template))
    config["process"]["terminal"] = False
    config["process"]["env"] = ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=@"]
    config["root"] = {"path": "rootfs"}
    raw = json.dumps(config).replace("NVIDIA_VISIBLE_DEVICES=@", r"NVIDIA_VISIBLE_DEVICES=\ud800")
    bundle = world.bundle(raw=raw.encode())
    log_path = os.path.join(world.base, "runc-log.json")
    result = world.shim("--log", log_path, "--log-format", "json", "create", "--bundle", bundle.path, bundle.id)
    check_failure(world, bundle, result, log_path, "json", ["malformed CDI device request"], "lone surrogate")


# --- issue 14, finding 11: the registry cache directory must be ours ---------------------------

def test_cache_dir_another_user_can_redirect_is_not_written(world):
    """A user owning the directory above the registry cache (/run/cdi-shim) could point cache/
    elsewhere; root then wrote there. The server's rule now holds here too: the create works,
    says why the cache is not used, and writes nothing where the link leads."""
    run_dir = os.path.join(world.base, "run-cdi-shim")
    elsewhere = os.path.join(world.base, "root-only")
    os.makedirs(run_dir)
    os.makedirs(elsewhere, mode=0o700)
    os.chown(run_dir, 65534, 65534)
    os.symlink(elsewhere, os.path.join(run_dir, "cache"))
    bundle = world.bundle(annotations=GPU0)
    result = world.shim("create", "--bundle", bundle.path, bundle.id,
                        env=world.env(CDI_SHIM_CACHE_DIR=os.path.join(run_dir, "cache")))
    assert result.returncode == 0, result.stderr
    assert any(d["path"] == "/dev/nvidia0" for d in bundle.config()["linux"]["devices"])
    assert os.listdir(elsewhere) == [], "root wrote where another user's link pointed"
    if world.resident_socket.endswith("no-resident.sock"):  # a resident worker has its own cache dir
        assert "registry cache directory" in result.stderr and run_dir in result.stderr, result.stderr
    assert world.shim("delete", "--force", bundle.id).returncode == 0
