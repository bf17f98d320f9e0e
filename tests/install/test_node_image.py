"""The node image, built here (scripts/build-node-image.sh: Debian bases from debootstrap, the
wheel, podman build) and run as the DaemonSet's init container runs it, against a node tree:
its installer copies the tree to the node's /opt/cdi-shim/releases/<release>, switches
`current`, and runs `cdi-shim install --node`. Then the real containerd 2.1 starts from the
config the installer wrote, with the node's /opt/cdi-shim, and a pod gets the fake GPU through
the installed runtime; a second release is installed while pods keep starting.

The installer runs `cdi-shim install` inside the container (NSENTER empty, --root /host) rather
than in the host's namespaces: this machine is not the node.
"""
import os
import subprocess
import threading
import time

import pytest

from tests.helpers import need, toml_loads

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(REPO, "scripts", "build-node-image.sh")
# an env request: containerd's own CDI ignores it, so only the installed runtime can give the GPU
REQUEST = {"NVIDIA_VISIBLE_DEVICES": "0"}
PROBE = "ls -l /dev/nvidia0 && cat /usr/local/fake-driver/version.txt"


def build(*args):
    start = time.monotonic()
    done = subprocess.run(["bash", BUILD, *args], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"build-node-image.sh {' '.join(args)}: {time.monotonic() - start:.1f} s")
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def image():
    need("podman", "podman")
    need("debootstrap", "debootstrap")
    return build()


def ulimits():
    """podman's default nofile/nproc are above the hard limits in some sandboxes."""
    from tests.cdi.podman_peer import _ulimit_flags

    return list(_ulimit_flags())


def installer(image, node, containerd_dir=None, extra_env=(), volume_options=""):
    """The image's entry point against NODE mounted at /host, cdi-shim install run inside."""
    args = ["--root /host"]
    volumes = ["-v", f"{node}:/host{volume_options}"]
    if containerd_dir:
        args.append("--containerd-binary /containerd/containerd")
        volumes += ["-v", f"{containerd_dir}:/containerd:ro"]
    env = ["-e", "HOST_OPT=/host/opt/cdi-shim", "-e", "NSENTER=", "-e", f"CDI_SHIM_INSTALL_ARGS={' '.join(args)}"]
    for item in extra_env:
        env += ["-e", item]
    return subprocess.run([need("podman", "podman"), "run", "--rm", "--network=none", *ulimits(), *volumes, *env,
                           image], capture_output=True, text=True, timeout=300)


def test_a_missing_input_is_named(tmp_path):
    done = subprocess.run(["bash", BUILD, "--python-standalone", str(tmp_path / "cpython-install_only.tar.gz")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "cpython-install_only.tar.gz: no such file" in done.stderr, done.stderr


def test_image_carries_one_self_contained_tree(image):
    from cdi import __version__

    label = subprocess.run(["podman", "image", "inspect", "--format",
                            '{{index .Config.Labels "org.opencontainers.image.version"}}', image],
                           capture_output=True, text=True).stdout.strip()
    assert label == __version__
    # the final stage has no Python of its own: the tree's runs
    script = ("test ! -e /usr/bin/python3 && cd /opt/cdi-shim/current && cat RELEASE && bin/cdi-shim --version && "
              "bin/cdi-shim-hook --version && bin/cdi-shim doctor --help >/dev/null && echo ok")
    done = subprocess.run(["podman", "run", "--rm", "--network=none", *ulimits(), "--entrypoint", "/bin/sh", image,
                           "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == [__version__, f"cdi-shim, version {__version__}",
                                           f"cdi-shim-hook, version {__version__}", "ok"], done.stdout


def test_installer_refuses_a_read_only_prefix(image, tmp_path):
    node = tmp_path / "node"
    (node / "opt").mkdir(parents=True)
    done = installer(image, node, volume_options=":ro")
    assert done.returncode == 1 and "/host/opt/cdi-shim/releases" in done.stderr, done.stderr
    assert not os.path.exists(node / "opt" / "cdi-shim")


def test_two_installers_at_once_give_one_release(image, tmp_path):
    node = tmp_path / "node"
    node.mkdir()
    runs = [subprocess.Popen(["podman", "run", "--rm", "--network=none", *ulimits(), "-v", f"{node}:/host",
                              "-e", "HOST_OPT=/host/opt/cdi-shim", image, "--copy-only"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], results
    releases = node / "opt" / "cdi-shim" / "releases"
    assert os.listdir(releases) == [os.readlink(node / "opt/cdi-shim/current").split("/")[1]], os.listdir(releases)
    assert sum("copied release" in err for _, err in results) == 1, results


@pytest.fixture
def lab21(tmp_path):
    from cdi_shim_lab.lab import Lab

    lab = Lab(tmp_path / "lab", containerd="2.1")
    yield lab
    lab.stop()


def test_installed_node_runs_gpu_pods_and_takes_a_new_release_under_load(image, tmp_path, lab21, cri_build_dir):
    lab = lab21
    node = tmp_path / "node"
    (node / "etc" / "containerd").mkdir(parents=True)
    (node / "etc" / "containerd" / "config.toml").write_text(lab.base_config_text())
    # the node's cdi-shim config (install keeps it): its spec-dirs, the lab's, become containerd's
    (node / "etc" / "cdi-shim").mkdir(parents=True)
    (node / "etc" / "cdi-shim" / "config.toml").write_text(f'spec-dirs = ["{lab.spec_dir}"]\n')
    start = time.monotonic()
    done = installer(image, node, os.path.dirname(lab.containerd))
    took = time.monotonic() - start
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"installer on an empty node tree: {took:.2f} s")
    from cdi import __version__

    assert os.readlink(node / "opt/cdi-shim/current") == f"releases/{__version__}"
    config = (node / "etc/containerd/config.toml").read_text()
    runtimes = toml_loads(config)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/opt/cdi-shim/current/bin/cdi-shim-runtime", runtimes
    unit = (node / "etc/systemd/system/cdi-shim-resident.service").read_text()
    assert "ExecStart=/opt/cdi-shim/current/bin/cdi-shim runtime serve" in unit

    # containerd 2.1 from the installed config, the node's /opt/cdi-shim in its mount namespace
    lab.mounts = [(None, "/opt"), (str(node / "opt" / "cdi-shim"), "/opt/cdi-shim")]
    lab.setup(config_text=config)
    first = lab.run_pod("nvidia", ["sh", "-c", PROBE], envs=REQUEST)
    assert first.status.exit_code == 0 and "fake driver 555.42" in first.output, first.output
    assert any("195,   0" in line for line in first.output), first.output

    # a new release while pods keep starting: none fails
    second = build("--release-tag", "next")
    results, stop = [], threading.Event()

    def loop():
        while not stop.is_set():
            try:
                run = lab.run_pod("nvidia", ["sh", "-c", PROBE], envs=REQUEST)
                results.append((run.status.exit_code, run.output))
            except Exception as err:   # noqa: BLE001 - a failed create is what this counts
                results.append((None, repr(err)))

    worker = threading.Thread(target=loop)
    worker.start()
    try:
        time.sleep(1.0)
        upgrade = installer(second, node, os.path.dirname(lab.containerd))
        time.sleep(1.0)
    finally:
        stop.set()
        worker.join(timeout=120)
    assert upgrade.returncode == 0, upgrade.stderr
    assert os.readlink(node / "opt/cdi-shim/current") == f"releases/{__version__}-next"
    assert sorted(os.listdir(node / "opt/cdi-shim/releases")) == [__version__, f"{__version__}-next"]
    failed = [r for r in results if r[0] != 0 or not any("fake driver 555.42" in line for line in r[1])]
    assert len(results) >= 3 and not failed, (len(results), failed[:3])
    print(f"{len(results)} GPU pods started during the switch, none failed")
    after = lab.run_pod("nvidia", ["sh", "-c", PROBE], envs=REQUEST)
    assert after.status.exit_code == 0, after.output


@pytest.mark.parametrize("owner, mode, said", [(1000, 0o755, "is owned by uid 1000, not root"),
                                               (0, 0o777, "has mode 777, writable by group or others")])
def test_installer_refuses_a_prefix_others_control(image, tmp_path, owner, mode, said):
    node = tmp_path / "node"
    prefix = node / "opt" / "cdi-shim"
    prefix.mkdir(parents=True)
    os.chown(prefix, owner, 0)
    os.chmod(prefix, mode)
    done = installer(image, node)
    assert done.returncode == 1 and f"/host/opt/cdi-shim {said}" in done.stderr, done.stderr
    assert os.listdir(prefix) == ["releases"] and not os.listdir(prefix / "releases")


def test_release_artefacts(image, tmp_path):
    """scripts/release.sh: the sdist, the wheel, the node tree tarball and SHA256SUMS of them."""
    from cdi import __version__

    out = tmp_path / "release"
    done = subprocess.run(["bash", os.path.join(REPO, "scripts", "release.sh"), str(out)], capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sums = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True, text=True)
    assert sums.returncode == 0 and sums.stdout.count(": OK") == 3, sums.stdout + sums.stderr
    listing = subprocess.run(["tar", "tzf", str(out / f"cdi-shim-node-{__version__}.tar.gz")], capture_output=True,
                             text=True).stdout.split()
    assert {"current/bin/cdi-shim-runtime", "current/bin/python3", "current/node-install.sh"} <= set(listing)
    assert [n for n in listing if n.endswith("/shim/node/units/cdi-shim-generate.service")], listing  # the refresh


def test_installer_on_a_node_without_containerd_config_names_the_file_and_the_fix(image, tmp_path):
    node = tmp_path / "node"
    node.mkdir()
    done = installer(image, node)
    assert done.returncode == 1, done.stderr
    assert ("/host/etc/containerd/config.toml is missing and containerd is not installed" in done.stderr
            and "install containerd on the node first, or name its binary with --containerd-binary" in done.stderr), \
        done.stderr
    assert not (node / "etc" / "containerd").exists() or not os.listdir(node / "etc" / "containerd")
