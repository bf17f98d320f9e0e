"""The hook differential's pure parts (benchmarks/hook_differential.py, hook_layouts.py): paths
resolved inside an image, a folder's one spelling per layout, the copies of a layout, and the
classifier's documented rules, which must hold on the case's layout, not only by their text."""
import os
import random
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")
sys.path.insert(0, BENCHMARKS)

import hook_differential as hd  # noqa: E402
import hook_layouts as hl  # noqa: E402


def test_in_root_follows_absolute_and_relative_links_inside_the_root(tmp_path):
    root = str(tmp_path)
    os.makedirs(root + hl.CUDA_HOME + "/compat")
    os.makedirs(root + "/usr/lib")
    hl.cuda_links(root, "alternatives")
    assert os.readlink(root + "/usr/local/cuda") == "/etc/alternatives/cuda"
    assert hl.in_root(root, "/usr/local/cuda/compat") == root + hl.CUDA_HOME + "/compat"
    assert hl.in_root(root, "/usr/local/cuda", follow_last=False) == root + "/usr/local/cuda"
    os.symlink("usr/lib", root + "/lib")
    assert hl.in_root(root, "/lib/x86_64-linux-gnu/libc.so.6") == root + "/usr/lib/x86_64-linux-gnu/libc.so.6"
    os.symlink("../../../../../../etc", root + "/usr/lib/up")           # never above the root
    assert hl.in_root(root, "/usr/lib/up/passwd") == root + "/etc/passwd"
    os.symlink("/", root + "/usr/lib/top")
    assert hl.in_root(root, "/usr/lib/top/usr") == root + "/usr"
    os.symlink("loop", root + "/loop")
    with pytest.raises(OSError):
        hl.in_root(root, "/loop/x")
    hl.cuda_links(root, "relative")
    assert os.readlink(root + "/usr/local/cuda") == os.path.basename(hl.CUDA_HOME)
    assert not os.path.lexists(root + "/etc/alternatives/cuda")


@pytest.mark.parametrize("layout, path, one", [
    ("debian12", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"),
    ("debian13", "/usr/lib/x86_64-linux-gnu/", "/usr/lib/x86_64-linux-gnu"),
    ("rpm", "/lib64", "/usr/lib64"),
    ("busybox", "/lib64", "/lib64"),                  # a directory there, not a link
    ("cuda", "/usr/local/cuda/lib64/stubs", hl.CUDA_TARGET + "/stubs"),
    ("cuda", "/usr/local/cuda-12/targets/x86_64-linux/lib", hl.CUDA_TARGET),
])
def test_a_folder_s_one_spelling_per_layout(layout, path, one):
    assert hl.canonical(layout, path) == one


def test_a_copy_shares_files_but_not_etc_and_a_write_through_a_shared_file_shows(tmp_path):
    layout = str(tmp_path / "layout")
    for sub in ("etc", "usr/lib"):
        os.makedirs(os.path.join(layout, sub))
    for name in ("etc/ld.so.conf", "usr/lib/libx.so.1"):
        with open(os.path.join(layout, name), "w") as out:
            out.write("original\n")
    before = hl.fingerprint(layout)
    copy = hl.clone(layout, str(tmp_path / "copy"))
    assert os.stat(copy + "/usr/lib/libx.so.1").st_ino == os.stat(layout + "/usr/lib/libx.so.1").st_ino
    assert os.stat(copy + "/etc/ld.so.conf").st_ino != os.stat(layout + "/etc/ld.so.conf").st_ino
    with open(copy + "/etc/ld.so.conf", "w") as out:
        out.write("rewritten in place\n")
    assert hl.fingerprint(layout) == before
    with open(copy + "/usr/lib/libx.so.1", "a") as out:
        out.write("written through the hard link\n")
    assert hl.fingerprint(layout) != before


def test_each_case_s_library_folder_is_one_its_layout_uses():
    rng = random.Random(5)
    cases = [hd.random_case(rng, n) for n in range(300)]
    assert {c["layout"] for c in cases} == set(hl.LAYOUTS)
    for case in cases:
        assert case["libdir"] in hl.LIBDIRS[case["layout"]]
        for hook in case["hooks"]:
            for arg in hook:
                if arg.startswith("lib") and "::" in arg:
                    assert os.path.dirname(arg.split("::")[1]) == case["libdir"]
        if case["layout"] == "cuda":
            assert case["compat"] and case["cuda_links"] in ("relative", "alternatives")
    assert all(c["layout"] == "rpm" for c in map(lambda n: hd.random_case(rng, n, ("rpm",)), range(20)))


def _case(layout, conf="plain", hooks=(("update-ldcache", "--folder", None),)):
    libdir = hl.LIBDIRS[layout][0]
    return {"layout": layout, "conf": conf, "libdir": libdir,
            "hooks": [[a if a is not None else libdir for a in hook] for hook in hooks]}


CACHE = "\tlibc.so.6 (libc6,x86-64) => {d}/libc.so.6\n"
GAIN = "\tlibcuda.so.1 (libc6,x86-64) => {d}/libcuda.so.1\n"


@pytest.mark.parametrize("layout, documented", [
    ("busybox", False),   # /usr/lib/x86_64-linux-gnu: read by ldconfig unlisted (a gain there: a real difference)
    ("debian12", False),
    ("debian13", False),
    ("cuda", False),
    ("rpm", True),        # /usr/lib64 is no folder of this machine's ldconfig: only the drop-in names it
])
def test_the_include_less_rule_covers_only_folders_the_toolkit_does_not_read(layout, documented):
    case = _case(layout)
    d = case["libdir"]
    theirs, ours = CACHE.format(d=d), CACHE.format(d=d) + GAIN.format(d=d)
    rule = hd._rule(case, "cache", theirs, ours)
    assert (rule == "documented: an ld.so.conf without an include line still gets the folders") is documented
    loaded = f"{d}/libcuda.so.1 libcuda.so.550.54.15"
    assert bool(hd._rule(case, "dlopen libcuda.so.1", "fails", loaded)) is documented


def test_the_include_less_rule_is_not_about_an_absent_ld_so_conf():
    """Where the image has no ld.so.conf both the hook and we write one with the include line."""
    case = _case("rpm", conf="absent")
    d = case["libdir"]
    assert hd._rule(case, "cache", CACHE.format(d=d), CACHE.format(d=d) + GAIN.format(d=d)) is None
    assert hd._rule(_case("rpm", conf="include"), "dlopen libcuda.so.1", "fails", f"{d}/libcuda.so.1 x") is None


def test_a_cache_built_without_update_ldcache_must_keep_the_image_s_sonames():
    case = _case("rpm", conf="include", hooks=(("create-symlinks", "--link", "libcuda.so.1::/usr/lib64/libcuda.so"),))
    d = case["libdir"]
    image = CACHE.format(d=d) + "\tlibz.so.1 (libc6,x86-64) => /usr/lib64/libz.so.1\n"
    ours = CACHE.format(d=d) + GAIN.format(d=d)
    assert hd._rule(case, "cache", image, ours, loads_gain=True) is None            # libz.so.1 dropped
    assert hd._rule(case, "cache", image, image + GAIN.format(d=d), loads_gain=True) \
        == "documented: library mounts without update-ldcache get a cache"


def test_the_sticky_bit_rule_only_for_chmod_1777():
    hooks = (("chmod", "--mode", "1777", "--path", "/opt/data"),)
    for layout in hl.LAYOUTS:
        assert hd._rule(_case(layout, hooks=hooks), "entry /opt/data", "entry d 0777", "entry d 1777")
        assert not hd._rule(_case(layout, hooks=(("chmod", "--mode", "755", "--path", "/opt/data"),)),
                            "entry /opt/data", "entry d 0755", "entry d 1755")


def test_the_include_less_rule_covers_the_system_folders_of_the_unread_zz_drop_in():
    """busybox (no /etc/debian_version): the hook's zz-nvcr drop-in names /lib64 and /usr/lib64;
    unread where ld.so.conf has no include, read by ours (observed: seed 2 case 37, the loader's
    /lib64/ld-linux-x86-64.so.2 listed by ours only)."""
    case = _case("busybox")
    d = case["libdir"]
    ours = CACHE.format(d=d) + "\tld-linux-x86-64.so.2 (libc6,x86-64) => /lib64/ld-linux-x86-64.so.2\n"
    assert hd._rule(case, "cache", CACHE.format(d=d), ours)
    assert hd._rule(_case("debian12"), "cache", CACHE.format(d=d), ours.replace("/lib64/", "/usr/lib64/")) is None
