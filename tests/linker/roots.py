"""Roots for the ldcache tests: built once, shared read-only, copied (hard links) to modify.

A "copy" is `cp -al`: new directories and links, shared file inodes. Tests that change a
copy only ever create, rename or remove names in it (never write into a shared file), so
the originals stay intact.
"""
import os
import shutil
import subprocess

import libtree

CACHE_DIR = os.environ.get("CDI_SHIM_TEST_CACHE", "/var/cache/cdi-shim-tests")
SUITE = "bookworm"
MIRROR = os.environ.get("CDI_SHIM_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DEBOOTSTRAP_TAR = os.path.join(CACHE_DIR, f"debootstrap-{SUITE}-minbase.tar")
NEXT_SUITE = "trixie"         # Debian 13: the other real layout the differential and layout tests use
LIBDIR = "/" + libtree.MULTIARCH        # the generated tree's multiarch directory


def debootstrap_tarball(suite=SUITE):
    """A minimal Debian rootfs of SUITE as a tarball, made with debootstrap once and kept."""
    tarball = os.path.join(CACHE_DIR, f"debootstrap-{suite}-minbase.tar")
    if os.path.exists(tarball):
        return tarball
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap not found: apt-get install debootstrap")
    os.makedirs(CACHE_DIR, exist_ok=True)
    work = tarball + ".work"
    shutil.rmtree(work, ignore_errors=True)
    subprocess.run(["debootstrap", "--variant=minbase", suite, work, MIRROR], check=True,
                   stdout=subprocess.DEVNULL)
    # The apt lists and archives are not part of the image we want.
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
        shutil.rmtree(os.path.join(work, sub), ignore_errors=True)
    subprocess.run(["tar", "-C", work, "--numeric-owner", "-cf", tarball + ".tmp", "."],
                   check=True)
    os.rename(tarball + ".tmp", tarball)
    shutil.rmtree(work, ignore_errors=True)
    return tarball


def extract(tarball, dest):
    os.makedirs(dest, exist_ok=True)
    subprocess.run(["tar", "-C", dest, "--numeric-owner", "-xf", tarball], check=True)
    return dest


def library_tree():
    """(tarball, manifest) of the generated library-rich root (libtree.py), built once and
    kept under CACHE_DIR."""
    return libtree.tarball(CACHE_DIR)


def library_image(root):
    """ROOT made from the generated library tree (no cache yet): 480 gcc-built library files
    and 417 links: the multiarch directory, its glibc-hwcaps subdirectories, a private
    directory and a 32-bit one listed in /etc/ld.so.conf.d, the merged-/usr symlinks, a
    Debian marker -- nothing of this machine's own libraries. Returns the manifest (what the
    cache of ROOT must list: libtree.cache_names)."""
    tarball, manifest = library_tree()
    extract(tarball, root)
    return manifest


def copy_tree(src, dest):
    """A hard-linked copy of SRC at DEST."""
    subprocess.run(["cp", "-al", src, dest], check=True)
    return dest
