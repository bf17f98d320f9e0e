"""cdi-shim installed as users install it: the sdist, the wheel built from it, the wheel
installed into a clean venv away from the source tree, and everything run from elsewhere.

The dev venv's editable install resolves imports from the source tree, so it cannot show a
module the wheel forgot, a path of the build machine compiled into a program, or a file read at
run time that is not package data. Here the venv that built the wheel is checked, then deleted,
and the same wheel is checked again in a second venv: nothing installed may need the first.
Each failure names the module or the command.
"""
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.helpers import need

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAMS = ("cdi-shim", "cdi-shim-runtime", "cdi-shim-hook", "cdi-shim-nshook", "nvidia-container-runtime-hook")


def base_python():
    """The interpreter the dev venv was made from (a venv of a venv would share its packages)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def run(argv, **kwargs):
    kwargs.setdefault("timeout", 600)
    return subprocess.run(argv, capture_output=True, text=True, **kwargs)


def make_venv(path):
    made = run([base_python(), "-m", "venv", str(path)])
    assert made.returncode == 0, f"python -m venv {path}: {made.stderr}"
    return str(path)


def pip(venv, *args):
    done = run([os.path.join(venv, "bin", "pip"), "--disable-pip-version-check", "-q", *args])
    assert done.returncode == 0, f"pip {' '.join(args)}: {done.stderr[-3000:]}"


def source_modules():
    """Every module of the source tree, by name: a new module is covered without editing this."""
    names = []
    for package in ("cdi", "shim"):
        for folder, dirs, files in os.walk(os.path.join(REPO, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    parts = os.path.relpath(os.path.join(folder, name[:-3]), REPO).split(os.sep)
                    names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The sdist and the wheel built from it by a build front end in venv `a`, which then gets
    the wheel installed: {sdist, wheel, first, top, outside}."""
    top = tmp_path_factory.mktemp("installed")
    outside = top / "elsewhere"     # every command runs from here: not the source tree
    outside.mkdir()
    first = make_venv(top / "a")
    pip(first, "install", "build")
    before = _tree_state()
    done = run([os.path.join(first, "bin", "python"), "-m", "build", "--outdir", str(top / "dist"), REPO],
               cwd=outside)
    assert done.returncode == 0, f"python -m build: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    assert _tree_state() == before, "building wrote into the source tree"
    sdist = next(str(p) for p in (top / "dist").glob("*.tar.gz"))
    wheel = next(str(p) for p in (top / "dist").glob("*.whl"))
    pip(first, "install", wheel)
    return {"sdist": sdist, "wheel": wheel, "first": first, "top": top, "outside": str(outside)}


def _tree_state():
    listing = run(["git", "-C", REPO, "status", "--porcelain", "--ignored", "--untracked-files=all"])
    return {line for line in listing.stdout.splitlines() if "__pycache__" not in line}


@pytest.fixture(scope="module", params=["the venv it was built in", "a second venv, the first deleted"])
def venv(request, built):
    if request.param.startswith("the venv"):
        return built["first"]
    shutil.rmtree(built["first"])
    second = make_venv(built["top"] / "b")
    pip(second, "install", built["wheel"])
    return second


def installed(venv, *argv, **kwargs):
    return run([os.path.join(venv, "bin", argv[0]), *argv[1:]], cwd=kwargs.pop("cwd", None) or os.path.dirname(venv),
               env=kwargs.pop("env", None) or {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}, **kwargs)


def our_files(venv):
    """The files the wheel installed, from its RECORD."""
    site = os.path.join(venv, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    record = next(os.path.join(site, d, "RECORD") for d in os.listdir(site)
                  if d.startswith("cdi_shim-") and d.endswith(".dist-info"))
    with open(record) as stream:
        return [os.path.normpath(os.path.join(site, line.split(",")[0])) for line in stream if line.strip()]


def test_sdist_carries_what_the_wheel_is_built_from(built):
    listing = run(["tar", "tzf", built["sdist"]]).stdout.splitlines()
    names = {line.split("/", 1)[1] for line in listing if "/" in line}
    for needed in ("setup.py", "pyproject.toml", "csrc/programs.py", "csrc/launcher/pylaunch.c",
                   "csrc/frontend/runtime_main.c", "csrc/engine/build_native.py"):
        assert needed in names, f"{needed} is missing from {built['sdist']}"


def test_the_wheel_ships_the_runtime_and_no_test_bench(built):
    """The node's wheel: cdi and shim, none of the lab (cdi_shim_lab: the labs, the releases they
    fetch, their images, the lab's pod scenarios), nor tests or benchmarks. The node's own pod
    benchmark (shim/bench: `bench pods --endpoint`, grpcio from the bench extra) is in it."""
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = wheel.namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.startswith("cdi_shim-")} == {"cdi", "shim"}, sorted(tops)
    lab = [name for name in names if name.startswith("shim/cri/") or "lab" in os.path.basename(name) or
           name.endswith((".proto", "releases.py", "hosttools.py", "pods.py", "images.py"))]
    assert not lab, lab
    for module in ("node", "cri", "cri_messages", "image"):
        assert f"shim/bench/{module}.py" in names, module
    metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
    with zipfile.ZipFile(built["wheel"]) as wheel:
        requires = [line for line in wheel.read(metadata).decode().splitlines() if line.startswith("Requires-Dist")]
    assert any("grpcio" in line and "extra == \"bench\"" in line for line in requires), requires
    assert not any("grpcio" in line and "extra" not in line for line in requires), requires
    assert "shim/runtime/main.py" in names and "cdi/registry.py" in names    # (the listing is the real one)
    for unit in ("cdi-shim-generate.service", "cdi-shim-generate-once.service", "cdi-shim-generate.timer"):
        assert f"shim/node/units/{unit}" in names, unit     # the spec refresh install --node installs


def test_bench_pods_without_the_lab_says_what_to_install(venv, built):
    done = installed(venv, "cdi-shim", "bench", "pods", "-n", "1", cwd=built["outside"])
    assert done.returncode != 0, done.stdout
    assert "cdi_shim_lab" in done.stderr and "pip install" in done.stderr and "Traceback" not in done.stderr, \
        done.stderr


def test_bench_pods_on_a_node_without_the_extra_says_what_to_install(venv, built, tmp_path):
    import socket

    stale = socket.socket(socket.AF_UNIX)           # a socket file nothing answers on
    stale.bind(str(tmp_path / "containerd.sock"))
    try:
        done = installed(venv, "cdi-shim", "bench", "pods", "--endpoint", f"unix://{tmp_path}/containerd.sock",
                         "--handler", "nvidia", cwd=built["outside"])
    finally:
        stale.close()
    assert done.returncode == 1 and "pip install 'cdi-shim[bench]'" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr


def test_bench_pods_from_the_wheel_with_its_extra_measures_a_nodes_containerd(built, lab, tmp_path):
    """pip install 'cdi-shim[bench]' into a venv of its own, then `bench pods --endpoint` from
    outside the checkout against a private containerd 1.6 (Debian's package, as a node's): the
    installed package alone measures it, checks the device, and leaves no pod."""
    venv = make_venv(tmp_path / "bench")
    pip(venv, "install", f"{built['wheel']}[bench]")
    socket_dir = tmp_path / "gone"
    socket_dir.mkdir()
    missing = installed(venv, "cdi-shim", "bench", "pods", "--endpoint", f"unix://{socket_dir}/containerd.sock",
                        "--handler", "nvidia", cwd=built["outside"])
    assert missing.returncode == 1 and f"no CRI endpoint at {socket_dir}/containerd.sock" in missing.stderr, \
        missing.stderr
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "CDI_SHIM_CONFIG": lab.shim_config}
    done = installed(venv, "cdi-shim", "bench", "pods", "--endpoint", f"unix://{lab.socket}", "--handler", "nvidia",
                     "--ctr", lab.ctr, "-n", "2", "--warmup", "0", cwd=built["outside"], env=env)
    assert done.returncode == 0, done.stderr
    assert "checked: A's container has /dev/nvidia0, B's not" in done.stdout, done.stdout
    assert "6 pods made, 0 left" in done.stdout, done.stdout
    assert not [pod for pod in lab.client.list_pod_sandboxes() if "cdi-shim.dev/bench" in pod.labels]


def test_no_installed_file_names_the_source_tree_or_another_venv(venv, built):
    files = our_files(venv)
    assert {os.path.basename(f) for f in files} >= set(PROGRAMS), sorted(files)
    foreign = [REPO.encode()]
    if venv != built["first"]:
        foreign.append(built["first"].encode())
    for path in files:
        if "__pycache__" in path:
            continue                    # compiled at install time, naming where they are
        with open(path, "rb") as stream:
            data = stream.read()
        for text in foreign:
            assert text not in data, f"{path} contains {text.decode()}"
    for name in PROGRAMS:
        with open(os.path.join(venv, "bin", name), "rb") as stream:
            assert stream.read(4) == b"\x7fELF", f"{name} is not a native program"


def test_every_module_imports_from_the_installed_package(venv, built):
    script = ("import importlib, sys\n"
              "for name in sys.argv[1:]:\n"
              "    try:\n"
              "        module = importlib.import_module(name)\n"
              "    except BaseException as err:\n"
              "        print(f'{name}: cannot import: {type(err).__name__}: {err}')\n"
              "        continue\n"
              "    if not module.__file__.startswith(sys.prefix + '/'):\n"
              "        print(f'{name}: imported from {module.__file__}, not the venv')\n")
    modules = source_modules()
    assert len(modules) > 60 and "shim.node.doctor.runtime" in modules
    done = installed(venv, "python", "-I", "-c", script, *modules, cwd=built["outside"])
    assert done.returncode == 0 and not done.stdout, done.stdout + done.stderr


def _command_paths(venv, cwd):
    script = ("import click\n"
              "from shim.cli.main import main\n"
              "def walk(command, path):\n"
              "    print(' '.join(path))\n"
              "    for name, sub in sorted(getattr(command, 'commands', {}).items()):\n"
              "        walk(sub, path + [name])\n"
              "walk(main, [])\n")
    done = installed(venv, "python", "-I", "-c", script, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return [line.split() for line in done.stdout.splitlines()]


def test_every_command_and_subcommand_helps(venv, built):
    paths = _command_paths(venv, built["outside"])
    assert ["install"] in paths and ["cdi", "generate"] in paths and ["runtime", "serve"] in paths, paths
    commands = [["cdi-shim", *path] for path in paths]
    commands += [["cdi-shim-hook"], ["cdi-shim-hook", "update-ldcache"], ["cdi-shim-hook", "create-symlinks"],
                 ["cdi-shim-runtime"], ["cdi-shim-nshook"], ["nvidia-container-runtime-hook"]]
    failed = []
    for argv in commands:
        done = installed(venv, *argv, "--help", cwd=built["outside"])
        if done.returncode != 0 or not done.stdout.strip():
            failed.append(f"{' '.join(argv)} --help: exit {done.returncode}: {(done.stderr or done.stdout)[-300:]}")
    assert not failed, "\n".join(failed)
    print(f"{len(commands)} commands' --help")


def test_every_program_tells_the_one_version(venv, built):
    from cdi import __version__

    said = {name: installed(venv, name, "--version", cwd=built["outside"]).stdout.splitlines()[:1]
            for name in ("cdi-shim", "cdi-shim-hook", "cdi-shim-runtime", "cdi-shim-nshook",
                         "nvidia-container-runtime-hook")}
    assert said == {"cdi-shim": [f"cdi-shim, version {__version__}"],
                    "cdi-shim-hook": [f"cdi-shim-hook, version {__version__}"],
                    "cdi-shim-runtime": [f"cdi-shim-runtime version {__version__}"],
                    "cdi-shim-nshook": [f"cdi-shim-nshook version {__version__}"],
                    "nvidia-container-runtime-hook": [f"nvidia-container-runtime-hook version {__version__}"]}, said
    assert os.path.basename(built["wheel"]).startswith(f"cdi_shim-{__version__}-")


def test_demo_container_through_the_installed_runtime(venv, built):
    need("runc", "runc")
    done = run(["bash", os.path.join(REPO, "scripts", "demo.sh")], cwd=built["outside"],
               env=dict(os.environ, CDI_SHIM_BIN=os.path.join(venv, "bin")))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count("fake driver 999.99") == 2 and "195,   0" in done.stdout, done.stdout


def test_doctor_on_a_healthy_and_a_broken_node(venv, built, tmp_path):
    from tests.node.test_doctor import DRIVER, LIBRARIES, make_node

    gcc = need("gcc", "gcc")
    source = tmp_path / "lib.c"
    source.write_text("int fake_driver_entry(void) { return 0; }\n")
    files = {}
    for lib in LIBRARIES:
        files[lib, DRIVER] = str(tmp_path / f"{lib}.so.{DRIVER}")
        subprocess.run([gcc, "-shared", "-fPIC", "-o", files[lib, DRIVER], f"-Wl,-soname,{lib}.so.1", str(source)],
                       check=True)
    node = make_node(tmp_path / "root", files)
    argv = ["cdi-shim", "doctor", "--root", node.root, "--containerd-binary", need("containerd", "containerd")]
    healthy = installed(venv, *argv, cwd=built["outside"])
    assert healthy.returncode == 0 and "fail" not in healthy.stdout, healthy.stdout + healthy.stderr
    os.unlink(node.path("/dev/nvidia0"))
    broken = installed(venv, *argv, cwd=built["outside"])
    assert broken.returncode == 1 and any(line.startswith("fail") and "kernel.devices" in line
                                          for line in broken.stdout.splitlines()), broken.stdout + broken.stderr


def test_install_node_into_an_empty_node_tree(venv, built, tmp_path):
    need("containerd", "containerd")
    root = tmp_path / "node"
    root.mkdir()
    done = installed(venv, "cdi-shim", "install", "--node", "--root", str(root), cwd=built["outside"])
    assert done.returncode == 0, done.stderr
    config = (root / "etc/containerd/config.toml").read_text()
    unit = (root / "etc/systemd/system/cdi-shim-resident.service").read_text()
    assert f"BinaryName = '{venv}/bin/cdi-shim-runtime'" in config or \
        f'BinaryName = "{venv}/bin/cdi-shim-runtime"' in config, config
    assert f"ExecStart={venv}/bin/cdi-shim runtime serve" in unit, unit
    refresh = (root / "etc/systemd/system/cdi-shim-generate.service").read_text()
    assert f"ExecStart={venv}/bin/cdi-shim cdi generate --watch " in refresh, refresh
    again = installed(venv, "cdi-shim", "install", "--node", "--root", str(root), cwd=built["outside"])
    assert again.returncode == 0 and "changed:" not in again.stderr.replace("unchanged:", ""), again.stderr
