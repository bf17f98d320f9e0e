"""`cdi-shim cdi generate` (issue 12) against a fake driver of real parts: gcc-built libraries
with real SONAMEs, the driver root's own ld.so.cache from the real `ldconfig -r`, mknod'ed
device nodes, and a fake libnvidia-ml.so.1 in C loaded by the real pynvml."""
import json
import os
import stat
import subprocess

import pytest
import yaml

import fakedriver
from fakedriver import LIBDIR

from shim.driver_version import recorded_driver_version

VERSION = fakedriver.VERSION
OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]


def load(path):
    with open(path) as stream:
        return yaml.safe_load(stream)


def mounts_by_path(doc):
    return {m["containerPath"]: m for m in doc["containerEdits"]["mounts"]}


def edits_hook_path(doc):
    return doc["containerEdits"]["hooks"][0]["path"]


def hook_args(doc, command):
    found = [h for h in doc["containerEdits"]["hooks"] if h["args"][1:2] == [command]]
    assert len(found) == 1, doc["containerEdits"]["hooks"]
    return found[0]["args"]


@pytest.mark.parametrize("count", [1, 8])
def test_spec_for_the_gpus_validates_and_lists_them(run, count):
    run.gpus(count)
    done = run.generate()
    assert f"wrote {run.output}: {2 * count + 1} devices ({count} GPU(s), driver {VERSION}), cdiVersion 0.5.0" \
        in done.stderr
    assert "warning" not in done.stderr, done.stderr
    assert stat.S_IMODE(os.stat(run.output).st_mode) == 0o644
    assert run.cli("cdi", "validate", "--spec-dir", os.path.dirname(run.output), run.output, check=0)

    listed = run.cli("cdi", "list", "--spec-dir", os.path.dirname(run.output), check=0).stdout.split()
    uuids = run.driver.uuids(count)
    expected = [f"nvidia.com/gpu={i}" for i in range(count)] + [f"nvidia.com/gpu={u}" for u in uuids] \
        + ["nvidia.com/gpu=all"]
    assert sorted(listed) == sorted(expected)

    doc = load(run.output)
    assert doc["cdiVersion"] == "0.5.0" and doc["kind"] == "nvidia.com/gpu"
    devices = {d["name"]: d["containerEdits"] for d in doc["devices"]}
    dev = run.driver.dev_root + "/dev"
    every = []
    for index, uuid in enumerate(uuids):
        # the GPU's node and its DRM nodes (found through /sys/bus/pci/devices/<bus id>/drm),
        # and the udev links /dev/dri/by-path/pci-<bus id>-{card,render} to them, made by a
        # create-symlinks hook of the device (the toolkit's dgpu discoverer): our C hook program
        card, render = fakedriver.drm_names(index)
        paths = [f"/dev/nvidia{index}", f"/dev/dri/{card}", f"/dev/dri/{render}"]
        bus = fakedriver.bus_id(index)
        expected = {"deviceNodes": [{"path": p, "hostPath": dev + p[4:]} for p in paths],
                    "hooks": [{"hookName": "createContainer",
                               "path": os.path.join(os.path.dirname(edits_hook_path(doc)), "cdi-shim-nshook"),
                               "args": ["cdi-shim-nshook", "symlinks",
                                        "--link", f"../{card}::/dev/dri/by-path/pci-{bus}-card",
                                        "--link", f"../{render}::/dev/dri/by-path/pci-{bus}-render"]}]}
        assert devices[str(index)] == expected      # world-accessible nodes (0666): no additionalGids
        assert devices[uuid] == expected
        every.append(expected)
    assert devices["all"] == {"deviceNodes": [n for e in every for n in e["deviceNodes"]],
                              "hooks": [{**every[0]["hooks"][0], "args": every[0]["hooks"][0]["args"][:2] + [
                                  arg for e in every for arg in e["hooks"][0]["args"][2:]]}]}

    edits = doc["containerEdits"]
    assert edits["env"] == [f"NVIDIA_CTK_LIBCUDA_DIR={LIBDIR}", "NVIDIA_VISIBLE_DEVICES=void"]
    assert edits["deviceNodes"] == [
        {"path": p, "hostPath": dev + p[4:]}
        for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")]
    mounts = mounts_by_path(doc)
    root = run.driver.root
    for library in run.driver.libraries:      # every lib*.so.<version> of the driver, vdpau's too
        assert mounts[library] == {"hostPath": root + library, "containerPath": library, "options": OPTIONS}
    libraries = [p for p in mounts if ".so." in p]
    assert sorted(libraries) == sorted(run.driver.libraries + [p for p in run.driver.graphics if ".so." in p])
    for binary in fakedriver.BINARIES:
        assert mounts[f"/usr/bin/{binary}"]["options"] == OPTIONS
    for firmware in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        assert f"/lib/firmware/nvidia/{VERSION}/{firmware}" in mounts
    assert mounts["/run/nvidia-persistenced/socket"]["options"] == ["nosuid", "nodev", "rbind", "rprivate", "noexec"]
    assert mounts["/etc/vulkan/icd.d/nvidia_icd.json"]["hostPath"] == root + "/usr/share/vulkan/icd.d/nvidia_icd.json"

    # the hook by the node prefix's stable path, not the release's (nor a venv's)
    assert all(h["path"].endswith("/opt/cdi-shim/current/bin/cdi-shim-hook") and os.access(h["path"], os.X_OK)
               and h["hookName"] ==
               "createContainer" and "env" not in h for h in edits["hooks"]), edits["hooks"]
    assert hook_args(doc, "update-ldcache") == ["cdi-shim-hook", "update-ldcache", "--folder", LIBDIR,
                                                "--folder", LIBDIR + "/vdpau"]
    links = hook_args(doc, "create-symlinks")[2:]
    assert links[0::2] == ["--link"] * (len(links) // 2)
    for link in (f"libcuda.so.1::{LIBDIR}/libcuda.so", f"libcuda.so.{VERSION}::{LIBDIR}/libcuda.so.1",
                 f"libGLX_nvidia.so.{VERSION}::{LIBDIR}/libGLX_indirect.so.0",
                 f"libnvidia-opticalflow.so.1::{LIBDIR}/libnvidia-opticalflow.so",
                 f"libvdpau_nvidia.so.{VERSION}::{LIBDIR}/vdpau/libvdpau_nvidia.so.1"):
        assert link in links[1::2]
    # A library whose SONAME is its file name gets no link.
    assert not any(link.startswith(f"libnvidia-glcore.so.{VERSION}::") for link in links[1::2])
    assert recorded_driver_version(doc) == VERSION
    assert run.calls().count("nvmlDeviceGetUUID") == count


def test_nvml_calls_are_those_of_the_toolkit_through_pynvml(run):
    run.generate()
    calls = run.calls()
    assert calls[0] == "nvmlInitWithFlags" and calls[-1] == "nvmlShutdown"    # pynvml's nvmlInit
    for call in ("nvmlSystemGetDriverVersion", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
                 "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetPciInfo_v3",
                 "nvmlDeviceGetMigMode"):
        assert call in calls


def test_zero_gpus_is_an_error_and_leaves_the_old_spec(run):
    os.makedirs(os.path.dirname(run.output))
    with open(run.output, "w") as out:
        out.write("old spec\n")
    run.gpus(0)
    done = run.generate(check=1)
    assert "reports no GPU on this node (driver 580.65.06)" in done.stderr and "nothing written" in done.stderr
    with open(run.output) as stream:
        assert stream.read() == "old spec\n"
    assert os.listdir(os.path.dirname(run.output)) == ["nvidia.yaml"]


def test_nvml_init_failure_carries_nvml_text(run):
    run.gpus(lines=[f"driver {VERSION}", "init-error 9"] + fakedriver.gpu_lines(1))
    done = run.generate(check=1)
    assert "NVML could not be initialised" in done.stderr
    assert "Driver Not Loaded" in done.stderr               # the fake library's nvmlErrorString
    assert "/proc/driver/nvidia/version" in done.stderr
    assert not os.path.exists(run.output)
    assert "nvmlShutdown" not in run.calls()


@pytest.mark.parametrize("function", ["nvmlDeviceGetUUID", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetPciInfo_v3"])
def test_a_device_that_errors_names_the_gpu_and_the_call(run, function):
    lines = fakedriver.gpu_lines(3)
    lines[1] += f" fail={function}:15"
    run.gpus(lines=[f"driver {VERSION}"] + lines)
    done = run.generate(check=1)
    assert "GPU 1" in done.stderr and f"{function}: GPU is lost" in done.stderr, done.stderr
    assert not os.path.exists(run.output)
    assert run.calls()[-1] == "nvmlShutdown"


def test_count_error(run):
    run.gpus(lines=[f"driver {VERSION}", "count-error 999"])
    done = run.generate(check=1)
    assert "Error: nvmlDeviceGetCount_v2: Unknown Error" in done.stderr


MIG_MINORS = ["config 1", "monitor 2", "gpu0/gi1/access 12", "gpu0/gi1/ci0/access 13", "gpu0/gi3/access 30",
              "gpu0/gi3/ci0/access 31", "gpu0/gi4/access 39", "gpu0/gi4/ci0/access 40"]


def _mig_setup(run, tmp_path, minors=MIG_MINORS, slots="0,2,3"):
    proc = tmp_path / "proc"
    (proc / "driver" / "nvidia-caps").mkdir(parents=True)
    fakedriver.write_proc_devices(str(proc))
    if minors is not None:
        (proc / "driver" / "nvidia-caps" / "mig-minors").write_text("\n".join(minors) + "\n")
    caps = os.path.join(run.driver.dev_root, "dev", "nvidia-caps")
    os.makedirs(caps, exist_ok=True)
    for minor in (12, 13, 30, 31, 39, 40):
        path = os.path.join(caps, f"nvidia-cap{minor}")
        if not os.path.exists(path):
            os.mknod(path, 0o444 | stat.S_IFCHR, os.makedev(fakedriver.CAPS_MAJOR, minor))
    lines = fakedriver.gpu_lines(2)
    lines[0] += f" mig=1 migs={slots}"
    lines[1] += " mig=na"
    run.gpus(lines=[f"driver {VERSION}"] + lines)
    return str(proc)


def test_mig_devices(run, tmp_path):
    """A GPU in MIG mode: a device per MIG device (slot index and MIG UUID), with the GPU's node
    and its GI and CI capability nodes; no device for the whole GPU; "all" has each node once."""
    proc = _mig_setup(run, tmp_path)
    done = run.generate("--proc-root", proc)
    assert "warning" not in done.stderr, done.stderr
    doc = load(run.output)
    devices = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in doc["devices"]}
    mig = "MIG-00000000-0000-4000-8000-{:012x}"
    assert list(devices) == ["0:0", mig.format(0), "0:2", mig.format(2), "0:3", mig.format(3), "1",
                             run.driver.uuids(2)[1], "all"]
    assert devices["0:0"] == devices[mig.format(0)] == ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12",
                                                        "/dev/nvidia-caps/nvidia-cap13"]
    assert devices["0:2"] == ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"]
    assert devices["all"] == ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13",
                              "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31",
                              "/dev/nvidia-caps/nvidia-cap39", "/dev/nvidia-caps/nvidia-cap40", "/dev/nvidia1",
                              "/dev/dri/card2", "/dev/dri/renderD129"]   # GPU 1's DRM nodes; MIG devices get none
    run.cli("cdi", "validate", run.output, check=0)
    calls = run.calls()
    assert calls.count("nvmlDeviceGetMigDeviceHandleByIndex") == 7        # every slot, empty ones skipped
    for call in ("nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId"):
        assert call in calls


def test_mig_without_its_minors_file_or_node_is_an_error(run, tmp_path):
    proc = _mig_setup(run, tmp_path, minors=None)
    done = run.generate("--proc-root", proc, check=1)
    assert "GPU 0 (GPU-00000000-1111-2222-3333-000000000000) " \
           "MIG device 0 (MIG-00000000-0000-4000-8000-000000000000): " \
           f"{proc}/driver/nvidia-caps/mig-minors is missing" in done.stderr
    (tmp_path / "proc" / "driver" / "nvidia-caps" / "mig-minors").write_text(
        "gpu0/gi1/access 12\ngpu0/gi1/ci0/access 99\n")
    done = run.generate("--proc-root", proc, check=1)
    assert "/dev/nvidia-caps/nvidia-cap99 under the dev root" in done.stderr
    assert "nvidia-modprobe -f /proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access" in done.stderr
    assert not os.path.exists(run.output)


def test_mig_mode_without_mig_devices_is_a_warning(run, tmp_path):
    proc = _mig_setup(run, tmp_path, slots="")
    done = run.generate("--proc-root", proc)
    assert "warning: GPU 0 (GPU-00000000-1111-2222-3333-000000000000) is in MIG mode and has no MIG device" \
        in done.stderr
    assert [d["name"] for d in load(run.output)["devices"]] == ["1", run.driver.uuids(2)[1], "all"]


def test_no_nvml_in_the_driver_root(run, tmp_path):
    empty = tmp_path / "empty-root"
    (empty / "etc").mkdir(parents=True)
    with open(empty / "etc" / "ld.so.conf", "w") as out:
        out.write("/usr/lib\n")
    subprocess.run([fakedriver.need("ldconfig", "libc-bin"), "-r", str(empty)], check=True)
    done = run.generate("--driver-root", str(empty), "--dev-root", run.driver.dev_root, roots=False, check=1)
    assert f"no NVIDIA user-space driver in the driver root {empty}" in done.stderr
    assert "lists no libnvidia-ml.so.1" in done.stderr
    assert f"cdi-shim ldcache list --root {empty} | grep libnvidia-ml.so.1" in done.stderr
    # no ld.so.cache at all
    os.unlink(empty / "etc" / "ld.so.cache")
    done = run.generate("--driver-root", str(empty), roots=False, check=1)
    assert "its /etc/ld.so.cache cannot be read" in done.stderr


def _generate_on(tmp_path, name, **driver_options):
    """`cdi generate` on a fake driver of one GPU built with DRIVER_OPTIONS: (driver, runner, result)."""
    fake = fakedriver.FakeDriver(tmp_path / name, gpus=1, **driver_options)
    try:
        runner = fakedriver.Runner(fake, tmp_path)
        runner.gpus(1)
        return fake, runner, runner.generate()
    finally:
        fake.close()


def test_missing_expected_files_are_warnings(tmp_path):
    fake, runner, done = _generate_on(tmp_path, "partial", omit=("libnvidia-glcore", "libcudadebugger", "nvidia-smi"))
    assert f"warning: libnvidia-glcore.so.{VERSION} (OpenGL core) is not in the driver's library directories " \
           f"({LIBDIR}) of {fake.root}" in done.stderr
    assert f"warning: libcudadebugger.so.{VERSION} (CUDA debugger)" in done.stderr
    assert "warning: nvidia-smi is not in /usr/local/sbin" in done.stderr
    assert len([line for line in done.stderr.splitlines() if line.startswith("warning:")]) == 3, done.stderr
    doc = load(runner.output)
    assert f"{LIBDIR}/libnvidia-glcore.so.{VERSION}" not in mounts_by_path(doc)


def test_missing_gpu_device_node_is_an_error(run):
    lines = fakedriver.gpu_lines(1)
    lines[0] = lines[0].replace("minor=0", "minor=42")
    run.gpus(lines=[f"driver {VERSION}"] + lines)
    done = run.generate(check=1)
    assert f"/dev/nvidia42 under the dev root {run.driver.dev_root} (GPU 0" in done.stderr
    assert "nvidia-smi" in done.stderr


def test_spec_version(run):
    done = run.generate("--spec-version", "0.4.0", check=1)
    assert "--spec-version 0.4.0: this spec needs at least 0.5.0 (device names that start with a digit" in done.stderr
    assert not os.path.exists(run.output)
    run.generate("--spec-version", "0.8.0")
    doc = load(run.output)
    assert doc["cdiVersion"] == "0.8.0"
    assert doc["annotations"] == {"cdi-shim.dev/driver-version": VERSION}
    assert run.generate("--spec-version", "2.0", check=1).stderr.count("not a CDI version") == 1


def test_uuid_naming_only(run):
    run.generate("--device-name-strategy", "uuid")
    names = [d["name"] for d in load(run.output)["devices"]]
    assert names == run.driver.uuids(2) + ["all"]


def test_type_index_naming(run, tmp_path):
    """The toolkit's type-index strategy: gpu<i> for a GPU, mig<i>:<j> for a MIG device."""
    proc = _mig_setup(run, tmp_path)
    run.generate("--proc-root", proc, "--device-name-strategy", "type-index")
    doc = load(run.output)
    assert [d["name"] for d in doc["devices"]] == ["mig0:0", "mig0:2", "mig0:3", "gpu1", "all"]
    run.cli("cdi", "validate", run.output, check=0)
    listed = run.cli("cdi", "list", "--spec-dir", os.path.dirname(run.output), check=0).stdout.split()
    assert "nvidia.com/gpu=gpu1" in listed and "nvidia.com/gpu=mig0:2" in listed


def test_vendor_and_class(run):
    run.generate("--vendor", "example.com", "--class", "accel")
    assert load(run.output)["kind"] == "example.com/accel"
    done = run.generate("--class", "_bad", check=1)
    assert "Error: --class _bad: invalid class" in done.stderr and "a bug" not in done.stderr


def test_json_format_and_dry_run(run):
    json_out = run.output[:-5] + ".json"
    run.generate("--format", "json", "--output", json_out, output=False)
    with open(json_out) as stream:
        doc = json.load(stream)
    assert doc["cdiVersion"] == "0.5.0"
    run.cli("cdi", "validate", json_out, check=0)
    bare = run.output[:-5]
    run.generate("--format", "json", "--output", bare, output=False)    # no extension: --format names it
    assert json.load(open(bare + ".json")) == doc and not os.path.exists(bare)
    done = run.generate("--dry-run")
    assert done.stdout.startswith(f"# Generated by cdi-shim cdi generate for NVIDIA driver {VERSION}, 2 GPU(s).\n---\n")
    assert yaml.safe_load(done.stdout)["devices"][0]["name"] == "0"
    assert not os.path.exists(run.output)


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_output_dash_is_stdout(run, tmp_path, fmt):
    """Toolkit habit (issue 46, item 3): `nvidia-ctk cdi generate` prints the spec; `--output -`
    does so here, in --format's format, and writes no file (not `-.yaml` in the current folder)."""
    done = subprocess.run([fakedriver.node_cli(), "cdi", "generate", "--driver-root", run.driver.root, "--dev-root",
                           run.driver.dev_root, "--sysfs-root", run.driver.sysfs, "--proc-root", run.driver.proc,
                           "--output", "-", "--format", fmt], capture_output=True, text=True, env=run.env(),
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout) if fmt == "json" else yaml.safe_load(done.stdout)
    assert doc["kind"] == "nvidia.com/gpu" and {"0", "1", "all"} <= {d["name"] for d in doc["devices"]}
    assert "wrote the spec to stdout: " in done.stderr
    assert not [name for name in os.listdir(tmp_path) if name.startswith("-")]
    spec = tmp_path / "cdi" / f"nvidia.{fmt}"
    spec.parent.mkdir()
    spec.write_text(done.stdout)
    run.cli("cdi", "validate", str(spec), check=0)
    for other in ("--dry-run", "--watch"):
        assert "does not go with it" in run.generate("--output", "-", other, output=False, check=2).stderr


def test_default_output_with_stdout_redirected_says_where_the_spec_went(run, tmp_path):
    """`cdi-shim cdi generate > /etc/cdi/nvidia.yaml`, as a toolkit user types it: the spec goes to
    the default /var/run/cdi/nvidia.yaml (a private /run here: a mount namespace of its own), and
    stderr says so, names the empty file stdout left, and how to print the spec."""
    redirected = tmp_path / "etc-cdi-nvidia.yaml"
    script = ('mount -t tmpfs tmpfs /run && exec "$@" > "$OUT" && ls /var/run/cdi')
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                           fakedriver.node_cli(), "cdi", "generate", "--driver-root", run.driver.root,
                           "--dev-root", run.driver.dev_root, "--sysfs-root", run.driver.sysfs,
                           "--proc-root", run.driver.proc], capture_output=True, text=True,
                          env=dict(run.env(), OUT=str(redirected)), timeout=120)
    assert done.returncode == 0, done.stderr
    assert redirected.read_text() == ""
    assert "wrote /var/run/cdi/nvidia.yaml: " in done.stderr
    assert (f"note: the spec is in /var/run/cdi/nvidia.yaml, not on stdout (`nvidia-ctk cdi generate` prints it "
            f"there): `--output -` prints it; stdout is {redirected}, left empty: remove it") in done.stderr
    # on a terminal, or with --output named, no note
    assert "note:" not in run.generate().stderr


def test_format_against_the_extension_warns_and_writes_by_the_extension(run):
    """nvidia-ctk 1.20 parity (issue 31 item 6): --format json with an output named .yaml is a
    warning, and the file is YAML (the extension decides); likewise the other way round."""
    done = run.generate("--format", "json")
    assert f"warning: --format json disagrees with the output file {run.output}: written as yaml, by its " \
           "extension" in done.stderr
    with open(run.output) as stream:
        text = stream.read()
    assert text.startswith("# Generated by") and yaml.safe_load(text)["kind"] == "nvidia.com/gpu"
    json_out = run.output[:-5] + ".json"
    done = run.generate("--format", "yaml", "--output", json_out, output=False)
    assert "warning: --format yaml disagrees with the output file" in done.stderr
    with open(json_out) as stream:
        assert json.load(stream)["kind"] == "nvidia.com/gpu"


def test_replaces_the_old_spec_atomically_with_mode_0644(run):
    os.makedirs(os.path.dirname(run.output))
    with open(run.output, "w") as out:
        out.write("old\n")
    os.chmod(run.output, 0o600)
    old_inode = os.stat(run.output).st_ino
    env_umask = os.umask(0o077)
    try:
        run.generate()
    finally:
        os.umask(env_umask)
    info = os.stat(run.output)
    assert stat.S_IMODE(info.st_mode) == 0o644 and info.st_ino != old_inode
    assert os.listdir(os.path.dirname(run.output)) == ["nvidia.yaml"]


@pytest.mark.parametrize("planted", ["by another user", "by root"])
def test_output_through_a_folder_link_planted_in_a_shared_sticky_folder(run, tmp_path, planted):
    """--output /shared/cdi/nvidia.yaml, where another user planted /shared/cdi (a sticky folder
    everyone writes, like /tmp) as a link to a folder of theirs: root wrote its spec into that
    user's folder. Refused, naming the link and its owner, and nothing written there; a link
    root owns in the same folder is refused too (its folder is one others write in: issue 43,
    finding 7)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 1000, 1000)
    os.symlink(theirs, shared / "cdi")
    if planted == "by another user":
        os.lchown(shared / "cdi", 1000, 1000)
    run.output = str(shared / "cdi" / "nvidia.yaml")
    done = run.generate(check=1)
    said = ("it is owned by uid 1000" if planted == "by another user" else
            "shared is writable by group or others (mode 1777)")
    assert f"will not write {run.output}: will not follow the link {shared}/cdi: " in done.stderr, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert os.listdir(theirs) == []
    # the same link in a folder only root writes: followed, as before
    private = tmp_path / "private"
    private.mkdir()
    os.symlink(theirs, private / "cdi")
    run.output = str(private / "cdi" / "nvidia.yaml")
    run.generate()
    assert os.listdir(theirs) == ["nvidia.yaml"]


def test_toolkit_hook_program(run):
    done = run.generate("--hook-program", "/usr/bin/nvidia-cdi-hook")
    if not os.access("/usr/bin/nvidia-cdi-hook", os.X_OK):
        assert "warning: the hook program /usr/bin/nvidia-cdi-hook is not an executable on this node" in done.stderr
    doc = load(run.output)
    hooks = doc["containerEdits"]["hooks"]
    assert [h["args"][1] for h in hooks] == ["create-symlinks", "enable-cuda-compat", "update-ldcache",
                                             "disable-device-node-modification", "update-application-profile"]
    assert all(h["path"] == "/usr/bin/nvidia-cdi-hook" and h["args"][0] == "nvidia-cdi-hook"
               and h["env"] == ["NVIDIA_CTK_DEBUG=false"] for h in hooks)
    assert hooks[1]["args"][2] == f"--host-driver-version={VERSION}"
    run.generate("--hook-program", "/usr/bin/nvidia-ctk")
    assert load(run.output)["containerEdits"]["hooks"][0]["args"][:3] == ["nvidia-ctk", "hook", "create-symlinks"]
    assert "an absolute path is needed" in run.generate("--hook-program", "nvidia-cdi-hook", check=1).stderr


def test_nvml_session_points_pynvml_at_each_library_in_turn(driver, tmp_path):
    """In one process, two libraries one after the other: each is called, never the other's
    cached function pointers, and pynvml's own global is restored."""
    import pynvml

    from shim.generate import nvml

    other = tmp_path / "other"
    other.mkdir()
    fakedriver.build_nvml(str(other / "libnvidia-ml.so.1"))
    with open(other / "fake-nvml.conf", "w") as out:
        out.write("driver 999.1\n" + "\n".join(fakedriver.gpu_lines(3)) + "\n")
    os.environ.pop("FAKE_NVML_CONFIG", None)
    first = nvml.query(driver.nvml)
    second = nvml.query(str(other / "libnvidia-ml.so.1"))
    assert (first.driver_version, len(first.gpus)) == (VERSION, 8)
    assert (second.driver_version, len(second.gpus)) == ("999.1", 3)
    assert second.gpus[2].uuid == "GPU-00000002-1111-2222-3333-000000000002" and second.gpus[2].minor == 2
    assert second.gpus[2].bus_id == "00000000:12:00.0"
    assert pynvml.nvmlLib is None


def test_merged_usr_root_gives_the_real_directories(tmp_path):
    """The root's cache names /lib/x86_64-linux-gnu/... through the /lib -> usr/lib link: the
    libraries are mounted where they are, once, and the firmware found through the link."""
    fake, runner, done = _generate_on(tmp_path, "merged", merged_usr=True)
    assert "warning" not in done.stderr, done.stderr
    doc = load(runner.output)
    mounts = mounts_by_path(doc)
    graphics = [p for p in fake.graphics if ".so." in p]
    assert sorted(p for p in mounts if ".so." in p) == sorted(fake.libraries + graphics)
    assert doc["containerEdits"]["env"][0] == f"NVIDIA_CTK_LIBCUDA_DIR={LIBDIR}"
    gsp = mounts[f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"]
    assert gsp["hostPath"] == f"{fake.root}/usr/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"


def test_absolute_links_in_the_driver_root_stay_inside_it(tmp_path):
    """A driver container's root with absolute SONAME links (/usr/lib/.../libnvidia-ml.so.<v>):
    they are resolved inside the root, never to the host's files of that name."""
    fake, runner, done = _generate_on(tmp_path, "abs", absolute_links=True)
    assert "warning" not in done.stderr, done.stderr
    doc = load(runner.output)
    assert all(m["hostPath"].startswith(fake.root + "/") for m in doc["containerEdits"]["mounts"])
    assert runner.calls()[0] == "nvmlInitWithFlags"     # the root's fake NVML was the one loaded
    links = hook_args(doc, "create-symlinks")[3::2]
    assert f"libcuda.so.{VERSION}::{LIBDIR}/libcuda.so.1" in links


def test_graphics_files_are_mounted_as_the_toolkit_does(run):
    """Xorg modules and EGL platform libraries where they are; configuration and ICD files at
    their own paths, the Vulkan ones under /etc/vulkan; the graphics links in the spec's
    create-symlinks hook (toolkit 1.20: internal/discover/graphics.go)."""
    run.gpus(1)
    run.generate()
    doc = load(run.output)
    mounts = mounts_by_path(doc)
    root = run.driver.root
    for path in run.driver.graphics:            # nvidia_drv.so, libglxserver_nvidia.so.<v>, libnvidia-egl-*.so.X.Y.Z
        assert mounts[path] == {"hostPath": root + path, "containerPath": path, "options": OPTIONS}
    assert "/usr/lib/xorg/modules/drivers/nvidia_drv.so" in run.driver.graphics
    for path, _text in fakedriver.GRAPHICS_FILES:
        where = "/etc" + path[len("/usr/share"):] if path.startswith("/usr/share/vulkan/") else path
        assert mounts[where] == {"hostPath": root + path, "containerPath": where, "options": OPTIONS}
    graphics = [p for p, _ in fakedriver.GRAPHICS_FILES] + run.driver.graphics
    assert not [p for p in mounts if p.startswith("/usr/share/vulkan/")]
    # the graphics mounts come first, as in the toolkit's spec
    first = [m["hostPath"][len(root):] for m in doc["containerEdits"]["mounts"][:len(graphics)]]
    assert sorted(first) == sorted(graphics)
    links = hook_args(doc, "create-symlinks")[3::2]
    assert links[:2] == [f"libglxserver_nvidia.so.{VERSION}::/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so",
                         f"../libnvidia-allocator.so.1::{LIBDIR}/gbm/nvidia-drm_gbm.so"]
    # the gbm link's target is made by the driver-library links of the same hook
    assert f"libnvidia-allocator.so.{VERSION}::{LIBDIR}/libnvidia-allocator.so.1" in links
    assert "additionalGids" not in doc["containerEdits"]


def _drm_dev_root(run, tmp_path, mode, gid, gpus=2):
    dev_root = str(tmp_path / "devroot")
    run.driver.make_nodes(gpus, dev_root=dev_root, drm_mode=mode, drm_gid=gid)
    return dev_root


def _generate_with_dev_root(run, dev_root, *extra, check=0):
    return run.generate("--driver-root", run.driver.root, "--dev-root", dev_root, "--sysfs-root", run.driver.sysfs,
                        "--proc-root", run.driver.proc, "--output", run.output, *extra, roots=False, output=False,
                        check=check)


def test_drm_nodes_only_a_group_may_use_give_additional_gids_and_cdi_0_7_0(run, tmp_path):
    """/dev/dri nodes of mode 0660, group 44 (video): the device's additionalGids name the group
    and the node carries it (the toolkit's edits/device.go); that needs cdiVersion 0.7.0, and
    only that: the same spec with world-accessible nodes is 0.5.0 (the other tests)."""
    run.gpus(2)
    dev_root = _drm_dev_root(run, tmp_path, 0o660, 44)
    done = _generate_with_dev_root(run, dev_root)
    assert "cdiVersion 0.7.0" in done.stderr and "warning" not in done.stderr, done.stderr
    assert run.cli("cdi", "validate", run.output, check=0)
    doc = load(run.output)
    assert doc["cdiVersion"] == "0.7.0"
    devices = {d["name"]: d["containerEdits"] for d in doc["devices"]}
    for name in ("1", run.driver.uuids(2)[1], "all"):
        assert devices[name]["additionalGids"] == [44]
        for node in devices[name]["deviceNodes"]:
            assert node.get("gid") == (44 if node["path"].startswith("/dev/dri/") else None), node
    assert "additionalGids" not in doc["containerEdits"]     # the control nodes are 0666
    # asked for an older version: refused, saying why
    done = _generate_with_dev_root(run, dev_root, "--spec-version", "0.6.0", check=1)
    assert "--spec-version 0.6.0: this spec needs at least 0.7.0 (additionalGids" in done.stderr
    # a group-only node of root's group needs nothing (the process is root's or gets nothing)
    root_group = _drm_dev_root(run, tmp_path / "root-group", 0o660, 0)
    done = _generate_with_dev_root(run, root_group)
    assert "cdiVersion 0.5.0" in done.stderr, done.stderr


def test_by_path_links_only_to_the_gpus_own_nodes(run, tmp_path):
    """A by-path link that leads elsewhere than the GPU's DRM nodes is left out; a sysfs drm
    entry that is no node in /dev/dri is left out; a GPU without a sysfs entry gets no DRM
    node and no hook."""
    run.gpus(2)
    dev_root = _drm_dev_root(run, tmp_path, 0o666, 0)
    link = f"{dev_root}/dev/dri/by-path/pci-{fakedriver.bus_id(0)}-card"
    os.unlink(link)
    os.symlink("../card9", link)
    lines = fakedriver.gpu_lines(2)
    lines[1] = lines[1].replace("bus=00000000:11:00.0", "bus=00000000:42:00.0")   # no such PCI device in sysfs
    run.gpus(lines=[f"driver {VERSION}"] + lines)
    # a sysfs drm entry without a character device in /dev/dri (an old kernel's controlD64)
    control = f"{run.driver.sysfs}/bus/pci/devices/{fakedriver.bus_id(0)}/drm/controlD64"
    os.mkdir(control)
    try:
        _generate_with_dev_root(run, dev_root)
    finally:
        os.rmdir(control)
    devices = {d["name"]: d["containerEdits"] for d in load(run.output)["devices"]}
    assert [n["path"] for n in devices["0"]["deviceNodes"]] == ["/dev/nvidia0", "/dev/dri/card1", "/dev/dri/renderD128"]
    assert devices["0"]["hooks"][0]["args"][2:] == [
        "--link", f"../renderD128::/dev/dri/by-path/pci-{fakedriver.bus_id(0)}-render"]
    assert devices["1"] == {"deviceNodes": [{"path": "/dev/nvidia1", "hostPath": f"{dev_root}/dev/nvidia1"}]}


def test_vulkan_files_at_the_driver_roots_top_and_every_config_found(tmp_path, monkeypatch):
    """A GKE-style driver root has vulkan/icd.d/ at its top: mounted at /etc/vulkan/...; a
    configuration file in both /etc and /usr/share is mounted from both, each at its path;
    the first Xorg module found in the search order is the one mounted."""
    from shim.generate.discover import DriverFiles, DriverRoot
    from shim.generate.graphics import discover_graphics, xorg_search_paths

    root = tmp_path / "root"
    files = {"vulkan/icd.d/nvidia_icd.json": "{}", "etc/glvnd/egl_vendor.d/10_nvidia.json": "{}",
             "usr/share/glvnd/egl_vendor.d/10_nvidia.json": "{}",
             "usr/lib64/nvidia/xorg/nvidia_drv.so": "", "usr/lib/xorg/modules/drivers/nvidia_drv.so": ""}
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "etc").mkdir(exist_ok=True)
    subprocess.run([fakedriver.need("ldconfig", "libc-bin"), "-r", str(root)], check=True)
    found = DriverFiles()
    found.lib_dirs = ["/usr/lib64"]
    assert xorg_search_paths(["/usr/lib64"])[:2] == ["/usr/lib64/nvidia/xorg", "/usr/lib64/xorg/modules/drivers"]
    with DriverRoot(str(root), "x86_64") as driver_root:
        discover_graphics(driver_root, VERSION, found)
    assert found.configs == [(f"{root}/etc/glvnd/egl_vendor.d/10_nvidia.json",
                              "/etc/glvnd/egl_vendor.d/10_nvidia.json"),
                             (f"{root}/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
                              "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"),
                             (f"{root}/vulkan/icd.d/nvidia_icd.json", "/etc/vulkan/icd.d/nvidia_icd.json")]
    assert found.graphics == [(f"{root}/usr/lib64/nvidia/xorg/nvidia_drv.so", "/usr/lib64/nvidia/xorg/nvidia_drv.so")]
    assert found.links == []

    # XDG_DATA_DIRS, when set, replaces /usr/local/share and /usr/share (relative entries ignored)
    from shim.generate.graphics import config_dirs

    monkeypatch.setenv("XDG_DATA_DIRS", "/opt/share:relative:/usr/share/")
    assert config_dirs() == ("/etc", "/opt/share", "/usr/share")
    (root / "opt/share/nvidia").mkdir(parents=True)
    (root / "opt/share/nvidia/nvoptix.bin").write_text("")
    (root / "usr/local/share/nvidia").mkdir(parents=True)
    (root / "usr/local/share/nvidia/nvoptix.bin").write_text("")
    found = DriverFiles()
    with DriverRoot(str(root), "x86_64") as driver_root:
        discover_graphics(driver_root, VERSION, found)
    assert [p for _h, p in found.configs if p.endswith("nvoptix.bin")] == ["/opt/share/nvidia/nvoptix.bin"]
    monkeypatch.setenv("XDG_DATA_DIRS", "")
    assert config_dirs() == ("/etc", "/usr/local/share", "/usr/share")


@pytest.mark.parametrize("nvml, kernel", [("00000000:3B:00.0", "0000:3b:00.0"), ("0000:3b:00.0", "0000:3b:00.0"),
                                          ("00010000:01:00.0", "00010000:01:00.0"), ("nonsense", None)])
def test_pci_bus_id_in_the_kernels_form(nvml, kernel):
    from shim.generate.graphics import pci_bus_id

    assert pci_bus_id(nvml) == kernel
