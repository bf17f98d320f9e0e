"""Direct `cdi-shim-runtime --device nvidia.com/gpu=0 run --bundle B ID` on one plain-folder
bundle, run after run (issue 47): the way runc's users and test suites run containers.

The first run rewrites config.json (the device injected, the library mounts moved to our binds
hook) and writes the cache and drop-ins into the root's /etc; the second injects onto that and
its config.json comes out the same (an earlier binds hook of ours is replaced, not kept beside
the new one: filebinds.replaced), so from then on every run has one key. The files our own
steps left are young, and trusted while they show the identity the step left (stepleft.trusted),
whichever of the server's workers stepped there (stepleft.py). The front end replays the
request from the third run: the second run's step still rewrites the cache (the first run's
create-symlinks link libcuda.so -> libcuda.so.1 dangled during its ldconfig's scan, as the
toolkit's hook's does in a fresh root, so only the second run's cache lists libcuda.so), but
that is all it changes, so its recipe is of the root as it left it (stepleft.only_the_cache);
each container sees what a step in that root gives. Another writer's change
to /etc/ld.so.cache or to one of our drop-ins between runs stops the replay. Without the
resident process the per-create interpreter keeps them alike, in the steps folder beside the
configured socket when that folder is ours alone (docs/fast.md), and the front end replays
those too."""
import os
import time

import pytest

from test_front_end_replay import result
from test_runtime_resident import debug_world, served_lines, start_server
from test_runtime_toolkit_hooks import LIBDIR, VERSION, _image, toolkit_spec

from test_image_layouts import merge_usr

from cdi_shim_lab.images import build_driver_libraries
from tests.helpers import ENGINE_SETTLE

FRONT_END = "replayed by the front end"
RUNS = 6


class Direct:
    """A world with the toolkit's spec, one plain-folder bundle of a small glibc image (its own
    ld.so.cache) asking for nothing itself, and optionally a resident server (two workers; files
    trusted however new, as the image was made just now)."""

    def __init__(self, world, driver, tmp_path, resident, merged=False):
        self.world, self.merged = world, merged
        self.server = None
        if resident:
            socket = os.path.join(world.base, "run", "runtime.sock")
            self.server = start_server(world, socket, workers=2, settle=0)    # (the image was just made)
            world.resident_socket = socket
        self.log = debug_world(world)
        # (16 more driver libraries: the mounts go to our binds hook: filebinds.MIN_BINDS)
        more = build_driver_libraries(str(tmp_path / "more-libraries"), 16, "gcc", VERSION)
        world.write_spec("nvidia-gpu.yaml", toolkit_spec(world, driver) + "".join(
            f"    - hostPath: {path}\n      containerPath: {LIBDIR}/{os.path.basename(path)}\n"
            "      options: [ro, nosuid, nodev, rbind, rprivate]\n" for path in more))
        self.bundle = self.fresh(driver, tmp_path, "direct")

    def fresh(self, driver, tmp_path, tag):
        bundle = self.world.bundle(args=["/prog"], tag=tag)
        _image(bundle, driver, str(tmp_path), compat=False)
        if self.merged:
            merge_usr(bundle.rootfs)
        return bundle

    def env(self):
        return self.world.env(CDI_SHIM_NVIDIA_PARAMS=os.path.join(self.world.base, "no-such-params"))

    def run(self, how, bundle=None, n=0):
        bundle = bundle or self.bundle
        name = f"{bundle.id}-{n}"
        device = ("--device", "nvidia.com/gpu=0")
        if how == "run":
            done = self.world.shim(*device, "run", "--bundle", bundle.path, name, env=self.env())
            assert done.returncode == 0 and done.stdout.startswith("linked=42"), done.stderr
        else:
            done = self.world.shim(*device, "create", "--bundle", bundle.path, name, env=self.env())
            assert done.returncode == 0, done.stderr
            assert self.world.runc_cmd("start", name).returncode == 0
            assert self.world.wait_stopped(name)["status"] == "stopped"
            self.world.runc_cmd("delete", "--force", name)
        return name

    def replayed(self, name):
        with open(self.log) as f:
            return any(FRONT_END in line and name in line for line in f)

    def served(self):
        return len(served_lines(self.log))

    def close(self):
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=30)


@pytest.fixture
def direct(world, driver, tmp_path):
    made = Direct(world, driver, tmp_path, resident=True)
    yield made
    made.close()


def _seen(bundle):
    """What the container is given (test_front_end_replay.result): config.json, the bundle's
    files, the links and the linker files in the root's /etc."""
    return result(bundle)


@pytest.mark.parametrize("how", ["run", "create-start"])
def test_repeated_direct_runs_are_replayed_by_the_front_end(direct, how):
    names, texts = [], []
    for n in range(RUNS):
        names.append(direct.run(how, n=n))
        texts.append(direct.bundle.read_bytes())
    replayed = [direct.replayed(name) for name in names]
    assert all(text == texts[1] for text in texts[1:])
    assert not replayed[0] and all(replayed[2:]), replayed
    assert direct.served() == RUNS - sum(replayed)
    # config.json the same run after run: one binds hook of ours, not one more a run
    config = direct.bundle.config()
    hooks = config["hooks"]["createContainer"]
    assert [hook["args"][1] for hook in hooks if "cdi-shim-nshook" in hook["path"]] == ["binds"], hooks
    # the replayed container sees what a step gives: the same root stepped by Python alone
    replayed_seen = _seen(direct.bundle)
    direct.world.resident_socket = os.path.join(direct.world.base, "no-resident.sock")
    direct.world.write_config(log_level="debug", log_file=direct.log)
    direct.run(how, n=RUNS)
    assert _seen(direct.bundle) == replayed_seen


@pytest.mark.parametrize("path", ["/etc/ld.so.cache", "/etc/ld.so.conf.d/00-nvcr-cdi-shim.conf"])
def test_another_writer_between_runs_stops_the_replay(direct, path):
    """Once the front end replays, another writer replaces one of the files our step wrote (the
    same bytes, a new file: only its identity tells): the next run is the worker's, which steps
    again and gives the container the same files."""
    names = [direct.run("run", n=n) for n in range(5)]
    assert direct.replayed(names[-1])
    target = direct.bundle.rootfs + path
    assert os.path.isfile(target), sorted(os.listdir(os.path.dirname(target)))
    before = _seen(direct.bundle)
    with open(target, "rb") as f:
        data = f.read()
    os.unlink(target)
    with open(target, "wb") as out:
        out.write(data)
    served = direct.served()
    again = direct.run("run", n=5)
    assert not direct.replayed(again) and direct.served() == served + 1
    assert _seen(direct.bundle)[1:] == before[1:]


def test_without_the_resident_process_runs_are_replayed_too(world, driver, tmp_path):
    """No resident process: each per-create interpreter keeps its injection and step as recipes in
    the steps folder beside the configured socket (made 0700: ours alone), and the front end
    replays them as it does a worker's, from the third run (as with the resident process); the
    replayed container sees what a step in that root gives; a folder others may write is
    refused, and the interpreter steps."""
    made = Direct(world, driver, tmp_path, resident=False)
    # (a per-create interpreter's settle window cannot be set as a server's is: cli_with_settle;
    # the image's files must age past it, the one wait of these tests)
    newest = max(os.lstat(os.path.join(folder, name)).st_ctime
                 for folder, dirs, files in os.walk(made.bundle.rootfs) for name in dirs + files + ["."])
    time.sleep(max(0.0, ENGINE_SETTLE + 0.1 - (time.time() - newest)))
    names, texts = [], []
    for n in range(RUNS):
        names.append(made.run("run", n=n))
        texts.append(made.bundle.read_bytes())
    replayed = [made.replayed(name) for name in names]
    assert all(text == texts[1] for text in texts[1:])
    assert not replayed[0] and all(replayed[2:]), replayed
    steps = os.path.join(os.path.dirname(world.resident_socket), "steps")
    assert os.stat(steps).st_mode & 0o777 == 0o700 and any(name.startswith("q") for name in os.listdir(steps))
    replayed_seen = _seen(made.bundle)
    os.chmod(steps, 0o777)      # (open to others: refused, the interpreter steps)
    again = made.run("run", n=RUNS)
    assert not made.replayed(again) and _seen(made.bundle) == replayed_seen


def test_repeated_direct_runs_on_merged_usr_are_replayed(world, driver, tmp_path):
    """The same on a merged-/usr image (Debian's): the step reads the library folder as
    /lib/x86_64-linux-gnu and makes the soname links and the mount points in
    /usr/lib/x86_64-linux-gnu; what it left is trusted under either spelling, and the cache,
    written after the mount points, stays newer than the folder (no rescan): replayed from the
    third run, each run with the soname links there. (The trust of our own young
    writes under another spelling: test_step_memo.test_our_own_young_write_is_trusted_under_
    another_spelling.)"""
    made = Direct(world, driver, tmp_path, resident=True, merged=True)
    try:
        names = [made.run("run", n=n) for n in range(RUNS)]
        replayed = [made.replayed(name) for name in names]
        assert not replayed[0] and all(replayed[2:]), replayed
        link = made.bundle.rootfs + f"{LIBDIR}/libnvidia-ml.so.1"
        assert os.readlink(link) == f"libnvidia-ml.so.{VERSION}"
    finally:
        made.close()
