"""A read-only root stays read-only under /etc (issue 43, findings 1 and 6).

The spec's update-ldcache work for a read-only root is shown through an overlay of the image's
/etc whose top layer is a folder of ours in the bundle: a read-only overlay (no upper folder),
so the container writes nothing into /etc -- not /etc/ld.so.preload, not a 64 MiB file -- as
under plain runc, and nothing it writes lands in the bundle. A later ldconfig fails there, as it
does under the toolkit's hook. Each test runs real runc, per-create interpreter and resident
(RESIDENT_TOO), and the replays (the front end's, the worker's memo) give the same result.
"""
import json
import os
import shutil
import subprocess

import pytest

import runtime_helpers as rh
from test_front_end_replay import Image, result
from test_runtime_toolkit_hooks import _absent_params, _image, preinject, toolkit_spec

RESIDENT_TOO = True

# The attack: writes into /etc of a read-only root, then the program (the cache must serve it)
# and a later ldconfig (it fails, as under the toolkit's hook).
ATTACK = ("echo /evil.so > /etc/ld.so.preload; echo preload=$?; "
          "dd if=/dev/zero of=/etc/big bs=1048576 count=64 2>/dev/null; echo big=$?; "
          "mkdir /etc/new; echo mkdir=$?; rm -f /etc/ld.so.conf.d/zz-nvcr-cdi-shim.conf; echo rm=$?; "
          "/prog; /sbin/ldconfig 2>/dev/null; echo ldconfig=$?; echo $(ls /etc/ld.so.conf.d)")


def _readonly(config):
    config["root"]["readonly"] = True


def _bundle_files(bundle):
    """Every path under the bundle but config.json and the rootfs."""
    found = []
    for top, dirs, files in os.walk(bundle.path):
        if top == bundle.path:
            dirs[:] = [d for d in dirs if d != "rootfs"]
        found += [os.path.relpath(os.path.join(top, name), bundle.path) for name in dirs + files]
    return sorted(found)


def _check_refused(result, bundle, rootfs_etc_before):
    lines = result.stdout.splitlines()
    assert lines[:4] == ["preload=1", "big=1", "mkdir=1", "rm=1"], result.stdout
    assert lines[4] == "linked=42 cuda=550", result.stdout       # the cache serves the program
    assert lines[5] == "ldconfig=1", result.stdout                # as under the toolkit's hook
    assert {"00-nvcr-cdi-shim.conf", "zz-nvcr-cdi-shim.conf"} <= set(lines[6].split()), result.stdout
    files = _bundle_files(bundle)
    assert not [f for f in files if f.endswith(("ld.so.preload", "big", "new"))], files
    assert not [f for f in files if f.startswith("cdi-shim.etc/upper") or f.startswith("cdi-shim.etc/work")], files
    assert sorted(os.listdir(bundle.rootfs + "/etc")) == rootfs_etc_before, "the image's /etc was written"
    overlay = [m for m in bundle.config()["mounts"] if m["destination"] == "/etc"]
    assert len(overlay) == 1 and "ro" in overlay[0]["options"], overlay
    assert not [o for o in overlay[0]["options"] if o.startswith(("upperdir=", "workdir="))], overlay


def test_plain_runc_refuses_writes_into_a_read_only_root_s_etc(world, tmp_path):
    """The control: plain runc, a read-only root, the same writes all refused."""
    bundle = world.bundle(args=["sh", "-c", ATTACK.split("; /prog")[0]], edit=_readonly)
    os.makedirs(bundle.rootfs + "/etc/ld.so.conf.d", exist_ok=True)
    open(bundle.rootfs + "/etc/ld.so.conf.d/zz-nvcr-cdi-shim.conf", "w").close()
    result = world.runc_cmd("run", "--bundle", bundle.path, bundle.id)
    assert result.stdout.splitlines() == ["preload=1", "big=1", "mkdir=1", "rm=1"], result.stdout


@pytest.mark.parametrize("how", ["preinjected", "annotation"])
def test_a_read_only_root_s_etc_stays_read_only(world, driver, tmp_path, how):
    """Finding 1: a read-only root and a toolkit spec (update-ldcache): the container cannot
    write /etc/ld.so.preload nor a 64 MiB file into /etc, nor make or remove anything there;
    nothing lands in the bundle; the program still finds the driver libraries and the drop-ins
    are there, and a later ldconfig fails as under the toolkit's hook."""
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(world, driver))
    bundle = world.bundle(args=["sh", "-c", ATTACK], edit=_readonly)
    rootfs = _image(bundle, driver, str(tmp_path), compat=False)
    os.makedirs(rootfs + "/sbin", exist_ok=True)
    shutil.copy2(rh.need("ldconfig", "libc-bin"), rootfs + "/sbin/ldconfig")     # (static)
    before = sorted(os.listdir(rootfs + "/etc"))
    if how == "preinjected":
        preinject(world, bundle)
    else:
        config = bundle.config()
        config["annotations"] = {"cdi.k8s.io/test": "nvidia.com/gpu=0"}
        with open(bundle.config_path, "w") as out:
            json.dump(config, out)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
    assert result.returncode == 0, result.stderr
    _check_refused(result, bundle, before)


def _layer(bundle):
    """{path: (bytes or None for a folder, mode, owner)} of our layer in the bundle."""
    top = os.path.join(bundle.path, "cdi-shim.etc", "files")
    found = {}
    for at, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(at, name)
            st = os.lstat(path)
            data = None if name in dirs else open(path, "rb").read()
            found[os.path.relpath(path, top)] = (data, st.st_mode, st.st_uid, st.st_gid)
    return found


@pytest.mark.own_resident
def test_every_way_gives_the_same_read_only_etc(world, driver, tmp_path):
    """Finding 1 through each replay: the worker, the front end's replay of its recipe
    (replay.c), the worker's memo and the Python step alone give the same read-only /etc, the
    same layer and config.json. The mounts under /etc that runc needs a mount point for -- a
    bind of a file at /etc/pod/hosts and a tmpfs at /etc/scratch, both missing in the image --
    find it in our layer (runc cannot make it in a read-only /etc). A bind there whose source
    became a folder is not replayed as a file's mount point: the worker does the step again."""
    made = Image(world, driver, tmp_path)
    try:
        os.makedirs(made.layer + "/sbin", exist_ok=True)
        shutil.copy2(rh.need("ldconfig", "libc-bin"), made.layer + "/sbin/ldconfig")     # (static)
        hosts = tmp_path / "hosts"
        hosts.write_text("127.0.0.1 pod\n")
        (tmp_path / "hosts-dir").mkdir()
        (tmp_path / "hosts-dir" / "inside").write_text("a folder\n")
        script = ATTACK + ("; cat /etc/pod/hosts 2>/dev/null || ls /etc/pod/hosts; "
                           "echo s > /etc/scratch/f; echo scratch=$?")
        before = sorted(os.listdir(made.layer + "/etc"))

        def change(source):
            def edit(config):
                config["root"]["readonly"] = True
                config["mounts"] += [
                    {"destination": "/etc/pod/hosts", "type": "bind", "source": source, "options": ["rbind", "ro"]},
                    {"destination": "/etc/scratch", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]}]
            return edit

        outputs, layers, configs = [], [], []
        for how, served in (("worker", 1), ("front end", 1), ("a folder now", 2), ("worker's memo", 3),
                            ("python", None)):
            if how == "worker's memo":
                shutil.rmtree(made.steps)
            if how == "python":
                world.resident_socket = os.path.join(world.base, "no-resident.sock")
                world.write_config(log_level="debug", log_file=made.log)
            source = str(tmp_path / ("hosts-dir" if how == "a folder now" else "hosts"))
            bundle = made.container(args=("sh", "-c", script), change=change(source))
            run = world.shim("run", "--bundle", bundle.path, bundle.id, env=made.env())
            assert run.returncode == 0, (how, run.stderr)
            if served is not None:
                assert made.served() == served, how
            _check_refused(run, bundle, before)
            lines = run.stdout.splitlines()
            if how == "a folder now":
                assert lines[7:] == ["inside", "scratch=0"], run.stdout
                assert _layer(bundle)["pod/hosts"][0] is None
                continue
            assert lines[7:] == ["127.0.0.1 pod", "scratch=0"], (how, run.stdout)
            outputs.append(run.stdout)
            layers.append(_layer(bundle))
            configs.append(result(bundle)[0])
        assert all(output == outputs[0] for output in outputs[1:]), outputs
        assert all(layer == layers[0] for layer in layers[1:]), layers
        assert all(config == configs[0] for config in configs[1:])
        # the mount points runc makes, as it makes them: a file for the file's bind, folders else
        assert layers[0]["pod/hosts"][:2] == (b"", 0o100644) and layers[0]["pod"][1] == 0o40755
        assert layers[0]["scratch"][1] == 0o40755
        assert [m for m in configs[0]["mounts"] if m["destination"] == "/etc"] == [{
            "destination": "/etc", "type": "overlay", "source": "overlay",
            "options": ["ro", "lowerdir=BUNDLE/cdi-shim.etc/files:ROOTFS/etc"]}]
    finally:
        made.close()


def _deep_tree(top, depth):
    """TOP with a chain of DEPTH folders below it (each made from its parent's descriptor: the
    path is far past PATH_MAX) and a file and a link at the bottom."""
    os.makedirs(top)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as out:
        out.write("left\n")
    os.symlink("/etc", "link", dir_fd=fd)
    os.close(fd)


def test_a_deep_tree_left_in_the_overlay_folder_is_removed(world, driver, tmp_path):
    """Finding 6: a tree 3,000 folders deep left in the bundle's /etc overlay folder (more than
    Python's recursion limit: shutil.rmtree raised RecursionError, an internal error) is
    removed, nothing below it followed, and the create makes the overlay as ever."""
    world.write_spec("nvidia-gpu.yaml", toolkit_spec(world, driver))
    bundle = world.bundle(args=["sh", "-c", ATTACK], edit=_readonly)
    rootfs = _image(bundle, driver, str(tmp_path), compat=False)
    os.makedirs(rootfs + "/sbin", exist_ok=True)
    shutil.copy2(rh.need("ldconfig", "libc-bin"), rootfs + "/sbin/ldconfig")     # (static)
    before = sorted(os.listdir(rootfs + "/etc"))
    _deep_tree(os.path.join(bundle.path, "cdi-shim.etc", "upper"), 3000)
    preinject(world, bundle)
    try:
        result = world.shim("run", "--bundle", bundle.path, bundle.id, env=world.env(**_absent_params(tmp_path)))
        left = sorted(os.listdir(os.path.join(bundle.path, "cdi-shim.etc")))
    finally:    # (pytest's own removal of old temp folders recurses too: leave it nothing deep)
        subprocess.run(["rm", "-rf", os.path.join(bundle.path, "cdi-shim.etc", "upper")], check=True)
    assert result.returncode == 0, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    _check_refused(result, bundle, before)
    assert left == ["files"]
    assert sorted(os.listdir(rootfs + "/etc")) == before     # (the link at the bottom not followed)


def test_remove_tree_takes_any_depth_and_follows_nothing(tmp_path):
    """etcfiles._remove_tree alone: a deep tree with links to a folder outside it goes, the
    folder outside is left whole; a file in place of the tree goes too; a missing one is no error."""
    from shim.linker.etcfiles import _remove_tree

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("kept\n")
    top = tmp_path / "tree"
    _deep_tree(str(top), 5000)
    os.symlink(str(outside), top / "to-outside")
    os.mkdir(top / "wide")
    for n in range(50):
        os.mkdir(top / "wide" / f".rm{n}")          # (names the removal also uses)
        os.symlink(str(outside), top / "wide" / f".rm{n}" / "link")
    try:
        _remove_tree(str(top))
        gone = not os.path.lexists(top)
    finally:    # (pytest's own removal of old temp folders recurses too: leave it nothing deep)
        subprocess.run(["rm", "-rf", str(top)], check=True)
    assert gone
    assert (outside / "keep").read_text() == "kept\n"
    (tmp_path / "file").write_text("x")
    _remove_tree(str(tmp_path / "file"))
    _remove_tree(str(tmp_path / "missing"))
    assert sorted(os.listdir(tmp_path)) == ["outside"]
