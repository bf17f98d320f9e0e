"""A device's library mounts bound by our C hook, not by runc (shim/linker/filebinds.py,
`cdi-shim-nshook binds`).

A config as containerd's own CDI leaves it for a toolkit spec: sixteen gcc-built driver libraries (filebinds.MIN_BINDS)
mounted with the toolkit's options (ro, nosuid, nodev, rbind, rprivate), one other file mount,
and the update-ldcache hook of /usr/bin/nvidia-cdi-hook (absent here). Through cdi-shim-runtime
the library mounts leave config.json for one `cdi-shim-nshook binds` hook; what the container
sees -- each file's bytes and its mount's options and propagation in /proc/self/mountinfo -- is
what plain runc gives for the same mounts. Hostile images: a library directory that is a link
out of the root (the files land inside it; the host directory is never made), a FIFO at a
library's path (left to runc, which binds over it without opening it), a read-only rootfs.
"""
import json
import os
import shlex
import shutil
import stat
import subprocess

import pytest

import runtime_helpers as rh
from cdi_shim_lab.images import build_driver_libraries
from test_runtime_toolkit_hooks import sanitized_nshook

RESIDENT_TOO = True
LIBDIR = "/usr/lib/x86_64-linux-gnu"
OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
COUNT = 16
UPDATE_LDCACHE = {"path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", LIBDIR],
                  "env": ["NVIDIA_CTK_DEBUG=false"]}


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("driver"))
    return build_driver_libraries(directory, COUNT, rh.need("gcc", "gcc"), "550.54.15")


def _script(names):
    """Each library's md5 and the mountinfo of every mount under LIBDIR and at /opt/info:
    (root in its filesystem, mount point, per-mount options, propagation fields)."""
    sums = "; ".join(f"/bin/busybox md5sum {LIBDIR}/{name}" for name in names)
    return (f"{sums}; /bin/busybox md5sum /opt/info; "
            "while read id parent dev root point options rest; do case $point in "
            f"{LIBDIR}/*|/opt/info) echo \"mount $root $point $options ${{rest%% - *}}\";; esac; "
            "done < /proc/self/mountinfo")


def _bundle(world, libraries, tmp_path, readonly=False, edit_rootfs=None, more=()):
    info = tmp_path / "info"
    info.write_text("not a library\n")
    mounts = [{"destination": f"{LIBDIR}/{os.path.basename(path)}", "type": "bind", "source": path,
               "options": list(OPTIONS)} for path in libraries]
    mounts += [{"destination": destination, "type": "bind", "source": source, "options": list(OPTIONS)}
               for source, destination in more]
    mounts.append({"destination": "/opt/info", "type": "bind", "source": str(info), "options": ["ro", "rbind"]})

    def edit(config):
        config["root"]["readonly"] = readonly
        config["hooks"] = {"createContainer": [dict(UPDATE_LDCACHE)]}

    bundle = world.bundle(args=["sh", "-c", _script([os.path.basename(p) for p in libraries])], mounts=mounts,
                          edit=edit)
    if edit_rootfs:
        edit_rootfs(bundle.rootfs)
    return bundle


def _runc_twin(world, bundle):
    """The same container for plain runc: a copy of the bundle without the hook (runc would
    fail on its missing program)."""
    twin = os.path.join(world.base, "bundles", bundle.id + "-runc")
    shutil.copytree(bundle.path, twin, symlinks=True)
    config = bundle.config()
    config["root"]["path"] = os.path.join(twin, "rootfs")
    config.pop("hooks")
    with open(os.path.join(twin, "config.json"), "w") as out:
        json.dump(config, out)
    return twin


def _seen(stdout):
    return sorted(line for line in stdout.splitlines() if line.strip())


def test_library_mounts_bound_by_our_hook_look_as_runc_makes_them(world, libraries, tmp_path):
    bundle = _bundle(world, libraries, tmp_path, readonly=True)
    twin = _runc_twin(world, bundle)
    plain = world.runc_cmd("run", "--bundle", twin, bundle.id + "-runc")
    assert plain.returncode == 0, plain.stderr

    ours = world.shim("run", "--bundle", bundle.path, bundle.id)
    assert ours.returncode == 0, ours.stderr
    assert _seen(ours.stdout) == _seen(plain.stdout)
    assert sum(line.startswith("mount ") for line in ours.stdout.splitlines()) == COUNT + 1
    assert all(" ro,nosuid,nodev," in line for line in ours.stdout.splitlines() if "libnvidia-bench" in line
               and line.startswith("mount ")), ours.stdout

    config = bundle.config()
    destinations = [m["destination"] for m in config["mounts"]]
    assert not any(d.startswith(LIBDIR) for d in destinations) and "/opt/info" in destinations
    # (a read-only root: the cache is in the /etc overlay, no file of ours to bind)
    assert "/etc/ld.so.cache" not in destinations and "/etc" in destinations
    hook = config["hooks"]["createContainer"][0]
    assert hook["args"][:4] == ["cdi-shim-nshook", "binds", "--rootfs", bundle.rootfs]
    assert hook["args"].count("--bind") == COUNT
    assert ["--bind", libraries[0], f"{LIBDIR}/{os.path.basename(libraries[0])}", ",".join(OPTIONS)] \
        == hook["args"][4:8]
    assert not any("nvidia-cdi-hook" in json.dumps(h) for h in config["hooks"]["createContainer"])


@pytest.mark.parametrize("leads", ["inside", "nowhere"])
def test_a_library_directory_linked_out_of_the_root_is_followed_inside_it(world, libraries, tmp_path, leads):
    """The image's library directory is a link to an absolute host path. Where that path is a
    directory inside the root, the hook binds there; where it leads nowhere, runc makes it
    (inside the root) and binds, as it would without us. The host path is never made."""
    outside = str(tmp_path / "host-libdir")

    def link_out(rootfs):
        os.makedirs(rootfs + "/usr/lib")
        os.symlink(outside, rootfs + LIBDIR)
        if leads == "inside":
            os.makedirs(rootfs + outside)

    bundle = _bundle(world, libraries, tmp_path, edit_rootfs=link_out)
    run = world.shim("run", "--bundle", bundle.path, bundle.id)
    assert run.returncode == 0, run.stderr
    assert not os.path.exists(outside), "a bind target was made outside the root"
    inside = bundle.rootfs + outside
    assert sorted(n for n in os.listdir(inside) if not os.path.islink(os.path.join(inside, n))) \
        == sorted(os.path.basename(p) for p in libraries)
    # (and the soname links the spec's update-ldcache makes beside them, where the directory is
    # there before runc: one only runc's mount makes gets none, and the cache names the files)
    made = {n: os.readlink(os.path.join(inside, n))
            for n in os.listdir(inside) if os.path.islink(os.path.join(inside, n))}
    assert made == ({os.path.basename(p).split(".so.")[0] + ".so.1": os.path.basename(p) for p in libraries}
            if leads == "inside" else {})
    config = bundle.config()
    if leads == "inside":
        assert config["hooks"]["createContainer"][0]["args"].count("--bind") == COUNT
    else:       # (too few to pay for the hook: runc binds them)
        assert not config.get("hooks")
        assert len([m for m in config["mounts"] if m["destination"].startswith(LIBDIR)]) == COUNT
    sums = [line.split()[0] for line in run.stdout.splitlines() if "libnvidia-bench" in line
            and not line.startswith("mount ")]
    assert len(sums) == COUNT and len(set(sums)) == COUNT


def test_a_fifo_at_a_library_path_is_left_to_runc(world, libraries, tmp_path):
    first = f"{LIBDIR}/{os.path.basename(libraries[0])}"

    def fifo(rootfs):
        os.makedirs(rootfs + LIBDIR)
        os.mkfifo(rootfs + first)

    # (one library more, mounted twice: fifteen others are too few to pay for the hook)
    extra = f"{LIBDIR}/libnvidia-extra.so.1"
    bundle = _bundle(world, libraries, tmp_path, edit_rootfs=fifo, more=[(libraries[1], extra)])
    run = world.shim("run", "--bundle", bundle.path, bundle.id)
    assert run.returncode == 0, run.stderr
    config = bundle.config()
    assert first in [m["destination"] for m in config["mounts"]]      # runc binds it, over the FIFO
    args = config["hooks"]["createContainer"][0]["args"]
    assert first not in args and args.count("--bind") == COUNT and extra in args    # the others
    assert any(line.endswith(first) and not line.startswith("mount ") for line in run.stdout.splitlines())


def _nshook_binds(rootfs, *binds, show="", extra=()):
    """`cdi-shim-nshook binds` (then EXTRA arguments) in a private mount namespace; then SHOW (a
    shell line) in it."""
    hook = os.path.join(rh.VENV_BIN, "cdi-shim-nshook")
    args = " ".join([f"--bind {shlex.quote(s)} {shlex.quote(d)} {shlex.quote(o)}" for s, d, o in binds]
                    + [shlex.quote(arg) for arg in extra])
    line = f"{hook} binds --rootfs {shlex.quote(str(rootfs))} {args} </dev/null; echo rc=$?; {show}"
    return subprocess.run([rh.need("unshare", "util-linux"), "-m", "--propagation", "private", "sh", "-c", line],
                          capture_output=True, text=True, timeout=30)


def test_nshook_binds_resolves_inside_the_root_and_never_opens_what_it_binds_over(tmp_path):
    rootfs, host = tmp_path / "rootfs", tmp_path / "host"
    (rootfs / "usr/lib").mkdir(parents=True)
    host.mkdir()
    source = tmp_path / "libfake.so.1"
    source.write_text("fake\n")
    os.mkfifo(rootfs / "usr/lib/fifo.so.1")                     # bound over, never opened: no hang
    os.symlink(str(host), rootfs / "usr/lib/out")               # a host path: resolved inside the root
    (rootfs / str(host).lstrip("/")).mkdir(parents=True)
    os.symlink("/usr/lib", rootfs / "lib")                      # absolute: the root's /usr/lib
    binds = [(str(source), "/usr/lib/fifo.so.1", "ro,nosuid,nodev,rbind,rprivate"),
             (str(source), "/usr/lib/out/libfake.so.1", "bind,ro"),
             (str(source), "/lib/new/deeper/libfake.so.1", "bind")]
    run = _nshook_binds(rootfs, *binds, show=f"cat {rootfs}/usr/lib/fifo.so.1 {rootfs}{host}/libfake.so.1 "
                        f"{rootfs}/usr/lib/new/deeper/libfake.so.1; grep -c {rootfs} /proc/self/mountinfo")
    assert run.stdout.split() == ["rc=0", "fake", "fake", "fake", "3"], (run.stdout, run.stderr)
    assert os.listdir(host) == []
    assert stat.S_ISFIFO(os.lstat(rootfs / "usr/lib/fifo.so.1").st_mode)
    assert oct(os.stat(rootfs / "usr/lib/new/deeper").st_mode & 0o777) == "0o755"


def test_nshook_binds_makes_the_links_folded_into_it(tmp_path):
    """A node with DRM devices: the /dev/dri/by-path links of our symlinks hook, made by the binds
    hook after its binds (one hook start, not two); a link leading out of the root is refused."""
    rootfs, host = tmp_path / "rootfs", tmp_path / "host"
    (rootfs / "usr/lib").mkdir(parents=True)
    (rootfs / "dev").mkdir()
    host.mkdir()
    os.symlink(str(host), rootfs / "dev" / "out")
    source = tmp_path / "libfake.so.1"
    source.write_text("fake\n")
    bind = (str(source), "/usr/lib/libfake.so.1", "ro,bind")
    run = _nshook_binds(rootfs, bind, extra=["--link", "../card1::/dev/dri/by-path/pci-0000:3b:00.0-card"],
                        show=f"cat {rootfs}/usr/lib/libfake.so.1")
    assert run.stdout.split() == ["rc=0", "fake"], (run.stdout, run.stderr)
    assert os.readlink(rootfs / "dev/dri/by-path/pci-0000:3b:00.0-card") == "../card1"
    run = _nshook_binds(rootfs, bind, extra=["--link", "x::/dev/out/escape"])
    assert run.stdout.split() == ["rc=1"]
    assert "Error: symlinks: cannot open the directory of /dev/out/escape" in run.stderr
    assert os.listdir(host) == []


@pytest.mark.parametrize("dest, options, says", [
    ("/usr/lib", "bind,ro", "is a directory: a file cannot be bound over it"),
    ("/usr/lib/gone/libfake.so.1", "bind", "cannot make the directory of /usr/lib/gone/libfake.so.1"),
    ("/usr/lib/libfake.so.1", "ro,nosuid", "malformed --bind"),                     # no bind
    ("/usr/lib/libfake.so.1", "bind,shared", "malformed --bind"),
    ("/usr/lib/libfake.so.1", "bind,rprivate,rslave", "malformed --bind"),
    ("/usr/lib/../etc/libfake.so.1", "bind", "malformed --bind"),
    ("usr/lib/libfake.so.1", "bind", "malformed --bind"),
])
def test_nshook_binds_refusals(tmp_path, dest, options, says):
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr/lib").mkdir(parents=True)
    os.symlink("/nowhere", rootfs / "usr/lib/gone")             # a link that leads nowhere: not followed
    source = tmp_path / "libfake.so.1"
    source.write_text("fake\n")
    run = _nshook_binds(rootfs, (str(source), dest, options), show=f"grep -c {rootfs} /proc/self/mountinfo")
    assert run.stdout.split() == ["rc=1", "0"], (run.stdout, run.stderr)
    assert "Error: binds: " in run.stderr and says in run.stderr, run.stderr
    assert not os.path.exists("/nowhere")


def test_nshook_binds_usage():
    hook = os.path.join(rh.VENV_BIN, "cdi-shim-nshook")
    for args in (["binds"], ["binds", "--rootfs", "/"], ["binds", "--rootfs", "/", "--bind", "/a", "/b"],
                 ["binds", "--rootfs", "/", "--link", "a::/b"], ["binds", "--rootfs", "/", "--params", "/p"],
                 ["binds", "--rootfs", "/", "--bind", "/a", "/b", "bind", "--params", "relative"],
                 ["binds", "--rootfs", "/", "--bind", "/a", "/b", "bind", "--params", "/p", "--params", "/q"]):
        run = subprocess.run([hook, *args], capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
        assert run.returncode == 2 and "cdi-shim-nshook binds [--rootfs DIR] --bind SOURCE DEST OPTIONS" in run.stderr


def test_nshook_binds_under_asan_and_ubsan(tmp_path):
    """The binds command built with gcc's sanitizers: good binds, every refusal, a long list."""
    binary = sanitized_nshook(tmp_path)
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr/lib").mkdir(parents=True)
    source = tmp_path / "libfake.so.1"
    source.write_text("fake\n")
    many = " ".join(f"--bind {source} /usr/lib/x/libfake{i}.so.1 ro,nosuid,nodev,rbind,rprivate" for i in range(300))
    cases = [(many, 0), (f"--bind {source} /usr/lib bind", 1), (f"--bind {source} /usr/lib/a ,,bind,", 1),
             (f"--bind {source} /usr/lib/b bind,", 0), (f"--bind {source} /usr/lib/c " + "ro," * 5000 + "x", 1),
             (f"--bind {source} /" + "d/" * 3000 + "e bind", 1), (f"--bind {source} / bind", 1)]
    for args, expected in cases:
        line = f"{binary} binds --rootfs {rootfs} {args} </dev/null; echo rc=$?"
        run = subprocess.run([rh.need("unshare", "util-linux"), "-m", "--propagation", "private", "sh", "-c", line],
                             capture_output=True, text=True, timeout=120)
        assert run.stdout.split() == [f"rc={expected}"], (args[:80], run.stdout, run.stderr[-2000:])
        assert "Sanitizer" not in run.stderr and "runtime error" not in run.stderr, run.stderr[-2000:]
