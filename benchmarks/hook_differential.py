"""Differential of the toolkit's hooks: runc + the real nvidia-cdi-hook against cdi-shim-runtime.

Each case (an image, a fake driver, a CDI spec with nvidia-cdi-hook hooks) runs three ways, on
an image of one of the layouts of benchmarks/hook_layouts.py, drawn per case: `busybox` (a plain
glibc folder), `debian12` and `debian13` (debootstrap minbase, merged /usr), `rpm` (/usr/lib64,
`/lib64 -> usr/lib64`, a relative include), `cuda` (a CUDA image on Debian 12: /usr/local/cuda
-> cuda-12.4, its compat folder, 000_cuda.conf). Each layout is built once per run and copied
(hard links, /etc copied) for each way; the spec's library folder is one its layout uses:

- `toolkit`: the spec pre-injected into config.json (`cdi-shim cdi inject`, as containerd's
  own CDI does) and run by plain runc, which runs the real nvidia-cdi-hook v1.20.0 (built by
  benchmarks/toolkit.py) as the OCI hooks;
- `preinjected`: the same config.json run by cdi-shim-runtime;
- `annotation`: the device asked by a `cdi.k8s.io/` annotation, run by cdi-shim-runtime;
- `nri`: the NRI plugin's path without containerd: the device asked by a pod annotation of the
  plugin's policy (shim/nri/policy.py), its adjustment applied to config.json as containerd
  applies it (tests/nri/containerd_nri.py), run by plain runc on an overlay rootfs (the case's
  image the lower layer, a fresh upper, as containerd's snapshotter mounts it): the one native
  hook (`cdi-shim-nshook nri`, no --fallback) makes the links and modes and hands the rootfs to
  the plugin's hook server (shim/nri/hookserver.py, in this process, with the memos the plugin
  runs with), which writes the linker cache;
- `nri-kept`: a second such container of the same image (the same lower layer, a new upper):
  the hook server's answer kept by the image's layers (shim/nri/layers.py), written without a
  plan (the settle window is 0 here: nothing changes the layers once built). Each case line
  says when an answer was not kept (a case without update-ldcache and enable-cuda-compat asks
  the plugin nothing).

A static probe inside (benchmarks/hook_probe.c) prints what the container sees: the entries
of the library folder, the compat folder, /etc/ld.so.conf.d, /dev/dri, /opt/data, with modes
and link texts; the ld.so.conf files; /etc/ld.so.cache (compared as `ldconfig -p` lists it);
and dlopen of each soname and dev link (each in its own process), with the path the loader
chose and which library it is. What differs is printed and classified: identical, harmless,
a documented difference (docs/hooks.md), or left.

    .venv/bin/python benchmarks/hook_differential.py --cases 200 --seed 1        # as root
    .venv/bin/python benchmarks/hook_differential.py --seed 1 --only 17 -v       # one case, its diff
    .venv/bin/python benchmarks/hook_differential.py --cases 50 --layout rpm     # one layout's images only
    .venv/bin/python benchmarks/hook_differential.py --way nri --way nri-kept    # the NRI path only
    .venv/bin/python benchmarks/hook_differential.py --reference preinjected --way nri    # NRI against our runtime

With `--reference WAY` the ways are compared with WAY's container instead of the toolkit's, and
the toolkit is neither needed nor run: the spec's hooks then name a stand-in nvidia-cdi-hook that
fails when run, so a case where any way ran a hook process is a difference. Only `identical`
means the same there (the documented rules are the toolkit's differences from ours).

Counts are printed per layout and in all, and per way: identical, harmless, documented, left
(a case counts as its worst way). With an NRI way the run is in a mount namespace of its own
(unshare -m), so that no overlay outlives it.

Needs root, runc, unshare, gcc with static glibc, debootstrap (the Debian tarballs, made once by
tests/linker/roots.py in /var/cache/cdi-shim-tests), and the toolkit (benchmarks/toolkit.py builds it).
"""
import argparse
import collections
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for sub in ("tests", "tests/runtime", "tests/linker", "tests/nri"):
    sys.path.insert(0, os.path.join(REPO, sub))
sys.path.insert(0, HERE)

import ldcache_helpers as lh  # noqa: E402
import runtime_helpers as rh  # noqa: E402
import hook_layouts as hl  # noqa: E402
import roots  # noqa: E402
from test_hook_fidelity import note_source  # noqa: E402
from test_runtime_toolkit_hooks import preinject  # noqa: E402
from toolkit import ToolkitUnavailable, toolkit_programs  # noqa: E402

WAYS = ("toolkit", "preinjected", "annotation", "nri", "nri-kept")
NRI_WAYS = ("nri", "nri-kept")
NOT_KEPT = "(the answer not kept)"      # nri-kept's note where the hook server planned it after all
CLASSES = ("identical", "harmless", "documented", "left")
GLIBC = rh.GLIBC_LIBDIR
COMPAT = hl.COMPAT
LIBS = ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-gpucomp")
DRIVERS = ("550.54.15", "535.104.05", "560.35.03")
COMPATS = ("560.28.03", "570.86.10", "550.90.07", "535.54.03", "560.35.05")
# the hooks' drop-ins are named 00-compat-<uuid>.conf, 00-nvcr-<number>.conf, zz-nvcr-<number>.conf
# the hook's drop-ins end in a random number or UUID, ours in "cdi-shim": compared as one name
DROPIN_NAME = re.compile(r"(?<=-)([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9]+|cdi-shim)"
                         r"(?=\.conf$)")
FAILED = (None, "absent", "fails")


# ---- cases ---------------------------------------------------------------------------------

def random_case(rng, number, layouts=hl.LAYOUTS):
    """One case: its image's layout, what the image holds, what the driver mounts, the spec's
    hooks in order. conf: the image's ld.so.conf as the layout has it (`include`), replaced by
    one without an include line (`plain`), or removed (`absent`)."""
    layout = rng.choice(layouts)
    libdir = rng.choice(hl.LIBDIRS[layout])
    driver = rng.choice(DRIVERS)
    libs = ["libcuda"] + rng.sample(LIBS[1:], rng.randint(0, 3))
    real = layout != "busybox"
    case = {"number": number, "layout": layout, "libdir": libdir, "driver": driver, "libs": libs,
            "image_cache": rng.random() < (0.85 if real else 0.75), "confd": rng.random() < 0.8,
            "conf": rng.choice(["include", "include", "include", "plain", "absent"]),
            "readonly": rng.random() < 0.2, "compat": None, "at_link": None, "hooks": []}
    if layout == "cuda":
        case["cuda_links"] = rng.choice(["relative", "alternatives"])
    if rng.random() < 0.6 or layout == "cuda":      # (CUDA images carry cuda-compat)
        note = None
        if rng.random() < 0.6:
            note = {"Format": 1, "CUDA Version": rng.choice(["12.2", "12.4", "12.6", "12.8"]),
                    "Driver": sorted(rng.sample([535, 550, 560, 570], rng.randint(1, 3))), "Device": [7, 8, 9]}
        case["compat"] = {"version": rng.choice(COMPATS), "note": note}
    links = []
    if rng.random() < 0.8:
        links.append(f"libcuda.so.1::{libdir}/libcuda.so")
    if "libnvidia-ml" in libs and rng.random() < 0.6:
        links.append(f"libnvidia-ml.so.{driver}::{libdir}/libnvidia-ml.so")
    if rng.random() < 0.3:
        links.append(f"libcuda.so.{driver}::{libdir}/libcuda.so.1")
    if rng.random() < 0.1:
        links.append(f"libnvidia-missing.so.1::{libdir}/libnvidia-missing.so")
    if links and rng.random() < 0.35:
        case["at_link"] = {"path": rng.choice(links).split("::")[1],
                           "what": rng.choice(["file", "file", "link", "link", "dir"])}
    hooks = [["create-symlinks", *[a for link in links for a in ("--link", link)]]] if links else []
    update = None
    if rng.random() < 0.85:
        folders = rng.choice([[libdir], [libdir], [libdir, libdir + "/vdpau"], []])
        update = ["update-ldcache", *[a for f in folders for a in ("--folder", f)]]
    ecc = None
    if rng.random() < 0.75:
        ecc = ["enable-cuda-compat"]
        if rng.random() < 0.8:
            ecc.append("--host-driver-version=" + rng.choice([driver, driver, "unknown"]))
        if rng.random() < 0.2:
            ecc.append("--host-cuda-version=" + rng.choice(["12.2", "12.4", "12.8"]))
    tail = [h for h in (ecc, update) if h]
    if len(tail) == 2 and rng.random() < 0.25:
        tail.reverse()                              # update-ldcache before enable-cuda-compat
    hooks += tail
    if rng.random() < 0.35:
        paths = rng.choice([["/dev/dri"], ["/opt/data"], ["/dev/dri", "/opt/data", "/dev/missing"]])
        hooks.append(["chmod", "--mode", rng.choice(["755", "711", "700", "1777"]),
                      *[a for p in paths for a in ("--path", p)]])
    case["hooks"] = hooks
    case["dri"] = any("/dev/dri" in h for h in hooks) or rng.random() < 0.2
    return case


# ---- the pieces: libraries, image, spec ----------------------------------------------------

class Parts:
    """Libraries built once per (name, version, note) in WORK, the probe once."""

    def __init__(self, work):
        self.work = work
        self.built = {}
        self.probe = os.path.join(work, "probe")
        rh.gcc("-static", "-O1", "-o", self.probe, os.path.join(HERE, "hook_probe.c"))

    def library(self, name, version, note=None, ident=None, soname=None):
        key = (name, version, json.dumps(note, sort_keys=True), ident, soname)
        if key not in self.built:
            path = os.path.join(self.work, f"lib{len(self.built)}", f"{name}.so.{version}")
            os.makedirs(os.path.dirname(path))
            body = 'const char *fake_id(void) { return "%s"; }\n' % (ident or f"{name}.so.{version}")
            if note is not None:
                body += note_source(note)
            rh.library(path, soname or f"{name}.so.1", body)
            self.built[key] = path
        return self.built[key]

    def named(self, path, soname, ident):
        """A library built at PATH (in an image being built) with SONAME; fake_id() IDENT."""
        rh.library(path, soname, 'const char *fake_id(void) { return "%s"; }\n' % ident)


class Layouts:
    """Each layout built once in WORK/layouts (hook_layouts.build) when a case first needs it,
    then copied for each way; each checked at the end to be as it was built."""

    def __init__(self, work, parts):
        self.dir = os.path.join(work, "layouts")
        self.parts = parts
        self.built = {}
        os.makedirs(self.dir)

    def path(self, name):
        if name not in self.built:
            start = time.monotonic()
            tarball = None
            if name in hl.SUITES or name == "cuda":
                tarball = roots.debootstrap_tarball(hl.SUITES.get(name, roots.SUITE))
            dest = hl.build(name, os.path.join(self.dir, name), busybox=rh.static_busybox(), tarball=tarball,
                            library=self.parts.named, ldconfig=rh.need("ldconfig", "libc-bin"))
            if name == "rpm":
                hl.makedirs(dest, "/usr/lib64/image")
                self.parts.named(os.path.join(dest, "usr/lib64/image/libimage.so.1.0"), "libimage.so.1",
                                 "image-private")
                os.symlink("libimage.so.1.0", os.path.join(dest, "usr/lib64/image/libimage.so.1"))
                hl.write(dest, RPM_DROPIN, "/usr/lib64/image\n")
                hl.image_ldconfig(dest, name, rh.need("ldconfig", "libc-bin"))
            self.built[name] = (dest, hl.fingerprint(dest))
            print(f"layout {name}: built in {time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)
        return self.built[name][0]

    def check(self):
        """The layouts that a way changed (a file written through a shared hard link)."""
        return [name for name, (dest, before) in self.built.items() if hl.fingerprint(dest) != before]


RPM_DROPIN = "/etc/ld.so.conf.d/image-x86_64.conf"      # the rpm image's own drop-in, its /usr/lib64/image


def make_image(rootfs, case, parts):
    """ROOTFS (a copy of the case's layout) made the case's image."""
    layout = case["layout"]
    hl.makedirs(rootfs, "/opt/data")
    os.chmod(hl.in_root(rootfs, "/opt/data"), 0o755)
    hl.copy(rootfs, parts.probe, "/probe")
    if layout == "busybox":
        if case["confd"]:
            hl.write(rootfs, "/etc/ld.so.conf.d/x86_64-linux-gnu.conf", GLIBC + "\n")
        if case["conf"] == "include":
            hl.write(rootfs, "/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    else:
        if layout == "cuda":
            hl.cuda_links(rootfs, case["cuda_links"])
        if layout == "rpm" and not case["confd"]:
            hl.remove(rootfs, RPM_DROPIN)
    if case["conf"] == "plain":
        hl.write(rootfs, "/etc/ld.so.conf", hl.PLAIN_CONF.get(layout, hl.PLAIN_CONF_REAL))
    elif case["conf"] == "absent":
        hl.remove(rootfs, "/etc/ld.so.conf")
    if case["compat"]:
        compat, version = case["compat"], case["compat"]["version"]
        hl.makedirs(rootfs, COMPAT)
        hl.copy(rootfs, parts.library("libcuda", version, compat["note"]), f"{COMPAT}/libcuda.so.{version}")
        hl.symlink(rootfs, f"libcuda.so.{version}", f"{COMPAT}/libcuda.so.1")
        if layout == "cuda":            # cuda-compat's other files
            hl.symlink(rootfs, "libcuda.so.1", f"{COMPAT}/libcuda.so")
            hl.copy(rootfs, parts.library("libnvidia-ptxjitcompiler", version, ident="compat-ptxjit"),
                    f"{COMPAT}/libnvidia-ptxjitcompiler.so.{version}")
            hl.symlink(rootfs, f"libnvidia-ptxjitcompiler.so.{version}", f"{COMPAT}/libnvidia-ptxjitcompiler.so.1")
    at = case["at_link"]
    if at:
        if at["what"] == "file":      # the image's own library of that name (an old driver)
            soname = os.path.basename(at["path"])
            soname = soname if soname.endswith(".so.1") else soname + ".1"
            hl.remove(rootfs, at["path"])
            hl.copy(rootfs, parts.library(soname.split(".so")[0], "0", ident="image-old"), at["path"])
        elif at["what"] == "link":
            hl.symlink(rootfs, "libimage-other.so.0", at["path"])
        else:
            hl.remove(rootfs, at["path"])
            hl.makedirs(rootfs, at["path"] + "/inside")
    if case["image_cache"]:
        hl.image_ldconfig(rootfs, layout, rh.need("ldconfig", "libc-bin"))
    else:
        hl.remove(rootfs, "/etc/ld.so.cache")


def spec_text(world, case, parts, hook):
    mounts = "".join(
        f"    - hostPath: {parts.library(name, case['driver'])}\n"
        f"      containerPath: {case['libdir']}/{name}.so.{case['driver']}\n"
        "      options: [ro, nosuid, nodev, rbind, rprivate]\n" for name in case["libs"])
    hooks = "".join(f"    - hookName: createContainer\n      path: {hook}\n"
                    f"      args: {json.dumps(['nvidia-cdi-hook', *args])}\n" for args in case["hooks"])
    dri = "    - {path: /dev/dri/card1, hostPath: /dev/null}\n" if case["dri"] else ""
    return ('cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\n'
            'devices:\n  - name: "0"\n    containerEdits:\n'
            f"      deviceNodes: [{{path: /dev/nvidia0, hostPath: {world.node(0)}}}]\n"
            "containerEdits:\n  deviceNodes:\n    - {path: /dev/nvidiactl, hostPath: /dev/null}\n" + dri
            + ("  hooks:\n" + hooks if hooks else "") + "  mounts:\n" + mounts)


IMAGE_SONAMES = {"cuda": ["libcudart.so.12"], "rpm": ["libimage.so.1", "libz.so.1"],
                 "debian12": ["libz.so.1"], "debian13": ["libz.so.1"]}


def probe_args(case):
    d = case["libdir"]
    sonames = sorted({f"{name}.so.1" for name in case["libs"]} | {"libcuda.so.1"}
                     | set(IMAGE_SONAMES.get(case["layout"], ())))
    paths = [f"{d}/libcuda.so", f"{d}/libcuda.so.1", f"{d}/libnvidia-ml.so"]
    return ["/probe", d, COMPAT, "/etc/ld.so.conf.d", "/dev/dri", "/opt/data", "--", *sonames, *paths]


# ---- running and comparing -----------------------------------------------------------------

class NRISide:
    """The NRI plugin's side: its hook server (remember on, as `cdi-shim nri` starts it) serving
    the native hook at a socket in WORK, and a policy per case on the case's spec folders."""

    def __init__(self, work):
        from shim.nri.hookserver import HookServer
        from shim.nri.layers import AnswerMemo
        from shim.nri.nativehook import ToolkitFiles

        self.dir = os.path.join(work, "nri")
        os.environ["CDI_SHIM_CACHE_DIR"] = os.path.join(self.dir, "registry-cache")
        os.environ["CDI_SHIM_NVIDIA_PARAMS"] = os.path.join(self.dir, "no-params")
        self.logged = []
        self.server = HookServer(os.path.join(self.dir, "hook", "h.sock"), self._log, remember=True).start()
        self.server.answers = AnswerMemo(settle_ns=0)
        self.files = ToolkitFiles(os.path.join(self.dir, "files"))
        self.hook = os.path.join(rh.VENV_BIN, "cdi-shim-nshook")
        self.lower = None           # (world's base, the case's image as a lower layer)

    def _log(self, level, message):
        self.logged.append(f"{level}: {message}")

    def image(self, world, case, parts, layouts):
        """The case's image, made once per case, the lower layer of each of its NRI containers."""
        if self.lower is None or self.lower[0] != world.base:
            lower = os.path.join(world.base, "nri-lower")
            hl.clone(layouts.path(case["layout"]), lower)
            make_image(lower, case, parts)
            self.lower = (world.base, lower)
        return self.lower[1]

    def adjusted(self, world, config):
        """CONFIG with the plugin's adjustment for a pod asking for nvidia.com/gpu=0, applied."""
        from containerd_nri import container_of, nri_apply
        from shim.config import Config
        from shim.nri.messages import nri
        from shim.nri.policy import Policy

        policy = Policy(Config(spec_dirs=(world.spec_dir_low, world.spec_dir)), ("*",), self.hook, self._log,
                        hook_options=("--socket", self.server.path), files=self.files)
        pod = nri.PodSandbox(id="p", name="diff", namespace="default",
                             annotations={"cdi.k8s.io/diff": "nvidia.com/gpu=0"})
        return nri_apply(config, policy.create_container(pod, container_of(config)))

    def close(self):
        self.server.close()


def _mount_overlay(lower, top, rootfs):
    for sub in ("upper", "work"):
        os.makedirs(os.path.join(top, sub))
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={top}/upper,workdir={top}/work", rootfs], check=True, timeout=60)


def run_nri(world, case, parts, layouts, way, side):
    """WAY (nri, nri-kept) of CASE: the plugin's adjustment, runc on an overlay of the case's image."""
    bundle = world.bundle(args=probe_args(case), tag=way[:3])
    lower = side.image(world, case, parts, layouts)
    shutil.rmtree(bundle.rootfs)
    os.makedirs(bundle.rootfs)
    _mount_overlay(lower, os.path.join(world.base, "overlay-" + bundle.id), bundle.rootfs)
    try:
        config = bundle.config()
        config["root"]["readonly"] = case["readonly"]
        with open(bundle.config_path, "w") as out:
            json.dump(side.adjusted(world, config), out)
        hits = side.server.answers.hits
        done = world.runc_cmd("run", "--bundle", bundle.path, bundle.id)
        world.runc_cmd("delete", "--force", bundle.id)
    finally:
        subprocess.run(["umount", "-l", bundle.rootfs], capture_output=True, timeout=60)
    return {"rc": done.returncode, "out": done.stdout, "err": done.stderr, "kept": side.server.answers.hits > hits}


def run_way(world, case, parts, layouts, way, side=None):
    if way in NRI_WAYS:
        return run_nri(world, case, parts, layouts, way, side)
    bundle = world.bundle(args=probe_args(case), tag=way[:3])
    shutil.rmtree(bundle.rootfs)
    hl.clone(layouts.path(case["layout"]), bundle.rootfs)
    make_image(bundle.rootfs, case, parts)
    config = bundle.config()
    config["root"]["readonly"] = case["readonly"]
    if way == "annotation":
        config.setdefault("annotations", {})["cdi.k8s.io/diff"] = "nvidia.com/gpu=0"
    with open(bundle.config_path, "w") as out:
        json.dump(config, out)
    if way != "annotation":
        preinject(world, bundle)
    env = world.env(CDI_SHIM_NVIDIA_PARAMS=os.path.join(world.base, "no-params"))
    if way == "toolkit":
        done = world.runc_cmd("run", "--bundle", bundle.path, bundle.id, env=env)
    else:
        done = world.shim("run", "--bundle", bundle.path, bundle.id, env=env)
    world.runc_cmd("delete", "--force", bundle.id)
    return {"rc": done.returncode, "out": done.stdout, "err": done.stderr}


def facts(result):
    """{key: value} of what the container saw ({"create": "fails"} when it was not created)."""
    if result["rc"] != 0 and not result["out"]:
        return {"create": "fails", "error": (result["err"] or "").strip().splitlines()[-1:]}
    seen = {"create": "ok"}
    for line in result["out"].splitlines():
        kind, _, rest = line.partition(" ")
        path, _, value = rest.partition(" ")
        path = DROPIN_NAME.sub("N", path)
        if kind == "cache":
            if value == "unreadable":
                seen["cache"] = "absent"
            else:
                listed = lh.listing(bytes.fromhex(value)).decode().splitlines()[1:]
                seen["cache"] = "\n".join(line for line in listed if "Cache generated" not in line)
        elif kind == "bytes":
            if value != "unreadable":
                seen[f"bytes {path}"] = bytes.fromhex(value).decode(errors="replace")
        else:
            seen[f"{kind} {path}"] = value
    return seen


def differences(a, b):
    """{key: (A's, B's)} of what differs (a failed create's error text is not compared)."""
    return {key: (a.get(key), b.get(key)) for key in sorted(set(a) | set(b))
            if a.get(key) != b.get(key) and key != "error"}


def classify(case, diff, seen=None):
    """(class, reasons) of one way's differences from the toolkit's (SEEN: the two ways' facts)."""
    if not diff:
        return "identical", ""
    reasons, left = set(), []
    # (without update-ldcache the toolkit's container keeps the image's cache: ours, built
    # anyway, may name other files, a gain when every loader result that differs is one)
    loads_gain = all(_gain(k, *v) for k, v in diff.items() if k.startswith("dlopen"))
    for key, (theirs, ours) in diff.items():
        rule = _rule(case, key, theirs, ours, loads_gain) or (seen and _same_file(key, theirs, ours, *seen))
        if rule:
            reasons.add(rule)
        else:
            left.append(key)
    if left:
        return "left", "; ".join(left)
    kinds = {r.split(":")[0] for r in reasons}
    return ("harmless" if kinds == {"harmless"} else "documented"), "; ".join(sorted(reasons))


def _gain(key, theirs, ours):
    """OURS gives what THEIRS lacks and takes nothing away."""
    if key == "cache":
        return theirs in FAILED or set((theirs or "").splitlines()) < set((ours or "").splitlines())
    if theirs in FAILED:
        return ours not in FAILED
    return theirs.endswith(" dangles") and ours == theirs[:-len("dangles")] + "resolves"


def _rule(case, key, theirs, ours, loads_gain=False):
    """The documented rule (docs/hooks.md) or harmless reason that covers one difference, or None.
    Each rule is checked against what the case's layout makes of it, not only its text: a
    difference the rule does not explain on this image stays left."""
    hooks = [h[0] for h in case["hooks"]]
    if key.startswith(("entry /dev/dri", "entry /opt/data")):
        chmod = next((h for h in case["hooks"] if h[0] == "chmod"), None)
        if chmod and chmod[2] == "1777" and theirs and ours and theirs.replace(" 0777", " 1777") == ours:
            return "documented: chmod keeps the sticky bit"
    if "update-ldcache" not in hooks and (_gain(key, theirs, ours) or key == "cache" and loads_gain) \
            and (key != "cache" or _keeps_sonames(theirs, ours)):
        return "documented: library mounts without update-ldcache get a cache"
    if case["conf"] == "plain" and "update-ldcache" in hooks and _gain(key, theirs, ours) \
            and _in_unread_folders(case, key, theirs, ours):
        return "documented: an ld.so.conf without an include line still gets the folders"
    if key.startswith("entry ") and ".so." in key.rsplit("/", 1)[-1] and theirs is None \
            and (ours or "").startswith("l ") and ours.endswith(" dangles") and "update-ldcache" in hooks:
        return "documented: a link that does not resolve, which ldconfig removes, is kept"
    return None


def _cache_lines(text):
    return [line.strip() for line in (text or "").splitlines() if " => " in line]


def _keeps_sonames(theirs, ours):
    """OURS (a cache listing) names each soname (and its flags) THEIRS names, whatever file: the
    image's own entries are not dropped by the cache built without update-ldcache."""
    if theirs in FAILED:
        return True
    names = {line.split(" => ")[0] for line in _cache_lines(ours)}
    return all(line.split(" => ")[0] in names for line in _cache_lines(theirs))


def _unread_folders(case):
    """The folders of the toolkit's drop-ins (update-ldcache's folders in 00-nvcr, the image's
    system folders in zz-nvcr), as the layout resolves them, that its ldconfig does not read on
    the case's image with an include-less ld.so.conf: neither one of that file's folders nor one
    of ldconfig's own (this machine's: /lib/x86_64-linux-gnu, /usr/lib/x86_64-linux-gnu, /lib,
    /usr/lib) -- the only folders the include-less rule is about."""
    layout = case["layout"]
    plain = hl.PLAIN_CONF.get(layout, hl.PLAIN_CONF_REAL).split()
    read = {hl.canonical(layout, d) for d in [*hl.LDCONFIG_TRUSTED, *plain]}
    folders = [a.split("=", 1)[-1] for h in case["hooks"] if h[0] == "update-ldcache"
               for i, a in enumerate(h) if i and h[i - 1] == "--folder" or a.startswith("--folder=")]
    return {hl.canonical(layout, f) for f in [*folders, *hl.SYSTEM_FOLDERS[layout]]} - read


def _in_unread_folders(case, key, theirs, ours):
    """The gain is all in folders the include-less ld.so.conf keeps from the toolkit's cache."""
    unread = _unread_folders(case)
    layout = case["layout"]

    def inside(path):
        return hl.canonical(layout, os.path.dirname(path)) in unread

    if key == "cache":
        extra = set(_cache_lines(ours)) - set(_cache_lines(theirs))
        return bool(extra) and all(inside(line.split(" => ")[1]) for line in extra)
    if key.startswith("dlopen "):
        return inside((ours or "").split(" ")[0])
    if key.startswith("entry "):
        return inside(key[len("entry "):])
    return False


def _final(facts, directory, text, hops=8):
    """The name a chain of links in DIRECTORY (as the probe listed it) ends at, from link text TEXT."""
    while hops and "/" not in text:
        entry = facts.get(f"entry {directory}/{text}") or ""
        if not entry.startswith("l "):
            return text
        text = entry.split(" -> ", 1)[1].rsplit(" ", 1)[0]
        hops -= 1
    return text


def _same_file(key, theirs, ours, toolkit, way):
    """harmless: a link both ways, resolving, whose chain ends at the same file of its folder
    (ldconfig chose another of two names of one library for the soname link)."""
    if not key.startswith("entry ") or not theirs or not ours:
        return None
    if not all(side.startswith("l ") and side.endswith(" resolves") for side in (theirs, ours)):
        return None
    directory = key[len("entry "):].rsplit("/", 1)[0]
    text = [v.split(" -> ", 1)[1].rsplit(" ", 1)[0] for v in (theirs, ours)]
    if _final(toolkit, directory, text[0]) == _final(way, directory, text[1]):
        return "harmless: the link reaches the same library by another of its names"
    return None


def _failed(result):
    return result["rc"] != 0 and not result["out"]


def run_case(world, case, parts, layouts, verbose, dump=None, ways=WAYS, side=None):
    """{way: (class, reasons)} of CASE's WAYS against the first of them (the reference: the
    toolkit's, unless --reference)."""
    results = {way: run_way(world, case, parts, layouts, way, side) for way in ways}
    if any(_failed(r) for r in results.values()) and not all(_failed(r) for r in results.values()):
        # once more, after a pause: a create of ours that failed while another session on this
        # machine reinstalled the venv or rebuilt the front end is not a difference; a real one
        # fails again (the first error is printed)
        first = {w: (r["err"] or "").strip().splitlines()[-1:] for w, r in results.items() if _failed(r)}
        print(f"case {case['number']}: a create failed, run again: {first}", flush=True)
        time.sleep(3)
        results = {way: run_way(world, case, parts, layouts, way, side) for way in ways}
    if dump:
        os.makedirs(dump, exist_ok=True)
        with open(os.path.join(dump, f"case-{case['number']}.json"), "w") as out:
            json.dump({"case": case, "ways": results}, out, indent=1)
    seen = {way: facts(result) for way, result in results.items()}
    reference = ways[0]
    outcome = {}
    for way in ways[1:]:
        diff = differences(seen[reference], seen[way])
        outcome[way] = classify(case, diff, (seen[reference], seen[way]))
        asks = any(hook[0] in ("update-ldcache", "enable-cuda-compat") for hook in case["hooks"])
        if way == "nri-kept" and asks and not results[way].get("kept") and not _failed(results[way]):
            outcome[way] = (outcome[way][0], "; ".join(r for r in (outcome[way][1], NOT_KEPT) if r))
        if verbose and diff:
            print(f"  {way}: {outcome[way][0]}")
            for side in (reference, way):
                if "error" in seen[side]:
                    print(f"    {side}'s create fails: {seen[side]['error']}")
            for key, (theirs, ours) in diff.items():
                print(f"    {key}\n      {reference}: {theirs!r}\n      {way}: {ours!r}")
    return outcome


def _stand_in_hook(work):
    """An nvidia-cdi-hook that fails, saying so, when run: the spec's hooks name it where no way
    is the toolkit's (every way does the hooks' work natively, and must not run one)."""
    path = os.path.join(work, "stand-in", "nvidia-cdi-hook")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as out:
        out.write("#!/bin/sh\necho \"stand-in nvidia-cdi-hook run: $*\" >&2\nexit 1\n")
    os.chmod(path, 0o755)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", type=int, action="append", help="run only case N (repeatable)")
    parser.add_argument("--layout", action="append", choices=hl.LAYOUTS,
                        help="draw the images from this layout only (repeatable; default: all of them)")
    parser.add_argument("--way", action="append", choices=WAYS[1:],
                        help="compare this way with the reference's (repeatable; default: all of them)")
    parser.add_argument("--reference", choices=WAYS, default="toolkit",
                        help="the way the others are compared with (default: the real toolkit's; another "
                             "needs no toolkit, and its hooks name a stand-in that fails if run)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each case and each difference")
    parser.add_argument("--json", help="write each case and its outcome to this file")
    parser.add_argument("--dump", help="write each case's probe outputs, each way's, into this folder")
    args = parser.parse_args(argv)
    ways = (args.reference, *[way for way in WAYS[1:] if way in (args.way or WAYS) and way != args.reference])
    if any(way in NRI_WAYS for way in ways) and os.environ.get("CDI_SHIM_DIFF_NAMESPACE") != str(os.getpid()):
        # (a mount namespace of its own: the overlays go with it, whatever ends the run)
        command = [sys.executable, os.path.abspath(__file__), *(sys.argv[1:] if argv is None else argv)]
        done = subprocess.run([rh.need("unshare", "util-linux"), "-m", "--propagation", "private", "sh", "-c",
                               'CDI_SHIM_DIFF_NAMESPACE=$$ exec "$@"', "sh", *command])
        return done.returncode
    work = tempfile.mkdtemp(prefix="hookdiff.")
    if "toolkit" in ways:
        try:
            hook = toolkit_programs()["nvidia-cdi-hook"]
        except ToolkitUnavailable as err:
            print(f"hook_differential.py: {err}", file=sys.stderr)
            return 1
    else:
        hook = _stand_in_hook(work)
    rng = random.Random(args.seed)
    cases = [random_case(rng, n, tuple(args.layout or hl.LAYOUTS)) for n in range(args.cases)]
    if args.only:
        cases = [c for c in cases if c["number"] in args.only]
    counts, reasons, records, start = collections.Counter(), collections.Counter(), [], time.monotonic()
    per_layout = collections.defaultdict(collections.Counter)
    per_way = collections.defaultdict(collections.Counter)
    changed, side, kept = [], None, collections.Counter()
    try:
        parts = Parts(work)
        layouts = Layouts(work, parts)
        if any(way in NRI_WAYS for way in ways):
            side = NRISide(work)
        for case in cases:
            if args.verbose:
                print(json.dumps(case))
            world = rh.World(os.path.join(work, f"w{case['number']}"))
            world.write_spec("nvidia-gpu.yaml", spec_text(world, case, parts, hook))
            try:
                outcome = run_case(world, case, parts, layouts, args.verbose, args.dump, ways, side)
            finally:
                world.cleanup()
                shutil.rmtree(world.base, ignore_errors=True)
            worst = max((o[0] for o in outcome.values()), key=CLASSES.index)
            counts[worst] += 1
            per_layout[case["layout"]][worst] += 1
            for way, result in outcome.items():
                per_way[way][result[0]] += 1
            if "nri-kept" in outcome and any(h[0] in ("update-ldcache", "enable-cuda-compat") for h in case["hooks"]):
                kept["not kept" if NOT_KEPT in outcome["nri-kept"][1] else "kept"] += 1
            for reason in {r for o in outcome.values() if o[0] != "left" for r in o[1].split("; ") if r} - {NOT_KEPT}:
                reasons[reason] += 1
            for key in {k for o in outcome.values() if o[0] == "left" for k in o[1].split("; ")} - {NOT_KEPT}:
                reasons["left: " + DROPIN_NAME.sub("N", key)] += 1
            records.append({"case": case, "outcome": outcome})
            print(f"case {case['number']} ({case['layout']}): {worst}"
                  + "".join(f"  [{w}: {o[0]}: {o[1]}]" for w, o in outcome.items() if o[0] != "identical" or o[1]),
                  flush=True)
        changed = layouts.check()
    finally:
        if side is not None:
            side.close()
            if args.verbose:
                print("the NRI hook server's log:\n  " + "\n  ".join(side.logged))
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(records, out, indent=1)
    for reason, n in reasons.most_common():
        print(f"  {n:4d} cases: {reason}")
    for layout in hl.LAYOUTS:
        if per_layout[layout]:
            print(f"  {layout:9s} {sum(per_layout[layout].values()):4d} cases: "
                  + ", ".join(f"{k} {per_layout[layout][k]}" for k in CLASSES))
    if len(ways) > 2:
        for way in ways[1:]:
            print(f"  {way:11s} " + ", ".join(f"{k} {per_way[way][k]}" for k in CLASSES))
    if kept:
        print(f"  nri-kept: the answer kept by the image's layers in {kept['kept']} of the {sum(kept.values())} "
              "cases whose hook asks the plugin")
    print(f"{len(cases)} cases, seed {args.seed}, {time.monotonic() - start:.0f} s: "
          + ", ".join(f"{k} {counts[k]}" for k in CLASSES))
    if changed:
        print(f"hook_differential.py: a way changed the cached layout(s) {', '.join(changed)}: the results are void",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
