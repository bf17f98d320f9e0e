"""`cdi-shim nri` on real containerd 1.7 (NRI turned on) and 2.1 (NRI on as shipped): pods on the
stock `runc` handler, no RuntimeClass, no cdi-shim runtime in the way (cdi_shim_lab/nrilab.py).

Each containerd is Debian's (trixie / forky, fetched once: cdi_shim_lab/releases.py); its NRI
socket is the lab's own, and the plugin is the real `cdi-shim nri` command serving the
namespace "default" (and the config's default, gpu-operator). containerd 2.1 keeps its own CDI
on (its default): the requests here are pod annotations and the toolkit's key, which
containerd's CDI does not read, so whatever device a container gets is the plugin's.
"""
import os
import signal
import threading
import time

import pytest

from tests.cri.test_pods import PROBE

pytestmark = pytest.mark.cri

DEVICE = "nvidia.com/gpu=0"
NODE = "character special file c3:0"  # 195:0 in hex
WHOLE = {"node": NODE, "env": "0/555.42", "mount": "fake driver 555.42"}


@pytest.fixture(scope="module", params=["1.7", "2.1"])
def nri_lab(request, tmp_path_factory, cri_build_dir):
    from cdi_shim_lab.lab import LabError
    from cdi_shim_lab.nrilab import NRILab
    from tests.helpers import need

    for name, package in (("runc", "runc"), ("busybox", "busybox-static"), ("unshare", "util-linux"),
                          ("gcc", "gcc"), ("ldconfig", "libc-bin")):
        need(name, package)
    if os.geteuid() != 0:
        pytest.fail("the CRI tests run a private containerd and pods with runc: run them as root", pytrace=False)
    lab = NRILab(tmp_path_factory.mktemp(f"nri-{request.param}"), containerd=request.param, runtime_log=True)
    try:
        lab.setup(library_image=True)
        lab.start_plugin()
    except LabError as err:
        lab.stop()
        pytest.fail(str(err), pytrace=False)
    yield lab
    lab.stop()


def seen_in(run):
    return dict(line.split("=", 1) for line in run.output if "=" in line)


def probe(lab, **request):
    run = lab.run_pod("runc", ["sh", "-c", PROBE], keep_configs=True, **request)
    assert run.status.exit_code == 0, run.output
    return run, seen_in(run)


def no_runtime_of_ours(lab, run):
    """The pod ran on the stock handler: runc straight, no cdi-shim-runtime create."""
    assert run.sandbox_spec is not None
    if os.path.exists(lab.runtime_log):
        with open(lab.runtime_log) as stream:
            assert run.container_id not in stream.read()


def test_pod_annotation_on_the_runc_handler(nri_lab):
    run, seen = probe(nri_lab, pod_annotations={"cdi.k8s.io/gpu": DEVICE})
    assert seen == WHOLE
    # the adjustment is in the OCI spec containerd made (containerd applies it before runc)
    spec = run.container_spec
    assert [d["path"] for d in spec["linux"]["devices"]] == ["/dev/nvidia0"]
    assert {"FAKE_GPU_INDEX=0", "FAKE_DRIVER=555.42"} <= set(spec["process"]["env"])
    no_runtime_of_ours(nri_lab, run)
    assert f"container main of pod default/{run_name(run)}: {DEVICE}" in nri_lab.plugin_log_text()


def run_name(run):
    return run.sandbox_spec["annotations"]["io.kubernetes.cri.sandbox-name"]


def test_container_annotation(nri_lab):
    """A container annotation reaches NRI too; on 2.1 containerd's own CDI reads that prefix
    and fails first when the device is not in its folders (/etc/cdi): the lab's spec folder is
    not, so this is checked on 1.7 (NRI only) and with a prefix of the plugin's alone on both."""
    if nri_lab.containerd_version == "1.7":
        _, seen = probe(nri_lab, annotations={"cdi.k8s.io/gpu": DEVICE})
        assert seen == WHOLE
    _, seen = probe(nri_lab, pod_annotations={"nvidia.cdi.k8s.io/container.other": DEVICE})
    assert "No such file" in seen["node"] and seen["env"] == "/"    # another container's key


def test_toolkit_key(nri_lab):
    """The toolkit plugin's nvidia.cdi.k8s.io/container.<name>: a bare name is of default-kind."""
    _, seen = probe(nri_lab, pod_annotations={"nvidia.cdi.k8s.io/container.main": "0"})
    assert seen == WHOLE


def test_namespace_not_on_the_list_refused(nri_lab):
    run, seen = probe(nri_lab, namespace="tenant", pod_annotations={"cdi.k8s.io/gpu": DEVICE})
    assert "No such file" in seen["node"] and seen["env"] == "/" and "No such file" in seen["mount"]
    assert not run.container_spec["linux"].get("devices")
    log = nri_lab.plugin_log_text()
    assert f"refused: container main of pod tenant/{run_name(run)} requests {DEVICE}, but namespace 'tenant'" in log


def test_unresolvable_device_fails_the_creation(nri_lab):
    from cdi_shim_lab.cri import CRIError

    with pytest.raises(CRIError) as err:
        nri_lab.run_pod("runc", ["true"], pod_annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=7"})
    assert "nvidia.com/gpu=7" in err.value.details, err.value.details


PROBE_LIBS = ("echo cache=$(tr '\\000' '\\n' < /etc/ld.so.cache "
              "| grep -o 'libnvidia-bench[0-9]*[.]so[.]1$' | sort -u | wc -l); "
              "echo image=$(tr '\\000' '\\n' < /etc/ld.so.cache | grep -c '^/'); "
              "echo link=$(readlink /usr/lib/x86_64-linux-gnu/libnvidia-bench0.so); "
              "echo link1=$(readlink /usr/lib/x86_64-linux-gnu/libnvidia-bench1.so); "
              "echo soname=$(readlink /usr/lib/x86_64-linux-gnu/libnvidia-bench5.so.1); "
              "echo named=$(tr '\\000' '\\n' < /etc/ld.so.cache "
              "| grep -c '^/.*/libnvidia-bench[0-9]*[.]so[.]1$'); "
              "echo profile=$(cat /etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf 2>/dev/null "
              "| wc -c)")


@pytest.fixture(scope="module")
def toolkit_devices(nri_lab):
    return nri_lab.write_native_cdi_specs(count=30)


def hook_lines(path):
    with open(path) as stream:
        return stream.read().splitlines()


def test_linker_cache_and_links_from_inside(nri_lab, toolkit_devices):
    """A spec as `nvidia-ctk cdi generate` writes it (30 driver libraries, the toolkit's six hooks,
    the hook program named nvidia-cdi-hook: here a stand-in that logs each run): the container
    finds every driver library in its ld.so.cache, beside the image's own entries, both
    create-symlinks links and the soname links ldconfig makes (the cache naming them);
    update-ldcache and create-symlinks ran as our one hook, not as the toolkit's processes: one
    cdi-shim-nshook nri (C), whose cache the plugin's own process wrote (no interpreter started
    for it)."""
    from cdi_shim_lab.lab import LIB_IMAGE

    before = len(hook_lines(toolkit_devices["hook_log"]))
    before_cache = nri_lab.plugin_log_text().count("hook: the linker cache of ")
    run = nri_lab.run_pod("runc", ["sh", "-c", PROBE_LIBS], keep_configs=True, image=LIB_IMAGE,
                          pod_annotations={"cdi.k8s.io/gpu": toolkit_devices["toolkit"]})
    assert run.status.exit_code == 0, run.output
    seen = seen_in(run)
    assert seen["cache"] == "30" and int(seen["image"]) > 30, seen
    assert seen["link"] == "libnvidia-bench0.so.1" and seen["link1"] == "libnvidia-bench1.so.1", seen
    # the soname links the toolkit's ldconfig makes beside the mounted libraries, named by the cache
    # (through /lib/x86_64-linux-gnu, the spelling by which this image's configuration reaches them)
    assert seen["soname"] == "libnvidia-bench5.so.550.54.15" and seen["named"] == "30", seen
    hooks = run.container_spec["hooks"]["createContainer"]
    ours = [hook for hook in hooks if hook["args"][:2] == ["cdi-shim-nshook", "nri"]]
    assert len(ours) == 1, hooks
    assert "--folder" in ours[0]["args"] and "--link" in ours[0]["args"]
    assert ours[0]["args"][2:4] == ["--socket", nri_lab.hook_socket]
    log = nri_lab.plugin_log_text()
    assert log.count("hook: the linker cache of ") == before_cache + 1, log
    ran = [line.split()[0] for line in hook_lines(toolkit_devices["hook_log"])[before:]]
    assert ran == [], ran     # no toolkit process: enable-cuda-compat too is the native hook's
    # update-application-profile: the plugin's file, bound read-only; disable-device-node-modification:
    # nothing to do on a host without /proc/driver/nvidia/params (no --params, no hook)
    assert int(seen["profile"]) > 0, seen
    profile = [m for m in run.container_spec["mounts"]
               if m["destination"] == "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"]
    assert len(profile) == 1 and "ro" in profile[0]["options"], profile
    assert "--params" not in ours[0]["args"]


PROBE_FILES = ("echo cache=$(od -An -v -tx1 /etc/ld.so.cache | tr -d ' \\n'); "
               "echo conf=$(cat /etc/ld.so.conf.d/00-nvcr-*.conf /etc/ld.so.conf.d/zz-nvcr-*.conf | tr '\\n' ' '); "
               "echo link=$(readlink /usr/lib/x86_64-linux-gnu/libnvidia-bench0.so)")


def test_answer_kept_for_the_image(nri_lab, toolkit_devices):
    """The hook's cache work is kept by the image's layers (shim/nri/layers.py): runc's mount
    points make the library folder new in each container's upper layer, so the second pod of
    the same image and spec gets the first one's answer (or an earlier test's), not a rescan;
    its files, seen from inside, are the same bytes. A pod of another image (busybox) has a
    cache of its own."""
    from cdi.safeio import RACY_WINDOW_NS
    from cdi_shim_lab.lab import LIB_IMAGE

    # (what changed within the settle window is not trusted by identity: the driver files are new)
    newest = max(os.stat(path).st_ctime_ns for path in toolkit_devices["libraries"])
    time.sleep(max(0, newest + RACY_WINDOW_NS - time.time_ns()) / 1e9)
    seen, lines = [], []
    for image in (LIB_IMAGE, LIB_IMAGE, LIB_IMAGE, None):
        before = nri_lab.plugin_log_text()
        run = nri_lab.run_pod("runc", ["sh", "-c", PROBE_FILES], **({"image": image} if image else {}),
                              pod_annotations={"cdi.k8s.io/gpu": toolkit_devices["toolkit"]})
        assert run.status.exit_code == 0, run.output
        seen.append(seen_in(run))
        (line,) = [line for line in nri_lab.plugin_log_text()[len(before):].splitlines()
                   if "hook: the linker cache of " in line]
        lines.append(line)
    assert seen[0] == seen[1] == seen[2] and seen[0]["link"] == "libnvidia-bench0.so.1", seen
    assert len(seen[0]["cache"]) > 1000 and seen[3]["cache"] != seen[0]["cache"], seen
    assert all("kept for its image's layers" in line for line in lines[1:3]), lines


PROBE_COMPAT = ("echo cache=$(od -An -v -tx1 /etc/ld.so.cache | tr -d ' \\n'); "
                "echo dropin=$(cat /etc/ld.so.conf.d/00-compat-*.conf 2>/dev/null)")


@pytest.mark.parametrize("case", ["newer", "older"])
def test_cuda_compat_from_inside(nri_lab, toolkit_devices, case):
    """enable-cuda-compat with no toolkit process (its program here is the lab's stand-in,
    which fails on an image with a compat folder: it must not run): the plugin decides the
    compat folder with the runtime's code and puts it first in the cache it writes. An image's
    compat libcuda (570) newer than the host driver (550) is the libcuda.so.1 the loader takes,
    under the folder's resolved name; with a newer host driver (580), the driver's own."""
    from cdi_shim_lab.nrilab import COMPAT_FOLDER, COMPAT_IMAGE
    from shim.ldconfig.ldcache import read_cache

    devices = getattr(nri_lab, "compat_devices", None) or nri_lab.add_compat_image(
        os.path.join(nri_lab.base, "hooks", "nvidia-cdi-hook"))
    nri_lab.compat_devices = devices
    before = len(hook_lines(toolkit_devices["hook_log"]))
    run = nri_lab.run_pod("runc", ["sh", "-c", PROBE_COMPAT], keep_configs=True, image=COMPAT_IMAGE,
                          pod_annotations={"cdi.k8s.io/gpu": devices[case]})
    assert run.status.exit_code == 0, run.output
    seen = seen_in(run)
    entries = read_cache(bytes.fromhex(seen["cache"])).entries
    first = next(entry.path for entry in entries if entry.soname == "libcuda.so.1")
    if case == "newer":
        assert first == f"{COMPAT_FOLDER}/libcuda.so.1" and seen["dropin"] == COMPAT_FOLDER, seen
    else:
        assert first.startswith("/usr/lib/x86_64-linux-gnu/libcuda.so.") and seen["dropin"] == "", (first, seen)
    assert len(hook_lines(toolkit_devices["hook_log"])) == before     # no toolkit process
    (ours,) = run.container_spec["hooks"]["createContainer"]
    assert ours["args"][:2] == ["cdi-shim-nshook", "nri"] and "--cuda-compat" in ours["args"], ours


def test_plugin_restarted_while_pods_start(nri_lab):
    """Pods start one after another while the plugin is killed and started again: each pod has
    the whole device or none of it (a pod created while no plugin is connected gets nothing, as
    NRI goes on without it); the plugin registers again, and pods after that get the device."""
    results, errors = [], []
    stop = threading.Event()

    def pods():
        while not stop.is_set() or len(results) < 12:
            began = time.monotonic()      # a pod counts from its start: its create may come after
            try:
                _, seen = probe(nri_lab, pod_annotations={"cdi.k8s.io/gpu": DEVICE})
                results.append((began, seen))
            except Exception as err:     # noqa: BLE001 -- a CRI error of a create in flight
                errors.append((began, repr(err)))
            if len(results) + len(errors) > 200:
                break

    worker = threading.Thread(target=pods)
    registered = nri_lab.plugin_registrations()
    worker.start()
    try:
        while len(results) < 3 and worker.is_alive():
            time.sleep(0.05)
        nri_lab.plugin.send_signal(signal.SIGKILL)
        nri_lab.plugin.wait(15)
        time.sleep(0.3)
        nri_lab.start_plugin()
        restarted = time.monotonic()
        assert nri_lab.plugin_registrations() == registered + 1
        while sum(1 for t, _ in results if t > restarted) < 5 and worker.is_alive():
            time.sleep(0.05)
    finally:
        stop.set()
        worker.join(120)
    assert not worker.is_alive()
    none = {"node", "env", "mount"}
    for _, seen in results:
        whole = seen == WHOLE
        nothing = "No such file" in seen["node"] and seen["env"] == "/" and "No such file" in seen["mount"]
        assert whole or nothing, seen
        assert set(seen) == none
    after = [seen for t, seen in results if t > restarted]
    assert len(after) >= 5 and all(seen == WHOLE for seen in after), after
    assert all(seen == WHOLE for _, seen in results[:3])
    # a create in flight when the plugin died may fail; none after it came back
    assert all(t < restarted for t, _ in errors), errors


def test_containerd_restarted_while_the_plugin_runs(nri_lab):
    registered = nri_lab.plugin_registrations()
    pid = nri_lab.plugin.pid
    nri_lab.restart_containerd()
    nri_lab.wait_registered(registered + 1)
    assert nri_lab.plugin.pid == pid and nri_lab.plugin.poll() is None   # the same process reconnected
    _, seen = probe(nri_lab, pod_annotations={"cdi.k8s.io/gpu": DEVICE})
    assert seen == WHOLE
