"""`cdi-shim-hook nri`: the one hook an NRI adjustment carries, run as runc runs a
createContainer hook (the container state on stdin) on a root: links, modes, then the cache."""
import json
import os
import shutil
import stat
import subprocess

from tests.conftest import tool

LIBZ = "/lib/x86_64-linux-gnu/libz.so.1"      # zlib1g: Essential in Debian (dpkg needs it)


def bundle(tmp_path):
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "dev" / "dri").mkdir(parents=True)
    os.chmod(rootfs / "dev" / "dri", 0o700)
    libs = rootfs / "usr" / "lib" / "x86_64-linux-gnu"
    libs.mkdir(parents=True)
    shutil.copy(os.path.realpath(LIBZ), libs / "libz.so.1.2.13")      # (its real SONAME, whatever the version)
    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"}}))
    return rootfs, json.dumps({"ociVersion": "1.0.2", "id": "c", "pid": 1, "bundle": str(tmp_path)})


def hook(args, state):
    return subprocess.run([tool("cdi-shim-hook"), "nri", *args], input=state, capture_output=True, text=True)


def test_links_modes_and_the_linker_cache(tmp_path):
    rootfs, state = bundle(tmp_path)
    done = hook(["--link", "libz.so.1.2.13::/usr/lib/x86_64-linux-gnu/libz.so", "--chmod", "755:/dev/dri",
                 "--chmod", "644:/no/such/path", "--folder", "/usr/lib/x86_64-linux-gnu"], state)
    assert done.returncode == 0, done.stderr
    assert os.readlink(rootfs / "usr/lib/x86_64-linux-gnu/libz.so") == "libz.so.1.2.13"
    assert stat.S_IMODE(os.stat(rootfs / "dev/dri").st_mode) == 0o755
    listing = subprocess.run([tool("cdi-shim"), "ldcache", "list", "--root", str(rootfs)],
                             capture_output=True, text=True, check=True).stdout
    assert "libz.so.1 " in listing and "/usr/lib/x86_64-linux-gnu/libz.so.1" in listing


def test_a_link_out_of_the_root_stays_inside(tmp_path):
    rootfs, state = bundle(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(str(outside), rootfs / "usr/lib/escape")
    done = hook(["--link", "x::/usr/lib/escape/y"], state)
    assert not os.path.lexists(outside / "y")
    assert done.returncode == 0 or "Error:" in done.stderr


def test_bad_options_and_a_bad_state_fail_with_a_reason(tmp_path):
    _, state = bundle(tmp_path)
    done = hook(["--chmod", "755"], state)
    assert done.returncode == 2 and "MODE:PATH" in done.stderr
    done = hook(["--folder", "/usr/lib"], "not json")
    assert done.returncode == 1 and done.stderr.startswith("Error: ")
