"""What a new user reads: every `--help` of the installed programs, README.md and the systemd
unit. They name only things a user has (this checkout, the programs, public projects), never the
project's own notes, issues or design documents."""
import os
import re
import subprocess

import click

from shim.cli.main import main as cli_main
from tests.conftest import tool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNSEEN = re.compile(r"\bissues?\b|reference/|DESIGN\.md|shared/", re.IGNORECASE)


def command_paths(group, prefix=()):
    yield prefix
    if isinstance(group, click.Group):
        for name, command in sorted(group.commands.items()):
            yield from command_paths(command, prefix + (name,))


def run(program, *args):
    env = {key: value for key, value in os.environ.items() if key != "CDI_SHIM_CONFIG"}
    result = subprocess.run([tool(program), *args], capture_output=True, text=True, env=env)
    assert result.returncode == 0, (program, args, result.stderr)
    return result.stdout


def help_texts():
    for path in command_paths(cli_main):
        yield "cdi-shim " + " ".join(path + ("--help",)), run("cdi-shim", *path, "--help")
    for path in (("-h",), ("update-ldcache", "-h"), ("create-symlinks", "-h")):
        yield "cdi-shim-hook " + " ".join(path), run("cdi-shim-hook", *path)
    for path in (("--help",), ("binds", "--help")):
        yield "cdi-shim-nshook " + " ".join(path), run("cdi-shim-nshook", *path)
    runtime_help = run("cdi-shim-runtime", "--help")
    yield "cdi-shim-runtime --help", runtime_help[:runtime_help.index("NAME:\n")]  # runc's own follows
    for name in ("README.md", "contrib/cdi-shim-resident.service"):
        with open(os.path.join(ROOT, name)) as f:
            yield name, f.read()


def test_no_pointers_to_documents_users_cannot_see():
    seen = 0
    for where, text in help_texts():
        seen += 1
        hits = [line for line in text.splitlines() if UNSEEN.search(line)]
        assert not hits, f"{where} points at what a user cannot see: {hits}"
    assert seen > 20


def test_bench_pods_help_says_how_to_install_its_extras_from_this_checkout():
    text = run("cdi-shim", "bench", "pods", "--help")
    lines = [line.strip() for line in text.splitlines()]
    assert ".venv/bin/pip install --config-settings editable_mode=compat -e '.[bench,plot]'" in lines, text
    # and how a node measures its own containerd, with no checkout
    assert "cdi-shim bench pods --endpoint unix:///run/containerd/containerd.sock --handler nvidia" in lines, text
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:  # the way setup.sh installs the checkout
        assert "--config-settings editable_mode=compat -e .\n" in f.read()


def test_bench_pods_native_cdi_needs_containerd_2_1():
    """--native-cdi asks containerd to inject the device (the CDIDevices field): refused on the
    system's 1.6 before any lab starts, with the way out in the message."""
    text = "".join(run("cdi-shim", "bench", "pods", "--help").split())  # click wraps at hyphens too
    assert "--native-cdi" in text and "programnamednvidia-cdi-hookthroughcdi-shim" in text
    result = subprocess.run([tool("cdi-shim"), "bench", "pods", "--native-cdi", "-n", "1"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
    assert "--native-cdi needs --containerd 2.1" in result.stderr, result.stderr


def test_resident_unit_describes_long_lived_workers_and_the_saving():
    with open(os.path.join(ROOT, "contrib", "cdi-shim-resident.service")) as f:
        comment = " ".join(line.lstrip("# ").strip() for line in f if line.startswith("#"))
    assert "long-lived worker processes" in comment and "fork of this" not in comment
    assert "a create pays no interpreter start (the figures are in docs/fast.md)" in comment
    serve = " ".join(run("cdi-shim", "runtime", "serve", "--help").split())
    assert "long-lived, warm workers" in serve and "a create pays no interpreter start" in serve


def test_nshook_help_exits_0_on_stdout_and_a_wrong_call_2_on_stderr():
    """`cdi-shim-nshook --help` exited 2 with its usage on stderr, as a wrong call does."""
    for args in (("--help",), ("-h",), ("symlinks", "--help")):
        asked = subprocess.run([tool("cdi-shim-nshook"), *args], capture_output=True, text=True, timeout=30)
        assert (asked.returncode, asked.stderr) == (0, ""), (args, asked.stderr)
        assert asked.stdout.startswith("usage: cdi-shim-nshook bind-params [--rootfs DIR] --source FILE\n")
    for args in ((), ("frobnicate",), ("symlinks",)):
        wrong = subprocess.run([tool("cdi-shim-nshook"), *args], capture_output=True, text=True, timeout=30)
        assert wrong.returncode == 2 and wrong.stdout == "" and wrong.stderr.startswith("usage: "), args
