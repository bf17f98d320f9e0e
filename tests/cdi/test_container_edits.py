"""Applying CDI container edits to an OCI config, checked against the reference semantics.

The expected behaviour is the CNCF CDI library at HEAD 05ae4b5b as written down in
shared/reference/cdi-semantics.md §3 (applying edits), §2.4 (edit validation) and the test cases
listed in §6.4 (container-edits_test.go TestApplyContainerEdits / TestValidateContainerEdits /
TestAppend). Where a case is [HEAD-only] the test name says so.

Device nodes are filled from REAL host nodes with lstat: /dev/null, a FIFO made with os.mkfifo,
char/block nodes made with os.mknod (we run as root), a regular file and a symlink.

Our implementation adds one guarantee the reference does not have (reference: "an error mid-way
leaves the OCI spec partially modified"): `apply_edits` returns a new config and never touches
its input, also when it fails. That is checked here too, including with hypothesis.
"""
import copy
import os
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdi.container_edits import (EditsInvalid, apply_edits, merge_edits, resolve_device_node,
                                 validate_edits)
from cdi.errors import EditError

HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
NULL = "/dev/null"
NULL_FILE_MODE = 0o666
NVIDIA_MAJOR = 195


def edits(**blocks):
    """One merged edits block, as the registry hands it to apply_edits."""
    return merge_edits([blocks])


def apply(config, **blocks):
    """apply_edits, also asserting that the input config is left as it was."""
    snapshot = copy.deepcopy(config)
    result = apply_edits(config, edits(**blocks))
    assert config == snapshot, "apply_edits modified its input"
    return result


def apply_fails(config, merged):
    """apply_edits must raise EditError and leave the input exactly as it was."""
    snapshot = copy.deepcopy(config)
    with pytest.raises(EditError) as info:
        apply_edits(config, merged)
    assert config == snapshot, "a failed apply_edits modified its input"
    return str(info.value)


def null_device(**extra):
    return dict({"path": NULL, "type": "c", "major": 1, "minor": 3, "fileMode": NULL_FILE_MODE}, **extra)


def rule(dev_type, major, minor, access="rwm"):
    result = {"allow": True, "type": dev_type, "major": major, "minor": minor}
    if access:
        result["access"] = access
    return result


@pytest.fixture(scope="module", autouse=True)
def _dev_null_is_what_the_tests_assume():
    info = os.lstat(NULL)
    assert stat.S_ISCHR(info.st_mode)
    assert (os.major(info.st_rdev), os.minor(info.st_rdev)) == (1, 3)
    assert stat.S_IMODE(info.st_mode) == NULL_FILE_MODE


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    os.chmod(path, 0o640)
    return str(path)


@pytest.fixture
def regular_file(tmp_path):
    path = tmp_path / "regular"
    path.write_text("not a device\n")
    return str(path)


@pytest.fixture
def symlink_to_null(tmp_path):
    path = tmp_path / "null-link"
    os.symlink(NULL, path)
    return str(path)


def _mknod(path, kind, major, minor, mode):
    try:
        os.mknod(path, kind | mode, os.makedev(major, minor))
    except PermissionError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"os.mknod needs root/CAP_MKNOD here: {err}")
    os.chmod(path, mode)  # the umask applies to mknod
    return str(path)


@pytest.fixture
def nvidia_char_node(tmp_path):
    return _mknod(tmp_path / "nvidia0", stat.S_IFCHR, NVIDIA_MAJOR, 0, 0o660)


@pytest.fixture
def block_node(tmp_path):
    return _mknod(tmp_path / "blk", stat.S_IFBLK, 7, 200, 0o640)


@pytest.fixture
def missing(tmp_path):
    return str(tmp_path / "does-not-exist")


# --- env (§3.5) ---------------------------------------------------------------------------

def test_env_added_and_process_created_if_absent():
    result = apply({}, env=["FOO=bar", "BAZ=1"])
    assert result["process"]["env"] == ["FOO=bar", "BAZ=1"]


def test_env_appended_after_existing_entries():
    config = {"process": {"env": ["PATH=/bin", "HOME=/root"], "cwd": "/"}}
    result = apply(config, env=["FOO=bar"])
    assert result["process"] == {"env": ["PATH=/bin", "HOME=/root", "FOO=bar"], "cwd": "/"}


def test_duplicate_cdi_env_first_position_last_value():
    # container-edits_test.go "empty spec, duplicate env vars use last value"
    result = apply({}, env=["A=1", "B=2", "A=3", "C=4", "B=5"])
    assert result["process"]["env"] == ["A=3", "B=5", "C=4"]


def test_duplicate_cdi_env_across_merged_blocks():
    merged = merge_edits([{"env": ["A=spec"]}, {"env": ["B=dev", "A=dev"]}])
    result = apply_edits({}, merged)
    assert result["process"]["env"] == ["A=dev", "B=dev"]


def test_env_existing_key_replaced_in_place_head_differs_from_v1_1_0():
    # [HEAD-only] commit 9c49c2b: a pre-existing key is replaced where it stands.
    # v1.1.0 (and podman's v0.5.2) appended "A=new" and kept "A=old".
    config = {"process": {"env": ["PATH=/bin", "A=old", "Z=z"]}}
    result = apply(config, env=["A=new"])
    assert result["process"]["env"] == ["PATH=/bin", "A=new", "Z=z"]


def test_env_existing_key_replaced_in_place_with_cdi_duplicates_head_differs_from_v1_1_0():
    config = {"process": {"env": ["A=0", "B=1"]}}
    result = apply(config, env=["C=2", "A=1", "A=2"])
    assert result["process"]["env"] == ["A=2", "B=1", "C=2"]


def test_env_duplicate_key_in_base_config_last_entry_replaced_head_differs_from_v1_1_0():
    # createEnvCacheMap (internal/ociedit/spec_editor.go) indexes the base env in a loop where
    # the last entry of a key wins, so the edit replaces "FOO=old2": the entry runc leaves in
    # effect. Replacing the first one would leave the container with FOO=old2.
    config = {"process": {"env": ["FOO=old", "FOO=old2"]}}
    assert apply(config, env=["FOO=bar"])["process"]["env"] == ["FOO=old", "FOO=bar"]


def test_env_duplicate_key_in_base_config_with_cdi_duplicates_head_differs_from_v1_1_0():
    config = {"process": {"env": ["A=0", "B=1", "A=2", "B=3"]}}
    result = apply(config, env=["B=x", "A=y", "A=z"])
    assert result["process"]["env"] == ["A=0", "B=1", "A=z", "B=x"]


def test_env_key_is_text_before_first_equals():
    config = {"process": {"env": ["A=x=y", "AB=1"]}}
    result = apply(config, env=["A=b=c", "A==", "ABC=2"])
    assert result["process"]["env"] == ["A==", "AB=1", "ABC=2"]


# --- device nodes (§3.3) ------------------------------------------------------------------

def test_dev_null_filled_from_host():
    # TestApplyContainerEdits: /dev/null filled from host (c 1:3, fileMode 0666, rule rwm)
    result = apply({}, deviceNodes=[{"path": NULL}])
    assert result["linux"]["devices"] == [null_device()]
    assert result["linux"]["resources"]["devices"] == [rule("c", 1, 3)]


def test_resolve_device_node_dev_null():
    node = {"path": NULL}
    assert resolve_device_node(node) == null_device()


def test_host_path_used_for_stat_and_path_kept(fifo):
    result = apply({}, deviceNodes=[{"path": "/dev/zero-in-container", "hostPath": "/dev/zero"}])
    assert result["linux"]["devices"] == [
        {"path": "/dev/zero-in-container", "type": "c", "major": 1, "minor": 5, "fileMode": 0o666}]
    assert "hostPath" not in result["linux"]["devices"][0]


def test_fifo_filled_from_host_without_cgroup_rule(fifo):
    result = apply({}, deviceNodes=[{"path": "/dev/myfifo", "hostPath": fifo}])
    assert result["linux"]["devices"] == [
        {"path": "/dev/myfifo", "type": "p", "major": 0, "minor": 0, "fileMode": 0o640}]
    assert result.get("linux", {}).get("resources", {}).get("devices", []) == []


def test_fifo_major_minor_left_as_written(fifo):
    # type "p": major/minor are never taken from the host (container-edits_unix.go:122-124)
    result = apply({}, deviceNodes=[{"path": "/dev/myfifo", "hostPath": fifo, "major": 5, "minor": 9}])
    assert result["linux"]["devices"] == [
        {"path": "/dev/myfifo", "type": "p", "major": 5, "minor": 9, "fileMode": 0o640}]


def test_minimal_fifo_with_missing_host_used_as_written(missing):
    # type "p" alone makes a node minimal; a failed stat is then not an error
    result = apply({}, deviceNodes=[{"path": "/dev/myfifo", "hostPath": missing, "type": "p"}])
    assert result["linux"]["devices"] == [{"path": "/dev/myfifo", "type": "p", "major": 0, "minor": 0}]
    assert result.get("linux", {}).get("resources", {}).get("devices", []) == []


def test_regular_file_is_not_a_device_node(regular_file):
    message = apply_fails({}, edits(deviceNodes=[{"path": "/dev/x", "hostPath": regular_file}]))
    assert message == f'failed to stat CDI host device "{regular_file}": not a device node'


def test_symlink_to_dev_null_is_not_followed(symlink_to_null):
    # lstat: a symlink is "not a device node" even when it points at one
    message = apply_fails({}, edits(deviceNodes=[{"path": "/dev/x", "hostPath": symlink_to_null}]))
    assert message == f'failed to stat CDI host device "{symlink_to_null}": not a device node'


def test_symlink_as_path_without_host_path(symlink_to_null):
    message = apply_fails({}, edits(deviceNodes=[{"path": symlink_to_null}]))
    assert message == f'failed to stat CDI host device "{symlink_to_null}": not a device node'


def test_missing_host_node_with_only_path_fails(missing):
    message = apply_fails({}, edits(deviceNodes=[{"path": missing}]))
    assert message == f'failed to stat CDI host device "{missing}": no such file or directory'


def test_missing_host_node_message_names_host_path(missing):
    message = apply_fails({}, edits(deviceNodes=[{"path": "/dev/foo", "hostPath": missing}]))
    assert message == f'failed to stat CDI host device "{missing}": no such file or directory'


def test_missing_host_node_type_without_major_is_not_minimal(missing):
    message = apply_fails({}, edits(deviceNodes=[{"path": missing, "type": "c", "minor": 4}]))
    assert message == f'failed to stat CDI host device "{missing}": no such file or directory'


def test_minimal_node_with_missing_host_used_as_written(missing):
    node = {"path": "/dev/foo", "hostPath": missing, "type": "c", "major": 10, "minor": 200}
    result = apply({}, deviceNodes=[node])
    # no fileMode: nothing to fill it from
    assert result["linux"]["devices"] == [{"path": "/dev/foo", "type": "c", "major": 10, "minor": 200}]
    assert result["linux"]["resources"]["devices"] == [rule("c", 10, 200)]


def test_minimal_node_with_non_device_host_path_used_as_written(regular_file, symlink_to_null):
    # "not a device node" comes out of deviceInfoFromPath like any stat error, and stat errors
    # are fatal only for non-minimal nodes (§3.3, container-edits_unix.go:57-66, 90-98).
    for host in (regular_file, symlink_to_null):
        node = {"path": "/dev/foo", "hostPath": host, "type": "c", "major": 10, "minor": 200}
        result = apply({}, deviceNodes=[node])
        assert result["linux"]["devices"] == [{"path": "/dev/foo", "type": "c", "major": 10, "minor": 200}]


@pytest.mark.parametrize("dev_type", ["b", "u"])
def test_type_mismatch_against_dev_null(dev_type):
    message = apply_fails({}, edits(deviceNodes=[{"path": NULL, "type": dev_type}]))
    assert message == f'CDI device ("{NULL}", "{NULL}"), host type mismatch ({dev_type}, c)'


def test_type_mismatch_names_path_and_host_path():
    message = apply_fails({}, edits(deviceNodes=[{"path": "/dev/foo", "hostPath": NULL, "type": "b"}]))
    assert message == f'CDI device ("/dev/foo", "{NULL}"), host type mismatch (b, c)'


def test_type_mismatch_fifo_against_char_needs_non_minimal(fifo):
    message = apply_fails({}, edits(deviceNodes=[{"path": "/dev/x", "hostPath": fifo, "type": "c"}]))
    assert message == f'CDI device ("/dev/x", "{fifo}"), host type mismatch (c, p)'


def test_minimal_node_skips_type_check_but_fills_file_mode():
    # minimal (type + major): type/major/minor as written, no mismatch check; fileMode filled
    # from the host since v1.1.0.
    result = apply({}, deviceNodes=[{"path": NULL, "type": "b", "major": 7, "minor": 1}])
    assert result["linux"]["devices"] == [
        {"path": NULL, "type": "b", "major": 7, "minor": 1, "fileMode": NULL_FILE_MODE}]
    assert result["linux"]["resources"]["devices"] == [rule("b", 7, 1)]


def test_file_mode_filled_for_minimal_node_when_stat_works():
    result = apply({}, deviceNodes=[{"path": NULL, "type": "c", "major": 1, "minor": 3}])
    assert result["linux"]["devices"] == [null_device()]


def test_explicit_file_mode_kept():
    result = apply({}, deviceNodes=[{"path": NULL, "fileMode": 0o600}])
    assert result["linux"]["devices"] == [null_device(fileMode=0o600)]


def test_major_zero_overwritten_including_minor():
    result = apply({}, deviceNodes=[{"path": NULL, "type": "c", "major": 0, "minor": 42}])
    assert result["linux"]["devices"] == [null_device()]
    result = apply({}, deviceNodes=[{"path": NULL, "minor": 42}])
    assert result["linux"]["devices"] == [null_device()]


def test_mknod_nvidia_char_node_filled(nvidia_char_node):
    result = apply({}, deviceNodes=[{"path": "/dev/nvidia0", "hostPath": nvidia_char_node}])
    assert result["linux"]["devices"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": NVIDIA_MAJOR, "minor": 0, "fileMode": 0o660}]
    assert result["linux"]["resources"]["devices"] == [rule("c", NVIDIA_MAJOR, 0)]


def test_mknod_block_node_filled(block_node):
    result = apply({}, deviceNodes=[{"path": "/dev/loop200", "hostPath": block_node}])
    assert result["linux"]["devices"] == [
        {"path": "/dev/loop200", "type": "b", "major": 7, "minor": 200, "fileMode": 0o640}]
    assert result["linux"]["resources"]["devices"] == [rule("b", 7, 200)]


def test_mknod_char_node_type_b_mismatch(nvidia_char_node):
    message = apply_fails({}, edits(deviceNodes=[{"path": "/dev/nvidia0", "hostPath": nvidia_char_node,
                                                  "type": "b"}]))
    assert message == f'CDI device ("/dev/nvidia0", "{nvidia_char_node}"), host type mismatch (b, c)'


def test_uid_gid_from_process_user_when_positive():
    config = {"process": {"user": {"uid": 1000, "gid": 2000}}}
    result = apply(config, deviceNodes=[{"path": NULL}])
    assert result["linux"]["devices"] == [null_device(uid=1000, gid=2000)]


def test_uid_gid_not_set_when_process_user_is_root():
    config = {"process": {"user": {"uid": 0, "gid": 0}}}
    result = apply(config, deviceNodes=[{"path": NULL}])
    assert result["linux"]["devices"] == [null_device()]


def test_uid_gid_not_set_without_process():
    result = apply({"linux": {}}, deviceNodes=[{"path": NULL}])
    assert result["linux"]["devices"] == [null_device()]


def test_explicit_uid_gid_kept_even_zero():
    config = {"process": {"user": {"uid": 1000, "gid": 2000}}}
    result = apply(config, deviceNodes=[{"path": NULL, "uid": 5, "gid": 0}])
    assert result["linux"]["devices"] == [null_device(uid=5, gid=0)]


def test_only_missing_id_taken_from_process_user():
    config = {"process": {"user": {"uid": 1000, "gid": 2000}}}
    result = apply(config, deviceNodes=[{"path": NULL, "uid": 7}])
    assert result["linux"]["devices"] == [null_device(uid=7, gid=2000)]
    config = {"process": {"user": {"uid": 0, "gid": 2000}}}
    result = apply(config, deviceNodes=[{"path": NULL}])
    assert result["linux"]["devices"] == [null_device(gid=2000)]


def test_cgroup_rule_permissions_none_has_no_access_head_only(missing):
    # [HEAD-only] "none" -> access "" (omitted in JSON)
    node = {"path": "/dev/foo", "hostPath": missing, "type": "c", "major": 10, "minor": 1,
            "permissions": "none"}
    result = apply({}, deviceNodes=[node])
    assert result["linux"]["resources"]["devices"] == [{"allow": True, "type": "c", "major": 10, "minor": 1}]
    assert "access" not in result["linux"]["resources"]["devices"][0]


@pytest.mark.parametrize("permissions", ["r", "rw", "mw", "rrw"])
def test_cgroup_rule_explicit_permissions_kept(permissions):
    result = apply({}, deviceNodes=[{"path": NULL, "permissions": permissions}])
    assert result["linux"]["resources"]["devices"] == [rule("c", 1, 3, permissions)]
    assert "permissions" not in result["linux"]["devices"][0]


def test_cgroup_rule_omitted_permissions_rwm():
    result = apply({}, deviceNodes=[{"path": NULL, "permissions": ""}])
    assert result["linux"]["resources"]["devices"] == [rule("c", 1, 3)]


def test_no_cgroup_rule_for_type_u(missing):
    node = {"path": "/dev/foo", "hostPath": missing, "type": "u", "major": 5, "minor": 1}
    result = apply({}, deviceNodes=[node])
    assert result["linux"]["devices"] == [{"path": "/dev/foo", "type": "u", "major": 5, "minor": 1}]
    assert result.get("linux", {}).get("resources", {}).get("devices", []) == []


def test_no_resources_object_created_without_b_or_c_nodes(fifo, missing):
    # AddLinuxResourcesDevice is only called for b/c nodes, so linux.resources stays nil and is
    # omitted from config.json (LinuxResources is `omitempty`).
    nodes = [{"path": "/dev/myfifo", "hostPath": fifo},
             {"path": "/dev/u", "hostPath": missing, "type": "u", "major": 5, "minor": 1}]
    result = apply({}, deviceNodes=nodes)
    assert len(result["linux"]["devices"]) == 2
    assert "resources" not in result["linux"]


def test_cgroup_rules_appended_existing_rules_kept():
    deny_all = {"allow": False, "access": "rwm"}
    config = {"linux": {"resources": {"devices": [deny_all], "memory": {"limit": 1}}}}
    result = apply(config, deviceNodes=[{"path": NULL}, {"path": "/dev/zero"}])
    assert result["linux"]["resources"] == {
        "devices": [deny_all, rule("c", 1, 3), rule("c", 1, 5)], "memory": {"limit": 1}}


def test_replaced_device_keeps_its_old_cgroup_rule():
    old = {"path": NULL, "type": "c", "major": 9, "minor": 9}
    old_rule = rule("c", 9, 9)
    config = {"linux": {"devices": [old], "resources": {"devices": [old_rule]}}}
    result = apply(config, deviceNodes=[{"path": NULL, "permissions": "r"}])
    assert result["linux"]["devices"] == [null_device()]
    assert result["linux"]["resources"]["devices"] == [old_rule, rule("c", 1, 3, "r")]


def test_existing_devices_preserved_and_new_appended():
    other = {"path": "/dev/other", "type": "c", "major": 4, "minor": 4}
    result = apply({"linux": {"devices": [other]}}, deviceNodes=[{"path": NULL}])
    assert result["linux"]["devices"] == [other, null_device()]


def test_replace_by_path_single_existing_is_removed_then_appended():
    a = {"path": "/dev/a", "type": "c", "major": 4, "minor": 1}
    b = {"path": "/dev/b", "type": "c", "major": 4, "minor": 2}
    old = {"path": NULL, "type": "c", "major": 9, "minor": 9}
    result = apply({"linux": {"devices": [a, old, b]}}, deviceNodes=[{"path": NULL}])
    assert result["linux"]["devices"] == [a, b, null_device()]


def test_replace_by_path_with_duplicate_remaining_replaces_in_place():
    # RemoveDevice drops the first match; AddDevice then replaces the next remaining match
    a = {"path": "/dev/a", "type": "c", "major": 4, "minor": 1}
    b = {"path": "/dev/b", "type": "c", "major": 4, "minor": 2}
    old1 = {"path": NULL, "type": "c", "major": 9, "minor": 1}
    old2 = {"path": NULL, "type": "c", "major": 9, "minor": 2}
    old3 = {"path": NULL, "type": "c", "major": 9, "minor": 3}
    result = apply({"linux": {"devices": [old1, a, old2, b]}}, deviceNodes=[{"path": NULL}])
    assert result["linux"]["devices"] == [a, null_device(), b]
    result = apply({"linux": {"devices": [old1, a, old2, b, old3]}}, deviceNodes=[{"path": NULL}])
    assert result["linux"]["devices"] == [a, null_device(), b, old3]


def test_same_node_twice_in_edits_gives_one_device_two_rules():
    result = apply({}, deviceNodes=[{"path": NULL}, {"path": NULL, "permissions": "r"}])
    assert result["linux"]["devices"] == [null_device()]
    assert result["linux"]["resources"]["devices"] == [rule("c", 1, 3), rule("c", 1, 3, "r")]


def test_device_nodes_are_not_modified_by_resolution():
    node = {"path": NULL}
    merged = edits(deviceNodes=[node])
    snapshot = copy.deepcopy(merged)
    apply_edits({}, merged)
    resolve_device_node(node)
    assert merged == snapshot and node == {"path": NULL}


# --- mounts (§3.4) ------------------------------------------------------------------------

def test_mount_conversion():
    mount = {"hostPath": "/host/lib", "containerPath": "/usr/lib/x", "type": "bind", "options": ["ro", "bind"]}
    result = apply({}, mounts=[mount])
    assert result["mounts"] == [
        {"destination": "/usr/lib/x", "source": "/host/lib", "type": "bind", "options": ["ro", "bind"]}]


def test_mount_without_type_and_options():
    result = apply({}, mounts=[{"hostPath": "/h", "containerPath": "/c"}])
    assert result["mounts"] == [{"destination": "/c", "source": "/h"}]


def test_mount_replaces_first_with_exact_destination():
    first = {"destination": "/data", "source": "/old1"}
    second = {"destination": "/data", "source": "/old2"}
    proc = {"destination": "/proc", "source": "proc", "type": "proc"}
    result = apply({"mounts": [first, proc, second]}, mounts=[{"hostPath": "/new", "containerPath": "/data"}])
    assert result["mounts"] == [proc, second, {"destination": "/data", "source": "/new"}]


def test_mount_destination_compared_without_cleaning_and_trailing_slash_kept():
    existing = {"destination": "/data", "source": "/old"}
    result = apply({"mounts": [existing]}, mounts=[{"hostPath": "/new", "containerPath": "/data/"}])
    assert result["mounts"] == [existing, {"destination": "/data/", "source": "/new"}]


def test_cdi_mount_after_existing_mounts_of_same_depth():
    # "mount added by edit comes after existing ones of same number of path parts"
    existing = [{"destination": "/dev", "source": "tmpfs"}, {"destination": "/proc", "source": "proc"},
                {"destination": "/sys", "source": "sysfs"}]
    result = apply({"mounts": existing}, mounts=[{"hostPath": "/h", "containerPath": "/a"}])
    assert [m["destination"] for m in result["mounts"]] == ["/dev", "/proc", "/sys", "/a"]


def test_mounts_whole_array_stable_sorted_by_depth():
    existing = [{"destination": "/a/b/c", "source": "1"}, {"destination": "/x", "source": "2"},
                {"destination": "/z/y", "source": "3"}, {"destination": "/proc", "source": "4"}]
    cdi_mounts = [{"hostPath": "h1", "containerPath": "/m/n/"}, {"hostPath": "h2", "containerPath": "/b"},
                  {"hostPath": "h3", "containerPath": "/"}]
    result = apply({"mounts": existing}, mounts=cdi_mounts)
    assert [m["destination"] for m in result["mounts"]] == ["/x", "/proc", "/b", "/", "/z/y", "/m/n/", "/a/b/c"]


def test_mount_depth_uses_cleaned_destination():
    existing = [{"destination": "/a/./b/../c//", "source": "1"}, {"destination": "/q", "source": "2"}]
    result = apply({"mounts": existing}, mounts=[{"hostPath": "h", "containerPath": "//x///y"}])
    # Clean("/a/./b/../c//") = "/a/c" (2), "/q" (1), Clean("//x///y") = "/x/y" (2)
    assert [m["destination"] for m in result["mounts"]] == ["/q", "/a/./b/../c//", "//x///y"]


def test_mounts_not_sorted_without_cdi_mounts():
    existing = [{"destination": "/a/b/c", "source": "1"}, {"destination": "/x", "source": "2"}]
    result = apply({"mounts": existing}, env=["A=1"])
    assert result["mounts"] == existing


USERNS = {"linux": {"namespaces": [{"type": "pid"}, {"type": "user"}]}}


@pytest.mark.parametrize("options, expected", [
    (["bind"], ["bind", "idmap"]),
    (["rbind", "ro"], ["rbind", "ro", "ridmap"]),
    (["bind", "idmap"], ["bind", "idmap"]),
    (["rbind", "ridmap"], ["rbind", "ridmap"]),
])
def test_bind_mount_idmapped_in_user_namespace_head_only(options, expected):
    result = apply(USERNS, mounts=[{"hostPath": "/h", "containerPath": "/c", "options": options}])
    assert result["mounts"] == [{"destination": "/c", "source": "/h", "options": expected}]


def test_bind_mount_not_idmapped_without_user_namespace():
    config = {"linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]}}
    for options in (["bind"], ["rbind", "ro"]):
        result = apply(config, mounts=[{"hostPath": "/h", "containerPath": "/c", "options": options}])
        assert result["mounts"] == [{"destination": "/c", "source": "/h", "options": options}]


def test_non_bind_mount_not_idmapped_in_user_namespace():
    mount = {"hostPath": "tmpfs", "containerPath": "/t", "type": "tmpfs", "options": ["nosuid"]}
    result = apply(USERNS, mounts=[mount])
    assert result["mounts"] == [{"destination": "/t", "source": "tmpfs", "type": "tmpfs", "options": ["nosuid"]}]


# --- hooks, intelRdt, netDevices, additionalGids (§3.6) ----------------------------------

def test_hooks_appended_to_all_six_lists_keeping_existing():
    existing = {name: [{"path": f"/old/{name}"}] for name in HOOK_NAMES}
    cdi_hooks = [{"hookName": name, "path": f"/new/{name}", "args": [f"/new/{name}", "x"],
                  "env": ["K=V"], "timeout": 5} for name in HOOK_NAMES]
    result = apply({"hooks": existing}, hooks=cdi_hooks)
    for name in HOOK_NAMES:
        assert result["hooks"][name] == [
            {"path": f"/old/{name}"},
            {"path": f"/new/{name}", "args": [f"/new/{name}", "x"], "env": ["K=V"], "timeout": 5}]


def test_hooks_created_when_absent_and_order_kept():
    cdi_hooks = [{"hookName": "createContainer", "path": "/a"}, {"hookName": "prestart", "path": "/b"},
                 {"hookName": "createContainer", "path": "/c"}]
    result = apply({}, hooks=cdi_hooks)
    assert result["hooks"] == {"createContainer": [{"path": "/a"}, {"path": "/c"}], "prestart": [{"path": "/b"}]}


def test_hook_timeout_zero_kept():
    result = apply({}, hooks=[{"hookName": "poststop", "path": "/x", "timeout": 0}])
    assert result["hooks"]["poststop"] == [{"path": "/x", "timeout": 0}]


def test_unknown_hook_name_fails():
    message = apply_fails({"hooks": {}}, edits(hooks=[{"hookName": "preStart", "path": "/x"}]))
    assert message == 'unknown hook name "preStart"'


def test_intel_rdt_set():
    rdt = {"closID": "clos1", "l3CacheSchema": "L3:0=ff", "memBwSchema": "MB:0=50",
           "schemata": ["L3:0=f"], "enableMonitoring": True}
    result = apply({}, intelRdt=rdt)
    assert result["linux"]["intelRdt"] == rdt


def test_intel_rdt_replaced_as_a_whole():
    config = {"linux": {"intelRdt": {"closID": "old", "l3CacheSchema": "L3:0=1", "enableMonitoring": True}}}
    result = apply(config, intelRdt={"closID": "new"})
    assert result["linux"]["intelRdt"] == {"closID": "new"}


def test_intel_rdt_empty_fields_omitted_like_go_omitempty():
    # OCI LinuxIntelRdt fields are all `omitempty`: an empty schemata slice does not appear.
    result = apply({}, intelRdt={"closID": "c", "schemata": [], "enableMonitoring": False})
    assert result["linux"]["intelRdt"] == {"closID": "c"}


def test_intel_rdt_last_block_wins_in_merge():
    merged = merge_edits([{"intelRdt": {"closID": "spec"}}, {"env": ["A=1"]}, {"intelRdt": {"closID": "dev"}},
                          {"intelRdt": None}])
    assert merged["intelRdt"] == {"closID": "dev"}
    result = apply_edits({}, merged)
    assert result["linux"]["intelRdt"] == {"closID": "dev"}


def test_net_devices_set_and_override():
    config = {"linux": {"netDevices": {"eth0": {"name": "old"}, "eth9": {"name": "keep"}}}}
    result = apply(config, netDevices=[{"hostInterfaceName": "eth0", "name": "ctr0"},
                                       {"hostInterfaceName": "eth1", "name": "ctr1"}])
    assert result["linux"]["netDevices"] == {
        "eth0": {"name": "ctr0"}, "eth9": {"name": "keep"}, "eth1": {"name": "ctr1"}}


def test_net_devices_later_block_overrides_earlier():
    merged = merge_edits([{"netDevices": [{"hostInterfaceName": "eth0", "name": "a"}]},
                          {"netDevices": [{"hostInterfaceName": "eth0", "name": "b"}]}])
    assert apply_edits({}, merged)["linux"]["netDevices"] == {"eth0": {"name": "b"}}


def test_additional_gids_appended_deduplicated_zero_skipped():
    config = {"process": {"user": {"uid": 1, "gid": 1, "additionalGids": [5]}}}
    result = apply(config, additionalGids=[5, 0, 7, 7, 9])
    assert result["process"]["user"] == {"uid": 1, "gid": 1, "additionalGids": [5, 7, 9]}


def test_additional_gids_create_process_user():
    result = apply({}, additionalGids=[3, 4])
    assert result["process"]["user"]["additionalGids"] == [3, 4]


def test_additional_gids_only_zero_changes_nothing():
    assert apply({}, additionalGids=[0, 0]) == {}


def test_additional_gids_not_deduplicated_at_merge_time():
    merged = merge_edits([{"additionalGids": [3, 3]}, {"additionalGids": [3, 0]}])
    assert merged["additionalGids"] == [3, 3, 3, 0]
    assert apply_edits({}, merged)["process"]["user"]["additionalGids"] == [3]


# --- merging (TestAppend) -----------------------------------------------------------------

def test_merge_concatenates_every_list_category_in_order():
    a = {"env": ["var0=val0"], "deviceNodes": [{"path": "/dev/dev1"}],
         "mounts": [{"hostPath": "a", "containerPath": "/a"}],
         "hooks": [{"hookName": "prestart", "path": "/a"}], "netDevices": [{"hostInterfaceName": "e0", "name": "n0"}],
         "additionalGids": [1]}
    b = {"env": ["var1=val1", "var2=val2"], "deviceNodes": [{"path": "/dev/dev2"}, {"path": "/dev/dev3"}]}
    c = {"env": ["var3=val3"], "deviceNodes": [{"path": "/dev/dev4"}],
         "mounts": [{"hostPath": "c", "containerPath": "/c"}],
         "hooks": [{"hookName": "poststop", "path": "/c"}], "netDevices": [{"hostInterfaceName": "e1", "name": "n1"}],
         "additionalGids": [1, 2]}
    merged = merge_edits([a, None, {}, b, c])
    assert merged["env"] == ["var0=val0", "var1=val1", "var2=val2", "var3=val3"]
    assert [n["path"] for n in merged["deviceNodes"]] == ["/dev/dev1", "/dev/dev2", "/dev/dev3", "/dev/dev4"]
    assert merged["mounts"] == a["mounts"] + c["mounts"]
    assert merged["hooks"] == a["hooks"] + c["hooks"]
    assert merged["netDevices"] == a["netDevices"] + c["netDevices"]
    assert merged["additionalGids"] == [1, 1, 2]
    assert merged["intelRdt"] is None


def test_merge_of_nothing_applies_nothing():
    config = {"process": {"env": ["A=1"]}, "mounts": [{"destination": "/b/c"}, {"destination": "/a"}]}
    for merged in (merge_edits([]), merge_edits([None]), merge_edits([{}])):
        assert apply(config, **{k: v for k, v in merged.items() if v}) == config
        assert apply_edits(config, merged) == config


# --- category order (§3.2) ----------------------------------------------------------------

def test_category_order_devices_fail_before_hooks(missing):
    # deviceNodes (2) are applied before hooks (5): the stat error wins over the hook error
    merged = edits(hooks=[{"hookName": "bogus", "path": "/x"}], deviceNodes=[{"path": missing}])
    assert apply_fails({}, merged) == f'failed to stat CDI host device "{missing}": no such file or directory'


def test_category_order_env_fails_before_devices(missing):
    merged = edits(env=["A=1"], deviceNodes=[{"path": missing}])
    message = apply_fails({"process": {"env": "A=0"}}, merged)
    assert "stat" not in message


def test_category_order_mounts_fail_before_hooks():
    merged = edits(mounts=[{"hostPath": "/h", "containerPath": "/c"}], hooks=[{"hookName": "bogus", "path": "/x"}])
    message = apply_fails({"mounts": {"destination": "/c"}}, merged)
    assert "hook" not in message


def test_all_categories_together():
    config = {"process": {"env": ["A=0"], "user": {"uid": 1000, "gid": 1000}},
              "mounts": [{"destination": "/proc", "source": "proc"}],
              "linux": {"namespaces": [{"type": "mount"}]}}
    merged = merge_edits([
        {"env": ["A=1", "B=2"], "mounts": [{"hostPath": "/h", "containerPath": "/data", "options": ["bind"]}],
         "hooks": [{"hookName": "createContainer", "path": "/hook"}]},
        {"deviceNodes": [{"path": NULL}], "netDevices": [{"hostInterfaceName": "eth0", "name": "net0"}],
         "intelRdt": {"closID": "c1"}, "additionalGids": [44]},
    ])
    result = apply_edits(config, merged)
    assert result == {
        "process": {"env": ["A=1", "B=2"], "user": {"uid": 1000, "gid": 1000, "additionalGids": [44]}},
        "mounts": [{"destination": "/proc", "source": "proc"},
                   {"destination": "/data", "source": "/h", "options": ["bind"]}],
        "linux": {"namespaces": [{"type": "mount"}],
                  "devices": [null_device(uid=1000, gid=1000)],
                  "resources": {"devices": [rule("c", 1, 3)]},
                  "netDevices": {"eth0": {"name": "net0"}},
                  "intelRdt": {"closID": "c1"}},
        "hooks": {"createContainer": [{"path": "/hook"}]},
    }


# --- the input is never modified ----------------------------------------------------------

def test_result_is_new_and_independent_of_input():
    config = {"process": {"env": ["A=0"], "user": {"uid": 0, "gid": 0}},
              "linux": {"devices": [], "resources": {"devices": []}}, "mounts": [], "hooks": {"prestart": []}}
    snapshot = copy.deepcopy(config)
    result = apply_edits(config, edits(env=["B=1"], deviceNodes=[{"path": NULL}],
                                       mounts=[{"hostPath": "/h", "containerPath": "/c"}],
                                       hooks=[{"hookName": "prestart", "path": "/p"}], additionalGids=[3]))
    assert result is not config
    result["process"]["env"].append("C=2")
    result["process"]["user"]["additionalGids"].append(4)
    result["linux"]["devices"].append({})
    result["linux"]["resources"]["devices"].append({})
    result["mounts"].append({})
    result["hooks"]["prestart"].append({})
    assert config == snapshot


def test_failed_stat_mid_way_leaves_input_untouched(fifo, missing):
    config = {"process": {"env": ["A=0"], "user": {"uid": 1000, "gid": 1000}},
              "linux": {"devices": [{"path": NULL, "type": "c", "major": 9, "minor": 9}],
                        "resources": {"devices": [{"allow": False, "access": "rwm"}]}},
              "mounts": [{"destination": "/x/y"}, {"destination": "/a"}]}
    merged = merge_edits([
        {"env": ["A=1", "B=2"], "mounts": [{"hostPath": "/h", "containerPath": "/b"}]},
        {"deviceNodes": [{"path": NULL}, {"path": "/dev/f", "hostPath": fifo}, {"path": "/dev/zero"},
                         {"path": "/dev/gone", "hostPath": missing}, {"path": "/dev/full"}],
         "hooks": [{"hookName": "prestart", "path": "/p"}], "additionalGids": [5],
         "netDevices": [{"hostInterfaceName": "eth0", "name": "n"}], "intelRdt": {"closID": "c"}},
    ])
    message = apply_fails(config, merged)
    assert message == f'failed to stat CDI host device "{missing}": no such file or directory'


def test_type_mismatch_mid_way_leaves_input_untouched():
    config = {"linux": {"devices": [{"path": "/dev/a"}]}}
    merged = edits(deviceNodes=[{"path": "/dev/zero"}, {"path": NULL, "type": "b"}])
    apply_fails(config, merged)


@pytest.mark.parametrize("config, blocks", [
    ({"process": {"env": "FOO=bar"}}, {"env": ["A=1"]}),
    ({"process": {"env": ["A=0", 7]}}, {"env": ["A=1"]}),
    ({"process": "x"}, {"env": ["A=1"]}),
    ({"mounts": {"destination": "/x"}}, {"mounts": [{"hostPath": "/h", "containerPath": "/c"}]}),
    ({"mounts": ["/x"]}, {"mounts": [{"hostPath": "/h", "containerPath": "/c"}]}),
    ({"linux": []}, {"deviceNodes": [{"path": NULL}]}),
    ({"linux": {"devices": "x"}}, {"deviceNodes": [{"path": NULL}]}),
    ({"linux": {"resources": {"devices": {}}}}, {"deviceNodes": [{"path": NULL}]}),
    ({"linux": {"netDevices": []}}, {"netDevices": [{"hostInterfaceName": "e", "name": "n"}]}),
    ({"hooks": {"prestart": {}}}, {"hooks": [{"hookName": "prestart", "path": "/p"}]}),
    ({"hooks": []}, {"hooks": [{"hookName": "prestart", "path": "/p"}]}),
    ({"process": {"user": {"additionalGids": "5"}}}, {"additionalGids": [6]}),
    ({"process": {"user": 3}}, {"additionalGids": [6]}),
    ([], {"env": ["A=1"]}),
])
def test_wrong_typed_config_fails_and_leaves_input_untouched(config, blocks):
    # earlier categories that would succeed must not leak into the input either
    merged = merge_edits([{"env": ["EARLY=1"]} if "env" not in blocks else {}, blocks])
    apply_fails(config, merged)


def test_wrong_typed_later_category_does_not_leak_earlier_ones():
    config = {"process": {"env": ["A=0"]}, "linux": {"devices": []}, "mounts": {"bad": True}}
    merged = edits(env=["A=1"], deviceNodes=[{"path": NULL}], mounts=[{"hostPath": "/h", "containerPath": "/c"}])
    apply_fails(config, merged)


# --- hypothesis: transactional for any config and any edits -------------------------------

@pytest.fixture(scope="module")
def host_paths(tmp_path_factory):
    base = tmp_path_factory.mktemp("hosts")
    fifo_path = base / "fifo"
    os.mkfifo(fifo_path)
    regular = base / "regular"
    regular.write_text("x")
    link = base / "link"
    os.symlink(NULL, link)
    return [NULL, "/dev/zero", str(fifo_path), str(regular), str(link),
            str(base / "missing1"), str(base / "missing2")]


_names = st.sampled_from(["A", "B", "PATH", "HOME", "X_1"])
_env_entry = st.builds(lambda k, v: f"{k}={v}", _names, st.sampled_from(["", "1", "2", "a=b"]))
_destinations = st.sampled_from(["/", "/a", "/a/b", "/a/b/", "/data", "/x/y/z", "//x", "/proc"])


def _maybe_wrong(strategy):
    return st.one_of(strategy, strategy, strategy, st.text(max_size=3), st.integers(), st.dictionaries(
        st.sampled_from(["x", "destination"]), st.text(max_size=2), max_size=1), st.none())


def _oci_device():
    return st.fixed_dictionaries({"path": st.sampled_from([NULL, "/dev/zero", "/dev/a", "/dev/b"])},
                                 optional={"type": st.sampled_from(["c", "b"]), "major": st.integers(0, 300),
                                           "minor": st.integers(0, 300)})


def _configs():
    process = st.fixed_dictionaries({}, optional={
        "env": _maybe_wrong(st.lists(_env_entry, max_size=5)),
        "user": _maybe_wrong(st.fixed_dictionaries({}, optional={
            "uid": st.integers(0, 3000), "gid": st.integers(0, 3000),
            "additionalGids": _maybe_wrong(st.lists(st.integers(0, 10), max_size=3))})),
        "cwd": st.just("/"),
    })
    linux = st.fixed_dictionaries({}, optional={
        "devices": _maybe_wrong(st.lists(_oci_device(), max_size=4)),
        "resources": _maybe_wrong(st.fixed_dictionaries({}, optional={
            "devices": _maybe_wrong(st.lists(st.fixed_dictionaries(
                {"allow": st.booleans()}, optional={"access": st.just("rwm")}), max_size=2))})),
        "namespaces": st.lists(st.fixed_dictionaries({"type": st.sampled_from(["user", "pid", "mount"])}),
                               max_size=3),
        "netDevices": _maybe_wrong(st.dictionaries(st.sampled_from(["eth0", "eth1"]),
                                                   st.fixed_dictionaries({"name": st.sampled_from(["a", "b"])}),
                                                   max_size=2)),
        "intelRdt": st.fixed_dictionaries({"closID": st.sampled_from(["x", "y"])}),
    })
    hooks = st.fixed_dictionaries({}, optional={
        name: _maybe_wrong(st.lists(st.fixed_dictionaries({"path": st.just("/old")}), max_size=2))
        for name in HOOK_NAMES})
    return st.fixed_dictionaries({}, optional={
        "ociVersion": st.just("1.0.2"),
        "process": _maybe_wrong(process),
        "linux": _maybe_wrong(linux),
        "mounts": _maybe_wrong(st.lists(st.fixed_dictionaries({"destination": _destinations},
                                                              optional={"source": st.just("s")}), max_size=4)),
        "hooks": _maybe_wrong(hooks),
    })


def _edit_blocks(host_choices, dense=False):
    host = {"hostPath": st.sampled_from(host_choices)}
    node = st.fixed_dictionaries({"path": st.sampled_from([NULL, "/dev/zero", "/dev/a", "/dev/b"]),
                                  **(host if dense else {})}, optional={
        **({} if dense else host),
        "type": st.sampled_from(["", "b", "c", "u", "p"]),
        "major": st.integers(0, 300), "minor": st.integers(0, 300),
        "fileMode": st.integers(0, 0o777),
        "permissions": st.sampled_from(["", "r", "rw", "rwm", "none"]),
        "uid": st.integers(0, 3000), "gid": st.integers(0, 3000),
    })
    mount = st.fixed_dictionaries({"hostPath": st.just("/h"), "containerPath": _destinations}, optional={
        "type": st.sampled_from(["bind", "tmpfs"]),
        "options": st.lists(st.sampled_from(["bind", "rbind", "ro", "idmap"]), max_size=3, unique=True)})
    hook = st.fixed_dictionaries({"hookName": st.sampled_from(HOOK_NAMES), "path": st.just("/hook")}, optional={
        "args": st.lists(st.just("a"), max_size=2), "timeout": st.integers(0, 10)})
    block = st.fixed_dictionaries({}, optional={
        "env": st.lists(_env_entry, max_size=4),
        "deviceNodes": st.lists(node, max_size=4),
        "mounts": st.lists(mount, max_size=3),
        "hooks": st.lists(hook, max_size=3),
        "intelRdt": st.fixed_dictionaries({"closID": st.sampled_from(["c1", "/"])}),
        "netDevices": st.lists(st.fixed_dictionaries({"hostInterfaceName": st.sampled_from(["eth0", "eth1"]),
                                                      "name": st.sampled_from(["n0", "n1"])}), max_size=2),
        "additionalGids": st.lists(st.integers(0, 10), max_size=3),
    })
    if dense:
        return st.lists(st.fixed_dictionaries({"deviceNodes": st.lists(node, min_size=1, max_size=3)}),
                        min_size=1, max_size=3).flatmap(lambda nodes: block.map(lambda b: nodes + [b]))
    return st.lists(st.one_of(block, st.none()), max_size=4)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_apply_edits_never_modifies_its_input(host_paths, data):
    config = data.draw(_configs(), label="config")
    blocks = data.draw(_edit_blocks(host_paths), label="edits")
    merged = merge_edits(blocks)
    snapshot = copy.deepcopy(config)
    try:
        result = apply_edits(config, merged)
    except EditError:
        assert config == snapshot, "failed apply_edits modified its input"
        return
    assert config == snapshot, "apply_edits modified its input"
    assert isinstance(result, dict)
    if merged["deviceNodes"]:
        # every CDI device node ended up in linux.devices
        paths = {dev.get("path") for dev in result["linux"]["devices"] if isinstance(dev, dict)}
        assert {node["path"] for node in merged["deviceNodes"]} <= paths


# --- validation of edits (§2.4, TestValidateContainerEdits) -------------------------------

@pytest.mark.parametrize("block", [
    {"env": ["FOO=", "BAR=baz", "WITH SPACE=1"]},
    {"deviceNodes": [{"path": "/dev/x"}]},
    {"deviceNodes": [{"path": "/dev/x", "type": "b"}]},
    {"deviceNodes": [{"path": "/dev/x", "type": "c", "permissions": "rwm"}]},
    {"deviceNodes": [{"path": "/dev/x", "permissions": "rrwwmm"}]},
    {"deviceNodes": [{"path": "/dev/x", "permissions": "none"}]},  # [HEAD-only]
    {"deviceNodes": [{"path": "relative/is/fine", "type": "u"}, {"path": "/dev/p", "type": "p"}]},
    {"hooks": [{"hookName": name, "path": "/bin/true"} for name in HOOK_NAMES]},
    {"hooks": [{"hookName": "prestart", "path": "/bin/true", "env": ["A=1"], "timeout": 0}]},
    {"mounts": [{"hostPath": "/h", "containerPath": "/c"}]},
    {"intelRdt": {"closID": "foo.bar"}},
    {"intelRdt": {"closID": "/"}},
    {"intelRdt": {"closID": ""}},
    {"netDevices": [{"hostInterfaceName": "eth0", "name": "n0"}, {"hostInterfaceName": "eth1", "name": "n1"}]},
    {},
])
def test_validate_edits_valid(block):
    validate_edits(block, "containerEdits")


@pytest.mark.parametrize("block, reason", [
    ({"env": [""]}, 'invalid container edits: invalid environment variable ""'),
    ({"env": ["=foo"]}, 'invalid container edits: invalid environment variable "=foo"'),
    ({"env": ["FOOBAR"]}, 'invalid container edits: invalid environment variable "FOOBAR"'),
    ({"deviceNodes": [{"path": ""}]}, "invalid (empty) device path"),
    ({"deviceNodes": [{"path": "/dev/x", "type": "f"}]}, 'device "/dev/x": invalid type "f"'),
    ({"deviceNodes": [{"path": "/dev/x", "permissions": "to land"}]},
     'device "/dev/x": invalid permissions "to land"'),
    ({"mounts": [{"hostPath": "", "containerPath": "/c"}]}, "invalid mount, empty host path"),
    ({"mounts": [{"hostPath": "/h", "containerPath": ""}]}, "invalid mount, empty container path"),
    ({"hooks": [{"hookName": "prestart", "path": ""}]}, 'invalid hook "prestart" with empty path'),
    ({"hooks": [{"hookName": "PreStart", "path": "/x"}]}, 'invalid hook name "PreStart"'),
    ({"hooks": [{"hookName": "prestart", "path": "/x", "env": ["=x"]}]},
     'invalid hook "prestart": invalid environment variable "=x"'),
    ({"intelRdt": {"closID": "foo/bar"}}, "invalid ClosID"),
    ({"intelRdt": {"closID": "."}}, "invalid ClosID"),
    ({"intelRdt": {"closID": ".."}}, "invalid ClosID"),
    ({"intelRdt": {"closID": "foo\nbar"}}, "invalid ClosID"),
    ({"intelRdt": {"closID": "x" * 4096}}, "invalid ClosID"),
    ({"netDevices": [{"hostInterfaceName": "", "name": "n"}]}, "invalid linux net device, empty HostInterfaceName"),
    ({"netDevices": [{"hostInterfaceName": "h", "name": ""}]}, "invalid linux net device, empty Name"),
    ({"netDevices": [{"hostInterfaceName": "h", "name": "a"}, {"hostInterfaceName": "h", "name": "b"}]},
     'invalid linux net device, duplicate HostInterfaceName "h" with names "b" and "a"'),
    ({"netDevices": [{"hostInterfaceName": "h1", "name": "a"}, {"hostInterfaceName": "h2", "name": "a"}]},
     'invalid linux net device, duplicate Name "a" with HostInterfaceName "h2" and "h1"'),
])
def test_validate_edits_invalid(block, reason):
    with pytest.raises(EditsInvalid) as info:
        validate_edits(block, "containerEdits")
    assert info.value.reason == reason
    assert info.value.field.startswith("containerEdits.")


def _reference_node_fails(node):
    """container-edits_unix.go fillMissingInfo (HEAD): does this node make Apply fail?"""
    dev_type, major = node.get("type", ""), node.get("major", 0)
    host = node.get("hostPath") or node["path"]
    minimal = dev_type != "" and (major != 0 or dev_type == "p")
    try:
        mode = os.lstat(host).st_mode
    except OSError:
        return not minimal
    host_type = "b" if stat.S_ISBLK(mode) else "c" if stat.S_ISCHR(mode) else "p" if stat.S_ISFIFO(mode) else None
    if host_type is None:  # "not a device node" is returned like any stat error
        return not minimal
    return not minimal and dev_type not in ("", host_type)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_fails_exactly_when_the_reference_does(host_paths, data):
    """Well-typed configs: apply_edits raises iff some device node fails the reference's fill."""
    config = data.draw(st.fixed_dictionaries({}, optional={
        "process": st.fixed_dictionaries({"env": st.lists(_env_entry, max_size=3),
                                          "user": st.fixed_dictionaries({"uid": st.integers(0, 3),
                                                                         "gid": st.integers(0, 3)})}),
        "linux": st.fixed_dictionaries({"devices": st.lists(_oci_device(), max_size=3)}),
        "mounts": st.lists(st.fixed_dictionaries({"destination": _destinations}), max_size=3),
    }), label="config")
    merged = merge_edits(data.draw(_edit_blocks(host_paths, dense=True), label="edits"))
    expect_failure = any(_reference_node_fails(node) for node in merged["deviceNodes"])
    snapshot = copy.deepcopy(config)
    if expect_failure:
        with pytest.raises(EditError):
            apply_edits(config, merged)
    else:
        apply_edits(config, merged)
    assert config == snapshot


# --- issue 14, finding 4: relative hook paths ------------------------------------------------
# The CNCF library accepts a hook whose path is relative; the OCI runtime spec says it must be
# absolute, and runc starts createContainer hooks with the rootfs as working directory (before
# pivot_root), so `bin/hookrel` would run a file of the image as root on the host. We diverge
# from the CNCF library on purpose and refuse it.

@pytest.mark.parametrize("path", ["bin/hookrel", "./hook", "hook", "../../usr/bin/true"])
def test_relative_hook_path_refused_diverging_from_cncf_library_on_purpose(path):
    with pytest.raises(EditsInvalid) as info:
        validate_edits({"hooks": [{"hookName": "createContainer", "path": "/bin/true"},
                                  {"hookName": "createContainer", "path": path}]}, "containerEdits")
    assert info.value.field == "containerEdits.hooks[1].path"
    assert info.value.reason == (f'invalid hook "createContainer": path "{path}" is not absolute '
                                 "(the OCI runtime spec requires an absolute path)")


def test_relative_hook_path_in_a_spec_names_spec_device_and_hook_diverging_from_cncf_library(tmp_path):
    from cdi.errors import SpecError
    from cdi.spec import read_spec

    path = tmp_path / "vendor.yaml"
    path.write_text('cdiVersion: "0.5.0"\nkind: vendor.com/gpu\ndevices:\n'
                    '  - name: gpu0\n    containerEdits:\n      env: ["A=1"]\n'
                    '      hooks:\n        - {hookName: createContainer, path: bin/hookrel}\n')
    with pytest.raises(SpecError) as info:
        read_spec(str(path))
    message = str(info.value)
    assert str(path) in message and "devices[0].containerEdits.hooks[0].path" in message
    assert '"gpu0"' in message and '"createContainer"' in message and '"bin/hookrel"' in message


def test_relative_hook_path_refused_at_injection_diverging_from_cncf_library():
    message = apply_fails({}, edits(hooks=[{"hookName": "createContainer", "path": "bin/hookrel"}]))
    assert message == ('invalid hook "createContainer": path "bin/hookrel" is not absolute '
                       "(the OCI runtime spec requires an absolute path)")
