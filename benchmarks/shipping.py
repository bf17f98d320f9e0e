"""What shipping costs: the wheel's build and install, the node image's build (cold, after a source
change, cached) and size, and the installer's run on a node tree.

    .venv/bin/python benchmarks/shipping.py [--cold]

As root, with the tests' tools (podman, debootstrap). --cold builds the image's Debian bases again
(a fresh cache folder, the base images removed): what a fresh CI machine pays.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_IMAGE = os.path.join(REPO, "scripts", "build-node-image.sh")


def timed(argv, **kwargs):
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    took = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return took, done.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="build the image's Debian bases again")
    options = parser.parse_args()
    base = getattr(sys, "_base_executable", None) or sys.executable
    rows = []
    with tempfile.TemporaryDirectory(prefix="cdi-shim-packaging.") as work:
        taken, _ = timed([base, "-m", "venv", os.path.join(work, "build")])
        timed([os.path.join(work, "build", "bin", "pip"), "install", "-q", "build"])
        taken, _ = timed([os.path.join(work, "build", "bin", "python"), "-m", "build", "--outdir",
                          os.path.join(work, "dist"), REPO], cwd=work)
        rows.append(("wheel: python -m build (the sdist, then the wheel from it)", f"{taken:.1f} s"))
        wheel = next(os.path.join(work, "dist", n) for n in os.listdir(os.path.join(work, "dist"))
                     if n.endswith(".whl"))
        rows.append(("wheel size", f"{os.path.getsize(wheel) / 1e6:.2f} MB"))
        timed([base, "-m", "venv", os.path.join(work, "v")])
        taken, _ = timed([os.path.join(work, "v", "bin", "pip"), "install", "-q", wheel])
        rows.append(("wheel: pip install into a new venv (with its dependencies)", f"{taken:.1f} s"))

        env = dict(os.environ)
        if options.cold:
            env["CDI_SHIM_TEST_CACHE"] = os.path.join(work, "cache")
            for name in ("bookworm-minbase", "bookworm-python"):
                subprocess.run(["podman", "rmi", "-f", f"localhost/cdi-shim-base:{name}"], capture_output=True)
        tag = f"cold{int(time.time())}" if options.cold else f"bench{int(time.time())}"
        taken, out = timed(["bash", BUILD_IMAGE, "--release-tag", tag], env=env)
        image = out.strip().splitlines()[-1]
        what = "cold: the Debian bases debootstrapped too" if options.cold else "a new input, the bases cached"
        rows.append((f"node image build, {what}", f"{taken:.1f} s"))
        taken, _ = timed(["bash", BUILD_IMAGE, "--release-tag", tag], env=env)
        rows.append(("node image build, the same inputs (cached)", f"{taken:.1f} s"))
        size = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", image], capture_output=True,
                              text=True).stdout.strip()
        rows.append(("node image size (minbase + the tree)", f"{int(size) / 1e6:.1f} MB"))
        tree = subprocess.run(["podman", "run", "--rm", "--network=none", "--ulimit", "nofile=20000:20000",
                               "--ulimit", "nproc=32768:32768", "--entrypoint", "du", image, "-sm",
                               "/opt/cdi-shim/current"], capture_output=True, text=True).stdout.split()[:1]
        rows.append(("its /opt/cdi-shim/current", f"{tree[0] if tree else '?'} MB"))
        from cdi_shim_lab import releases

        containerd_dir = os.path.dirname(releases.binaries(releases.fetch("2.1"))["containerd"])
        node = os.path.join(work, "node")
        os.makedirs(node)
        installer = ["podman", "run", "--rm", "--network=none", "--ulimit", "nofile=20000:20000",
                     "--ulimit", "nproc=32768:32768", "-v", f"{node}:/host", "-v", f"{containerd_dir}:/containerd:ro",
                     "-e", "HOST_OPT=/host/opt/cdi-shim", "-e", "NSENTER=",
                     "-e", "CDI_SHIM_INSTALL_ARGS=--root /host --containerd-binary /containerd/containerd", image]
        taken, _ = timed(installer)
        rows.append(("installer on an empty node tree (podman run: copy, switch, install --node)", f"{taken:.2f} s"))
        taken, _ = timed(installer)
        rows.append(("installer again (nothing to change)", f"{taken:.2f} s"))
        subprocess.run(["podman", "rmi", "-f", image], capture_output=True)
        if options.cold:
            shutil.rmtree(env["CDI_SHIM_TEST_CACHE"], ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    for what, value in rows:
        print(f"{what:<{width}}  {value}")


if __name__ == "__main__":
    main()
