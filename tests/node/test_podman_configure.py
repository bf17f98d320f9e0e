"""`cdi-shim runtime configure --runtime=podman` on containers.conf files, with real podman binaries:
Debian's 4.3 (bookworm's own) and 5.8 (forky's, fetched once into $CDI_SHIM_TEST_CACHE:
cdi_shim_lab/releases.py). They tell the version and load the written file (`CONTAINERS_CONF=NEW
podman version`); that check runs here in a mount namespace with a tmpfs at /run and storage of
the test's own, so the host's podman state is never touched. The containers themselves run in
tests/cri/test_podman.py.
"""
import fcntl
import os
import threading
import time

import pytest
import tomlkit

from tests.helpers import cdi_shim_cli, read

VERSIONS = ("4.3", "5.8")
COMMENTED = """\
# site settings (kept)
[containers]
log_size_max = -1   # unlimited

[engine]
# which runtime podman uses
runtime = "runc"
events_logger = "file"
helper_binaries_dir = ["{helpers}"]

[engine.runtimes]
runc = ["/usr/sbin/runc", "/usr/bin/runc"]
kata = ["/usr/bin/kata-runtime"]

[network]
default_subnet = "10.88.0.0/16"
"""


@pytest.fixture
def commented(podman):
    """COMMENTED, its helper_binaries_dir podman 5.8's (where its netavark is: podman 5 loads no
    config without one)."""
    from cdi_shim_lab import releases

    netavark = releases.podman_binaries(releases.podman_prefix_path("5.8"))["netavark"]
    return COMMENTED.replace("{helpers}", os.path.dirname(netavark))


@pytest.fixture(scope="module")
def podman():
    """{version: path of its podman}; fails (never skips) when they cannot be had."""
    import shutil

    from cdi_shim_lab import releases

    system = shutil.which("podman")
    if not system:
        pytest.fail("podman not found: apt-get install podman (scripts/setup-tests.sh)", pytrace=False)
    try:
        prefix = releases.fetch_podman("5.8")
    except releases.ReleaseError as err:
        pytest.fail(f"cannot fetch podman 5.8 (Debian forky's, needs apt-get, patchelf and the Debian archive): "
                    f"{err}", pytrace=False)
    return {"4.3": system, "5.8": releases.podman_binaries(prefix)["podman"]}


@pytest.fixture
def conf(tmp_path):
    path = tmp_path / "etc" / "containers.conf"
    path.parent.mkdir()
    return path


def configure(tmp_path, path, binary, podman_path, *extra, name=None, check=None):
    import subprocess

    if os.geteuid() != 0:
        pytest.fail("podman's check of the new file runs as root here: run the tests as root", pytrace=False)
    storage = tmp_path / "storage.conf"
    if not storage.exists():
        storage.write_text(f'[storage]\ndriver = "vfs"\ngraphroot = "{tmp_path}/graph"\nrunroot = "{tmp_path}/run"\n')
    env = dict(os.environ, CONTAINERS_STORAGE_CONF=str(storage), PODMAN_IGNORE_CGROUPSV1_WARNING="1")
    env.pop("CONTAINERS_CONF", None)
    argv = [cdi_shim_cli(), "runtime", "configure", "--runtime=podman", "--config", str(path), "--runtime-binary",
            binary, "--podman-binary", podman_path, *(["--runtime-name", name] if name else []), *extra]
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                          'mount -t tmpfs cdi-shim-test /run && exec "$@"', "sh", *argv],
                         capture_output=True, text=True, env=env, timeout=120)
    if check is True:
        assert out.returncode == 0, out.stderr
    elif check is False:
        assert out.returncode != 0, out.stdout
    return out


def siblings(path):
    return sorted(name for name in os.listdir(os.path.dirname(path)) if name != os.path.basename(path))


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_keeps_comments_keys_and_runtimes(tmp_path, conf, podman, runtime_binary, version, commented):
    conf.write_text(commented)
    out = configure(tmp_path, conf, runtime_binary, podman[version], check=True)
    text = read(conf)
    assert text == commented.replace('kata = ["/usr/bin/kata-runtime"]\n',
                                     f'kata = ["/usr/bin/kata-runtime"]\ncdi-shim = ["{runtime_binary}"]\n')
    assert f"podman {version}" in out.stderr and "kept the other runtimes: kata, runc" in out.stderr
    assert "loaded by podman" in out.stderr and "podman needs no restart" in out.stderr
    assert 'engine.runtime stays "runc"' in out.stderr and "--runtime cdi-shim" in out.stderr
    again = configure(tmp_path, conf, runtime_binary, podman[version], check=True)
    assert "nothing changed" in again.stderr and read(conf) == text
    default = configure(tmp_path, conf, runtime_binary, podman[version], "--set-as-default", check=True)
    doc = tomlkit.parse(read(conf))
    assert doc["engine"]["runtime"] == "cdi-shim" and doc["engine"]["events_logger"] == "file"
    assert 'engine.runtime was "runc", now "cdi-shim"' in default.stderr
    assert "# which runtime podman uses" in read(conf) and "# unlimited" in read(conf)


@pytest.mark.parametrize("version", ["4.3"])
def test_missing_file_is_created_and_a_backup_kept_of_an_existing_one(tmp_path, conf, podman, runtime_binary, version):
    # (4.3: podman 5 loads no file without a helper_binaries_dir holding netavark, as the package installs it)
    configure(tmp_path, conf, runtime_binary, podman[version], check=True)
    assert tomlkit.parse(read(conf)).unwrap() == {"engine": {"runtimes": {"cdi-shim": [runtime_binary]}}}
    assert siblings(conf) == []
    conf.chmod(0o600)
    out = configure(tmp_path, conf, runtime_binary, podman[version], "--set-as-default", check=True)
    backups = siblings(conf)
    assert len(backups) == 1 and backups[0].startswith("containers.conf.bak-") and "backup:" in out.stderr
    assert os.stat(conf).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("text, where", [
    ('[engine]\nruntime = "runc"\n[engine\n', "line 3, column 8"),
    ('[engine]\nruntime = "runc"\nruntime = "crun"\n', "line 3"),
    ('[engine.runtimes]\ncdi-shim = ["/x"\n', "line 2"),
])
def test_syntax_error_is_refused_naming_line_and_column(tmp_path, conf, podman, runtime_binary, text, where):
    conf.write_text(text)
    out = configure(tmp_path, conf, runtime_binary, podman["4.3"], check=False)
    assert f"{conf}: not valid TOML at {where}" in out.stderr and "fix the file" in out.stderr
    assert read(conf) == text and siblings(conf) == []


@pytest.mark.parametrize("text, says", [
    ("engine = 3\n", "engine is a Integer, not a table"),
    ("[engine]\nruntimes = [1]\n", "engine.runtimes is a Array, not a table"),
])
def test_engine_that_is_not_a_table_is_refused(tmp_path, conf, podman, runtime_binary, text, says):
    conf.write_text(text)
    out = configure(tmp_path, conf, runtime_binary, podman["4.3"], check=False)
    assert says in out.stderr and read(conf) == text and siblings(conf) == []


def test_an_entry_of_ours_that_points_elsewhere_is_refused(tmp_path, conf, podman, runtime_binary):
    text = '[engine.runtimes]\ncdi-shim = ["/opt/other/runtime"]\n'
    conf.write_text(text)
    out = configure(tmp_path, conf, runtime_binary, podman["5.8"], check=False)
    assert 'cdi-shim = ["/opt/other/runtime"] does not hold' in out.stderr and "--runtime-name" in out.stderr
    assert read(conf) == text and siblings(conf) == []
    # an entry that lists our path among others is ours: kept as it is
    listed = f'[engine.runtimes]\ncdi-shim = ["/opt/other/runtime", "{runtime_binary}"]\n'
    conf.write_text(listed)
    assert "nothing changed" in configure(tmp_path, conf, runtime_binary, podman["5.8"], check=True).stderr


@pytest.mark.parametrize("version", VERSIONS)
def test_a_file_podman_refuses_is_not_written(tmp_path, conf, podman, runtime_binary, version):
    # valid TOML, but a value of the wrong type: podman's load says so, nothing changes
    text = "[engine]\nevents_logger = 5\n"
    conf.write_text(text)
    out = configure(tmp_path, conf, runtime_binary, podman[version], check=False)
    assert "podman refuses the new" in out.stderr and "nothing was changed" in out.stderr
    assert read(conf) == text and siblings(conf) == []


def test_dry_run_prints_the_diff_and_writes_nothing(tmp_path, conf, podman, runtime_binary, commented):
    conf.write_text(commented)
    out = configure(tmp_path, conf, runtime_binary, podman["4.3"], "--dry-run", "--set-as-default", check=True)
    assert f'+cdi-shim = ["{runtime_binary}"]' in out.stdout and '+runtime = "cdi-shim"' in out.stdout
    assert read(conf) == commented and siblings(conf) == []


def test_two_runs_at_once_follow_one_another(tmp_path, conf, podman, runtime_binary, commented):
    """Each run holds the lock from reading to renaming: both entries survive, under two names."""
    conf.write_text(commented)
    other = tmp_path / "bin" / "other-runtime"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    lock = conf.parent / ".containers.conf.cdi-shim.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)   # a run in progress
    results = []

    def one(binary, name):
        results.append(configure(tmp_path, conf, binary, podman["4.3"], name=name))

    threads = [threading.Thread(target=one, args=(runtime_binary, "cdi-shim")),
               threading.Thread(target=one, args=(str(other), "cdi-shim-other"))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 3   # both started, and blocked on the lock
    while time.monotonic() < deadline and not all(not t.is_alive() for t in threads):
        time.sleep(0.2)
    assert read(conf) == commented, "a run wrote while another held the lock"
    os.unlink(lock)   # as a finishing holder does
    os.close(fd)
    for thread in threads:
        thread.join(60)
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert any("waiting for another run" in r.stderr for r in results)
    runtimes = tomlkit.parse(read(conf))["engine"]["runtimes"].unwrap()
    assert runtimes == {"runc": ["/usr/sbin/runc", "/usr/bin/runc"], "kata": ["/usr/bin/kata-runtime"],
                        "cdi-shim": [runtime_binary], "cdi-shim-other": [str(other)]}


@pytest.mark.parametrize("option", [("--cdi",), ("--enable-cdi", "true"), ("--drop-in", "/tmp"), ("--restart",),
                                    ("--dockerd-binary", "/usr/bin/dockerd")])
def test_other_engines_options_are_refused_for_podman(tmp_path, conf, podman, runtime_binary, option):
    out = configure(tmp_path, conf, runtime_binary, podman["4.3"], *option, check=False)
    assert f"{option[0]} does not apply to podman" in out.stderr and not conf.exists()


def test_runtime_names_of_podman_itself_are_refused(tmp_path, conf, podman, runtime_binary):
    out = configure(tmp_path, conf, runtime_binary, podman["4.3"], name="crun", check=False)
    assert "one of podman's own" in out.stderr and not conf.exists()


def test_podman_version_is_read_from_each_release(podman):
    from shim.node.podman_config import podman_version

    assert podman_version(podman["4.3"])[:2] == (4, 3)
    assert podman_version(podman["5.8"])[:2] == (5, 8)
    assert podman_version("/nonexistent/podman") is None


def test_default_file_for_root_a_rootless_user_and_containers_conf():
    from shim.node.podman_config import SYSTEM_CONFIG, default_path

    assert default_path(euid=0, environ={}) == SYSTEM_CONFIG == "/etc/containers/containers.conf"
    assert default_path(euid=1000, environ={"XDG_CONFIG_HOME": "/home/u/.cfg"}) == \
        "/home/u/.cfg/containers/containers.conf"
    assert default_path(euid=1000, environ={}) == os.path.expanduser("~/.config/containers/containers.conf")
    assert default_path(euid=0, environ={"CONTAINERS_CONF": "/srv/c.conf"}) == "/srv/c.conf"
