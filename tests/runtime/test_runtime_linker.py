"""The runtime prepares the container's linker cache itself (issue 4, runtime part).

A glibc root (copied from this host) runs a program linked against a fake driver library,
libnvidia-ml.so.1, that the spec bind-mounts under its versioned file name, exactly as the
toolkit's generated specs do, with the toolkit's update-ldcache and create-symlinks hooks
pointing at an nvidia-cdi-hook that does not exist on this host. The program can only start if
our cache resolves the soname, and runc can only run the container if those hooks were
dropped (their binary is missing).
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

import runtime_helpers as rh

RESIDENT_TOO = True  # every test also through `cdi-shim runtime serve` (conftest.py)

VERSION = rh.DRIVER_VERSION
LIBDIR = "/usr/lib/x86_64-linux-gnu"
PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
int cdi_shim_fake(void);
int main(void) {
    void *handle = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    printf("linked=%d dlopen=%s\n", cdi_shim_fake(), handle ? "ok" : dlerror());
    return handle ? 0 : 1;
}
"""


def _glibc_rootfs(world, bundle, nvml_library, tmp_path):
    """Turn the bundle's busybox rootfs into a small glibc image with its own ld.so.cache."""
    rootfs = os.path.join(bundle.path, "rootfs")
    rh.glibc_image(rootfs, PROGRAM, str(nvml_library), str(tmp_path))
    subprocess.run([rh.need("ldconfig", "libc-bin"), "-r", rootfs], check=True, timeout=60)
    return rootfs


def _spec(world, nvml_library, readonly_link=None):
    fake_hook = "/usr/bin/nvidia-cdi-hook-absent-on-this-host"
    assert not os.path.exists(fake_hook)
    return (
        'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\n'
        "containerEdits:\n"
        "  mounts:\n"
        f"    - hostPath: {nvml_library}\n      containerPath: {LIBDIR}/{nvml_library.name}\n"
        "      options: [ro, nosuid, nodev, bind]\n"
        "  hooks:\n"
        f"    - hookName: createContainer\n      path: {fake_hook}\n"
        f"      args: [nvidia-cdi-hook, create-symlinks, --link, '{nvml_library.name}::{LIBDIR}/libnvidia-ml.so']\n"
        f"    - hookName: createContainer\n      path: {fake_hook}\n"
        f"      args: [nvidia-cdi-hook, update-ldcache, --folder, {LIBDIR}]\n"
        'devices:\n  - name: "0"\n    containerEdits:\n'
        f"      deviceNodes: [{{path: /dev/nvidia0, hostPath: {world.node(0)}}}]\n"
    )


@pytest.mark.parametrize("readonly", [False, True], ids=["rw-rootfs", "readonly-rootfs"])
def test_injected_library_resolves_by_soname_without_hooks(world, nvml_library, tmp_path, readonly):
    world.write_spec("nvidia-gpu.yaml", _spec(world, nvml_library))

    def edit(config):
        config["root"]["readonly"] = readonly

    bundle = world.bundle(args=["/prog"], env=["NVIDIA_VISIBLE_DEVICES=0"], edit=edit)
    rootfs = _glibc_rootfs(world, bundle, nvml_library, tmp_path)
    image_cache = open(rootfs + "/etc/ld.so.cache", "rb").read()

    result = world.shim("run", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "linked=42 dlopen=ok\n"

    config = bundle.config()
    assert not config.get("hooks", {}).get("createContainer"), "the replaced hooks must be gone"
    assert not [m for m in config["mounts"] if m["destination"] == "/etc/ld.so.cache"]
    overlay = [m for m in config["mounts"] if m["destination"] == "/etc"]
    layer = os.path.join(bundle.path, "cdi-shim.etc", "files")
    if readonly:
        # the image's /etc left as it was: the cache is in our layer of the read-only overlay, in the bundle
        assert open(rootfs + "/etc/ld.so.cache", "rb").read() == image_cache
        assert overlay and overlay[0]["type"] == "overlay"
        assert overlay[0]["options"] == ["ro", f"lowerdir={layer}:{rootfs}/etc"]
        assert open(layer + "/ld.so.cache", "rb").read() != image_cache
    else:
        # written where the hook's ldconfig writes it, in the root
        assert open(rootfs + "/etc/ld.so.cache", "rb").read() != image_cache
        assert not overlay and not os.path.exists(layer)
    assert os.readlink(rootfs + f"{LIBDIR}/libnvidia-ml.so") == nvml_library.name


def test_without_our_cache_the_program_cannot_start(world, nvml_library, tmp_path):
    """The control: the same edits applied by `cdi inject` (hooks removed) under plain runc."""
    world.write_spec("nvidia-gpu.yaml", _spec(world, nvml_library))
    bundle = world.bundle(args=["/prog"])
    _glibc_rootfs(world, bundle, nvml_library, tmp_path)
    edited = subprocess.run([os.path.join(rh.VENV_BIN, "cdi-shim"), "cdi", "inject", "--device", "nvidia.com/gpu=0",
                             os.path.join(bundle.path, "config.json")], env=world.env(),
                            capture_output=True, text=True, check=True).stdout
    config = json.loads(edited)
    config.pop("hooks", None)
    with open(os.path.join(bundle.path, "config.json"), "w") as out:
        json.dump(config, out)
    result = world.runc_cmd("run", "--bundle", bundle.path, bundle.id)
    assert result.returncode != 0
    assert "libnvidia-ml.so.1" in result.stdout + result.stderr


def test_linker_phase_is_logged(world, nvml_library, tmp_path):
    world.write_config(log_level="debug")
    world.write_spec("nvidia-gpu.yaml", _spec(world, nvml_library))
    bundle = world.bundle(args=["/prog"], annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
    _glibc_rootfs(world, bundle, nvml_library, tmp_path)
    log = os.path.join(bundle.path, "log.json")
    result = world.shim("--log", log, "--log-format", "json", "run", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    messages = [message for _, message in rh.read_log(log, "json")]
    assert any("phase=linker took=" in m for m in messages)
    assert any("linker cache:" in m and "entries" in m for m in messages)


# The hooks as a spec names them: `cdi-shim hook ...`, or the lean `cdi-shim-hook ...`.
HOOK_COMMANDS = {"cdi-shim hook": ("cdi-shim", ["hook"]), "cdi-shim-hook": ("cdi-shim-hook", [])}


def _hook_spec(world, nvml_library, hook_command="cdi-shim hook"):
    # An explicit env for each hook: without one, runc gives a hook the container's env.
    program, sub = HOOK_COMMANDS[hook_command]
    cdi_shim = os.path.join(rh.VENV_BIN, program)
    prefix = ", ".join([program] + sub)
    return (
        'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\n'
        "containerEdits:\n"
        "  mounts:\n"
        f"    - hostPath: {nvml_library}\n      containerPath: {LIBDIR}/{nvml_library.name}\n"
        "      options: [ro, nosuid, nodev, bind]\n"
        "  hooks:\n"
        f"    - hookName: createContainer\n      path: {cdi_shim}\n"
        f"      args: [{prefix}, create-symlinks, --link, '{nvml_library.name}::{LIBDIR}/libnvidia-ml.so']\n"
        "      env: [PATH=/usr/sbin:/usr/bin:/sbin:/bin]\n"
        f"    - hookName: createContainer\n      path: {cdi_shim}\n"
        f"      args: [{prefix}, update-ldcache, --folder, {LIBDIR}]\n"
        "      env: [PATH=/usr/sbin:/usr/bin:/sbin:/bin]\n"
        'devices:\n  - name: "0"\n    containerEdits:\n'
        f"      deviceNodes: [{{path: /dev/nvidia0, hostPath: {world.node(0)}}}]\n"
    )


@pytest.mark.parametrize("hook_command", list(HOOK_COMMANDS))
def test_our_hooks_under_plain_runc(world, nvml_library, tmp_path, hook_command):
    """Specs naming `cdi-shim hook ...` work with any runtime: here runc runs the hooks."""
    world.write_spec("nvidia-gpu.yaml", _hook_spec(world, nvml_library, hook_command))
    # The image's environment preloads a library of the image's through the hook's working
    # directory (the rootfs), as in CVE-2025-23266: had a hook loaded it, its constructor would
    # have written MARKER on the host (inside the container that path does not exist).
    evil_src = tmp_path / "evil.c"
    marker = tmp_path / "preload-ran"
    evil_src.write_text('#include <stdio.h>\n__attribute__((constructor)) static void ran(void) {'
                        f' FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    bundle = world.bundle(args=["/prog"], env=["LD_PRELOAD=/proc/self/cwd/evil.so"])
    rootfs = _glibc_rootfs(world, bundle, nvml_library, tmp_path)
    rh.gcc("-shared", "-fPIC", "-o", os.path.join(rootfs, "evil.so"), str(evil_src))
    image_cache = open(rootfs + "/etc/ld.so.cache", "rb").read()
    edited = subprocess.run([os.path.join(rh.VENV_BIN, "cdi-shim"), "cdi", "inject", "--device", "nvidia.com/gpu=0",
                             os.path.join(bundle.path, "config.json")], env=world.env(),
                            capture_output=True, text=True, check=True).stdout
    with open(os.path.join(bundle.path, "config.json"), "w") as out:
        out.write(edited)
    result = world.runc_cmd("run", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "linked=42 dlopen=ok\n"
    assert open(rootfs + "/etc/ld.so.cache", "rb").read() != image_cache  # the hook wrote it, in the root
    assert os.readlink(rootfs + f"{LIBDIR}/libnvidia-ml.so") == nvml_library.name
    assert not marker.exists(), "a hook loaded the image's LD_PRELOAD library"


@pytest.mark.parametrize("hook_command", list(HOOK_COMMANDS))
def test_runtime_does_the_work_of_our_hooks(world, nvml_library, tmp_path, hook_command):
    """Through cdi-shim-runtime the same spec needs no hook process: the runtime recognises
    our hooks (either program name) as it does the toolkit's, and drops them."""
    world.write_spec("nvidia-gpu.yaml", _hook_spec(world, nvml_library, hook_command))
    bundle = world.bundle(args=["/prog"], env=["NVIDIA_VISIBLE_DEVICES=0"])
    rootfs = _glibc_rootfs(world, bundle, nvml_library, tmp_path)
    image_cache = open(rootfs + "/etc/ld.so.cache", "rb").read()
    result = world.shim("run", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "linked=42 dlopen=ok\n"
    assert not bundle.config().get("hooks", {}).get("createContainer")
    # no hook ran: the runtime wrote the cache where the hook's ldconfig writes it, in the root
    assert open(rootfs + "/etc/ld.so.cache", "rb").read() != image_cache
    assert not [n for n in os.listdir(bundle.path) if n.startswith("cdi-shim.")]
    assert os.readlink(rootfs + f"{LIBDIR}/libnvidia-ml.so") == nvml_library.name


@pytest.mark.parametrize("hook_command", list(HOOK_COMMANDS))
def test_update_ldcache_hook_refuses_bad_state(tmp_path, hook_command):
    program, sub = HOOK_COMMANDS[hook_command]
    hook = [os.path.join(rh.VENV_BIN, program)] + sub
    for state, text in (("not json", "not JSON"), ('{"bundle": "relative"}', "no absolute bundle"),
                        ('{"bundle": "/nonexistent-bundle"}', "cannot open")):
        result = subprocess.run(hook + ["update-ldcache", "--folder", LIBDIR], input=state,
                                capture_output=True, text=True)
        assert result.returncode == 1 and "Error: " in result.stderr and text in result.stderr, result.stderr
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"root": {"path": "/"}}')
    result = subprocess.run(hook + ["create-symlinks", "--link", "a::/b"],
                            input=json.dumps({"bundle": str(bundle)}), capture_output=True, text=True)
    assert result.returncode == 1 and "refusing to work on /" in result.stderr
    # What the lean parser does not know goes to the full command line, which explains.
    result = subprocess.run(hook + ["update-ldcache", "--bogus"], capture_output=True, text=True)
    assert result.returncode == 2 and "No such option '--bogus'" in result.stderr
    assert f"Usage: {hook_command} update-ldcache" in result.stderr
    result = subprocess.run(hook + ["update-ldcache", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "Update the container's /etc/ld.so.cache" in result.stdout


def test_lean_hook_ignores_the_python_environment(tmp_path):
    """cdi-shim-hook runs `python -I -S`: PYTHONPATH and friends in a hook's environment (the
    image's, under a runtime that passes it) cannot bring code into the hook."""
    marker = tmp_path / "imported"
    planted = tmp_path / "planted"
    (planted / "shim").mkdir(parents=True)
    (planted / "shim" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (planted / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(planted), "PYTHONSTARTUP": str(planted / "sitecustomize.py")}
    result = subprocess.run([os.path.join(rh.VENV_BIN, "cdi-shim-hook"), "update-ldcache"], input="not json",
                            env=env, capture_output=True, text=True)
    assert result.returncode == 1 and "not JSON" in result.stderr, result.stderr
    assert not marker.exists()
    # nor into `cdi-shim hook` (the same launcher); a plain interpreter, for comparison, takes it
    subprocess.run([os.path.join(rh.VENV_BIN, "cdi-shim"), "hook", "update-ldcache"], input="not json",
                   env=env, capture_output=True, text=True)
    assert not marker.exists()
    subprocess.run([sys.executable, "-c", "import shim"], env=env, capture_output=True, text=True)
    assert marker.exists()


def test_runtime_gives_hooks_an_env_so_the_image_env_cannot_reach_them(world, tmp_path):
    """CVE-2025-23266: a hook without env inherits the container's env (LD_PRELOAD) from runc."""
    marker = tmp_path / "preload-ran"
    evil_src = tmp_path / "evil.c"
    evil_src.write_text('#include <stdio.h>\n__attribute__((constructor)) static void ran(void) {'
                        f' FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    hook_program = tmp_path / "hook-prog"
    (tmp_path / "hook.c").write_text("int main(void) { return 0; }\n")
    rh.gcc("-o", str(hook_program), str(tmp_path / "hook.c"))  # dynamically linked: honours LD_PRELOAD
    world.write_spec("hooked.yaml", 'cdiVersion: "0.5.0"\nkind: example.com/hooked\ndevices:\n'
                     '  - name: "a"\n    containerEdits:\n      env: [HOOKED=1]\n      hooks:\n'
                     f"        - {{hookName: createContainer, path: {hook_program}}}\n")
    bundle = world.bundle(args=["true"], env=["LD_PRELOAD=/proc/self/cwd/evil.so"],
                          annotations={"cdi.k8s.io/x": "example.com/hooked=a"})
    rh.gcc("-shared", "-fPIC", "-o", os.path.join(bundle.rootfs, "evil.so"), str(evil_src))
    result = world.shim("run", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    hook = bundle.config()["hooks"]["createContainer"][0]
    assert hook["env"] and not any(e.startswith("LD_") for e in hook["env"])
    assert not marker.exists(), "the image's LD_PRELOAD reached a hook"


def _unfit_image(rootfs, shape):
    if shape == "etc-is-a-file":
        shutil.rmtree(rootfs + "/etc")
        with open(rootfs + "/etc", "w") as out:
            out.write("not a directory\n")
        return "the image's /etc is not a directory"
    os.unlink(rootfs + "/etc/ld.so.cache")
    os.mkdir(rootfs + "/etc/ld.so.cache")
    return "the image's /etc/ld.so.cache is a directory"


@pytest.mark.parametrize("shape", ["etc-is-a-file", "cache-is-a-directory"])
def test_image_without_a_place_for_the_cache_the_spec_needs_is_a_clear_error(world, nvml_library, tmp_path, shape):
    """Issue 14, finding 12b: an image whose /etc is a regular file (or whose /etc/ld.so.cache
    is a directory) failed inside runc, which cannot bind our cache file there. Decision: when
    the spec asks for the cache (update-ldcache: its libraries need it to be found by soname,
    and the toolkit's hook would fail on this image too), the create fails before runc with an
    error that says why; config.json is left as it was."""
    world.write_spec("nvidia-gpu.yaml", _spec(world, nvml_library))
    bundle = world.bundle(args=["/prog"], env=["NVIDIA_VISIBLE_DEVICES=0"])
    why = _unfit_image(_glibc_rootfs(world, bundle, nvml_library, tmp_path), shape)
    result = world.shim("run", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 1, result.stderr
    assert why in result.stderr and "update-ldcache" in result.stderr and "nvidia.com/gpu=0" in result.stderr, \
        result.stderr
    assert "Traceback" not in result.stderr and "runc run failed" not in result.stderr, result.stderr
    assert bundle.unchanged()
    assert world.state(bundle.id) is None


@pytest.mark.parametrize("shape", ["etc-is-a-file", "cache-is-a-directory"])
def test_image_without_a_place_for_our_own_cache_runs_without_it(world, nvml_library, tmp_path, shape):
    """The same image with a spec that only mounts libraries (no update-ldcache hook: the cache
    would be our own idea) runs as under the toolkit, without a cache, with a warning."""
    world.write_spec("nvidia-gpu.yaml", 'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ncontainerEdits:\n  mounts:\n'
                     f"    - hostPath: {nvml_library}\n      containerPath: {LIBDIR}/{nvml_library.name}\n"
                     "      options: [ro, nosuid, nodev, bind]\n"
                     'devices:\n  - name: "0"\n    containerEdits:\n'
                     f"      deviceNodes: [{{path: /dev/nvidia0, hostPath: {world.node(0)}}}]\n")
    bundle = world.bundle(args=["sh", "-c", f"ls {LIBDIR}"], env=["NVIDIA_VISIBLE_DEVICES=0"])
    why = _unfit_image(_glibc_rootfs(world, bundle, nvml_library, tmp_path), shape)
    result = world.shim("run", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    assert nvml_library.name in result.stdout.split()
    assert "linker cache not mounted" in result.stderr and why in result.stderr, result.stderr
    assert not [m for m in bundle.config()["mounts"] if m["destination"] == "/etc/ld.so.cache"]
    assert sorted(os.listdir(bundle.path)) == ["config.json", "rootfs"]


def test_cache_that_cannot_be_written_keeps_the_hooks(world, nvml_library, tmp_path):
    """A read-only root whose bundle cannot take the cache, neither in the /etc overlay's
    folder (a read-only mount in the way: nothing in it can be removed) nor as a file to bind
    (a directory in the way: rename fails with EISDIR): a warning naming the file, the spec's
    hooks kept, and the container still gets its cache from them; never an internal error."""
    world.write_spec("nvidia-gpu.yaml", _hook_spec(world, nvml_library))
    bundle = world.bundle(args=["/prog"], env=["NVIDIA_VISIBLE_DEVICES=0"],
                          edit=lambda config: config["root"].update(readonly=True))
    _glibc_rootfs(world, bundle, nvml_library, tmp_path)
    os.makedirs(os.path.join(bundle.path, "cdi-shim.ld.so.cache", "in-the-way"))
    in_the_way = os.path.join(bundle.path, "cdi-shim.etc")
    os.makedirs(in_the_way)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", in_the_way], check=True)
    try:
        open(os.path.join(in_the_way, "kept"), "w").close()
        subprocess.run(["mount", "-o", "remount,ro", in_the_way], check=True)
        result = world.shim("run", "--bundle", bundle.path, bundle.id)
    finally:
        subprocess.run(["umount", in_the_way], check=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "linked=42 dlopen=ok\n"
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert f"cannot write {bundle.path}/cdi-shim.ld.so.cache" in result.stderr, result.stderr
    assert "hooks run as written" in result.stderr, result.stderr
    config = bundle.config()
    kept = [h["args"] for h in config["hooks"]["createContainer"]]
    assert any("update-ldcache" in args for args in kept), kept
    assert not [m for m in config["mounts"] if m["destination"] == "/etc/ld.so.cache"]
    assert not [n for n in os.listdir(bundle.path) if n.endswith("~")]


class _Recorder:
    def __init__(self):
        self.lines = []
        self.debug_enabled = False

    def debug(self, message):
        pass

    def warning(self, message):
        self.lines.append(("warning", message))

    def error(self, message):
        self.lines.append(("error", message))


@pytest.mark.parametrize("failure", ["ENOSPC", "EROFS"])
def test_cache_write_errors_keep_the_hooks(nvml_library, tmp_path, failure):
    """prepare_linker for a read-only root (the cache goes into the bundle) on a bundle
    directory that is full (a 4 KiB tmpfs, filled) or read-only (a tmpfs remounted ro): the
    config comes back with the hooks and without the cache mount or /etc overlay, a warning
    says which file and why, and no temp file or folder of ours is left."""
    from shim.linker.container import prepare_linker

    require = rh.need("mount", "mount")
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    subprocess.run([require, "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(bundle)], check=True)
    try:
        if failure == "ENOSPC":
            with open(bundle / "filler", "wb") as out:
                try:
                    out.write(b"x" * 65536)
                except OSError:
                    pass
        else:
            subprocess.run([require, "-o", "remount,ro", str(bundle)], check=True)
        # a hook program present on this host: the hook is kept for runc to run
        program = os.path.join(rh.VENV_BIN, "cdi-shim-hook")
        hook = {"path": program, "args": ["cdi-shim-hook", "update-ldcache", "--folder", LIBDIR]}
        config = {"root": {"path": str(rootfs), "readonly": True}, "hooks": {"createContainer": [hook]},
                  "mounts": [{"destination": f"{LIBDIR}/{nvml_library.name}", "source": str(nvml_library),
                              "type": "bind", "options": ["ro", "bind"]}]}
        log = _Recorder()
        out = prepare_linker(config, str(bundle), log)
        assert out["hooks"]["createContainer"] == [hook]
        assert not [m for m in out["mounts"] if m["destination"] in ("/etc/ld.so.cache", "/etc")]
        assert not os.path.exists(bundle / "cdi-shim.etc")
        why = {"ENOSPC": "No space left on device", "EROFS": "Read-only file system"}[failure]
        assert log.lines == [("warning", f"linker cache not written into the bundle (cannot write "
                                         f"{bundle}/cdi-shim.ld.so.cache: {why}); the spec's hooks run as written")]
        assert not [n for n in os.listdir(bundle) if n.endswith("~")]
        # the toolkit's program, absent on this host: the create fails, naming the hook and why
        from shim.linker.toolkit_hooks import HookFailure

        absent = dict(hook, path="/usr/bin/nvidia-cdi-hook", args=["nvidia-cdi-hook", *hook["args"][1:]])
        message = (f"update-ldcache hook cannot be done: linker cache not written "
                   f"into the bundle: cannot write .*{why}.*/usr/bin/nvidia-cdi-hook is not")
        with pytest.raises(HookFailure, match=message):
            prepare_linker(dict(config, hooks={"createContainer": [absent]}), str(bundle), _Recorder())
    finally:
        subprocess.run(["umount", str(bundle)], check=False)


def test_stale_cache_temp_files_are_removed(world, nvml_library, tmp_path):
    """A worker killed between writing the cache's temp file and renaming it leaves
    .cdi-shim.ld.so.cache.cds-PID-N~ in the bundle: the next create there removes it (its
    writer is gone), as it does config.json's; a live writer's stays."""
    world.write_spec("nvidia-gpu.yaml", _spec(world, nvml_library))
    bundle = world.bundle(args=["/prog"], env=["NVIDIA_VISIBLE_DEVICES=0"])
    _glibc_rootfs(world, bundle, nvml_library, tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = [f".cdi-shim.ld.so.cache.cds-{gone.pid}-0~", f".cdi-shim.musl-0.path.cds-{gone.pid}-3~"]
    live = f".cdi-shim.ld.so.cache.cds-{os.getpid()}-0~"
    for name in stale + [live]:
        with open(os.path.join(bundle.path, name), "wb") as out:
            out.write(b"partial")
    result = world.shim("create", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    names = os.listdir(bundle.path)
    assert not set(stale) & set(names), names
    assert live in names


def _self_referencing_include(rootfs):
    """/g: ten links to "." and x.conf naming the library directory; ld.so.conf includes
    it through `/g/*/*/*/*/*/*/*.conf` (10**7 paths of one file to glob(3))."""
    g = os.path.join(rootfs, "g")
    os.makedirs(g)
    for i in range(10):
        os.symlink(".", os.path.join(g, f"l{i}"))
    with open(os.path.join(g, "x.conf"), "w") as out:
        out.write(LIBDIR + "\n")
    with open(rootfs + "/etc/ld.so.conf", "a") as out:
        out.write("include /g/" + "*/" * 6 + "*.conf\n")


def test_include_glob_over_self_referencing_links(world, nvml_library, tmp_path):
    """An image whose ld.so.conf globs over self-referencing links (issue 14, finding 3: 7
    levels took minutes and gigabytes, and the kept hook repeated it inside runc): served
    in well under a second, the hooks dropped."""
    world.write_spec("nvidia-gpu.yaml", _spec(world, nvml_library))
    bundle = world.bundle(args=["/prog"], env=["NVIDIA_VISIBLE_DEVICES=0"])
    rootfs = _glibc_rootfs(world, bundle, nvml_library, tmp_path)
    _self_referencing_include(rootfs)
    result = world.shim("run", "--bundle", bundle.path, bundle.id, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "linked=42 dlopen=ok\n"
    assert not bundle.config().get("hooks", {}).get("createContainer")


def test_include_glob_past_its_bound_fails_the_create(world, nvml_library, tmp_path):
    """An ld.so.conf whose include globs look into more directories than the bound (70 x 70
    real ones): the create fails with a message naming the file, its include line and the
    bound, in stderr and runc's log; config.json is untouched, so the spec's update-ldcache
    hook never runs to repeat the work inside runc."""
    world.write_spec("nvidia-gpu.yaml", _spec(world, nvml_library))
    bundle = world.bundle(args=["/prog"], env=["NVIDIA_VISIBLE_DEVICES=0"])
    rootfs = _glibc_rootfs(world, bundle, nvml_library, tmp_path)
    for i in range(70):
        for j in range(70):
            os.makedirs(os.path.join(rootfs, f"d/{i}/{j}"))
    with open(rootfs + "/etc/ld.so.conf", "a") as out:
        out.write("include /d/*/*/*.conf\n")
    runc_log = os.path.join(world.base, "runc.json")
    result = world.shim("--log", runc_log, "--log-format", "json", "run", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 1, result.stderr
    expected = ("/etc/ld.so.conf: include /d/*/*/*.conf: include globs looked into more than 4096 "
                "directories (the bound on include globs)")
    assert expected in result.stderr and rootfs in result.stderr, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    errors = [msg for level, msg in rh.read_log(runc_log, "json") if level == "error"]
    assert any(expected in msg for msg in errors), errors
    assert bundle.unchanged() and bundle.extra_files() == []
    assert world.state(bundle.id) is None


def test_linker_step_past_its_time_bound_is_refused(nvml_library, tmp_path, monkeypatch):
    """The wall-clock bound on the whole linker step (LINKER_TIME_LIMIT, here 0 s): the step
    raises LinkerLimitError, which fails the create, saying which bound and where."""
    from shim.ldconfig import ldcache
    from shim.linker.container import LinkerLimitError, prepare_linker

    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    hook = {"path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", LIBDIR]}
    config = {"root": {"path": str(rootfs)}, "hooks": {"createContainer": [hook]},
              "mounts": [{"destination": f"{LIBDIR}/{nvml_library.name}", "source": str(nvml_library), "type": "bind"}]}
    monkeypatch.setattr(ldcache, "LINKER_TIME_LIMIT", 0)
    with pytest.raises(LinkerLimitError) as caught:
        prepare_linker(config, str(bundle), _Recorder())
    assert f"the linker cache of {rootfs} is refused: not done within 0 s (the bound on the linker step), at " \
        in str(caught.value), caught.value
    assert os.listdir(bundle) == []
    monkeypatch.setattr(ldcache, "LINKER_TIME_LIMIT", 10)
    made = prepare_linker(config, str(bundle), _Recorder())
    assert made["mounts"][-1]["destination"] == f"{LIBDIR}/{nvml_library.name}"
    assert (rootfs / "etc" / "ld.so.cache").is_file()      # (written in the root, as the hook's ldconfig does)
