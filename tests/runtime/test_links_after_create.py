"""The device links of a create made after `runc create`, with no hook process
(csrc/frontend/after_create.c, the rule in csrc/engine/devlinks.c).

A spec's `cdi-shim-nshook symlinks` hook (the /dev/dri/by-path links of a GPU with DRM nodes)
makes its links in the /dev runc mounts. For a create with --pid-file, as every engine's shim
calls it, the front end takes the hook out of config.json, lets runc create the container and
makes the links in the created container's root before its process has run. The container
sees what the hook gives it (real runc, busybox's stat inside); a link that cannot be made
fails the create and leaves no container, as the hook's failure does; the rule that decides
is read through the engine, case by case."""
import json
import os
import stat
import subprocess

import pytest

import runtime_helpers as rh
from shim._native import ffi, lib

CARD_LINK = "../card1::/dev/dri/by-path/pci-0000:01:00.0-card"
RENDER_LINK = "../renderD128::/dev/dri/by-path/pci-0000:01:00.0-render"
PROBE = ("stat -c '%N %u %g %a %F' /dev/dri /dev/dri/card1 /dev/dri/renderD128 /dev/dri/by-path "
         "/dev/dri/by-path/*")
NSHOOK = os.path.join(os.path.dirname(rh.runtime()), "cdi-shim-nshook")
TOOLKIT_HOOK = "/usr/bin/nvidia-cdi-hook"     # (never run: the runtime makes the hook its own)


def _drm_spec(world, extra_mount="", extra_node="", program=NSHOOK):
    for minor in (1, 128):
        node = os.path.join(world.dev_dir, f"dri-{minor}")
        if not os.path.exists(node):
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(226, minor))
    world.write_spec("drm.yaml", f"""cdiVersion: "0.5.0"
kind: example.com/drm
devices:
  - name: card
    containerEdits:
      deviceNodes:
        - path: /dev/dri/card1
          hostPath: {world.dev_dir}/dri-1
        - path: /dev/dri/renderD128
          hostPath: {world.dev_dir}/dri-128
{extra_node}      hooks:
        - hookName: createContainer
          path: {program}
          args: [{os.path.basename(program)}, {"symlinks" if program == NSHOOK else "create-symlinks"},
                 --link, "{CARD_LINK}", --link, "{RENDER_LINK}"]
          env: [PATH=/usr/bin:/bin]
{extra_mount}""")


@pytest.fixture(params=["exec", "resident"])
def world(tmp_path, request):
    server = request.getfixturevalue("resident_server") if request.param == "resident" else None
    made = rh.World(tmp_path, resident=server)
    made.resident = server is not None
    yield made
    made.cleanup()


def _bundle(world, edit=None):
    return world.bundle(args=("sh", "-c", PROBE), annotations={"cdi.k8s.io/drm": "example.com/drm=card"}, edit=edit)


def _nshook_hooks(bundle):
    hooks = bundle.config().get("hooks", {}).get("createContainer", [])
    return [h for h in hooks if h["path"] in (NSHOOK, TOOLKIT_HOOK)]


def _create_and_start(world, bundle, pid_file=True):
    """create (with --pid-file unless told), start, wait: the container's output."""
    with open(os.path.join(world.base, bundle.id + ".out"), "w+") as out:
        pid = ["--pid-file", os.path.join(bundle.path, "init.pid")] if pid_file else []
        done = world.shim("create", *pid, "--bundle", bundle.path, bundle.id, stdout=out)
        assert done.returncode == 0, done.stderr
        hooks = _nshook_hooks(bundle)
        assert world.runc_cmd("start", bundle.id).returncode == 0
        world.wait_stopped(bundle.id)
        out.seek(0)
        return out.read(), hooks


def test_the_container_sees_the_links_the_hook_makes(world):
    _drm_spec(world)
    first = _bundle(world)
    run = world.shim("run", "--bundle", first.path, first.id)
    assert run.returncode == 0, run.stderr
    assert len(_nshook_hooks(first)) == 1                       # run: runc runs the hook
    seen = run.stdout
    assert "'/dev/dri/by-path/pci-0000:01:00.0-card' -> '../card1' 0 0 777 symbolic link" in seen, seen
    assert "/dev/dri/by-path 0 0 755 directory" in seen, seen
    # twice: the worker's create, then (with the resident process) the front end's replay
    for _ in range(2):
        output, hooks = _create_and_start(world, _bundle(world))
        assert output == seen
        # with the resident process the front end execs runc and makes the links; without it
        # Python execs runc, which runs the hook
        assert hooks == ([] if world.resident else _nshook_hooks(first))
    output, hooks = _create_and_start(world, _bundle(world), pid_file=False)
    assert output == seen and len(hooks) == 1                   # no --pid-file: the hook stays


def test_a_config_with_the_hook_and_nothing_else_for_us(world):
    """containerd's own CDI hands over the edits and the hook: the front end passes the create
    to runc, and still makes the links itself."""
    _drm_spec(world)
    first = _bundle(world)
    assert world.shim("run", "--bundle", first.path, first.id).returncode == 0
    injected = first.config()
    injected["process"]["args"] = ["sh", "-c", PROBE]

    def as_injected(config):
        config.update({key: injected[key] for key in ("hooks", "mounts")})
        config["linux"]["devices"] = injected["linux"]["devices"]
        config["linux"]["resources"] = injected["linux"]["resources"]
        config.pop("annotations", None)
    seen = None
    for pid_file in (False, True):
        bundle = world.bundle(args=("sh", "-c", PROBE), edit=as_injected)
        output, hooks = _create_and_start(world, bundle, pid_file=pid_file)
        assert len(hooks) == (0 if pid_file else 1)
        assert "-> '../renderD128' 0 0 777 symbolic link" in output, output
        seen = seen or output
        assert output == seen


def test_the_toolkit_s_hook_in_a_bundle_with_a_relative_root(world):
    """The toolkit's create-symlinks hook becomes `cdi-shim-nshook symlinks --rootfs ROOT`, ROOT
    resolved; containerd's root.path is relative to the bundle: still the same root."""
    _drm_spec(world, program=TOOLKIT_HOOK)

    def relative(config):
        config["root"]["path"] = "rootfs"
    first = _bundle(world, edit=relative)
    run = world.shim("run", "--bundle", first.path, first.id)
    assert run.returncode == 0, run.stderr
    (hook,) = _nshook_hooks(first)
    assert hook["path"] == NSHOOK and "--rootfs" in hook["args"]
    for _ in range(2):
        output, hooks = _create_and_start(world, _bundle(world, edit=relative))
        assert output == run.stdout
        assert [h["path"] for h in hooks] == ([] if world.resident else [NSHOOK])


def test_a_link_that_cannot_be_made_fails_the_create_and_leaves_no_container(world):
    """A directory where a link goes (runc made it for a device node under it): the hook fails
    the create under runc, and so does the front end, naming the link, with nothing left."""
    _drm_spec(world, extra_node=f"""        - path: {CARD_LINK.partition('::')[2]}/node
          hostPath: {world.dev_dir}/nvidia0
""")
    hooked = _bundle(world)
    run = world.shim("run", "--bundle", hooked.path, hooked.id)
    assert run.returncode != 0 and "is a directory" in run.stderr.lower(), run.stderr
    for _ in range(2):
        bundle = _bundle(world)
        done = world.shim("create", "--pid-file", os.path.join(bundle.path, "init.pid"), "--bundle", bundle.path,
                          bundle.id)
        assert done.returncode != 0
        assert "/dev/dri/by-path/pci-0000:01:00.0-card" in done.stderr and "Is a directory" in done.stderr, \
            done.stderr
        assert world.state(bundle.id) is None                       # deleted


@pytest.mark.parametrize("where", ["/dev/dri/by-path", "/dev//dri/by-path", "/dev/dri/./by-path",
                                   "/dev/dri/by-path/"])
def test_a_read_only_tmpfs_where_the_links_go_keeps_the_hook(world, where):
    """runc makes a read-only tmpfs read-only only after its hooks, so the hook's links are made
    in it: the front end leaves such a create to the hook, however the mount's path is spelled
    (runc cleans it: issue 43, finding 4)."""
    _drm_spec(world, extra_mount=("      mounts:\n        - hostPath: tmpfs\n"
                                  f"          containerPath: {where}\n"
                                  "          type: tmpfs\n          options: [ro, nosuid]\n"))
    first = _bundle(world)
    run = world.shim("run", "--bundle", first.path, first.id)
    assert run.returncode == 0, run.stderr
    output, hooks = _create_and_start(world, _bundle(world))
    assert output == run.stdout and len(hooks) == 1
    assert "-> '../card1' 0 0 777 symbolic link" in output, output


def _injected_bundle(world, tag="c"):
    """A bundle whose config.json has the spec's edits and our links hook in it already (as
    containerd's own CDI hands it over): the front end passes the create to runc and makes the
    links itself, with or without the resident process."""
    _drm_spec(world)
    first = _bundle(world)
    assert world.shim("run", "--bundle", first.path, first.id).returncode == 0
    injected = first.config()

    def as_injected(config):
        config.update({key: injected[key] for key in ("hooks", "mounts")})
        config["linux"]["devices"] = injected["linux"]["devices"]
        config["linux"]["resources"] = injected["linux"]["resources"]
        config.pop("annotations", None)
    return lambda: world.bundle(args=("sh", "-c", PROBE), edit=as_injected, tag=tag)


@pytest.mark.parametrize("folder", ["writable by others", "sticky, writable by others", "another user's"])
def test_a_pid_file_in_a_folder_others_can_write_keeps_the_hook(world, folder):
    """Whoever can write the pid file's folder could name another process there, whose root the
    front end would make links in: the pid file is trusted only in a folder that nobody but
    root (or the caller) can write, as every engine's state folder is; elsewhere the hook makes
    the links (issue 43, finding 5)."""
    new_bundle = _injected_bundle(world)
    bundle = new_bundle()
    pids = os.path.join(world.base, "pids")
    os.makedirs(pids)
    os.chmod(pids, {"writable by others": 0o777, "sticky, writable by others": 0o1777}.get(folder, 0o755))
    if folder == "another user's":
        os.chown(pids, 1000, 1000)
    with open(os.path.join(world.base, bundle.id + ".out"), "w+") as out:
        done = world.shim("create", "--pid-file", os.path.join(pids, "init.pid"), "--bundle", bundle.path,
                          bundle.id, stdout=out)
        assert done.returncode == 0, done.stderr
        assert [h["path"] for h in _nshook_hooks(bundle)] == [NSHOOK]          # runc runs the hook
        assert world.runc_cmd("start", bundle.id).returncode == 0
        world.wait_stopped(bundle.id)
        out.seek(0)
        assert "-> '../card1' 0 0 777 symbolic link" in out.read()
    # the same bundle, its pid file in a private folder: no hook
    output, hooks = _create_and_start(world, new_bundle())
    assert hooks == [] and "-> '../card1' 0 0 777 symbolic link" in output, output


def test_a_pid_that_is_not_the_container_s_fails_the_create(world, tmp_path):
    """The pid file names another process once runc has written it (a runtime wrapper stands in
    for whoever rewrites it): /proc/PID/root is not the container's root, so no link is made
    there; the create fails, naming the PID, and leaves no container (issue 43, finding 5)."""
    new_bundle = _injected_bundle(world)
    decoy_root = rh.build_rootfs(str(tmp_path / "decoy"), world.busybox)
    decoy = subprocess.Popen(["chroot", decoy_root, "/bin/sleep", "60"])
    wrapper = os.path.join(world.base, "runc-wrapper")
    with open(wrapper, "w") as f:
        f.write(f"""#!/bin/sh
{world.runc} "$@" || exit $?
prev= pid_file= create=
for arg; do
    [ "$prev" = --pid-file ] && pid_file=$arg
    [ "$arg" = create ] && create=1
    prev=$arg
done
[ -n "$create" ] && [ -n "$pid_file" ] && echo {decoy.pid} > "$pid_file"
exit 0
""")
    os.chmod(wrapper, 0o755)
    world.write_config(runtime=wrapper)
    try:
        bundle = new_bundle()
        done = world.shim("create", "--pid-file", os.path.join(bundle.path, "init.pid"), "--bundle", bundle.path,
                          bundle.id)
        assert done.returncode != 0
        assert f"names PID {decoy.pid}, whose root is not the container's root" in done.stderr, done.stderr
        assert world.state(bundle.id) is None                       # deleted
        assert not os.path.lexists(os.path.join(decoy_root, "dev", "dri")), os.listdir(decoy_root + "/dev")
    finally:
        rh.kill_quietly(decoy)
        world.write_config()


def test_runc_s_help_before_the_create_makes_no_links_and_leaves_the_config(world):
    """`--help` among runc's global options: runc prints its help and creates nothing, so the
    create line the front end parsed is no create to make links for; config.json keeps its hook
    and nothing is reported."""
    bundle = _injected_bundle(world)()
    before = bundle.config()
    done = world.shim("--help", "create", "--pid-file", os.path.join(bundle.path, "init.pid"), "--bundle",
                      bundle.path, bundle.id)
    assert done.returncode == 0 and "USAGE" in done.stdout and done.stderr == "", done.stderr
    assert bundle.config() == before and world.state(bundle.id) is None


# -- the rule ------------------------------------------------------------------------------------

def _deferred(config, bundle):
    text = json.dumps(config).encode() if not isinstance(config, bytes) else config
    out = ffi.new("struct cds_deferred_links *")
    done = lib.cds_deferred_links(text, len(text), bundle.encode(), out)
    try:
        if done != 1:
            return done, None, None
        return done, ffi.buffer(out.config, out.config_len)[:], [ffi.string(out.link[i]).decode()
                                                                 for i in range(out.count)]
    finally:
        lib.cds_deferred_links_free(out)


@pytest.fixture
def bundle(tmp_path):
    """A bundle folder with its rootfs, and another folder beside it."""
    os.makedirs(tmp_path / "bundle" / "rootfs")
    os.makedirs(tmp_path / "elsewhere")
    return str(tmp_path / "bundle")


@pytest.fixture
def config(tmp_path, bundle):
    world = rh.World(tmp_path / "world")
    made = json.loads(json.dumps(world._template))
    made["root"] = {"path": "rootfs", "readonly": True}         # relative to the bundle, as containerd writes it
    made["hooks"] = {"createContainer": [{"path": NSHOOK, "args": ["cdi-shim-nshook", "symlinks", "--link",
                                                                   CARD_LINK, "--link", RENDER_LINK]}]}
    return made


def _without_hook(config):
    config = json.loads(json.dumps(config))
    config["hooks"]["createContainer"].pop()
    return config


def test_the_rule_takes_the_last_hook_out(config, bundle):
    done, text, links = _deferred(config, bundle)
    assert done == 1 and links == [CARD_LINK, RENDER_LINK]
    assert json.loads(text) == _without_hook(config)
    before = {"path": "/bin/true", "args": ["true"], "timeout": 5}
    config["hooks"]["createContainer"].insert(0, before)
    # --rootfs as the runtime writes it: the root resolved against the bundle
    config["hooks"]["createContainer"][-1]["args"][2:2] = ["--rootfs", bundle + "/./rootfs"]
    config["hooks"]["startContainer"] = [{"path": "/bin/true"}]
    config["hooks"]["createContainer"][-1]["env"] = ["PATH=/bin"]
    done, text, links = _deferred(config, bundle)
    assert done == 1 and links == [CARD_LINK, RENDER_LINK]
    assert json.loads(text) == _without_hook(config)             # the hook before it, as it was
    config["root"]["path"] = bundle + "/rootfs"
    assert _deferred(config, bundle)[0] == 1


def _change(config, how, bundle):
    hook = config["hooks"]["createContainer"][-1]
    dev = next(m for m in config["mounts"] if m["destination"] == "/dev")
    if how == "a hook after it":
        config["hooks"]["createContainer"].append({"path": "/bin/true"})
    elif how == "a user namespace":
        config["linux"]["namespaces"].append({"type": "user"})
    elif how == "a read-only /dev":
        dev["options"].append("ro")
    elif how == "/dev not a tmpfs":
        dev["type"] = "bind"
    elif how == "no /dev mount":
        config["mounts"].remove(dev)
    elif how == "a read-only path in /dev":
        config["linux"]["readonlyPaths"].append("/dev/dri")
    elif how == "a masked /dev":
        config["linux"]["maskedPaths"].append("/dev")
    elif how == "a link outside /dev":
        hook["args"] += ["--link", "libcuda.so.1::/usr/lib/libcuda.so"]
    elif how == "a mount above a link":
        config["mounts"].append({"destination": "/dev/dri/by-path", "type": "tmpfs", "source": "tmpfs"})
    elif how == "a mount at a link":
        config["mounts"].append({"destination": CARD_LINK.partition("::")[2], "type": "bind", "source": "/x"})
    elif how == "another rootfs":
        hook["args"] += ["--rootfs", os.path.join(os.path.dirname(bundle), "elsewhere")]
    elif how == "another option":
        hook["args"] += ["--mode", "755"]
    elif how == "a value missing":
        hook["args"].append("--link")
    elif how == "another command":
        hook["args"][1] = "chmod"
    elif how == "another program":
        hook["path"] = "/usr/bin/cdi-shim-nshook-not-there"
    elif how == "a program of another name":
        hook["path"] = "/bin/true"
    elif how == "another hook member":
        hook["annotations"] = {}
    elif how == "an escaped link":
        hook["args"][3] = CARD_LINK.replace("card1", "card\\u0031")
    # spelled as runc does not read them: runc cleans paths ("//" and "/./" collapsed)
    elif how in UNCLEAN_MOUNTS:
        config["mounts"].append({"destination": UNCLEAN_MOUNTS[how], "type": "tmpfs", "source": "tmpfs",
                                 "options": ["ro"]})
    elif how == "a masked //dev/dri":
        config["linux"]["maskedPaths"].append("//dev/dri")
    elif how == "a read-only /dev/./dri":
        config["linux"]["readonlyPaths"].append("/dev/./dri")
    elif how == "a read-only /":
        config["linux"]["readonlyPaths"].append("/")
    # a ".." is refused up front: the hook keeps the work
    elif how == "a masked path with ..":
        config["linux"]["maskedPaths"].append("/proc/../dev/dri")
    elif how == "a relative masked path":
        config["linux"]["maskedPaths"].append("dev/dri")
    elif how == "a link with a . part":
        hook["args"][3] = CARD_LINK.replace("/by-path/", "/./by-path/")
    elif how == "a link with a .. part":
        hook["args"][3] = CARD_LINK.replace("/by-path/", "/x/../by-path/")
    return config


UNCLEAN_MOUNTS = {"a mount above a link, spelled //": "/dev//dri/by-path",
                  "a mount above a link, spelled /./": "/dev/dri/./by-path",
                  "a mount above a link, spelled ///": "///dev///dri//",
                  "a read-only mount at //dev": "//dev",
                  "a read-only mount at /dev/": "/dev/",
                  "a mount with ..": "/dev/x/../dri/by-path",
                  "a mount with .. that climbs": "/../dev/dri",
                  "a relative mount": "dev/dri/by-path"}


@pytest.mark.parametrize("how", ["a hook after it", "a user namespace", "a read-only /dev", "/dev not a tmpfs",
                                 "no /dev mount", "a read-only path in /dev", "a masked /dev", "a link outside /dev",
                                 "a mount above a link", "a mount at a link",
                                 "another rootfs", "another option", "a value missing", "another command",
                                 "another program", "a program of another name", "another hook member",
                                 "an escaped link", *UNCLEAN_MOUNTS, "a masked //dev/dri", "a read-only /dev/./dri",
                                 "a read-only /", "a masked path with ..", "a relative masked path",
                                 "a link with a . part", "a link with a .. part"])
def test_the_rule_keeps_the_hook_where_the_container_could_tell(config, bundle, how):
    changed = _change(config, how, bundle)
    text = json.dumps(changed).replace("\\\\u0031", "\\u0031").encode()
    assert _deferred(text, bundle)[0] == 0


def test_the_rule_leaves_paths_and_mounts_that_only_begin_alike(config, bundle):
    config["linux"]["maskedPaths"].append("/devices")
    config["linux"]["readonlyPaths"].append("/device")
    config["mounts"].append({"destination": "/dev/dri/by-pat", "type": "tmpfs", "source": "tmpfs"})
    config["mounts"].append({"destination": "//dev//dri/by-pat/", "type": "tmpfs", "source": "tmpfs"})
    assert _deferred(config, bundle)[0] == 1


def test_the_rule_reads_paths_cleaned(config, bundle):
    """runc's /dev spelled "//dev/" is still the read-write /dev tmpfs; a link spelled with "//"
    is made where the hook makes it."""
    dev = next(m for m in config["mounts"] if m["destination"] == "/dev")
    dev["destination"] = "//dev/"
    hook = config["hooks"]["createContainer"][-1]
    hook["args"][3] = CARD_LINK.replace("/dri/", "//dri//")
    done, _, links = _deferred(config, bundle)
    assert done == 1 and links == [hook["args"][3], RENDER_LINK]


@pytest.mark.parametrize("how", ["private", "writable by others", "sticky, writable by others", "another user's",
                                 "sticky above", "writable above", "a link to a private one", "a link to a shared one",
                                 "another user's link", "missing", "a file", "relative, with .."])
def test_the_pid_file_folder_rule_is_safeio_s(tmp_path, how):
    """The front end's rule for the pid file's folder (cds_private_dir_problem) is
    cdi.safeio.private_dir_problem's, case by case, messages included."""
    from cdi.safeio import private_dir_problem

    base = tmp_path / "base"
    base.mkdir()
    folder = base / "pids"
    folder.mkdir()
    given = str(folder)
    if how in ("writable by others", "sticky, writable by others"):
        os.chmod(folder, 0o777 if how == "writable by others" else 0o1777)
    elif how == "another user's":
        os.chown(folder, 1000, 1000)
    elif how in ("sticky above", "writable above"):
        os.chmod(base, 0o1777 if how == "sticky above" else 0o777)
    elif how.startswith("a link to"):
        if how.endswith("shared one"):
            os.chmod(folder, 0o777)
        os.symlink("pids", base / "link")
        given = str(base / "link")
    elif how == "another user's link":
        os.symlink("pids", base / "link")
        os.lchown(base / "link", 1000, 1000)
        given = str(base / "link")
    elif how == "missing":
        given = str(base / "gone")
    elif how == "a file":
        (base / "file").write_text("")
        given = str(base / "file")
    elif how == "relative, with ..":
        given = os.path.relpath(str(folder) + "/../pids", os.getcwd())
    why = ffi.new("char[]", 4400)
    got = lib.cds_private_dir_problem(given.encode(), why, len(why))
    expected = private_dir_problem(given)
    assert (ffi.string(why).decode() if got else None) == expected
