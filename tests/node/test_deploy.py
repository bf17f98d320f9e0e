"""deploy/: the Kubernetes manifests pass the Kubernetes schema (kubernetes-validate ships the
schemas, offline; strict: no unknown field), the kustomization builds (a small merge: its
resources, its namespace, its image tags), and the pieces agree with each other and with
`cdi-shim install` (the options the DaemonSet and the bootstrap pass exist, the paths the image
puts in place are the ones they run). deploy/node-install.sh runs for real on a fake host tree.
"""
import copy
import os
import shlex
import subprocess

import pytest
import yaml

from shim.cli.install import install as install_command
from tests.helpers import read

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEPLOY = os.path.join(REPO, "deploy")
KUBE = os.path.join(DEPLOY, "kubernetes")
# the oldest Kubernetes still served by the managed offerings, and the newest the schemas know
VERSIONS = ("1.29.0", "1.37.0")


def documents(path):
    with open(path) as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def kustomize_build(directory):
    """What `kustomize build` makes of the kinds of fields our kustomization uses (resources,
    namespace, images); any other field fails the test, so a new one cannot go unchecked."""
    kustomization = documents(os.path.join(directory, "kustomization.yaml"))[0]
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    unknown = set(kustomization) - {"apiVersion", "kind", "namespace", "resources", "images"}
    assert not unknown, f"kustomize_build does not model {unknown}"
    built = []
    for resource in kustomization["resources"]:
        path = os.path.join(directory, resource)
        assert os.path.isfile(path), f"kustomization resource {resource} does not exist"
        built += documents(path)
    namespace = kustomization.get("namespace")
    cluster_scoped = {"Namespace", "RuntimeClass"}
    for doc in built:
        if namespace and doc["kind"] not in cluster_scoped:
            doc["metadata"]["namespace"] = namespace
    for image in kustomization.get("images", []):
        for doc in built:
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("initContainers", []) + spec.get("containers", []):
                name, _, _ = container["image"].partition(":")
                if name == image["name"]:
                    container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    return built


def built():
    return {doc["kind"]: doc for doc in kustomize_build(KUBE)}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["daemonset.yaml", "runtimeclass.yaml", "namespace.yaml"])
def test_manifest_passes_the_kubernetes_schema(name, version):
    import kubernetes_validate

    for doc in documents(os.path.join(KUBE, name)):
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_kustomization_builds_to_valid_resources(version):
    import kubernetes_validate

    resources = kustomize_build(KUBE)
    assert sorted(doc["kind"] for doc in resources) == ["DaemonSet", "Namespace", "RuntimeClass"]
    for doc in resources:
        kubernetes_validate.validate(doc, version, strict=True)


def test_schema_check_is_real():
    """The schema check refuses what Kubernetes refuses (else the tests above prove nothing)."""
    import kubernetes_validate
    from kubernetes_validate.utils import ValidationError

    daemonset = copy.deepcopy(built()["DaemonSet"])
    daemonset["spec"]["template"]["spec"]["hostPid"] = True  # misspelt: strict refuses it
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(daemonset, VERSIONS[-1], strict=True)
    runtimeclass = copy.deepcopy(built()["RuntimeClass"])
    del runtimeclass["handler"]
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(runtimeclass, VERSIONS[-1], strict=True)


def test_runtimeclass_is_what_cdi_shim_runtimeclass_prints():
    from tests.helpers import run_cli

    printed = yaml.safe_load(run_cli("runtimeclass", check=True).stdout)
    ours = built()["RuntimeClass"]
    assert {k: ours[k] for k in printed} == printed  # plus a nodeSelector: GPU nodes only
    install_default = next(p.default for p in install_command.params if p.name == "runtime_name")
    assert ours["handler"] == install_default
    daemonset = built()["DaemonSet"]["spec"]["template"]["spec"]
    assert ours["scheduling"]["nodeSelector"] == daemonset["nodeSelector"]


def _install_options():
    return {opt for param in install_command.params for opt in param.opts}


def _check_install_words(words):
    assert words[:2] == ["install", "--node"] or "--node" not in words
    for word in words:
        if word.startswith("--"):
            assert word in _install_options(), f"`cdi-shim install` has no option {word}"


def test_daemonset_runs_the_image_s_installer_with_options_install_has():
    kinds = built()
    spec = kinds["DaemonSet"]["spec"]["template"]["spec"]
    assert kinds["DaemonSet"]["metadata"]["namespace"] == kinds["Namespace"]["metadata"]["name"]
    assert spec["hostPID"] is True
    init = spec["initContainers"][0]
    assert init["securityContext"]["privileged"] is True
    env = {e["name"]: e["value"] for e in init["env"]}
    _check_install_words(["install", "--node"] + shlex.split(env["CDI_SHIM_INSTALL_ARGS"]))
    assert "--restart" in env["CDI_SHIM_INSTALL_ARGS"]
    containerfile = read(os.path.join(DEPLOY, "Containerfile"))
    assert f"COPY deploy/node-install.sh {init['command'][0]}" in containerfile
    mount = next(m for m in init["volumeMounts"] if m["mountPath"] == env["HOST_OPT"])
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == "/opt/cdi-shim"
    tags = {c["image"] for c in spec["initContainers"] + spec["containers"]}
    assert len(tags) == 1  # the idle container is the same image: nothing more to pull
    from cdi import __version__

    assert tags == {f"ghcr.io/cdi-shim/cdi-shim:{__version__}"}, tags   # the one version


def test_bootstrap_user_data():
    path = os.path.join(DEPLOY, "node-bootstrap", "cloud-init.yaml")
    text = read(path)
    assert text.startswith("#cloud-config\n")
    from cdi import __version__

    assert f"ghcr.io/cdi-shim/cdi-shim:{__version__}" in text      # the one version
    data = yaml.safe_load(text)
    unit_path = os.path.join(DEPLOY, "node-bootstrap", "cdi-shim-install.service")
    written = {f["path"]: f["content"] for f in data["write_files"]}
    assert written["/etc/systemd/system/cdi-shim-install.service"] == read(unit_path)
    exec_start = next(line for line in read(unit_path).splitlines() if line.startswith("ExecStart="))
    words = shlex.split(exec_start[len("ExecStart="):])
    assert words[0] == "/opt/cdi-shim/current/bin/cdi-shim"
    _check_install_words(words[1:])
    commands = [c if isinstance(c, list) else shlex.split(c) for c in data["runcmd"]]
    assert ["systemctl", "enable", "cdi-shim-install.service"] in commands
    assert any(c[-2:] == ["/opt/cdi-shim/current/node-install.sh", "--copy-only"] for c in commands)


# --- deploy/node-install.sh on a fake host ----------------------------------------------------------

def _tree(tmp_path, release):
    tree = tmp_path / f"image-{release}"
    (tree / "bin").mkdir(parents=True, exist_ok=True)
    (tree / "bin" / "cdi-shim").write_text("#!/bin/sh\n")
    (tree / "RELEASE").write_text(release + "\n")
    return tree


def _node_install(tmp_path, tree, *args):
    log = tmp_path / "nsenter.log"
    recorder = tmp_path / "nsenter"
    recorder.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n')
    recorder.chmod(0o755)
    env = dict(os.environ, HOST_OPT=str(tmp_path / "host-opt"), CDI_SHIM_TREE=str(tree), NSENTER=str(recorder),
               CDI_SHIM_INSTALL_ARGS="--drop-in --restart")
    if log.exists():
        log.unlink()
    done = subprocess.run(["sh", os.path.join(DEPLOY, "node-install.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr, (read(log).splitlines() if log.exists() else [])


def test_node_install_script_copies_switches_and_installs(tmp_path):
    host = tmp_path / "host-opt"
    install = "/opt/cdi-shim/current/bin/cdi-shim install --node --drop-in --restart"
    out, calls = _node_install(tmp_path, _tree(tmp_path, "aaaa"))
    assert os.readlink(host / "current") == "releases/aaaa"
    assert (host / "releases" / "aaaa" / "bin" / "cdi-shim").is_file()
    assert calls == [install, "systemctl try-restart cdi-shim-resident.service cdi-shim-generate.service"]
    out, calls = _node_install(tmp_path, _tree(tmp_path, "aaaa"))  # a node restart: same image
    assert out == "" and calls == [install]
    _node_install(tmp_path, _tree(tmp_path, "bbbb"))
    _, calls = _node_install(tmp_path, _tree(tmp_path, "cccc"))
    assert os.readlink(host / "current") == "releases/cccc"
    assert sorted(os.listdir(host / "releases")) == ["bbbb", "cccc"]  # the one before is kept
    assert calls[-1] == "systemctl try-restart cdi-shim-resident.service cdi-shim-generate.service"
    out, calls = _node_install(tmp_path, _tree(tmp_path, "cccc"), "--copy-only")
    assert calls == []


# --- whose the host's /opt/cdi-shim is (issue 43, finding 8) -------------------------------------

def _run_node_install(tmp_path, tree, host_opt):
    env = dict(os.environ, HOST_OPT=str(host_opt), CDI_SHIM_TREE=str(tree), NSENTER="true")
    return subprocess.run(["sh", os.path.join(DEPLOY, "node-install.sh"), "--copy-only"], capture_output=True,
                          text=True, env=env, timeout=60)


@pytest.mark.parametrize("above, said", [
    ("a folder others can write", "has mode 777, writable by group or others"),
    ("a folder another user owns", "is owned by uid 1000, not root"),
    ("a link another user owns", "is owned by uid 1000, not root"),
    ("a link into a folder others can write", "has mode 777, writable by group or others")])
def test_node_install_checks_every_folder_above_the_host_s_opt(tmp_path, above, said):
    """HOST_OPT itself root's, but a folder above it one another user can change: that user can
    swap HOST_OPT (and what every container start runs as root) for a tree of theirs. Refused,
    naming the folder; nothing is copied."""
    up = tmp_path / "up"
    up.mkdir()
    host_opt = up / "opt" / "cdi-shim"
    if above == "a folder others can write":
        up.chmod(0o777)
    elif above == "a folder another user owns":
        os.chown(up, 1000, 1000)
    else:
        shared = tmp_path / "shared"
        (shared / "opt").mkdir(parents=True)
        os.symlink(shared / "opt", up / "opt")
        if above == "a link another user owns":
            os.lchown(up / "opt", 1000, 1000)
        else:
            shared.chmod(0o777)
    done = _run_node_install(tmp_path, _tree(tmp_path, "aaaa"), host_opt)
    assert done.returncode == 1 and said in done.stderr, done.stderr
    where = done.stderr.strip().split("cdi-shim: ", 1)[1].split(" ")[0]
    assert where in (str(up), str(up / "opt"), str(tmp_path / "shared")), done.stderr
    assert not os.listdir(host_opt / "releases")


def test_node_install_takes_a_sticky_folder_above(tmp_path):
    """A sticky folder above (/tmp's mode): others cannot rename root's entries in it."""
    up = tmp_path / "up"
    up.mkdir()
    up.chmod(0o1777)
    done = _run_node_install(tmp_path, _tree(tmp_path, "aaaa"), up / "cdi-shim")
    assert done.returncode == 0, done.stderr
    up.chmod(0o755)
    host = up / "cdi-shim"
    host.chmod(0o1777)           # HOST_OPT itself: never
    done = _run_node_install(tmp_path, _tree(tmp_path, "bbbb"), host)
    assert done.returncode == 1 and f"{host} has mode 1777, writable by group or others" in done.stderr, done.stderr


def test_node_install_copies_a_tree_root_owns_and_only_root_writes(tmp_path):
    """The image's tree with a 0777 file, a uid-1000 file and folder, a set-user-ID program and a
    link: the copy on the host is root's, writable by root only, whatever the tree had."""
    import stat

    tree = _tree(tmp_path, "aaaa")
    (tree / "bin" / "cdi-shim").chmod(0o777)
    (tree / "lib").mkdir()
    (tree / "lib" / "theirs.py").write_text("x = 1\n")
    os.chown(tree / "lib" / "theirs.py", 1000, 1000)
    os.chown(tree / "lib", 1000, 1000)
    (tree / "lib").chmod(0o775)
    (tree / "bin" / "setuid").write_text("#!/bin/sh\n")
    (tree / "bin" / "setuid").chmod(0o4755)
    os.symlink("cdi-shim", tree / "bin" / "link")
    host = tmp_path / "host-opt"
    done = _run_node_install(tmp_path, tree, host)
    assert done.returncode == 0, done.stderr
    release = host / "releases" / "aaaa"
    found = {}
    for directory, dirs, files in os.walk(release):
        for name in dirs + files:
            info = os.lstat(os.path.join(directory, name))
            found[os.path.relpath(os.path.join(directory, name), release)] = (info.st_uid, info.st_gid,
                                                                                stat.S_IMODE(info.st_mode))
    assert {path for path, (uid, gid, mode) in found.items() if uid or gid} == set()
    links = {"bin/link"}
    assert {path for path, (_, _, mode) in found.items() if mode & 0o6022 and path not in links} == set(), found
    assert found["bin/cdi-shim"][2] == 0o755 and found["lib/theirs.py"][2] == 0o644
    assert found["bin/setuid"][2] == 0o755 and os.readlink(release / "bin" / "link") == "cdi-shim"
