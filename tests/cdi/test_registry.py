"""The registry: directory priority, conflicts, broken files, and the persistent parse cache."""
import os
import subprocess
import sys

import pytest

from cdi.errors import EditError, UnresolvableDevicesError
from cdi.registry import Registry
from tests.conftest import simple_spec, write_spec


@pytest.fixture
def dirs(tmp_path):
    return str(tmp_path / "etc"), str(tmp_path / "run")


def names(registry):
    return registry.refresh().device_names()


def test_higher_priority_directory_wins(dirs, cache_dir):
    etc, run = dirs
    write_spec(etc, "a.yaml", simple_spec(devices=("dev1", "dev2"), env_prefix="ETC"))
    write_spec(run, "a.yaml", simple_spec(devices=("dev1",), env_prefix="RUN"))
    registry = Registry(dirs, cache_dir=cache_dir).refresh()
    assert registry.device_names() == ["example.com/dev=dev1", "example.com/dev=dev2"]
    assert registry.inject({}, ["example.com/dev=dev1"])["process"]["env"] == ["RUN_DEV1=1"]
    assert registry.inject({}, ["example.com/dev=dev2"])["process"]["env"] == ["ETC_DEV2=1"]
    assert registry.errors() == {}


def test_same_priority_conflict_deletes_device_and_blames_both_files(dirs, cache_dir):
    etc, run = dirs
    first = write_spec(etc, "a.yaml", simple_spec(devices=("dev1", "dev2")))
    second = write_spec(etc, "b.yaml", simple_spec(devices=("dev1",)))
    registry = Registry(dirs, cache_dir=cache_dir).refresh()
    assert registry.device_names() == ["example.com/dev=dev2"]
    message = f'conflicting device "example.com/dev=dev1" (specs "{second}", "{first}")'
    assert registry.errors() == {first: [message], second: [message]}


def test_conflict_deletion_also_removes_higher_priority_definition(dirs, cache_dir):
    # The reference deletes conflicted names after the whole scan (podman scenario S6).
    etc, run = dirs
    write_spec(etc, "a.yaml", simple_spec(devices=("dev1",)))
    write_spec(etc, "b.yaml", simple_spec(devices=("dev1",)))
    write_spec(run, "c.yaml", simple_spec(devices=("dev1", "dev3")))
    assert names(Registry(dirs, cache_dir=cache_dir)) == ["example.com/dev=dev3"]


def test_broken_file_is_isolated(dirs, cache_dir):
    etc, _ = dirs
    write_spec(etc, "good.yaml", simple_spec(devices=("ok",)))
    broken = write_spec(etc, "broken.yaml", "garbage: [")
    write_spec(etc, "onebad.json", simple_spec(kind="other.com/x", devices=("good",)).replace(
        "devices:", "containerEdits: {env: [NOEQUALS]}\ndevices:"))
    registry = Registry(dirs, cache_dir=cache_dir).refresh()
    assert registry.device_names() == ["example.com/dev=ok"]
    errors = registry.errors()
    assert set(errors) == {broken, os.path.join(etc, "onebad.json")}
    assert errors[broken][0].startswith(f'failed to load CDI Spec failed to parse CDI Spec "{broken}": ')


def test_file_selection_rules(dirs, cache_dir):
    etc, _ = dirs
    write_spec(etc, "a.yml", simple_spec(devices=("yml",)))
    write_spec(etc, "b.JSON", simple_spec(devices=("upper",)))
    write_spec(os.path.join(etc, "sub"), "c.yaml", simple_spec(devices=("sub",)))
    write_spec(etc, "spec.123.tmp", simple_spec(devices=("tmp",)))
    write_spec(etc, ".hidden.yaml", simple_spec(devices=("hidden",)))
    assert names(Registry(dirs, cache_dir=cache_dir)) == ["example.com/dev=hidden"]


def test_unresolvable_is_all_or_nothing_and_explains(dirs, cache_dir):
    etc, _ = dirs
    path = write_spec(etc, "a.yaml", simple_spec(kind="nvidia.com/gpu", devices=("0", "all")))
    write_spec(etc, "broken.yaml", "kind: nvidia.com/gpu\ncdiVersion: 9.9.9\ndevices: []\n")
    registry = Registry(dirs, cache_dir=cache_dir).refresh()
    config = {"process": {"env": ["A=1"]}}
    with pytest.raises(UnresolvableDevicesError) as info:
        registry.inject(config, ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "vendor1.com/device=dev2"])
    text = str(info.value)
    assert text.startswith("unresolvable CDI devices nvidia.com/gpu=1, vendor1.com/device=dev2; ")
    assert 'nvidia.com/gpu has only "0", "all"' in text
    assert "no spec defines devices of kind vendor1.com/device" in text
    assert 'invalid version "9.9.9"' in text and f"searched {etc}, {dirs[1]}" in text
    assert config == {"process": {"env": ["A=1"]}}
    assert path in registry.spec_paths()


def test_spec_level_edits_once_before_first_device_in_request_order(dirs, cache_dir):
    etc, _ = dirs
    write_spec(etc, "gpu.yaml", simple_spec(kind="vendor.com/gpu", devices=("0", "1"), env_prefix="GPU",
                                             extra="containerEdits:\n  env: [GLOBAL=1]\n"))
    write_spec(etc, "dev.yaml", simple_spec(kind="vendor.com/dev", devices=("a",), env_prefix="DEV"))
    registry = Registry(dirs, cache_dir=cache_dir).refresh()
    config = registry.inject({}, ["vendor.com/gpu=1", "vendor.com/dev=a", "vendor.com/gpu=0"])
    assert config["process"]["env"] == ["GLOBAL=1", "GPU_1=1", "DEV_A=1", "GPU_0=1"]


def test_inject_wraps_apply_errors(dirs, cache_dir):
    etc, _ = dirs
    write_spec(etc, "a.yaml", 'cdiVersion: "0.5.0"\nkind: x.com/y\ndevices:\n  - name: a\n'
                              "    containerEdits:\n      deviceNodes: [{path: /dev/does-not-exist-cdi}]\n")
    with pytest.raises(EditError, match='^failed to inject devices: failed to stat CDI host device '
                                        '"/dev/does-not-exist-cdi": no such file or directory$'):
        Registry(dirs, cache_dir=cache_dir).refresh().inject({}, ["x.com/y=a"])


# --- the persistent cache -----------------------------------------------------------------

def test_fresh_registry_reuses_the_cache(dirs, cache_dir):
    etc, _ = dirs
    for index in range(5):
        write_spec(etc, f"s{index}.yaml", simple_spec(kind=f"v{index}.com/c", devices=("a", "b")))
    first = Registry(dirs, cache_dir=cache_dir).refresh()
    assert first.reparsed == 5
    # Age the files past the racy window so their stat alone proves them unchanged.
    for index in range(5):
        os.utime(os.path.join(etc, f"s{index}.yaml"), ns=(1, 1_000_000_000))
    Registry(dirs, cache_dir=cache_dir).refresh()  # notices the new stats once
    again = Registry(dirs, cache_dir=cache_dir).refresh()
    assert again.reparsed == 0
    assert again.device_names() == first.device_names()


@pytest.mark.parametrize("change", ["rewrite_same_size", "append", "remove", "add", "rename_over", "symlink_retarget"])
def test_any_change_is_seen_at_once(dirs, cache_dir, change, tmp_path):
    etc, _ = dirs
    spec = write_spec(etc, "a.yaml", simple_spec(devices=("aaa",)))
    other = write_spec(str(tmp_path / "elsewhere"), "t.yaml", simple_spec(devices=("tgt",)))
    link = os.path.join(etc, "link.yaml")
    if change == "symlink_retarget":
        os.symlink(spec, link)
        os.rename(spec, spec + ".off")
        write_spec(str(tmp_path / "elsewhere"), "s.yaml", simple_spec(devices=("src",)))
        os.unlink(link)
        os.symlink(str(tmp_path / "elsewhere" / "s.yaml"), link)
    before = names(Registry(dirs, cache_dir=cache_dir))
    stat = os.stat(spec) if os.path.exists(spec) else None
    if change == "rewrite_same_size":
        write_spec(etc, "a.yaml", simple_spec(devices=("bbb",)))
        os.utime(spec, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
        expected = ["example.com/dev=bbb"]
    elif change == "append":
        with open(spec, "a") as out:
            out.write('  - name: "ccc"\n    containerEdits: {env: [C=1]}\n')
        expected = ["example.com/dev=aaa", "example.com/dev=ccc"]
    elif change == "remove":
        os.unlink(spec)
        expected = []
    elif change == "add":
        write_spec(etc, "b.yaml", simple_spec(kind="new.com/x", devices=("n",)))
        expected = ["example.com/dev=aaa", "new.com/x=n"]
    elif change == "rename_over":
        os.rename(other, spec)
        expected = ["example.com/dev=tgt"]
    else:
        os.unlink(link)
        os.symlink(other, link)
        expected = ["example.com/dev=tgt"]
    assert before != expected
    assert names(Registry(dirs, cache_dir=cache_dir)) == expected


def test_untrusted_cache_file_is_ignored(dirs, cache_dir):
    etc, _ = dirs
    write_spec(etc, "a.yaml", simple_spec(devices=("real",)))
    registry = Registry(dirs, cache_dir=cache_dir).refresh()
    cache_file = registry._cache.path
    os.chmod(cache_file, 0o666)  # anyone could have planted devices in it
    again = Registry(dirs, cache_dir=cache_dir).refresh()
    assert again.reparsed == 1


def test_corrupt_cache_file_is_ignored(dirs, cache_dir):
    etc, _ = dirs
    write_spec(etc, "a.yaml", simple_spec(devices=("real",)))
    registry = Registry(dirs, cache_dir=cache_dir).refresh()
    with open(registry._cache.path, "wb") as out:
        out.write(b"\xff\x00garbage")
    assert names(Registry(dirs, cache_dir=cache_dir)) == ["example.com/dev=real"]


def test_concurrent_refreshes_never_give_a_wrong_answer(dirs, cache_dir):
    """Several processes refresh the same cache while a writer keeps changing the specs."""
    etc, _ = dirs
    write_spec(etc, "a.yaml", simple_spec(devices=("gen0",)))
    reader = (
        "import sys, json\n"
        "from cdi.registry import Registry\n"
        "for _ in range(40):\n"
        "    names = Registry(sys.argv[1:], cache_dir=%r).refresh().device_names()\n"
        "    assert len(names) == 1 and names[0].startswith('example.com/dev=gen'), names\n" % cache_dir
    )
    procs = [subprocess.Popen([sys.executable, "-c", reader, *dirs], cwd=os.getcwd()) for _ in range(3)]
    for generation in range(1, 60):
        # Atomic replacement, as spec writers do, so readers never see a partial file.
        tmp = write_spec(etc, "a.yaml.tmp", simple_spec(devices=(f"gen{generation}",)))
        os.rename(tmp, os.path.join(etc, "a.yaml"))
    assert [proc.wait(timeout=120) for proc in procs] == [0, 0, 0]
    # Whatever the processes left behind, the next answer reflects the last write.
    assert names(Registry(dirs, cache_dir=cache_dir)) == ["example.com/dev=gen59"]


def test_cache_can_be_disabled(dirs, monkeypatch, tmp_path):
    etc, _ = dirs
    write_spec(etc, "a.yaml", simple_spec(devices=("x",)))
    monkeypatch.setenv("CDI_SHIM_CACHE_DIR", "")
    registry = Registry(dirs).refresh()
    assert registry._cache.path is None and registry.device_names() == ["example.com/dev=x"]


def test_cache_file_of_another_layout_is_ignored(dirs, cache_dir):
    """A file with our magic but sections of another shape (an older build) is rebuilt."""
    import marshal

    from cdi import registry as module

    etc, _ = dirs
    write_spec(etc, "a.yaml", simple_spec(devices=("real",)))
    path = Registry(dirs, cache_dir=cache_dir).refresh()._cache.path
    hot = marshal.dumps({"version": module.__version__, "dirs": tuple(dirs), "signature": "", "racy": [],
                         "spans": [(0, 1)], "kinds": {}, "kind_spans": b""})
    with open(path, "wb") as out:
        out.write(module._MAGIC + len(hot).to_bytes(4, "little") + (0).to_bytes(4, "little") + hot)
    assert names(Registry(dirs, cache_dir=cache_dir)) == ["example.com/dev=real"]


def test_cache_of_older_decoding_rules_is_parsed_again(dirs, cache_dir, monkeypatch):
    """A cache written by the same package version under older decoding rules (before Go's YAML
    numbers) may hold another meaning of the same file: it is not trusted."""
    from cdi import registry as module

    etc, _ = dirs
    write_spec(etc, "a.yaml", simple_spec(devices=("x",)))
    with monkeypatch.context() as patch:
        patch.setattr(module, "_CACHE_VERSION", module.__version__)   # what the cache held before
        Registry(dirs, cache_dir=cache_dir).refresh()
    again = Registry(dirs, cache_dir=cache_dir).refresh()
    assert again.reparsed == 1 and again.device_names() == ["example.com/dev=x"]
    warm = Registry(dirs, cache_dir=cache_dir).refresh()
    assert warm.reparsed == 0
# --- issue 14, finding 11: the cache directory itself must be ours ---------------------------
# The resident server refuses a socket directory that others could write; the registry cache
# wrote wherever its directory led. A user owning /run/cdi-shim could point cache/ elsewhere and
# root then wrote there.

NOBODY = 65534


def _cache_files(directory):
    return sorted(name for name in os.listdir(directory) if "registry" in name)


def test_cache_dir_under_a_directory_another_user_owns_is_not_used(dirs, tmp_path):
    etc, _ = dirs
    write_spec(etc, "a.yaml", simple_spec(devices=("real",)))
    run = tmp_path / "run-cdi-shim"
    run.mkdir()
    os.chown(run, NOBODY, NOBODY)                      # the user owns /run/cdi-shim ...
    elsewhere = tmp_path / "root-only"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, run / "cache")               # ... and points cache/ elsewhere
    registry = Registry(dirs, cache_dir=str(run / "cache")).refresh()
    assert registry.device_names() == ["example.com/dev=real"]
    assert _cache_files(elsewhere) == [], "root wrote where another user's directory pointed"
    assert "owned by uid" in registry.cache_problem and str(run) in registry.cache_problem
    # a cache file planted there (a copy of a real one, owned by root) is not read either
    good = tmp_path / "good-cache"
    Registry(dirs, cache_dir=str(good)).refresh()
    for name in _cache_files(good):
        os.rename(good / name, elsewhere / name)
    assert Registry(dirs, cache_dir=str(run / "cache")).refresh().reparsed == 1


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777])
def test_cache_dir_writable_by_others_is_not_used(dirs, tmp_path, mode):
    etc, _ = dirs
    write_spec(etc, "a.yaml", simple_spec(devices=("real",)))
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, mode)
    registry = Registry(dirs, cache_dir=str(cache)).refresh()
    assert registry.device_names() == ["example.com/dev=real"]
    assert _cache_files(cache) == []
    assert "not writable by group or others" in registry.cache_problem


def test_cache_dir_owned_by_another_user_is_not_used(dirs, tmp_path):
    etc, _ = dirs
    write_spec(etc, "a.yaml", simple_spec(devices=("real",)))
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, NOBODY, NOBODY)
    Registry(dirs, cache_dir=str(cache)).refresh()
    assert _cache_files(cache) == []


def test_cache_dir_of_ours_is_used_and_made(dirs, tmp_path):
    etc, _ = dirs
    write_spec(etc, "a.yaml", simple_spec(devices=("real",)))
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)              # like /tmp: others cannot rename our entries
    registry = Registry(dirs, cache_dir=str(sticky / "a" / "cache")).refresh()
    assert registry.cache_problem is None
    assert len(_cache_files(sticky / "a" / "cache")) == 1
    assert Registry(dirs, cache_dir=str(sticky / "a" / "cache")).refresh().reparsed == 0
