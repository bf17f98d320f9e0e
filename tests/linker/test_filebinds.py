"""Which mounts the binds hook takes from runc (shim/linker/filebinds.py, plan): only those whose
result cannot tell the difference, and only enough of them to pay for the hook. The hook's own
result against runc's: tests/runtime/test_file_binds.py."""
import os

import pytest

from shim.linker import filebinds
from shim.linker.stepresult import StepResult
from shim.linker.container import _is_library
from shim.ldconfig.engine import Root

LIBDIR = "/usr/lib/x86_64-linux-gnu"
OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]


@pytest.fixture(autouse=True)
def eight(monkeypatch):
    """The threshold these tests count against (the module's own may move with measurements)."""
    monkeypatch.setattr(filebinds, "MIN_BINDS", 8)


@pytest.fixture
def host(tmp_path):
    directory = tmp_path / "driver"
    directory.mkdir()
    for index in range(14):
        (directory / f"libnvidia-x{index}.so.1").write_bytes(b"\x7fELF")
    (directory / "nvidia-smi").write_bytes(b"\x7fELF")
    (directory / "libdir.so.1").mkdir()
    return directory


@pytest.fixture
def rootfs(tmp_path):
    root = tmp_path / "rootfs"
    (root / LIBDIR.lstrip("/")).mkdir(parents=True)
    (root / "etc").mkdir()
    return root


def library(host, index, **changes):
    mount = {"destination": f"{LIBDIR}/libnvidia-x{index}.so.1", "type": "bind",
             "source": str(host / f"libnvidia-x{index}.so.1"), "options": list(OPTIONS)}
    mount.update(changes)
    return mount


def chosen(rootfs, mounts, ours=(), **config):
    with Root(str(rootfs)) as root:
        return filebinds.plan(dict(config, mounts=mounts), root, set(ours), _is_library)


def test_enough_library_binds_are_all_taken(host, rootfs):
    mounts = [{"destination": "/proc", "type": "proc", "source": "proc"}] + [library(host, i) for i in range(8)]
    assert chosen(rootfs, mounts) == list(range(1, 9))
    assert chosen(rootfs, mounts[:-1]) == []        # seven: the hook's start would not be paid back


@pytest.mark.parametrize("config", [
    {"linux": {"namespaces": [{"type": "mount"}, {"type": "user"}]}},
    {"hooks": {"prestart": [{"path": "/bin/true"}]}},
    {"hooks": {"createRuntime": [{"path": "/bin/true"}]}},
], ids=["user namespace", "prestart hook", "createRuntime hook"])
def test_none_in_a_container_where_runc_orders_things_otherwise(host, rootfs, config):
    assert chosen(rootfs, [library(host, i) for i in range(10)], **config) == []
    assert len(chosen(rootfs, [library(host, i) for i in range(10)],
                      hooks={"createContainer": [{"path": "/bin/true"}]})) == 10


@pytest.mark.parametrize("change", [
    {"options": ["ro", "rbind", "rw"]},
    {"options": ["ro", "rbind", "shared"]},
    {"options": ["ro", "rbind", "rprivate", "rslave"]},
    {"options": ["ro", "nosuid"]},
    {"options": "ro,rbind"},
    {"type": "tmpfs"},
    {"destination": "/dev/libnvidia-x0.so.1"},
    {"destination": f"{LIBDIR}/../lib/libnvidia-x0.so.1"},
    {"destination": "usr/lib/libnvidia-x0.so.1"},
    {"destination": "/usr/bin/nvidia-smi"},
    {"source": "relative/libnvidia-x0.so.1"},
    {"source": "/no/such/libnvidia-x0.so.1"},
], ids=lambda change: repr(change))
def test_a_mount_of_another_kind_stays_with_runc(host, rootfs, change):
    if change.get("destination") == "/usr/bin/nvidia-smi":
        change = dict(change, source=str(host / "nvidia-smi"))     # a host file, not a library
    mounts = [library(host, 0, **change)] + [library(host, i) for i in range(1, 10)]
    assert chosen(rootfs, mounts) == list(range(1, 10))


def test_a_source_that_is_a_directory_stays_with_runc(host, rootfs):
    mounts = [library(host, 0, source=str(host / "libdir.so.1"))] + [library(host, i) for i in range(1, 10)]
    assert chosen(rootfs, mounts) == list(range(1, 10))


def test_our_bundle_files_are_taken_and_other_host_files_are_not(host, rootfs, tmp_path):
    cache = tmp_path / "bundle" / "cdi-shim.ld.so.cache"
    cache.parent.mkdir()
    cache.write_bytes(b"cache")
    ours = {"destination": "/etc/ld.so.cache", "type": "bind", "source": str(cache), "options": ["bind", "ro"]}
    mounts = [library(host, i) for i in range(8)] + [ours]
    assert chosen(rootfs, mounts, ours=[str(cache)]) == list(range(9))
    assert chosen(rootfs, mounts) == list(range(8))


def test_a_later_mount_above_a_library_keeps_it_with_runc(host, rootfs):
    """The hook runs after every mount runc makes: a library bound before a mount over its
    directory must stay below that mount."""
    tmpfs = {"destination": "/usr/lib", "type": "tmpfs", "source": "tmpfs"}
    libraries = [library(host, i) for i in range(10)]
    assert chosen(rootfs, libraries[:2] + [tmpfs] + libraries[2:]) == list(range(3, 11))
    assert chosen(rootfs, [tmpfs] + libraries) == list(range(1, 11))
    again = dict(libraries[0])      # the same destination twice: runc stacks them, in order
    assert chosen(rootfs, libraries + [again]) == list(range(1, 10))


def test_what_the_image_has_at_the_destination(host, rootfs):
    libdir = str(rootfs) + LIBDIR
    open(libdir + "/libnvidia-x0.so.1", "w").close()             # a regular file: bound over
    os.mkfifo(libdir + "/libnvidia-x1.so.1")                      # a FIFO: runc's
    os.symlink("elsewhere", libdir + "/libnvidia-x2.so.1")        # a link: runc resolves it
    os.mkdir(libdir + "/libnvidia-x3.so.1")                       # a directory: runc fails it
    mounts = [library(host, i) for i in range(14)]
    mounts[4]["destination"] = "/usr/lib64/deeper/libnvidia-x4.so.1"   # missing directories: made
    mounts[5]["destination"] = "/opt/gone/libnvidia-x5.so.1"
    os.symlink("/nowhere", str(rootfs) + "/opt")                          # a link leading nowhere: runc's
    mounts[6]["destination"] = "/etc/alt/libnvidia-x6.so.1"
    os.symlink("/etc", str(rootfs) + "/etc/alt")                          # a link to a directory: followed
    mounts[7]["destination"] = "/etc/passwd/libnvidia-x7.so.1"
    open(str(rootfs) + "/etc/passwd", "w").close()                        # under a file: runc fails it
    assert chosen(rootfs, mounts) == [0, 4, 6, 8, 9, 10, 11, 12, 13]


def test_at_most_max_binds_a_hook(tmp_path, rootfs, monkeypatch):
    monkeypatch.setattr(filebinds, "MAX_BINDS", 9)
    directory = tmp_path / "many"
    directory.mkdir()
    mounts = []
    for index in range(12):
        (directory / f"libmany{index}.so.1").write_bytes(b"\x7fELF")
        mounts.append({"destination": f"{LIBDIR}/libmany{index}.so.1",
                       "source": str(directory / f"libmany{index}.so.1"), "options": ["bind"]})
    assert chosen(rootfs, mounts) == list(range(9))


def test_our_own_hooks_are_folded_into_the_binds_hook(host, rootfs):
    program = "/opt/cdi-shim/bin/cdi-shim-nshook"
    params = {"path": program, "args": ["cdi-shim-nshook", "bind-params", "--rootfs", str(rootfs), "--source", "/b/p"]}
    links = {"path": program, "args": ["cdi-shim-nshook", "symlinks", "--rootfs", str(rootfs),
                                       "--link", "../card1::/dev/dri/by-path/x-card",
                                       "--link", "../r::/dev/dri/by-path/x-r"]}
    other = {"path": "/usr/bin/vendor-hook", "args": ["vendor-hook"]}
    elsewhere = dict(links, args=links["args"][:3] + ["/other/rootfs"] + links["args"][4:])
    config = {"mounts": [library(host, 0)], "hooks": {"createContainer": [other, params, elsewhere, links]}}
    folded, source, made_links = filebinds.folded_hooks(config, program, str(rootfs))
    assert folded == [1, 3] and source == "/b/p"     # (their places among the createContainer hooks)
    assert made_links == ["../card1::/dev/dri/by-path/x-card", "../r::/dev/dri/by-path/x-r"]
    assert filebinds.folded_hooks(config, "/elsewhere/cdi-shim-nshook", str(rootfs)) == ([], None, [])
    assert chosen(rootfs, config["mounts"], **{k: v for k, v in config.items() if k != "mounts"}) == []
    with Root(str(rootfs)) as root:
        picked = filebinds.plan(config, root, set(), _is_library, minimum=1)
    new, made = filebinds.hook(config, picked, str(rootfs), program, ["PATH=/bin"], source, made_links)
    assert new["mounts"] == []
    # (the step puts it first and takes the folded ones out: shim/linker/stepresult.py)
    new = StepResult(None, config).put_first(new, "createContainer", made, folded)
    assert new["hooks"]["createContainer"] == [made, other, elsewhere]
    assert made["args"] == ["cdi-shim-nshook", "binds", "--rootfs", str(rootfs),
                            "--bind", config["mounts"][0]["source"], config["mounts"][0]["destination"],
                            ",".join(OPTIONS), "--params", "/b/p",
                            "--link", "../card1::/dev/dri/by-path/x-card", "--link", "../r::/dev/dri/by-path/x-r"]
    assert config["hooks"]["createContainer"] == [other, params, elsewhere, links]    # left as it was
