"""The images of benchmarks/hook_differential.py: real layouts, each built once per run and
copied (hard links, /etc copied whole) for each way of each case.

- `busybox`: the differential's first image -- a busybox root, the glibc folder a plain
  directory (/usr/lib/x86_64-linux-gnu), /lib64 a directory; the case writes its ld.so.conf;
- `debian12`, `debian13`: `debootstrap --variant=minbase` of bookworm and trixie (cached as
  tarballs by tests/linker/roots.py), merged /usr (`/lib -> usr/lib`, `/lib64 -> usr/lib64`),
  `include /etc/ld.so.conf.d/*.conf` and Debian's `x86_64-linux-gnu.conf` (/usr/local/lib/
  x86_64-linux-gnu, /lib/x86_64-linux-gnu, /usr/lib/x86_64-linux-gnu), the image's own cache
  (/usr/share left out: nothing there is read by a loader);
- `rpm`: as Fedora lays it out: /usr/lib64 the system folder (this machine's glibc libraries
  copied there under their own names, the loader at /usr/lib64/ld-linux-x86-64.so.2),
  `/lib64 -> usr/lib64`, `/lib -> usr/lib`, `/bin -> usr/bin`, `/sbin -> usr/sbin`, no
  /etc/debian_version, and ld.so.conf `include ld.so.conf.d/*.conf` (relative, as Fedora ships
  it); the image's cache made as Fedora's ldconfig would (/usr/lib64 trusted);
- `cuda`: debian12 with a CUDA toolkit laid out as NVIDIA's CUDA images do:
  /usr/local/cuda-12.4/targets/x86_64-linux/lib (libcudart, and stubs/libcuda.so, soname
  libcuda.so.1), /usr/local/cuda-12.4/lib64 -> targets/x86_64-linux/lib, the cuda-compat
  folder /usr/local/cuda-12.4/compat (its libraries are the case's), /usr/local/cuda ->
  cuda-12.4 and /usr/local/cuda-12 -> cuda-12.4 (or, per case, through /etc/alternatives as
  the images' update-alternatives makes them), /etc/ld.so.conf.d/000_cuda.conf and
  988_cuda-12.conf naming the folders through those links, and nvidia.conf naming
  /usr/local/nvidia/lib and lib64 (not present).

Every path inside an image is resolved in it (`in_root`): its links, absolute ones included,
never lead out to this machine.
"""
import errno
import os
import shutil
import subprocess

LAYOUTS = ("busybox", "debian12", "debian13", "rpm", "cuda")
MULTIARCH = "/usr/lib/x86_64-linux-gnu"
HOST_LIBDIR = "/lib/x86_64-linux-gnu"
CUDA = "12.4"
CUDA_HOME = f"/usr/local/cuda-{CUDA}"
CUDA_TARGET = f"{CUDA_HOME}/targets/x86_64-linux/lib"
COMPAT = "/usr/local/cuda/compat"
SUITES = {"debian12": "bookworm", "debian13": "trixie"}
# the library folders each layout's images use, as a spec names them (the second spelling of
# a merged-/usr folder: a spec generated on a host whose ldconfig -p names /lib/...)
LIBDIRS = {
    "busybox": [MULTIARCH, MULTIARCH, "/usr/lib64"],
    "debian12": [MULTIARCH, MULTIARCH, MULTIARCH, "/lib/x86_64-linux-gnu"],
    "debian13": [MULTIARCH, MULTIARCH, MULTIARCH, "/lib/x86_64-linux-gnu"],
    "rpm": ["/usr/lib64", "/usr/lib64", "/usr/lib64", "/lib64"],
    "cuda": [MULTIARCH, MULTIARCH, MULTIARCH, "/lib/x86_64-linux-gnu"],
}
# the include-less /etc/ld.so.conf a case may put in place of the image's: the busybox image's
# lists its one folder; the real ones as a Dockerfile's `echo /usr/local/lib > /etc/ld.so.conf`
PLAIN_CONF = {"busybox": MULTIARCH + "\n"}
PLAIN_CONF_REAL = "/usr/local/lib\n"
# the host's glibc (and a few common) libraries an RPM image carries in /usr/lib64
# the folders this machine's ldconfig (Debian's glibc 2.36, which the hook runs) reads unlisted
LDCONFIG_TRUSTED = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib")
# the hook's "system search paths" (its zz-nvcr drop-in): Debian's where /etc/debian_version is
DEBIAN_LIKE = ("debian12", "debian13", "cuda")
SYSTEM_FOLDERS = {layout: ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu") if layout in DEBIAN_LIKE
                  else ("/lib64", "/usr/lib64") for layout in LAYOUTS}
# each layout's links between folders, as (link, what it leads to): a folder's one spelling
FOLDER_LINKS = {
    "busybox": (),
    "debian12": (("/lib", "/usr/lib"), ("/lib64", "/usr/lib64")),
    "debian13": (("/lib", "/usr/lib"), ("/lib64", "/usr/lib64")),
    "rpm": (("/lib", "/usr/lib"), ("/lib64", "/usr/lib64")),
    "cuda": (("/lib", "/usr/lib"), ("/lib64", "/usr/lib64"), ("/usr/local/cuda", CUDA_HOME),
             ("/usr/local/cuda-12", CUDA_HOME), (f"{CUDA_HOME}/lib64", CUDA_TARGET)),
}
RPM_LIBS = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libgcc_s.so.1")
RPM_LINKED = ("libz.so.1", "libstdc++.so.6")     # a soname link to a versioned file, as RPMs ship them


def in_root(root, path, follow_last=True, hops=40):
    """The host path of PATH inside ROOT, its links followed inside ROOT (an absolute link text
    from ROOT, `..` never above it); the last component's link too when FOLLOW_LAST."""
    todo = [p for p in path.split("/") if p and p != "."]
    done = []
    while todo:
        name = todo.pop(0)
        if name == "..":
            if done:
                done.pop()
            continue
        host = os.path.join(root, *done, name)
        if (todo or follow_last) and os.path.islink(host):
            hops -= 1
            if hops <= 0:
                raise OSError(errno.ELOOP, "too many links", path)
            text = os.readlink(host)
            if text.startswith("/"):
                done = []
            todo = [p for p in text.split("/") if p and p != "."] + todo
            continue
        done.append(name)
    return os.path.join(root, *done)


def canonical(layout, path):
    """PATH spelled without the links between folders LAYOUT's images have (its one name there)."""
    path = os.path.normpath(path)
    changed = True
    while changed:
        changed = False
        for link, target in FOLDER_LINKS[layout]:
            if path == link or path.startswith(link + "/"):
                path, changed = target + path[len(link):], True
    return path


def makedirs(root, path, mode=0o755):
    host = in_root(root, path)
    os.makedirs(host, mode=mode, exist_ok=True)
    return host


def write(root, path, text, mode=0o644):
    host = in_root(root, path, follow_last=False)
    os.makedirs(os.path.dirname(host), exist_ok=True)
    if os.path.lexists(host):
        os.unlink(host)
    with open(host, "w") as out:
        out.write(text)
    os.chmod(host, mode)
    return host


def symlink(root, text, path):
    host = in_root(root, path, follow_last=False)
    os.makedirs(os.path.dirname(host), exist_ok=True)
    if os.path.lexists(host):
        os.unlink(host)
    os.symlink(text, host)
    return host


def copy(root, source, path):
    host = in_root(root, path, follow_last=False)
    os.makedirs(os.path.dirname(host), exist_ok=True)
    shutil.copy2(source, host)
    return host


def remove(root, path):
    host = in_root(root, path, follow_last=False)
    if os.path.isdir(host) and not os.path.islink(host):
        shutil.rmtree(host)
    elif os.path.lexists(host):
        os.unlink(host)


def image_ldconfig(root, layout, ldconfig="ldconfig"):
    """The image's own cache, as its distribution's ldconfig makes it at build time. This
    machine's ldconfig (Debian's) reads /lib, /usr/lib and the multiarch folders unlisted;
    Fedora's reads /lib64 and /usr/lib64 (after the configured folders, whatever ld.so.conf
    includes): for `rpm` a private configuration includes the image's ld.so.conf (if any) and
    then lists those two."""
    args = [ldconfig, "-r", root]
    private = None
    if layout == "rpm":
        conf = "include /etc/ld.so.conf\n" if os.path.lexists(in_root(root, "/etc/ld.so.conf", False)) else ""
        private = write(root, "/etc/.fedora-ldconfig.conf", conf + "/lib64\n/usr/lib64\n")
        args += ["-f", "/etc/.fedora-ldconfig.conf"]
    try:
        subprocess.run(args, check=True, timeout=60, capture_output=True)
    finally:
        if private:
            os.unlink(private)


# ---- building each layout once ---------------------------------------------------------------

def build(name, dest, *, busybox, tarball=None, library=None, ldconfig="ldconfig"):
    """The layout NAME at DEST (a new directory). TARBALL: the debootstrap tarball of a Debian
    layout (cuda: Debian 12's); LIBRARY(path, soname, ident): builds a fake library (cuda)."""
    os.makedirs(dest)
    if name == "busybox":
        _busybox(dest, busybox)
    elif name in SUITES or name == "cuda":
        _debian(dest, tarball)
        if name == "cuda":
            _cuda(dest, library)
    elif name == "rpm":
        _rpm(dest, busybox)
    else:
        raise ValueError(f"no layout {name!r}")
    if name != "busybox":
        image_ldconfig(dest, name, ldconfig)
    return dest


def _busybox(dest, busybox):
    for sub in ("bin", "dev", "proc", "sys", "etc", "tmp", MULTIARCH[1:], "lib64", "usr/lib64"):
        os.makedirs(os.path.join(dest, sub), exist_ok=True)
    shutil.copy2(busybox, os.path.join(dest, "bin", "busybox"))
    for applet in ("sh", "ls", "cat"):
        os.symlink("busybox", os.path.join(dest, "bin", applet))
    write(dest, "/etc/passwd", "root:x:0:0:root:/:/bin/sh\n")
    for name in ("libc.so.6", "libm.so.6"):
        copy(dest, os.path.realpath(f"{HOST_LIBDIR}/{name}"), f"{MULTIARCH}/{name}")
    copy(dest, os.path.realpath("/lib64/ld-linux-x86-64.so.2"), "/lib64/ld-linux-x86-64.so.2")


def _debian(dest, tarball):
    subprocess.run(["tar", "-C", dest, "--numeric-owner", "-xf", tarball], check=True)
    share = os.path.join(dest, "usr", "share")
    shutil.rmtree(share, ignore_errors=True)
    os.makedirs(share)
    for sub in ("var/cache", "var/log"):
        for entry in os.listdir(os.path.join(dest, sub)):
            path = os.path.join(dest, sub, entry)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)


def _rpm(dest, busybox):
    for sub in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "usr/local/lib", "usr/local/lib64", "etc/ld.so.conf.d",
                "dev", "proc", "sys", "tmp", "run", "var", "opt", "root", "home"):
        os.makedirs(os.path.join(dest, sub), exist_ok=True)
    for link, text in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        os.symlink(text, os.path.join(dest, link))
    shutil.copy2(busybox, os.path.join(dest, "usr/bin/busybox"))
    for applet in ("sh", "ls", "cat"):
        os.symlink("busybox", os.path.join(dest, "usr/bin", applet))
    for name in RPM_LIBS:
        copy(dest, os.path.realpath(f"{HOST_LIBDIR}/{name}"), f"/usr/lib64/{name}")
    for name in RPM_LINKED:
        real = os.path.realpath(f"{HOST_LIBDIR}/{name}")
        copy(dest, real, f"/usr/lib64/{os.path.basename(real)}")
        symlink(dest, os.path.basename(real), f"/usr/lib64/{name}")
    copy(dest, os.path.realpath("/lib64/ld-linux-x86-64.so.2"), "/usr/lib64/ld-linux-x86-64.so.2")
    write(dest, "/etc/ld.so.conf", "include ld.so.conf.d/*.conf\n")
    write(dest, "/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n")
    write(dest, "/etc/redhat-release", "Fedora release 41 (Forty One)\n")
    write(dest, "/etc/os-release", 'NAME="Fedora Linux"\nID=fedora\nVERSION_ID=41\n')


def _cuda(dest, library):
    target = makedirs(dest, CUDA_TARGET)
    real = f"libcudart.so.{CUDA}.127"
    library(os.path.join(target, real), "libcudart.so.12", "image-cudart")
    os.symlink(real, os.path.join(target, "libcudart.so.12"))
    os.symlink("libcudart.so.12", os.path.join(target, "libcudart.so"))
    os.makedirs(os.path.join(target, "stubs"))
    library(os.path.join(target, "stubs", "libcuda.so"), "libcuda.so.1", "image-cuda-stub")
    symlink(dest, "targets/x86_64-linux/lib", f"{CUDA_HOME}/lib64")
    makedirs(dest, f"{CUDA_HOME}/compat")
    cuda_links(dest, "relative")
    write(dest, "/etc/ld.so.conf.d/000_cuda.conf", "/usr/local/cuda/targets/x86_64-linux/lib\n")
    write(dest, "/etc/ld.so.conf.d/988_cuda-12.conf", "/usr/local/cuda-12/targets/x86_64-linux/lib\n")
    write(dest, "/etc/ld.so.conf.d/nvidia.conf", "/usr/local/nvidia/lib\n/usr/local/nvidia/lib64\n")


def cuda_links(root, style):
    """/usr/local/cuda and /usr/local/cuda-12 to CUDA_HOME: `relative` (cuda-12.4), or
    `alternatives` (/etc/alternatives/cuda -> /usr/local/cuda-12.4, absolute, as the images' are)."""
    for name in ("cuda", "cuda-12"):
        if style == "relative":
            symlink(root, os.path.basename(CUDA_HOME), f"/usr/local/{name}")
            remove(root, f"/etc/alternatives/{name}")
        else:
            symlink(root, CUDA_HOME, f"/etc/alternatives/{name}")
            symlink(root, f"/etc/alternatives/{name}", f"/usr/local/{name}")


# ---- copies ----------------------------------------------------------------------------------

def clone(layout_dir, dest):
    """A copy of LAYOUT_DIR at DEST: hard links (files are replaced, never written, by the ways'
    work), but /etc copied whole, the one folder whose files a way may rewrite in place."""
    subprocess.run(["cp", "-al", layout_dir, dest], check=True)
    etc = os.path.join(dest, "etc")
    if os.path.isdir(etc) and not os.path.islink(etc):
        shutil.rmtree(etc)
        subprocess.run(["cp", "-a", os.path.join(layout_dir, "etc"), etc], check=True)
    return dest


def fingerprint(layout_dir):
    """{relative path: (inode, size, mtime_ns, mode)} of each regular file: the cached layout
    must come out of a run as it went in (a way that wrote into a shared file would show)."""
    seen = {}
    for top, dirs, files in os.walk(layout_dir):
        for name in files:
            path = os.path.join(top, name)
            st = os.lstat(path)
            if not os.path.islink(path):
                seen[os.path.relpath(path, layout_dir)] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
    return seen
