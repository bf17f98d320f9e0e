"""`cdi-shim runtime configure --runtime=docker` on daemon.json files, with real dockerd binaries:
Debian's docker.io 20.10 (bookworm), 26.1 (trixie) and 28.5 (forky), fetched once into
$CDI_SHIM_TEST_CACHE (cdi_shim_lab/releases.py). They tell the version (CDI from 25) and, from 23,
check the written file (`dockerd --validate`). The daemons themselves run in tests/cri/test_docker.py.
"""
import json
import os
import subprocess
import threading

import pytest

from tests.helpers import read, run_cli

VERSIONS = ("20.10", "26.1", "28.5")


@pytest.fixture(scope="module")
def dockerd():
    """{version: path of its dockerd}; fails (never skips) when they cannot be fetched."""
    from cdi_shim_lab import releases

    found = {}
    for version in VERSIONS:
        try:
            prefix = releases.fetch_docker(version)
        except releases.ReleaseError as err:
            pytest.fail(f"cannot fetch Docker {version} (Debian's docker.io, needs apt-get and the Debian "
                        f"archive): {err}", pytrace=False)
        found[version] = releases.docker_binaries(prefix)["dockerd"]
    return found


def env_for(dockerd_path):
    # dockerd --validate looks for docker-proxy on PATH (the package's /usr/sbin)
    return dict(os.environ, PATH=f"{os.path.dirname(dockerd_path)}:{os.environ.get('PATH', '/usr/bin:/bin')}")


def configure(path, binary, dockerd_path, *extra, check=None):
    return run_cli("runtime", "configure", "--runtime=docker", "--config", str(path), "--runtime-binary", binary,
                   "--dockerd-binary", dockerd_path, *extra, env=env_for(dockerd_path), check=check)


def siblings(path):
    return sorted(name for name in os.listdir(os.path.dirname(path)) if name != os.path.basename(path))


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_keeps_every_other_key_and_runtime(tmp_path, dockerd, runtime_binary, version):
    path = tmp_path / "etc" / "daemon.json"
    path.parent.mkdir(exist_ok=True)
    original = {"log-level": "warn", "storage-driver": "vfs", "default-runtime": "runc",
                "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}},
                "registry-mirrors": ["https://mirror.example"]}
    path.write_text(json.dumps(original, indent=2))
    out = configure(path, runtime_binary, dockerd[version], check=True)
    doc = json.loads(read(path))
    assert doc["runtimes"]["nvidia"] == original["runtimes"]["nvidia"]
    assert doc["runtimes"]["cdi-shim"] == {"path": runtime_binary}
    for key in ("log-level", "storage-driver", "default-runtime", "registry-mirrors"):
        assert doc[key] == original[key]
    assert "features" not in doc and "cdi-spec-dirs" not in doc
    # runtimes is reloadable: a SIGHUP is enough
    assert "reload" in out.stderr and "must restart" not in out.stderr
    if version != "20.10":
        assert "checked by dockerd --validate" in out.stderr
    else:
        assert "not checked" in out.stderr
    # a second run changes nothing; --set-as-default then changes default-runtime only
    assert "nothing changed" in configure(path, runtime_binary, dockerd[version], check=True).stderr
    configure(path, runtime_binary, dockerd[version], "--set-as-default", check=True)
    again = json.loads(read(path))
    assert again["default-runtime"] == "cdi-shim"
    assert {k: v for k, v in again.items() if k != "default-runtime"} == {k: v for k, v in doc.items()
                                                                          if k != "default-runtime"}


@pytest.mark.parametrize("version", ("26.1", "28.5"))
def test_cdi_sets_the_feature_and_spec_dirs_and_asks_for_a_restart(tmp_path, dockerd, runtime_binary, version):
    path = tmp_path / "etc" / "daemon.json"
    path.parent.mkdir(exist_ok=True)
    config = tmp_path / "cdi-shim.toml"
    config.write_text('spec-dirs = ["/srv/cdi", "/run/cdi-extra"]\n')
    path.write_text('{"features": {"buildkit": true}}')
    env = dict(env_for(dockerd[version]), CDI_SHIM_CONFIG=str(config))
    out = run_cli("runtime", "configure", "--runtime=docker", "--config", str(path), "--runtime-binary",
                  runtime_binary, "--dockerd-binary", dockerd[version], "--cdi", env=env, check=True)
    doc = json.loads(read(path))
    assert doc["features"] == {"buildkit": True, "cdi": True}
    assert doc["cdi-spec-dirs"] == ["/srv/cdi", "/run/cdi-extra"]
    assert "dockerd must restart" in out.stderr and "features" in out.stderr
    assert "checked by dockerd --validate" in out.stderr


def test_cdi_on_docker_20_10_is_refused_naming_version_and_fix(tmp_path, dockerd, runtime_binary):
    path = tmp_path / "etc" / "daemon.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text('{"log-level": "warn"}\n')
    out = configure(path, runtime_binary, dockerd["20.10"], "--cdi", check=False)
    assert "Docker 20.10.24" in out.stderr and "no CDI support" in out.stderr
    assert "upgrade Docker" in out.stderr and "--runtime=cdi-shim" in out.stderr
    assert read(path) == '{"log-level": "warn"}\n' and siblings(path) == []


@pytest.mark.parametrize("text, expected", [
    ('{"log-level": "warn",\n  "runtimes": {\n    "x": {"path": "/a"},\n  }\n}\n', "line 4, column 3"),
    ("[1, 2]\n", "not an object"),
    ('"runc"', "not an object"),
    ('{"runtimes": {}, "runtimes": {}}', 'key "runtimes" appears twice'),
    ('{"runtimes": ["cdi-shim"]}', "runtimes is a JSON list, not an object"),
])
def test_bad_daemon_json_is_refused_and_nothing_written(tmp_path, dockerd, runtime_binary, text, expected):
    path = tmp_path / "etc" / "daemon.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    out = configure(path, runtime_binary, dockerd["28.5"], check=False)
    assert str(path) in out.stderr and expected in out.stderr, out.stderr
    assert read(path) == text and siblings(path) == []


def test_an_entry_of_ours_that_points_elsewhere_is_refused(tmp_path, dockerd, runtime_binary):
    path = tmp_path / "etc" / "daemon.json"
    path.parent.mkdir(exist_ok=True)
    text = '{"runtimes": {"cdi-shim": {"path": "/usr/local/bin/something-else"}}}'
    path.write_text(text)
    out = configure(path, runtime_binary, dockerd["28.5"], check=False)
    assert 'runtimes["cdi-shim"].path is "/usr/local/bin/something-else"' in out.stderr
    assert runtime_binary in out.stderr and "--runtime-name" in out.stderr
    assert read(path) == text and siblings(path) == []


def test_dry_run_prints_the_diff_and_writes_nothing(tmp_path, dockerd, runtime_binary):
    path = tmp_path / "etc" / "daemon.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text('{"log-level": "warn"}\n')
    out = configure(path, runtime_binary, dockerd["28.5"], "--dry-run", "--cdi", check=True)
    assert f'+        "cdi-shim": {{\n+            "path": "{runtime_binary}"' in out.stdout
    assert '+        "cdi": true' in out.stdout
    assert read(path) == '{"log-level": "warn"}\n' and siblings(path) == []


def test_missing_file_is_created_and_a_backup_kept_of_an_existing_one(tmp_path, dockerd, runtime_binary):
    path = tmp_path / "docker" / "daemon.json"
    configure(path, runtime_binary, dockerd["28.5"], check=True)
    assert json.loads(read(path)) == {"runtimes": {"cdi-shim": {"path": runtime_binary}}}
    assert siblings(path) == []
    path.write_text('{"debug": true}')
    os.chmod(path, 0o600)
    out = configure(path, runtime_binary, dockerd["28.5"], check=True)
    backups = siblings(path)
    assert len(backups) == 1 and backups[0].startswith("daemon.json.bak-") and "backup:" in out.stderr
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_a_file_dockerd_refuses_is_not_written(tmp_path, dockerd, runtime_binary):
    # valid JSON, but not a daemon.json dockerd accepts: its --validate says so, nothing changes
    path = tmp_path / "etc" / "daemon.json"
    path.parent.mkdir(exist_ok=True)
    text = '{"log-level": "loud"}'
    path.write_text(text)
    out = configure(path, runtime_binary, dockerd["28.5"], check=False)
    assert "dockerd refuses the new" in out.stderr and "nothing was changed" in out.stderr
    assert read(path) == text and siblings(path) == []


def test_two_runs_at_once_follow_one_another(tmp_path, dockerd, runtime_binary):
    """Each run holds the lock from reading to renaming: both entries survive, under two names."""
    path = tmp_path / "etc" / "daemon.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text("{}")
    other = tmp_path / "bin" / "other-runtime"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    lock = tmp_path / "etc" / ".daemon.json.cdi-shim.lock"
    import fcntl

    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)   # a run in progress
    results = []

    def one(binary, name):
        results.append(run_cli("runtime", "configure", "--runtime=docker", "--config", str(path), "--runtime-binary",
                               binary, "--runtime-name", name, "--dockerd-binary", dockerd["28.5"],
                               env=env_for(dockerd["28.5"])))

    threads = [threading.Thread(target=one, args=(runtime_binary, "cdi-shim")),
               threading.Thread(target=one, args=(str(other), "cdi-shim-other"))]
    for thread in threads:
        thread.start()
    import time

    deadline = time.monotonic() + 3   # both started, and blocked on the lock
    while time.monotonic() < deadline and read(path) == "{}":
        time.sleep(0.2)
        if all(not thread.is_alive() for thread in threads):
            break
    assert read(path) == "{}", "a run wrote while another held the lock"
    os.unlink(lock)   # as a finishing holder does
    os.close(fd)
    for thread in threads:
        thread.join(60)
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert any("waiting for another run" in r.stderr for r in results)
    runtimes = json.loads(read(path))["runtimes"]
    assert runtimes == {"cdi-shim": {"path": runtime_binary}, "cdi-shim-other": {"path": str(other)}}


def test_containerd_only_options_are_refused_for_docker(tmp_path, dockerd, runtime_binary):
    path = tmp_path / "etc" / "daemon.json"
    path.parent.mkdir(exist_ok=True)
    out = configure(path, runtime_binary, dockerd["28.5"], "--enable-cdi", "true", check=False)
    assert "--enable-cdi applies to containerd only" in out.stderr and not path.exists()


def test_dockerd_version_is_read_from_each_release(dockerd):
    from shim.node.docker_config import docker_version

    assert docker_version(dockerd["20.10"])[:2] == (20, 10)
    assert docker_version(dockerd["26.1"])[:2] == (26, 1)
    assert docker_version(dockerd["28.5"])[:2] == (28, 5)
    assert docker_version("/nonexistent/dockerd") is None
    subprocess.run([dockerd["28.5"], "--version"], check=True, capture_output=True)


def test_restart_without_systemd_fails_saying_why_after_writing(tmp_path, dockerd, runtime_binary):
    from shim.node.containerd import pid1_init

    systemd, init = pid1_init()
    if systemd:
        pytest.fail("this test needs a machine whose PID 1 is not systemd (a container, as in CI)", pytrace=False)
    path = tmp_path / "etc" / "daemon.json"
    path.parent.mkdir()
    out = configure(path, runtime_binary, dockerd["28.5"], "--restart", check=False)
    assert f'cannot restart dockerd: PID 1 is "{init}", not systemd' in out.stderr
    assert json.loads(read(path))["runtimes"]["cdi-shim"] == {"path": runtime_binary}


def test_non_ascii_text_of_other_keys_is_kept_as_written(tmp_path, dockerd, runtime_binary):
    path = tmp_path / "etc" / "daemon.json"
    path.parent.mkdir()
    path.write_text('{"labels": ["zone=Zürich"]}', encoding="utf-8")
    configure(path, runtime_binary, dockerd["28.5"], check=True)
    assert '"zone=Zürich"' in path.read_text(encoding="utf-8")
