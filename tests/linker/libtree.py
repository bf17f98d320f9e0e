"""A generated library-rich Debian-like root for the ldcache tests and the benchmarks.

No file of this machine's library directories goes into it: every library is linked here by
gcc (one tiny object, compiled once, linked into each .so with its own -Wl,-soname), so the
tree is the same on a minimal Debian root as on a developer's machine with every package
installed. What it holds (counted in the manifest, from which the tests compute what they
expect):

  usr/lib/x86_64-linux-gnu        ~400 sonames in 409 files: versioned files (libfoo.so.1.2.3,
                                  .so.4.5, soname-named files like libc.so.6, libdb-5.3.so),
                                  their soname links, dev links (libfoo.so) for a sixth, a second
                                  major of some libraries, stale older files with the same
                                  soname, a GNU ld script (libcdtscript.so), libz.so.1.2.13
    glibc-hwcaps/x86-64-v3, -v2   libraries of the parent's sonames linked -z x86-64-v3/v2
    cdt-private                   a private directory listed in etc/ld.so.conf.d
    cdt-plugins                   a sub-folder no configuration names: never in the cache
  usr/lib/i386-linux-gnu          32-bit libraries (gcc -m32), listed in
                                  etc/ld.so.conf.d/i386-linux-gnu.conf
  etc/ld.so.conf(.d), etc/debian_version, lib -> usr/lib, lib64 -> usr/lib64,
  var/cache/ldconfig; no ld.so.cache (the users make theirs)

In all 490 library files (480 in directories ldconfig scans) and 417 links; 545 cache
entries, as many as the host trees the tests and benchmarks used before. Built cold in 4-10 s
on two shared cores (the manifest's build_seconds), 7 MB as a tarball.

The tree is built once and kept as a tarball (with its manifest) under CDI_SHIM_TEST_CACHE,
named by a hash of this file and of gcc's version: a change to the generator builds it anew.
Nothing here is loaded by ld.so; the libraries are real enough for ldconfig and our reader
(ELF headers, dynamic sections, SONAMEs, GNU property notes, DT_NEEDED libc.so.6).
"""
import collections
import concurrent.futures
import hashlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import time

MULTIARCH = "usr/lib/x86_64-linux-gnu"
I386 = "usr/lib/i386-linux-gnu"
PRIVATE = MULTIARCH + "/cdt-private"
PLUGINS = MULTIARCH + "/cdt-plugins"
HWCAPS = {"x86-64-v3": 12, "x86-64-v2": 4}

MAIN_SONAMES = 392          # sonames made in the multiarch directory (libz.so.1 included)
PRIVATE_LIBS = 30
PLUGIN_LIBS = 10
I386_LIBS = 25
STALE = 10                  # older files beside a newer one with the same soname
SECOND_MAJOR = 12           # libraries present with two majors (libfoo.so.1 and libfoo.so.2)

SOURCE = "int cdt_library_value(void) { return 42; }\n"
STEMS = ["ssl", "crypto", "xml", "gtk", "glib", "X", "xcb", "pcre", "png", "jpeg", "tiff",
         "curl", "idn", "ssh", "krb", "gss", "sasl", "ldap", "db", "gdbm", "ffi", "gmp", "mpfr",
         "mpc", "isl", "tinfo", "ncurses", "readline", "history", "bz", "lzma", "zstd", "lz",
         "brotli", "expat", "yaml", "json", "uuid", "blkid", "mount", "selinux", "sepol",
         "audit", "cap", "acl", "attr", "pam", "systemd", "udev", "dbus", "gcrypt", "gpg",
         "assuan", "ksba", "npth", "tasn", "nettle", "hogweed", "gnutls", "p11", "unistring",
         "icu", "harfbuzz", "freetype", "fontconfig", "pixman", "cairo", "pango", "atk",
         "drm", "gbm", "EGL", "GLX", "GL", "vulkan", "wayland", "xkb", "input", "evdev",
         "mtdev", "wacom", "gudev", "pulse", "asound", "sndfile", "FLAC", "ogg", "vorbis",
         "opus", "mp3lame", "avcodec", "avformat", "avutil", "swscale", "x264", "vpx", "dav",
         "python", "perl", "ruby", "lua", "tcl", "stdc++", "gfortran", "quadmath", "gomp"]
SUFFIXES = ["", "2", "3", "-1.0", "-2.0", "-3", "mm", "_core", "-util", "-gtk3", "-glib",
            "-private", "32", "64", "-extra", "plus", "-render", "-shm", "-xfixes", "-image"]


def _name_pool():
    rng = random.Random(14)
    names = [f"lib{stem}{suffix}" for stem in STEMS for suffix in SUFFIXES]
    rng.shuffle(names)
    return names


def _version(rng):
    """(file suffix after the base name, soname suffix) in the shapes Debian has."""
    major = rng.choice([0, 1, 1, 1, 2, 3, 4, 5, 6, 12, 27, 100])
    shape = rng.randrange(10)
    if shape < 5:
        return f".so.{major}.{rng.randrange(30)}.{rng.randrange(20)}", f".so.{major}"
    if shape < 7:
        return f".so.{major}.{rng.randrange(2000)}", f".so.{major}"
    if shape < 9:
        return f".so.{major}", f".so.{major}"                   # the file is the soname
    suffix = f"-{major}.{rng.randrange(40)}.so"                   # libdb-5.3.so
    return suffix, suffix


def plan():
    """What to build: a list of actions and the manifest. Deterministic."""
    rng = random.Random(5401)
    names = _name_pool()
    libs = []           # (relative path, soname, kind) kind: x86-64 | v3 | v2 | i386
    links = []          # (relative path, target)
    texts = []          # (relative path, content)
    names_in = {}       # scanned directory -> the names its cache entries must have

    def add(directory, base, kind="x86-64", version=None, dev_link=False):
        file_suffix, soname_suffix = version or _version(rng)
        file_name, soname = base + file_suffix, base + soname_suffix
        libs.append((f"{directory}/{file_name}", soname, kind))
        if file_name != soname:
            links.append((f"{directory}/{soname}", file_name))
        listed = names_in.setdefault(directory, set()) if directory != PLUGINS else set()
        listed.add(soname)
        if dev_link and soname != base + ".so":
            links.append((f"{directory}/{base}.so", soname))
            # ldconfig lists a dev link under its own name (a file of its own, as the link is
            # not named by the file's soname) -- except one to a file named *.so, the file
            # being its own soname (libdb.so -> libdb-5.3.so): a link to the library then
            if not file_name.endswith(".so"):
                listed.add(base + ".so")
        return file_name, soname

    main = []
    add(MULTIARCH, "libz", version=(".so.1.2.13", ".so.1"), dev_link=True)
    main.append(("libz", ".so.1.2.13", ".so.1"))
    while len(main) < MAIN_SONAMES:
        base = names.pop()
        version = _version(rng)
        file_name, soname = add(MULTIARCH, base, version=version, dev_link=rng.randrange(6) == 0)
        main.append((base, file_name[len(base):], soname[len(base):]))
    # second majors (sonames of their own) and stale files (a soname twice)
    for base, file_suffix, soname_suffix in main[1:1 + SECOND_MAJOR]:
        if not soname_suffix.startswith(".so."):
            continue
        major = int(soname_suffix.split(".")[2]) + 1
        add(MULTIARCH, base, version=(f".so.{major}.0.0", f".so.{major}"))
    for base, file_suffix, soname_suffix in main[20:20 + STALE]:
        if file_suffix == soname_suffix or not soname_suffix.startswith(".so."):
            continue        # (a file named as its soname is where the soname link would go)
        older = soname_suffix + (".0.0" if file_suffix != soname_suffix + ".0.0" else ".0.0.0")
        libs.append((f"{MULTIARCH}/{base}{older}", base + soname_suffix, "x86-64"))
    texts.append((f"{MULTIARCH}/libcdtscript.so", "/* GNU ld script */\nGROUP ( libz.so.1 )\n"))
    plain = [m for m in main if m[2].startswith(".so.")]
    at = 40
    for level, count in HWCAPS.items():
        directory = f"{MULTIARCH}/glibc-hwcaps/{level}"
        for base, file_suffix, soname_suffix in plain[at:at + count]:
            add(directory, base, kind=level[-2:], version=(file_suffix, soname_suffix))
        at += count
    for i in range(PRIVATE_LIBS):
        add(PRIVATE, f"libcdt-private{i}", dev_link=i % 5 == 0)
    for i in range(PLUGIN_LIBS):
        add(PLUGINS, f"libcdt-plugin{i}", version=(".so", ".so"))
    for i in range(I386_LIBS):
        add(I386, names.pop(), kind="i386", dev_link=i % 4 == 0)
    manifest = {
        "names": {"/" + d: sorted(s) for d, s in sorted(names_in.items())},
        "entries": sum(len(s) for s in names_in.values()),
        "files": sum(1 for path, _, _ in libs if not path.startswith(PLUGINS + "/")),
        "unlisted": sorted({soname for path, soname, _ in libs if path.startswith(PLUGINS + "/")}),
        "libdir": "/" + MULTIARCH,
    }
    return libs, links, texts, manifest


ETC = {
    "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n\n",
    "etc/ld.so.conf.d/libc.conf": "# libc default configuration\n/usr/local/lib\n",
    "etc/ld.so.conf.d/x86_64-linux-gnu.conf":
        "# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n"
        "/usr/lib/x86_64-linux-gnu\n",
    "etc/ld.so.conf.d/i386-linux-gnu.conf":
        "# Multiarch support\n/usr/local/lib/i386-linux-gnu\n/lib/i386-linux-gnu\n"
        "/usr/lib/i386-linux-gnu\n",
    "etc/ld.so.conf.d/cdt-private.conf": "/" + PRIVATE + "\n",
    "etc/debian_version": "12.0\n",
}


def build(root, gcc="gcc", jobs=None):
    """Build the tree at ROOT (which must not exist); returns the manifest."""
    libs, links, texts, manifest = plan()
    os.makedirs(root)
    work = tempfile.mkdtemp(prefix="libtree.")
    try:
        objects, stubs = {}, {}
        src = os.path.join(work, "lib.c")
        with open(src, "w") as out:
            out.write(SOURCE)
        for bits, flags in (("64", []), ("32", ["-m32"])):
            obj = os.path.join(work, f"lib{bits}.o")
            subprocess.run([gcc, *flags, "-c", "-fPIC", "-O1", "-o", obj, src], check=True)
            objects[bits] = obj
            # a stand-in libc.so.6 to link against (DT_NEEDED libc.so.6, as real libraries
            # have), so that neither the host's libc nor a 32-bit one need be installed
            stubs[bits] = os.path.join(work, bits, "libc.so.6")
            os.makedirs(os.path.dirname(stubs[bits]))
            subprocess.run([gcc, *flags, "-shared", "-nostdlib", "-o", stubs[bits], obj,
                            "-Wl,-soname,libc.so.6"], check=True)

        def link(item):
            path, soname, kind = item
            bits = "32" if kind == "i386" else "64"
            argv = [gcc, "-shared", "-nostdlib", "-o", os.path.join(root, path), objects[bits],
                    "-Wl,--no-as-needed", stubs[bits], f"-Wl,-soname,{soname}"]
            if kind == "i386":
                argv.insert(1, "-m32")
            elif kind in ("v3", "v2"):
                argv.append(f"-Wl,-z,x86-64-{kind}")
            subprocess.run(argv, check=True)

        for directory in {os.path.dirname(p) for p, _, _ in libs} | {"usr/lib64", "var/cache/ldconfig",
                                                                      "etc/ld.so.conf.d"}:
            os.makedirs(os.path.join(root, directory), exist_ok=True)
        with concurrent.futures.ThreadPoolExecutor(jobs or os.cpu_count() or 2) as pool:
            list(pool.map(link, libs))
        for path, target in links:
            os.symlink(target, os.path.join(root, path))
        for path, content in texts + list(ETC.items()):
            with open(os.path.join(root, path), "w") as out:
                out.write(content)
        os.symlink("usr/lib", os.path.join(root, "lib"))
        os.symlink("usr/lib64", os.path.join(root, "lib64"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return manifest


def _key(gcc):
    with open(os.path.abspath(__file__), "rb") as me:
        digest = hashlib.sha256(me.read())
    version = subprocess.run([gcc, "--version"], capture_output=True, check=True).stdout
    digest.update(version)
    return digest.hexdigest()[:16]


def cache_names(manifest, *more):
    """The names the cache of the tree must list, with their counts (one per directory that
    has the name), plus MORE (iterables of names added to the tree)."""
    names = collections.Counter(n for listed in manifest["names"].values() for n in listed)
    for extra in more:
        names.update(extra)
    return names


def tarball(cache_dir, gcc="gcc"):
    """(path of the cached tarball of the tree, manifest) in the directory CACHE_DIR; built on first use."""
    if shutil.which(gcc) is None:
        raise RuntimeError("gcc not found: apt-get install gcc")
    key = _key(gcc)
    tar = os.path.join(cache_dir, f"libtree-{key}.tar")
    meta = tar + ".json"
    if os.path.exists(tar) and os.path.exists(meta):
        with open(meta) as src:
            return tar, json.load(src)
    os.makedirs(cache_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"libtree-{key}.", dir=cache_dir)
    try:
        start = time.monotonic()
        manifest = build(os.path.join(work, "root"), gcc)
        manifest["build_seconds"] = round(time.monotonic() - start, 2)
        subprocess.run(["tar", "-C", os.path.join(work, "root"), "--numeric-owner", "-cf",
                        os.path.join(work, "tree.tar"), "."], check=True)
        with open(os.path.join(work, "tree.json"), "w") as out:
            json.dump(manifest, out, indent=1)
        os.rename(os.path.join(work, "tree.json"), meta)    # the manifest first: the tarball's
        os.rename(os.path.join(work, "tree.tar"), tar)      # presence says both are there
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tar, manifest
