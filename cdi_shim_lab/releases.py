"""Newer containerd releases beside the system's, and Docker releases, for the labs and their tests.

Debian's archive serves containerd 1.7 in trixie and 2.1 in forky; their packages depend only on
libc6 (>= 2.34) and runc, so on bookworm `apt-get download` with a private sources list (the
mirror taken from this machine's own apt sources) and `dpkg-deb -x` into a private prefix give
real binaries (containerd, ctr, containerd-shim-runc-v2) without touching the system's
containerd. The prefix is kept under ``$CDI_SHIM_TEST_CACHE`` (default
``/var/cache/cdi-shim-tests``), like the debootstrap tarball of the linker tests: the ~30 MB
download happens once per machine.

Docker the same way: Debian's docker.io 20.10 (bookworm), 26.1 (trixie) and 28.5 (forky) unpack
into prefixes of their own (dockerd, the docker client); each runs with the containerd of its
suite (bookworm's is the system's 1.6; trixie's 1.7 and forky's 2.1 come from fetch above).

Podman 5.8 (forky; bookworm's system podman is 4.3, trixie's 5.4) links glibc 2.38+ and newer
gpgme, seccomp and subid libraries than bookworm has: they unpack beside it (forky's libc6,
libgpgme45, libassuan9, libgpg-error0, libseccomp2, libsubid6), and patchelf points podman and its
netavark at that loader with an RPATH of that library folder, so they run on bookworm with their
own glibc while every other program keeps the system's (conmon and runc are bookworm's).
"""
import fcntl
import glob
import os
import re
import shutil
import subprocess
import tempfile

CACHE_DIR = os.environ.get("CDI_SHIM_TEST_CACHE", "/var/cache/cdi-shim-tests")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
SYSTEM = "1.6"
# containerd minor version -> the Debian suite that serves it
SUITES = {"1.7": "trixie", "2.1": "forky"}
VERSIONS = (SYSTEM,) + tuple(SUITES)
# Docker major.minor -> (the Debian suite that serves docker.io, the containerd it runs with)
DOCKER_SUITES = {"20.10": ("bookworm", SYSTEM), "26.1": ("trixie", "1.7"), "28.5": ("forky", "2.1")}
# the packages of its daemon and client (from trixie on the client is a package of its own)
DOCKER_PACKAGES = {"20.10": ("docker.io",), "26.1": ("docker.io", "docker-cli"), "28.5": ("docker.io", "docker-cli")}
DOCKER_VERSIONS = tuple(DOCKER_SUITES)
# podman major.minor -> the Debian suite that serves it (4.3 is bookworm's own, /usr/bin/podman)
PODMAN_SUITES = {"5.8": "forky"}
PODMAN_PACKAGES = ("podman", "netavark", "libc6", "libgpgme45", "libassuan9", "libgpg-error0", "libseccomp2",
                   "libsubid6")
SYSTEM_PODMAN = "4.3"
PODMAN_VERSIONS = (SYSTEM_PODMAN,) + tuple(PODMAN_SUITES)
TIMEOUT = 600


class ReleaseError(Exception):
    pass


def apt_mirror():
    """The Debian mirror this machine's apt uses (``$CDI_SHIM_DEBIAN_MIRROR`` overrides)."""
    explicit = os.environ.get("CDI_SHIM_DEBIAN_MIRROR")
    if explicit:
        return explicit
    uris = []
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        try:
            text = open(path).read()
        except OSError:
            continue
        for stanza in re.split(r"\n\s*\n", text):
            fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
            if "deb" in fields.get("Types", "").split() and fields.get("Enabled", "yes") != "no":
                uris += [(uri, fields.get("Suites", "")) for uri in fields.get("URIs", "").split()]
    for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
        try:
            lines = open(path).read().splitlines()
        except OSError:
            continue
        for line in lines:
            match = re.match(r"^\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", line)
            if match:
                uris.append((match.group(1), match.group(2)))
    for uri, suites in uris:
        # the main archive, not debian-security (its suites are "<name>-security")
        if uri.startswith(("http://", "https://")) and not any(s.endswith("-security") for s in suites.split()):
            return uri.rstrip("/")
    return DEFAULT_MIRROR


def prefix_path(version, cache_dir=None):
    return os.path.join(cache_dir or CACHE_DIR, f"containerd-{version}-{SUITES[version]}")


def binaries(prefix):
    """{name: path} of the unpacked release."""
    return {name: os.path.join(prefix, "usr", "bin", name) for name in ("containerd", "ctr", "containerd-shim-runc-v2")}


def fetch(version, cache_dir=None, mirror=None, log=None):
    """The prefix holding containerd `version` ("1.7" or "2.1"), fetched and unpacked once."""
    if version not in SUITES:
        raise ReleaseError(f"no Debian suite known for containerd {version} (known: {', '.join(SUITES)})")
    return _fetch_package(("containerd",), SUITES[version], prefix_path(version, cache_dir),
                          binaries, mirror, log)


def docker_prefix_path(version, cache_dir=None):
    return os.path.join(cache_dir or CACHE_DIR, f"docker-{version}-{DOCKER_SUITES[version][0]}")


def docker_binaries(prefix):
    """{name: path} of an unpacked docker.io."""
    return {"dockerd": os.path.join(prefix, "usr", "sbin", "dockerd"),
            "docker": os.path.join(prefix, "usr", "bin", "docker")}


def fetch_docker(version, cache_dir=None, mirror=None, log=None):
    """The prefix holding Debian's docker.io `version` ("20.10", "26.1" or "28.5"), fetched once."""
    if version not in DOCKER_SUITES:
        raise ReleaseError(f"no Debian suite known for Docker {version} (known: {', '.join(DOCKER_SUITES)})")
    return _fetch_package(DOCKER_PACKAGES[version], DOCKER_SUITES[version][0], docker_prefix_path(version, cache_dir),
                          docker_binaries, mirror, log)


def podman_prefix_path(version, cache_dir=None):
    return os.path.join(cache_dir or CACHE_DIR, f"podman-{version}-{PODMAN_SUITES[version]}")


def podman_binaries(prefix):
    """{name: path} of an unpacked podman (netavark: its network backend, found through
    containers.conf's helper_binaries_dir)."""
    return {"podman": os.path.join(prefix, "usr", "bin", "podman"),
            "netavark": os.path.join(prefix, "usr", "lib", "podman", "netavark")}


def fetch_podman(version, cache_dir=None, mirror=None, log=None):
    """The prefix holding Debian's podman `version` ("5.8"), its own glibc beside it, fetched once."""
    if version not in PODMAN_SUITES:
        raise ReleaseError(f"no Debian suite known for podman {version} (known: {', '.join(PODMAN_SUITES)}; "
                           f"{SYSTEM_PODMAN} is bookworm's own: apt-get install podman)")
    return _fetch_package(PODMAN_PACKAGES, PODMAN_SUITES[version], podman_prefix_path(version, cache_dir),
                          podman_binaries, mirror, log, prepare=_own_glibc)


def _own_glibc(root, prefix):
    """Point the podman and netavark unpacked in ROOT (to become PREFIX) at PREFIX's loader, with
    RPATH (not RUNPATH: it serves their libraries' own dependencies too) PREFIX's library folder."""
    patchelf = shutil.which("patchelf")
    if patchelf is None:
        raise ReleaseError("patchelf not found: apt-get install patchelf (podman 5.8 runs with forky's glibc)")
    libdir = os.path.join(prefix, "usr", "lib", "x86_64-linux-gnu")
    for program in podman_binaries(root).values():
        _run([patchelf, "--set-interpreter", os.path.join(libdir, "ld-linux-x86-64.so.2"), "--force-rpath",
              "--set-rpath", libdir, program])


def _fetch_package(packages, suite, prefix, wanted, mirror, log, prepare=None):
    """PREFIX holding PACKAGES of Debian SUITE, unpacked once into it; WANTED(prefix) names the
    files that must be executable in it; PREPARE(root, prefix), when given, adjusts the unpacked
    tree ROOT before it is renamed to PREFIX."""
    if all(os.access(path, os.X_OK) for path in wanted(prefix).values()):
        return prefix
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise ReleaseError(f"{tool} not found: fetching {' '.join(packages)} of {suite} needs Debian's apt")
    parent = os.path.dirname(prefix)
    os.makedirs(parent, exist_ok=True)
    name = os.path.basename(prefix)
    with open(os.path.join(parent, f".{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test sessions fetch it once
        if all(os.access(path, os.X_OK) for path in wanted(prefix).values()):
            return prefix
        work = tempfile.mkdtemp(prefix=f".{name}.", dir=parent)
        try:
            debs = _download(work, suite, mirror or apt_mirror(), log, packages)
            root = os.path.join(work, "root")
            for deb in debs:
                _run(["dpkg-deb", "-x", deb, root])
            missing = [p for p in wanted(root).values() if not os.access(p, os.X_OK)]
            if missing:
                raise ReleaseError(f"{', '.join(map(os.path.basename, debs))} have no {', '.join(missing)}")
            if prepare:
                prepare(root, prefix)
            shutil.rmtree(prefix, ignore_errors=True)
            os.rename(root, prefix)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return prefix


def _download(work, suite, mirror, log, packages):
    lists, cache, dl = (os.path.join(work, d) for d in ("lists", "cache", "dl"))
    for directory in (os.path.join(lists, "partial"), os.path.join(cache, "archives", "partial"), dl):
        os.makedirs(directory)
    sources = os.path.join(work, "sources.list")
    signed = f"[signed-by={KEYRING}] " if os.path.exists(KEYRING) else ""
    with open(sources, "w") as stream:
        stream.write(f"deb {signed}{mirror} {suite} main\n")
    options = ["-o", f"Dir::Etc::sourcelist={sources}", "-o", "Dir::Etc::sourceparts=-",
               "-o", f"Dir::State::Lists={lists}", "-o", f"Dir::Cache={cache}",
               "-o", "Dir::State::status=/dev/null", "-o", "APT::Sandbox::User=root"]
    if log:
        log(f"fetching {' '.join(packages)} from {mirror} {suite} (apt-get download, once; kept in "
            f"{os.path.dirname(work)})")
    _run(["apt-get", "-qq"] + options + ["update"])
    _run(["apt-get", "-qq"] + options + ["download", *packages], cwd=dl)
    debs = []
    for package in packages:
        found = glob.glob(os.path.join(dl, f"{package}_*.deb"))
        if len(found) != 1:
            raise ReleaseError(f"apt-get download {package} ({suite}) gave {found or 'nothing'}")
        debs += found
    return debs


def _run(command, cwd=None):
    try:
        out = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ReleaseError(f"{command[0]} failed: {err}") from None
    if out.returncode != 0:
        lines = [line for line in (out.stderr or out.stdout).strip().splitlines() if line.strip()]
        last = lines[-1] if lines else out.returncode
        raise ReleaseError(f"{' '.join(command[:2])} ... {command[-1]} failed: {last}")
    return out
