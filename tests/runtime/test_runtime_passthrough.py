"""cdi-shim-runtime is indistinguishable from runc apart from the devices it adds: exit codes,
stdout/stderr, --console-socket, exec, kill, delete --force, state, --version, --root, --log and
--log-format, --preserve-fds, signals, runc's global options that take values.

Where a command can take either path of the runtime (pass straight through, or inject then exec
runc), both are exercised: "plain" bundles request nothing, "gpu" bundles request nvidia.com/gpu=0.
The only normalisation is runc's own log timestamps (time="..."), which differ between two calls.
"""
import json
import os
import re
import signal
import subprocess
import time

import pytest

import runtime_helpers as rh

pytestmark = pytest.mark.runtime_e2e

GPU0 = {"cdi.k8s.io/e2e": "nvidia.com/gpu=0"}
REQUESTS = {"plain": None, "gpu": GPU0}


def norm(text):
    """runc's stderr with its timestamps taken out (they differ between two calls)."""
    return re.sub(r'time="[^"]*"', 'time="T"', text)


def pair(world, request, args, **kw):
    """Two identical bundles (one for the shim, one for plain runc)."""
    return (world.bundle(args=args, annotations=REQUESTS[request], **kw),
            world.bundle(args=args, annotations=REQUESTS[request], **kw))


@pytest.mark.parametrize("request_kind", list(REQUESTS))
def test_run_exit_code_and_stdio(world, request_kind):
    script = "echo to-stdout; echo to-stderr >&2; exit 3"
    ours, theirs = pair(world, request_kind, ("sh", "-c", script))
    mine = world.shim("run", "--bundle", ours.path, ours.id)
    plain = world.runc_cmd("run", "--bundle", theirs.path, theirs.id)
    assert plain.returncode == 3 and plain.stdout == "to-stdout\n"
    assert (mine.returncode, mine.stdout, mine.stderr) == (plain.returncode, plain.stdout, plain.stderr)


@pytest.mark.parametrize("request_kind", list(REQUESTS))
def test_console_socket_terminal(world, request_kind):
    script = "test -t 0 && echo stdin-is-a-tty; test -t 1 && echo stdout-is-a-tty; echo done"
    outputs = {}
    for who in ("shim", "runc"):
        bundle = world.bundle(args=("sh", "-c", script), annotations=REQUESTS[request_kind], terminal=True)
        sock_path = os.path.join(world.base, f"console-{who}.sock")
        console = rh.ConsoleSocket(sock_path)
        try:
            runner = world.shim if who == "shim" else world.runc_cmd
            created = runner("create", "--console-socket", sock_path, "--bundle", bundle.path, bundle.id)
            assert created.returncode == 0, f"{who}: {created.stderr}"
            console.receive()
            started = runner("start", bundle.id)
            assert started.returncode == 0, started.stderr
            outputs[who] = console.read_all(timeout=20).replace(b"\r\n", b"\n")
            world.wait_stopped(bundle.id)
            assert runner("delete", bundle.id).returncode == 0
        finally:
            console.close()
    assert b"stdin-is-a-tty\nstdout-is-a-tty\ndone\n" in outputs["runc"], outputs
    assert outputs["shim"] == outputs["runc"]


def start_sleeper(world, request_kind, runner=None):
    bundle = world.bundle(args=("sleep", "60"), annotations=REQUESTS[request_kind])
    runner = runner or world.shim
    created = runner("create", "--bundle", bundle.path, bundle.id)
    assert created.returncode == 0, created.stderr
    assert runner("start", bundle.id).returncode == 0
    assert world.state(bundle.id)["status"] == "running"
    return bundle


@pytest.mark.parametrize("request_kind", list(REQUESTS))
def test_exec_state_ps_kill_delete(world, request_kind):
    bundle = start_sleeper(world, request_kind)
    cid = bundle.id
    # exec: exit status and both streams, exactly as runc exec
    script = ("sh", "-c", "echo exec-out; echo exec-err >&2; ls /dev/nvidia0 2>/dev/null; exit 5")
    mine = world.shim("exec", cid, *script)
    plain = world.runc_cmd("exec", cid, *script)
    assert plain.returncode == 5 and plain.stdout.startswith("exec-out\n")
    assert (mine.returncode, mine.stdout, mine.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    if request_kind == "gpu":
        assert "/dev/nvidia0" in mine.stdout
    # exec --detach with a pid file
    pid_file = os.path.join(world.base, "exec.pid")
    detached = world.shim("exec", "--detach", "--pid-file", pid_file, cid, "sleep", "1")
    assert detached.returncode == 0, detached.stderr
    assert int(open(pid_file).read()) > 0
    # state and ps: byte-identical output
    for argv in (("state", cid), ("ps", "--format", "json", cid), ("list", "--format", "json")):
        mine, plain = world.shim(*argv), world.runc_cmd(*argv)
        assert plain.returncode == 0, plain.stderr
        assert (mine.returncode, mine.stdout, mine.stderr) == (plain.returncode, plain.stdout, plain.stderr), argv
    assert json.loads(world.shim("state", cid).stdout)["status"] == "running"
    # kill, then state says stopped, identically
    killed = world.shim("kill", cid, "KILL")
    assert killed.returncode == 0, killed.stderr
    world.wait_stopped(cid)
    mine, plain = world.shim("state", cid), world.runc_cmd("state", cid)
    assert mine.stdout == plain.stdout and json.loads(mine.stdout)["status"] == "stopped"
    # killing a stopped container fails the same way
    mine, plain = world.shim("kill", cid, "KILL"), world.runc_cmd("kill", cid, "KILL")
    assert plain.returncode != 0
    assert (mine.returncode, norm(mine.stderr)) == (plain.returncode, norm(plain.stderr))
    assert world.shim("delete", cid).returncode == 0
    assert world.state(cid) is None


@pytest.mark.parametrize("request_kind", list(REQUESTS))
def test_delete_force_running(world, request_kind):
    bundle = start_sleeper(world, request_kind)
    result = world.shim("delete", "--force", bundle.id)
    assert result.returncode == 0, result.stderr
    assert world.state(bundle.id) is None


@pytest.mark.parametrize("argv", [
    ("state", "no-such-container"), ("kill", "no-such-container", "KILL"), ("delete", "no-such-container"),
    ("start", "no-such-container"), ("exec", "no-such-container", "true"), ("list",), ("list", "-q"),
    ("features",), ("spec", "--help"), ("no-such-command",), ("--no-such-flag", "list"),
], ids=lambda a: "-".join(a))
def test_passthrough_output_identical(world, argv):
    """(`--help` prints ours before runc's: test_runtime_cli.py.)"""
    mine, plain = world.shim(*argv), world.runc_cmd(*argv)
    assert (mine.returncode, norm(mine.stdout), norm(mine.stderr)) == \
        (plain.returncode, norm(plain.stdout), norm(plain.stderr))


@pytest.mark.parametrize("argv", [("--version",), ("-v",), ("--log-format", "json", "--version"),
                                  ("--debug", "-v")], ids=lambda a: " ".join(a))
def test_version_ours_then_runc(world, argv):
    """`--version` prints ours, then runc's, wherever it stands among the global options."""
    plain = world.runc_cmd(*argv, root=False)
    if True:
        mine = world.shim(*argv, root=False)
        assert mine.returncode == 0, mine.stderr
        first, _, rest = mine.stdout.partition("\n")
        assert first.startswith("cdi-shim-runtime") and re.search(r"\d+\.\d+", first), mine.stdout
        assert rest == plain.stdout, mine.stdout


@pytest.mark.parametrize("request_kind", list(REQUESTS))
def test_root_option_respected(world, request_kind):
    other_root = os.path.join(world.base, "other-root")
    bundle = world.bundle(args=("true",), annotations=REQUESTS[request_kind])
    result = world.shim("--root", other_root, "create", "--bundle", bundle.path, bundle.id, root=False)
    assert result.returncode == 0, result.stderr
    world.created.append(bundle.id)
    assert os.path.isdir(os.path.join(other_root, bundle.id)), "runc state not under --root"
    assert world.runc_cmd("--root", other_root, "state", bundle.id, root=False).returncode == 0
    assert world.runc_cmd("state", bundle.id).returncode != 0, "container found under the default test root"
    state = world.shim("--root=" + other_root, "state", bundle.id, root=False)
    assert state.returncode == 0 and json.loads(state.stdout)["id"] == bundle.id
    assert world.shim("--root", other_root, "delete", "--force", bundle.id, root=False).returncode == 0


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_log_and_log_format_passthrough(world, log_format):
    logs = {}
    for who in ("shim", "runc"):
        path = os.path.join(world.base, f"{who}.{log_format}.log")
        runner = world.shim if who == "shim" else world.runc_cmd
        result = runner("--log", path, "--log-format", log_format, "delete", "no-such-container")
        assert result.returncode != 0
        logs[who] = rh.read_log(path, log_format)
    assert logs["runc"] and logs["shim"] == logs["runc"]


def test_log_format_json_on_successful_inject(world):
    """On an injecting create, whatever the shim adds to runc's json log is well-formed json lines
    and runc's own lines still follow."""
    path = os.path.join(world.base, "create.json.log")
    bundle = world.bundle(args=("true",), annotations=GPU0)
    result = world.shim("--log", path, "--log-format=json", "--debug", "create", "--bundle", bundle.path, bundle.id)
    assert result.returncode == 0, result.stderr
    records = rh.read_log(path, "json")
    assert any("cdi-shim" not in msg for _, msg in records), "runc's own debug lines missing"
    assert world.shim("delete", "--force", bundle.id).returncode == 0


@pytest.mark.parametrize("request_kind", list(REQUESTS))
def test_preserve_fds(world, request_kind):
    bundle = world.bundle(args=("sh", "-c", "echo via-fd3 >&3; ls /dev/nvidia0 >&3 2>/dev/null; true"),
                          annotations=REQUESTS[request_kind])
    read_end, write_end = os.pipe()
    try:
        cmd = [world.runtime, "--root", world.runc_root, "run", "--preserve-fds", "1", "--bundle", bundle.path,
               bundle.id]

        def fd3():  # the child gets the pipe as fd 3, the first fd --preserve-fds hands on
            os.dup2(write_end, 3)
            os.set_inheritable(3, True)

        proc = subprocess.run(cmd, env=world.env(), pass_fds=(3,), preexec_fn=fd3, capture_output=True,
                              timeout=rh.CMD_TIMEOUT)
        os.close(write_end)
        write_end = -1
        assert proc.returncode == 0, proc.stderr
        data = b""
        while True:
            chunk = os.read(read_end, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    expected = b"via-fd3\n" + (b"/dev/nvidia0\n" if request_kind == "gpu" else b"")
    assert data == expected


@pytest.mark.parametrize("request_kind", list(REQUESTS))
def test_signals_reach_container_same_pid(world, request_kind):
    """`run` in the foreground: the runtime's pid becomes runc's (exec, no child), and a SIGTERM
    sent to it reaches the container, whose exit status comes back."""
    script = "trap 'exit 7' TERM; echo up > /ready; while :; do sleep 0.05; done"
    bundle = world.bundle(args=("sh", "-c", script), annotations=REQUESTS[request_kind])
    proc = subprocess.Popen([world.runtime, "--root", world.runc_root, "run", "--bundle", bundle.path, bundle.id],
                            env=world.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    world.created.append(bundle.id)
    try:
        ready = os.path.join(bundle.rootfs, "ready")
        deadline = time.monotonic() + 20
        while not os.path.exists(ready):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "container never became ready"
            time.sleep(0.02)
        exe = os.readlink(f"/proc/{proc.pid}/exe")
        assert os.path.realpath(exe) == os.path.realpath(world.runc), \
            f"pid {proc.pid} is {exe}, not runc: the runtime did not exec runc"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 7, err.decode()
    finally:
        rh.kill_quietly(proc)


@pytest.mark.parametrize("spelling", ["--bundle B", "-b B", "--bundle=B", "cwd", "flags-first", "run-detach"])
def test_create_option_spellings(world, spelling):
    """The bundle is found however runc would find it, with value-taking and boolean create
    options before it, and runc's value-taking global options before the command."""
    bundle = world.bundle(args=("true",), annotations=GPU0)
    pid_file = os.path.join(world.base, "init.pid")
    opts = {"--bundle B": ["--bundle", bundle.path], "-b B": ["-b", bundle.path],
            "--bundle=B": [f"--bundle={bundle.path}"], "cwd": [],
            "flags-first": ["--no-new-keyring", "--pid-file", pid_file, "--no-pivot", "-b", bundle.path],
            "run-detach": ["-d", "--pid-file", pid_file, "--bundle", bundle.path]}[spelling]
    cwd = bundle.path if spelling == "cwd" else world.base
    command = "run" if spelling == "run-detach" else "create"
    result = world.shim("--rootless", "false", "--log-format", "text", command, *opts, bundle.id, cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert any(d["path"] == "/dev/nvidia0" for d in bundle.config()["linux"]["devices"]), \
        "the device was not injected into the bundle's config.json"
    if spelling == "flags-first":
        assert int(open(pid_file).read()) == world.state(bundle.id)["pid"]
    if spelling == "run-detach":
        assert os.path.exists(pid_file)
    assert world.shim("delete", "--force", bundle.id).returncode == 0


def test_global_value_options_passthrough(world):
    """--rootless/--criu/--log-format take a value: `false`/a path must not be taken for the command."""
    bundle = start_sleeper(world, "plain")
    argv = ("--rootless", "false", "--criu", "/nonexistent/criu", "--log-format", "text", "state", bundle.id)
    mine, plain = world.shim(*argv), world.runc_cmd(*argv)
    assert plain.returncode == 0, plain.stderr
    assert (mine.returncode, mine.stdout, mine.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert world.shim("delete", "--force", bundle.id).returncode == 0


@pytest.mark.parametrize("request_kind", list(REQUESTS))
def test_missing_low_level_runtime(world, request_kind):
    """runtime = a path that does not exist: create fails, saying which runtime, on stderr and in
    runc's --log (the only place containerd looks), and config.json is untouched."""
    missing = os.path.join(world.base, "no-such-runc")
    world.write_config(runtime=missing)
    bundle = world.bundle(args=("true",), annotations=REQUESTS[request_kind])
    log_path = os.path.join(world.base, "runc.json.log")
    result = world.shim("--log", log_path, "--log-format", "json", "create", "--bundle", bundle.path, bundle.id)
    assert result.returncode != 0
    assert missing in result.stderr, result.stderr
    assert bundle.unchanged()
    errors = [msg for level, msg in rh.read_log(log_path, "json") if level == "error"]
    assert any(missing in msg for msg in errors), f"runc log has no error naming the runtime: {errors}"
