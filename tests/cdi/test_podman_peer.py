"""Differential test: `cdi-shim cdi inject` against Debian podman 4.3.1 (CDI library v0.5.2).

Each test installs spec files in /etc/cdi and /var/run/cdi (under a host-wide lock, restored
afterwards), has podman generate the OCI config for `--device ...`, runs our inject on podman's
baseline config (same flags, no devices) with the same spec dirs, and compares the two documents
(see podman_peer.py for the normalisation). Only cdiVersion <= 0.5.0 features are used. The
v0.5.2 behaviours that differ from CDI head (podman-peer.md §6) are asserted on both sides:
podman must still show the old behaviour and we must show head's.

Needs root, podman, runc and a static busybox; without them the tests FAIL (they do not skip).
"""
import json
import os
import stat

import pytest

import podman_peer as pp

pytestmark = pytest.mark.podman

ETC, RUN = pp.SPEC_DIRS


class _Unavailable:
    """Stands in for the peer when a tool is missing: any use FAILS the test (never a skip)."""

    def __init__(self, reason):
        self.reason = reason

    def __getattr__(self, name):
        pytest.fail(self.reason, pytrace=False)


@pytest.fixture(scope="session")
def peer(tmp_path_factory):
    try:
        pp.cdi_shim_command()
        peer = pp.PodmanPeer(tmp_path_factory.mktemp("podman-peer"))
    except pp.PeerUnavailable as err:
        yield _Unavailable(str(err))
        return
    # Host nodes the specs refer to.
    os.mkfifo(os.path.join(peer.workdir, "fifo"), 0o640)
    with open(os.path.join(peer.workdir, "regular-file"), "w") as out:
        out.write("not a device\n")
    os.symlink("/dev/null", os.path.join(peer.workdir, "null-link"))
    yield peer
    peer.close()


def specs(peer, files):
    """Spec files with @TMP@ replaced by the peer's work dir."""
    return {path: text.replace("@TMP@", peer.workdir) for path, text in files.items()}


def differential(peer, files, devices, flags=(), refresh_log=False):
    return peer.differential(specs(peer, files), devices, flags=flags, refresh_log=refresh_log)


# --- spec files -------------------------------------------------------------------------------

DEV_SPEC = """\
cdiVersion: "0.5.0"
kind: example.com/dev
devices:
  - name: a
    containerEdits:
      deviceNodes:
        - path: /dev/exampleA
          hostPath: /dev/null
      env:
        - EXAMPLE_A=1
      mounts:
        - hostPath: @TMP@/hostfile.txt
          containerPath: /mountpoint
          options: [ro, bind]
  - name: b
    containerEdits:
      deviceNodes:
        - {path: /dev/exampleB, hostPath: /dev/zero}
      env: [EXAMPLE_B=1, EMPTY=]
"""

# Two devices plus spec-level env, mount (replacing podman's /etc/hosts) and hook.
GPU_SPEC = """\
cdiVersion: "0.5.0"
kind: vendor.com/gpu
containerEdits:
  env: [VENDOR_GLOBAL=g, TERM=overridden-by-spec]
  mounts:
    - {hostPath: "@TMP@/hostfile.txt", containerPath: /etc/hosts, options: [ro, bind]}
  hooks:
    - {hookName: createContainer, path: /bin/true, args: [true, spec-level], env: [HOOK=spec], timeout: 5}
devices:
  - name: "0"
    containerEdits:
      env: [DEV=0, DUP=first]
      deviceNodes:
        - {path: /dev/gpu0, hostPath: /dev/null, permissions: rw, fileMode: 0660, uid: 11, gid: 12}
      mounts:
        - {hostPath: "@TMP@/hostdir", containerPath: /opt/gpu0, options: [ro, rbind]}
      hooks:
        - {hookName: prestart, path: /bin/true, args: [true, dev0]}
        - {hookName: poststop, path: /bin/true}
  - name: "1"
    containerEdits:
      env: [DEV=1, DUP=second]
      deviceNodes:
        - {path: /dev/gpu1, hostPath: /dev/zero, permissions: r}
      hooks:
        - {hookName: createContainer, path: /bin/true, args: [true, dev1], timeout: 3}
"""

NODES_SPEC = """\
cdiVersion: "0.5.0"
kind: example.com/nodes
devices:
  - name: fifo
    containerEdits:
      deviceNodes: [{path: /dev/myfifo, hostPath: "@TMP@/fifo"}]
  - name: explicit
    containerEdits:
      deviceNodes: [{path: /dev/ghost, type: b, major: 259, minor: 3}]
  - name: octal
    containerEdits:
      deviceNodes:
        - {path: /dev/octal, hostPath: /dev/null, fileMode: 0640}
        - {path: /dev/decimal, hostPath: /dev/zero, fileMode: 416, type: c}
  - name: implicit
    containerEdits:
      deviceNodes: [{path: /dev/ghost2}]
  - name: typemismatch
    containerEdits:
      deviceNodes: [{path: /dev/tm, hostPath: /dev/null, type: b}]
  - name: utype
    containerEdits:
      deviceNodes: [{path: /dev/tu, hostPath: /dev/null, type: u}]
  - name: regfile
    containerEdits:
      deviceNodes: [{path: /dev/reg, hostPath: "@TMP@/regular-file"}]
  - name: symlink
    containerEdits:
      deviceNodes: [{path: /dev/link, hostPath: "@TMP@/null-link"}]
"""

MOUNT_SPEC = """\
cdiVersion: "0.5.0"
kind: example.com/mnt
devices:
  - name: m
    containerEdits:
      mounts:
        - {hostPath: "@TMP@/hostdir", containerPath: /zz/y/x, options: [ro, rbind]}
        - {hostPath: "@TMP@/hostfile.txt", containerPath: /b, options: [ro, bind]}
        - {hostPath: "@TMP@/hostdir", containerPath: /a/b/, options: [rbind]}
        - {hostPath: "@TMP@/hostdir", containerPath: /aa, type: bind, options: [rbind, ro]}
        - {hostPath: "@TMP@/hostdir", containerPath: /b, options: [rbind]}
"""

OVERRIDE_SPEC = """\
cdiVersion: "0.5.0"
kind: example.com/dev
devices:
  - name: a
    containerEdits:
      deviceNodes: [{path: /dev/exampleA, hostPath: /dev/zero}]
      env: [EXAMPLE_A=from-run]
"""

CONFLICT_SPEC = """\
cdiVersion: "0.4.0"
kind: example.com/dev
devices:
  - name: a
    containerEdits:
      env: [EXAMPLE_A=from-test2]
"""

CASE_SPEC = """\
CDIVersion: "0.5.0"
Kind: example.com/case
DEVICES:
  - NAME: x
    containeredits:
      ENV: [CASE=insensitive]
      DeviceNodes: [{PATH: /dev/case, HOSTPATH: /dev/null}]
"""

JSON_SPEC = json.dumps({
    "cdiVersion": "0.5.0", "kind": "example.com/json",
    "devices": [{"name": "j", "containerEdits": {"env": ["FROM_JSON=1"],
                                                 "deviceNodes": [{"path": "/dev/json", "hostPath": "/dev/zero"}]}}],
})


def invalid_spec(kind, body):
    return f'cdiVersion: "0.5.0"\nkind: {kind}\n' + body


# Files both libraries skip (each one defines a device that must stay unresolvable).
INVALID_FILES = {
    f"{ETC}/broken.yaml": "garbage: [\n",
    f"{ETC}/unknown.yaml": invalid_spec("example.com/unknown", """\
devices:
  - name: u
    bogusField: 1
    containerEdits: {env: [U=1]}
"""),
    f"{ETC}/ignored.yml": invalid_spec("example.com/yml", "devices: [{name: y, containerEdits: {env: [Y=1]}}]\n"),
    f"{ETC}/sub/nested.yaml": invalid_spec("example.com/sub", "devices: [{name: s, containerEdits: {env: [S=1]}}]\n"),
    f"{ETC}/dotted.yaml": invalid_spec("example.com/cl.ass", "devices: [{name: d, containerEdits: {env: [D=1]}}]\n"),
    f"{ETC}/badenv.yaml": invalid_spec("example.com/badenv", """\
devices:
  - {name: good, containerEdits: {env: [GOOD=1]}}
  - {name: bad, containerEdits: {env: [NOEQUALS]}}
"""),
    f"{ETC}/hookname.yaml": invalid_spec("example.com/hookname", """\
devices:
  - name: h
    containerEdits:
      hooks: [{hookName: preStart, path: /bin/true}]
"""),
    f"{RUN}/broken-run.json": '{"cdiVersion": "0.5.0", ',
}
# (example.com/cl.ass=d is not requested: podman 4.3.1 does not take a dotted class for a CDI
# name and stats it as a host path instead; the file is there to be skipped.)
INVALID_DEVICES = ["example.com/unknown=u", "example.com/yml=y", "example.com/sub=s",
                   "example.com/badenv=good", "example.com/badenv=bad", "example.com/hookname=h"]


# --- successful injections --------------------------------------------------------------------

def test_single_device_and_difference_file_mode(peer):
    sc = differential(peer, {f"{ETC}/test.yaml": DEV_SPEC}, ["example.com/dev=a"])
    filled = pp.compare(sc)
    # Documented difference 1: v0.5.2 leaves fileMode out; head fills the host's (0666 for /dev/null).
    assert filled == {"/dev/exampleA": stat.S_IMODE(os.stat("/dev/null").st_mode)}
    assert "fileMode" not in sc.podman.config["linux"]["devices"][0]
    linux = sc.ours.config["linux"]
    assert linux["devices"][-1]["path"] == "/dev/exampleA"
    assert linux["resources"]["devices"][-1] == {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}


def test_multi_device_spec_level_edits_hooks_and_mount_replace(peer):
    sc = differential(peer, {f"{ETC}/gpu.yaml": GPU_SPEC}, ["vendor.com/gpu=1", "vendor.com/gpu=0"])
    filled = pp.compare(sc)
    assert set(filled) == {"/dev/gpu1"}  # gpu0 has an explicit fileMode (YAML octal 0660)
    ours = sc.ours.config
    assert [d["path"] for d in ours["linux"]["devices"]] == ["/dev/gpu1", "/dev/gpu0"]
    gpu0 = ours["linux"]["devices"][1]
    assert (gpu0["fileMode"], gpu0["uid"], gpu0["gid"]) == (0o660, 11, 12)
    assert [r.get("access") for r in ours["linux"]["resources"]["devices"][-2:]] == ["r", "rw"]
    hosts = [m for m in ours["mounts"] if m["destination"] == "/etc/hosts"]
    assert hosts == [{"destination": "/etc/hosts", "source": f"{peer.workdir}/hostfile.txt", "options": ["ro", "bind"]}]
    # Spec-level hook first (once), then the devices' hooks in request order.
    assert [h.get("args") for h in ours["hooks"]["createContainer"]] == [["true", "spec-level"], ["true", "dev1"]]


def test_two_specs_interleaved(peer):
    sc = differential(peer, {f"{ETC}/gpu.yaml": GPU_SPEC, f"{ETC}/test.yaml": DEV_SPEC},
                      ["vendor.com/gpu=0", "example.com/dev=a", "vendor.com/gpu=1"])
    pp.compare(sc)
    env = pp.env_first_position_last_value(sc.ours.config["process"]["env"])
    assert (env["DEV"], env["DUP"], env["EXAMPLE_A"]) == ("1", "second", "1")
    assert list(env)[-4:] == ["VENDOR_GLOBAL", "DEV", "DUP", "EXAMPLE_A"]


def test_duplicate_request(peer):
    sc = differential(peer, {f"{ETC}/gpu.yaml": GPU_SPEC}, ["vendor.com/gpu=0", "vendor.com/gpu=0"])
    pp.compare(sc)
    linux = sc.ours.config["linux"]
    assert [d["path"] for d in linux["devices"]] == ["/dev/gpu0"]
    assert len([r for r in linux["resources"]["devices"] if r.get("allow")]) == 2
    assert len(sc.ours.config["hooks"]["prestart"]) == 2
    assert len(sc.ours.config["hooks"]["createContainer"]) == 1


def test_process_user_uid_gid(peer):
    sc = differential(peer, {f"{ETC}/test.yaml": DEV_SPEC, f"{ETC}/gpu.yaml": GPU_SPEC},
                      ["example.com/dev=a", "vendor.com/gpu=0"], flags=("--user", "1000:2000"))
    pp.compare(sc)
    devices = {d["path"]: d for d in sc.ours.config["linux"]["devices"]}
    assert (devices["/dev/exampleA"]["uid"], devices["/dev/exampleA"]["gid"]) == (1000, 2000)
    assert (devices["/dev/gpu0"]["uid"], devices["/dev/gpu0"]["gid"]) == (11, 12)


def test_cdi_node_replaces_non_cdi_device_same_path(peer):
    # A plain `--device /dev/zero:/dev/exampleA` is in the baseline; the CDI node replaces it,
    # but its cgroup allow rule stays (rules are only appended).
    sc = differential(peer, {f"{ETC}/test.yaml": DEV_SPEC}, ["example.com/dev=a", "example.com/dev=b"],
                      flags=("--device", "/dev/zero:/dev/exampleA"))
    pp.compare(sc)
    linux = sc.ours.config["linux"]
    assert [(d["path"], d["minor"]) for d in linux["devices"]] == [("/dev/exampleA", 3), ("/dev/exampleB", 5)]
    allowed = [(r.get("major"), r.get("minor")) for r in linux["resources"]["devices"] if r.get("allow")]
    assert allowed == [(1, 5), (1, 3), (1, 5)]
    assert "EMPTY=" in sc.ours.config["process"]["env"]


def test_fifo_missing_explicit_and_octal_file_modes(peer):
    files = {f"{ETC}/nodes.yaml": NODES_SPEC}
    sc = differential(peer, files, ["example.com/nodes=fifo", "example.com/nodes=explicit", "example.com/nodes=octal"])
    filled = pp.compare(sc)
    assert filled == {"/dev/myfifo": 0o640}  # not for the missing node, not where the spec has one
    devices = {d["path"]: d for d in sc.podman.config["linux"]["devices"]}
    assert devices["/dev/myfifo"] == {"path": "/dev/myfifo", "type": "p", "major": 0, "minor": 0}
    assert devices["/dev/ghost"] == {"path": "/dev/ghost", "type": "b", "major": 259, "minor": 3}
    assert devices["/dev/octal"]["fileMode"] == 0o640 and devices["/dev/decimal"]["fileMode"] == 416
    rules = sc.ours.config["linux"]["resources"]["devices"]
    assert [(r.get("type"), r.get("major")) for r in rules if r.get("allow")] == [("b", 259), ("c", 1), ("c", 1)]


def test_mount_replace_and_sort_order(peer):
    sc = differential(peer, {f"{ETC}/mnt.yaml": MOUNT_SPEC}, ["example.com/mnt=m"])
    pp.compare(sc, cdi_mounts=True)
    ours = [m["destination"] for m in sc.ours.config["mounts"]]
    podman = [m["destination"] for m in sc.podman.config["mounts"]]
    assert ours.count("/b") == 1 and podman.count("/b") == 1
    assert next(m for m in sc.ours.config["mounts"] if m["destination"] == "/b")["options"] == ["rbind"]
    assert "/a/b/" in ours  # kept verbatim, trailing slash included
    # Documented difference 3: podman sorts by (depth, destination), reordering its own mounts;
    # head sorts stably by depth only, so the baseline's depth-1 order survives.
    base_depth1 = [m["destination"] for m in sc.baseline["mounts"] if pp.mount_depth(m["destination"]) == 1]
    # (the second /b removes the first and is appended after /aa)
    assert [d for d in ours if pp.mount_depth(d) == 1] == base_depth1 + ["/aa", "/b"]
    assert [d for d in podman if pp.mount_depth(d) == 1] == sorted(base_depth1 + ["/aa", "/b"])
    assert ours != podman


def test_spec_dir_priority_run_over_etc(peer):
    files = {f"{ETC}/test.yaml": DEV_SPEC, f"{RUN}/override.yaml": OVERRIDE_SPEC}
    sc = differential(peer, files, ["example.com/dev=a", "example.com/dev=b"])
    pp.compare(sc)
    env = pp.env_first_position_last_value(sc.ours.config["process"]["env"])
    assert env["EXAMPLE_A"] == "from-run" and env["EXAMPLE_B"] == "1"
    assert sc.ours.config["linux"]["devices"][0]["minor"] == 5  # /dev/zero from /var/run/cdi


def test_same_dir_conflict_other_device_still_resolves(peer):
    files = {f"{ETC}/test.yaml": DEV_SPEC, f"{ETC}/test2.yaml": CONFLICT_SPEC}
    sc = differential(peer, files, ["example.com/dev=b"])
    pp.compare(sc)


def test_invalid_files_skipped_valid_ones_used(peer):
    files = dict(INVALID_FILES, **{f"{ETC}/test.yaml": DEV_SPEC, f"{ETC}/json.json": JSON_SPEC})
    sc = differential(peer, files, ["example.com/dev=a", "example.com/json=j"], refresh_log=True)
    pp.compare(sc)
    # podman really loaded and rejected the invalid files (one report each; v0.5.2 names the
    # file only for parse errors); the .yml file and the sub-directory were not read at all.
    log = sc.refresh_log
    for reason in ('failed to parse CDI Spec "/etc/cdi/broken.yaml"',
                   'failed to parse CDI Spec "/var/run/cdi/broken-run.json"',
                   'failed to parse CDI Spec "/etc/cdi/unknown.yaml"', 'unknown field "bogusField"',
                   "invalid character '.' in device class \"cl.ass\"",
                   'invalid environment variable "NOEQUALS"', 'invalid hook name "preStart"'):
        assert reason in log, (reason, log)
    assert "6 errors occurred" in log, log


def test_case_insensitive_keys(peer):
    sc = differential(peer, {f"{ETC}/case.yaml": CASE_SPEC}, ["example.com/case=x"])
    pp.compare(sc)
    assert "CASE=insensitive" in sc.ours.config["process"]["env"]


# --- failures compared on their message -------------------------------------------------------

@pytest.mark.parametrize("device, reason", [
    ("implicit", 'failed to stat CDI host device "/dev/ghost2": no such file or directory'),
    ("typemismatch", 'CDI device ("/dev/tm", "/dev/null"), host type mismatch (b, c)'),
    ("utype", 'CDI device ("/dev/tu", "/dev/null"), host type mismatch (u, c)'),
    ("regfile", 'failed to stat CDI host device "@TMP@/regular-file": not a device node'),
    ("symlink", 'failed to stat CDI host device "@TMP@/null-link": not a device node'),
])
def test_device_node_failures(peer, device, reason):
    sc = differential(peer, {f"{ETC}/nodes.yaml": NODES_SPEC}, [f"example.com/nodes={device}"])
    got = pp.assert_same_failure(sc)
    assert reason.replace("@TMP@", peer.workdir) in got


def test_same_dir_conflict_deletes_device_even_with_higher_priority_override(peer):
    base = {f"{ETC}/test.yaml": DEV_SPEC, f"{ETC}/test2.yaml": CONFLICT_SPEC}
    expected = "unresolvable CDI devices example.com/dev=a"
    pp.assert_same_failure(differential(peer, base, ["example.com/dev=a"]), expected)  # S5
    s6 = dict(base, **{f"{RUN}/override.yaml": OVERRIDE_SPEC})
    pp.assert_same_failure(differential(peer, s6, ["example.com/dev=a"]), expected)  # S6 quirk


@pytest.mark.parametrize("device", INVALID_DEVICES)
def test_devices_of_invalid_or_ignored_files_unresolvable(peer, device):
    files = dict(INVALID_FILES, **{f"{ETC}/test.yaml": DEV_SPEC})
    pp.assert_same_failure(differential(peer, files, [device]), f"unresolvable CDI devices {device}")


# --- documented v0.5.2 differences, asserted on both sides ------------------------------------

def test_difference_env_append_vs_replace(peer):
    flags = ("-e", "DEV=user", "-e", "VENDOR_GLOBAL=user")
    sc = differential(peer, {f"{ETC}/gpu.yaml": GPU_SPEC}, ["vendor.com/gpu=0"], flags=flags)
    pp.compare(sc)  # equal as "first position, last value"
    podman_env, ours_env = sc.podman.config["process"]["env"], sc.ours.config["process"]["env"]
    # podman (v0.5.2): a CDI entry whose key exists is appended -> the key appears twice.
    for key, user, cdi in (("DEV", "user", "0"), ("VENDOR_GLOBAL", "user", "g"),
                           ("TERM", "xterm", "overridden-by-spec")):
        assert [e for e in podman_env if e.startswith(key + "=")] == [f"{key}={user}", f"{key}={cdi}"]
        # head: replaced in place, at the baseline's position.
        assert [e for e in ours_env if e.startswith(key + "=")] == [f"{key}={cdi}"]
        base_env = sc.baseline["process"]["env"]
        assert ours_env.index(f"{key}={cdi}") == base_env.index(f"{key}={user}")
    # Duplicates inside the CDI edits are replaced in place on both sides.
    assert [e for e in podman_env if e.startswith("DUP=")] == ["DUP=first"]


def test_difference_unresolvable_message(peer):
    sc = differential(peer, {f"{ETC}/test.yaml": DEV_SPEC}, ["example.com/dev=a", "example.com/dev=nope"])
    assert sc.podman.rc != 0 and sc.podman.config is None
    # v0.5.2 lists every requested device; head only the unresolved ones.
    assert sc.podman.error == "unresolvable CDI devices example.com/dev=a, example.com/dev=nope"
    assert sc.ours.rc != 0 and not sc.ours.stdout.strip()
    assert "unresolvable CDI devices example.com/dev=nope" in sc.ours.stderr
    assert "example.com/dev=a" not in sc.ours.stderr


def test_difference_minimum_version(peer):
    """v0.5.2 has no minimum-version check (cdi-semantics.md §7); head refuses a 0.3.0 spec
    that uses hostPath (a 0.5.0 field), so the device is unresolvable for us only."""
    old = DEV_SPEC.replace('cdiVersion: "0.5.0"', 'cdiVersion: "0.3.0"')
    sc = differential(peer, {f"{ETC}/test.yaml": old}, ["example.com/dev=a"])
    pp.assert_podman_ok(sc)
    assert "EXAMPLE_A=1" in sc.podman.config["process"]["env"]
    assert sc.ours.rc != 0 and not sc.ours.stdout.strip()
    assert "unresolvable CDI devices example.com/dev=a" in sc.ours.stderr


def test_difference_empty_devices_list(peer):
    """v0.5.2 accepts `devices: []`; head rejects the file (no device is lost either way)."""
    from cdi.errors import SpecError
    from cdi.spec import read_spec

    empty = 'cdiVersion: "0.5.0"\nkind: example.com/empty\ncontainerEdits: {env: [EMPTY_SPEC=1]}\ndevices: []\n'
    files = {f"{ETC}/empty.yaml": empty, f"{ETC}/broken.yaml": "garbage: [\n", f"{ETC}/test.yaml": DEV_SPEC}
    sc = differential(peer, files, ["example.com/dev=a"], refresh_log=True)
    pp.compare(sc)
    assert "/etc/cdi/broken.yaml" in sc.refresh_log, "control: podman reports rejected files"
    assert "/etc/cdi/empty.yaml" not in sc.refresh_log, "podman (v0.5.2) rejected `devices: []`"
    path = os.path.join(peer.workdir, "empty.yaml")
    with open(path, "w") as out:
        out.write(empty)
    with pytest.raises(SpecError, match="no devices"):
        read_spec(path)


# --- end to end: what the container sees ------------------------------------------------------

E2E_COMMAND = ("/bin/sh", "-c", "ls -ln /dev/exampleA; env; cat /mountpoint")


def _check_container_output(output):
    lines = output.splitlines()
    node = next((line for line in lines if line.endswith("/dev/exampleA")), "")
    assert node.startswith("crw-rw-rw-") and "1,   3" in node, output
    assert "EXAMPLE_A=1" in lines, output
    assert pp.HOSTFILE_TEXT.strip() in lines, output


def test_end_to_end_container_sees_device_env_mount(peer):
    files = specs(peer, {f"{ETC}/test.yaml": DEV_SPEC})
    with pp.installed_specs(files):
        theirs = peer.run_podman(devices=["example.com/dev=a"], command=E2E_COMMAND)
        ours = peer.run_with_our_injection(["example.com/dev=a"], command=E2E_COMMAND)
    assert theirs.rc == 0, theirs
    _check_container_output(theirs.stdout)
    # The same container, with cdi-shim doing the injection inside the runtime wrapper.
    assert ours.rc == 0, ours
    _check_container_output(ours.stdout)
