"""One object for a create (shim.runtime.main.Create) and the worker state it carries: a create
given a resident worker's memos (ldcache.Memos) keeps its step as a recipe beside the worker's
socket; one without (the interpreter, or any caller of prepare that is no worker) keeps nothing,
whatever a process set before (no module switch decides it)."""
import json
import os

from shim.config import Config
from shim.ldconfig import ldcache
from shim.runtime.main import Create, _steps_dir, prepare
from shim.runtime.runc_args import parse_runc_argv
from shim.runtime.runlog import RunLog


def _create(bundle, memos=None, container="c1", **settings):
    argv = ["create", "--bundle", str(bundle)] + ([container] if container else [])
    return Create(parse_runc_argv(argv), Config(**settings), RunLog(), None, memos)


def test_the_create_names_its_bundle_and_container(tmp_path):
    create = _create(tmp_path)
    assert (create.bundle, create.container) == (str(tmp_path), "c1")
    assert _create(tmp_path, container=None).container == "?"
    assert (create.config, create.devices, create.steps, create.recorded, create.why) == (None, [], None, None, None)


def test_a_create_keeps_steps_beside_the_socket_in_a_folder_of_ours(tmp_path):
    """A worker's create (given memos) keeps its steps beside the socket; a per-create
    interpreter's too (issue 47), where that folder is ours alone: made 0700 when missing, refused
    when others may write it, when it is a link, or another user's."""
    sock = str(tmp_path / "run" / "runtime.sock")
    steps = str(tmp_path / "run" / "steps")
    memos = ldcache.Memos()     # (not opened: whether there are memos is what counts here)
    assert _steps_dir(_create(tmp_path, memos, resident_socket=sock)) == steps
    assert not os.path.exists(steps)        # (the worker's server made its folder; C makes steps/)
    assert _steps_dir(_create(tmp_path, memos, resident_socket=sock, file_binds="runc")) is None
    assert _steps_dir(_create(tmp_path, memos, resident_socket="")) is None
    assert _steps_dir(_create(tmp_path, resident_socket=sock)) == steps
    assert os.stat(steps).st_mode & 0o777 == os.stat(os.path.dirname(steps)).st_mode & 0o777 == 0o700
    assert _steps_dir(_create(tmp_path, resident_socket=sock, file_binds="runc")) is None
    os.chmod(steps, 0o770)
    assert _steps_dir(_create(tmp_path, resident_socket=sock)) is None
    os.rmdir(steps)
    os.makedirs(tmp_path / "elsewhere", mode=0o700)
    os.symlink(tmp_path / "elsewhere", steps)
    assert _steps_dir(_create(tmp_path, resident_socket=sock)) is None
    os.unlink(steps)
    os.makedirs(steps, mode=0o700)
    os.chown(steps, 12345, 12345)
    assert _steps_dir(_create(tmp_path, resident_socket=sock)) is None
    os.chown(steps, 0, 0)
    os.chmod(os.path.dirname(steps), 0o777)     # (the socket's folder open to others)
    assert _steps_dir(_create(tmp_path, resident_socket=sock)) is None


def test_a_create_with_nothing_to_do_leaves_the_bundle_as_it_was(tmp_path):
    """Through prepare and the Create it makes: no device, no hook we know; config.json's bytes
    unchanged, nothing of ours written, with a worker's memos or without."""
    os.makedirs(tmp_path / "rootfs")
    raw = json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"args": ["/bin/true"]},
                      "hooks": {"prestart": [{"path": "/usr/bin/true"}]}}).encode()
    (tmp_path / "config.json").write_bytes(raw)
    settings = Config(spec_dirs=(str(tmp_path / "specs"),), resident_socket=str(tmp_path / "run" / "runtime.sock"))
    args = parse_runc_argv(["create", "--bundle", str(tmp_path), "c1"])
    for memos in (None, ldcache.Memos()):
        assert prepare(args, settings, RunLog(), memos=memos) == []
        assert (tmp_path / "config.json").read_bytes() == raw
        assert sorted(os.listdir(tmp_path)) == ["config.json", "rootfs"]
