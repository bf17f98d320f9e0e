"""The hook server's answers kept by the image's layers (shim/nri/layers.py), on overlay roots
made as containerd and runc make them (a lower layer, a fresh upper, the spec's library files
bind-mounted over mount points), in a private mount namespace: a second container of the same
image and mounts gets the first one's files; one whose mounted file, upper layer or layers
differ does the work again, and so does a root that is not an overlay; a pod's own mount
elsewhere (/etc/hosts) changes nothing."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.nri.test_hook import LIBZ

FOLDER = "/usr/lib/x86_64-linux-gnu"

SCRIPT = r'''
import json, os, subprocess, sys
from shim.ldconfig import ldcache
from shim.nri.hookserver import HookServer
from shim.nri.layers import AnswerMemo

base, folder, libs, other = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
logged = []
server = HookServer(os.path.join(base, "h.sock"), lambda level, text: logged.append(text))
server.memos = ldcache.Memos().open()
server.answers = AnswerMemo(settle_ns=0)   # (the files are new: no settle window here)
items = [("folder", folder)]
out = []

def container(name, lower="lower", mounted=None, upper_file=None, overlay=True, hosts=False):
    work = os.path.join(base, name)
    for sub in ("upper", "work", "merged"):
        os.makedirs(os.path.join(work, sub))
    root = os.path.join(work, "merged")
    if overlay:
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={base}/{lower},upperdir={work}/upper,"
                        f"workdir={work}/work", root], check=True)
    else:
        subprocess.run(["cp", "-a", f"{base}/{lower}/.", root], check=True)
    for lib in mounted or libs:
        dest = root + folder + "/" + os.path.basename(lib).replace("-other", "")
        open(dest, "a").close()
        subprocess.run(["mount", "--bind", "-o", "ro", lib, dest], check=True)
    if upper_file:
        subprocess.run(["cp", upper_file, root + folder + "/"], check=True)
    if hosts:   # (a pod's own file: not read by the linker)
        with open(os.path.join(work, "hosts"), "w") as stream:
            stream.write(name + "\n")
        open(root + "/etc/hosts", "a").close()
        subprocess.run(["mount", "--bind", os.path.join(work, "hosts"), root + "/etc/hosts"], check=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with server.memos.using():
            result = server._update(f"/proc/self/fd/{fd}", items, fd, os.getpid())
    finally:
        os.close(fd)
    with open(root + "/etc/ld.so.cache", "rb") as stream:
        data = stream.read()
    listing = subprocess.run(["ldconfig", "-p", "-C", root + "/etc/ld.so.cache"], capture_output=True, text=True).stdout
    out.append({"name": name, "kept": result[3], "cache": data.hex(), "listing": listing})

container("first")
container("second")
container("other-source", mounted=[libs[0], other])
container("upper-file", upper_file=other)
container("other-layers", lower="lower2")
container("plain", overlay=False)
container("hosts", hosts=True)
container("third")
print(json.dumps({"runs": out, "logged": logged}))
'''


def build_lib(directory, name, soname, gcc):
    source = os.path.join(directory, name + ".c")
    with open(source, "w") as stream:
        stream.write(f"int {name.replace('.', '_').replace('-', '_')}(void) {{ return 1; }}\n")
    path = os.path.join(directory, name)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", path, source, f"-Wl,-soname,{soname}"], check=True)
    return path


def test_answers_kept_by_the_layers(tmp_path):
    gcc, unshare = shutil.which("gcc"), shutil.which("unshare")
    if os.geteuid() != 0 or not gcc or not unshare:
        pytest.skip("needs root, gcc and unshare (overlay and bind mounts in a private namespace)")
    for lower in ("lower", "lower2"):
        libs = tmp_path / lower / FOLDER.lstrip("/")
        libs.mkdir(parents=True)
        (tmp_path / lower / "etc").mkdir()
        (tmp_path / lower / "etc" / "ld.so.conf").write_text(f"{FOLDER}\n")
        shutil.copy(os.path.realpath(LIBZ), libs / "libz.so.1.2.13")
        subprocess.run(["ldconfig", "-r", str(tmp_path / lower)], check=True)
    (tmp_path / "lower2" / FOLDER.lstrip("/") / "libz.so.1.2.13").unlink()
    subprocess.run(["ldconfig", "-r", str(tmp_path / "lower2")], check=True)
    drv = tmp_path / "driver"
    drv.mkdir()
    libs = [build_lib(str(drv), f"libnvidia-t{i}.so.550.1", f"libnvidia-t{i}.so.1", gcc) for i in range(2)]
    other = build_lib(str(drv), "libnvidia-t1.so.550.1-other", "libnvidia-t1x.so.1", gcc)
    run = subprocess.run([unshare, "-m", "--propagation", "private", sys.executable, "-c", SCRIPT, str(tmp_path),
                          FOLDER, json.dumps(libs), other], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    runs = {entry["name"]: entry for entry in result["runs"]}
    assert [entry["kept"] for entry in result["runs"]] == [False, True, False, False, False, False, True, True], result
    assert runs["second"]["cache"] == runs["first"]["cache"] == runs["third"]["cache"]
    assert "libnvidia-t1.so.1" in runs["first"]["listing"] and "libz.so.1" in runs["first"]["listing"]
    assert "libnvidia-t1x.so.1" in runs["other-source"]["listing"]
    upper = runs["upper-file"]["listing"]
    assert "libnvidia-t1x.so.1" in upper and "libnvidia-t1.so.1" in upper
    assert "libz.so.1" not in runs["other-layers"]["listing"]
    assert runs["plain"]["cache"] == runs["first"]["cache"]     # (done again: not an overlay)
    assert any("not kept" in text for text in result["logged"]), result["logged"]


def test_nothing_young_is_kept():
    """A layer or a mounted file changed within the settle window is not trusted by identity."""
    import time

    from shim.nri.layers import AnswerMemo

    memo = AnswerMemo()
    old = (0o100000, 1, 2, 3, 4, 5)
    young = (0o100000, 1, 2, 3, 4, time.time_ns())
    assert not memo.keep((("folder", "/x"), (("/l", young),)), ("/x",), ((), ()), "answer")
    assert not memo.keep((("folder", "/x"), (("/l", old),)), ("/x",), ((), (("/x/a", young),)), "answer")
    assert memo.keep((("folder", "/x"), (("/l", old),)), ("/x",), ((), (("/x/a", old),)), "answer")
