"""The trial path of docs/trial.md, as a user runs it: scripts/trial.py builds the fake driver,
generates its spec, starts a private containerd 2.1 and runs two GPU pods through cdi-shim."""
import os
import subprocess
import sys

import pytest



pytestmark = pytest.mark.cri
TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRIAL = os.path.join(TOP, "scripts", "trial.py")


def sections(text, title):
    """The lines of each '== TITLE' section of the pods' output, in order."""
    found, current = [], None
    for line in text.splitlines():
        if line.startswith("== "):
            current = [] if line == f"== {title}" else None
            if current is not None:
                found.append(current)
        elif current is not None:
            current.append(line)
    return found


def trial(*argv):
    return subprocess.run([sys.executable, TRIAL, *argv], capture_output=True, text=True, timeout=600)


def test_trial_runs_gpu_pods_on_containerd_2_1(cri_build_dir, tmp_path):
    done = trial(str(tmp_path / "trial"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "wrote " in done.stderr + out and "5 devices (2 GPU(s), driver 580.65.06)" in done.stderr + out
    devices = sections(out, "devices")
    assert [d for d in devices[0] if d.startswith("nvidia") and d[6:].isdigit()] == ["nvidia0"]
    assert [d for d in devices[1] if d.startswith("nvidia") and d[6:].isdigit()] == ["nvidia1"]
    assert sections(out, "linker cache") == [["libnvidia-ml.so.1"], ["libnvidia-ml.so.1"]]
    assert sections(out, "nvidia-smi") == [["nvidia-smi 580.65.06"], ["nvidia-smi 580.65.06"]]
    assert out.count("(exit status 0;") == 2
    # the lab is gone, the driver stays for another engine
    assert os.path.exists(tmp_path / "trial" / "fake-driver" / "devroot" / "dev" / "nvidia0")
    assert not [line for line in open("/proc/self/mountinfo") if str(tmp_path) in line]


@pytest.mark.parametrize("containerd", ["2.1", "1.7"])
def test_trial_nri_runs_gpu_pods_on_the_runc_handler(cri_build_dir, tmp_path, containerd):
    """`trial.py DIR --nri`: `cdi-shim nri` on the lab's NRI socket; two GPU pods on the stock runc
    handler (a CDI pod annotation, the toolkit's key), each listed with its handler, its devices
    and its start-up; the linker cache from the plugin's native hook."""
    import re

    done = trial(str(tmp_path / "trial"), "--nri", "--containerd", containerd)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "registered as " in out
    devices = sections(out, "devices")
    assert [d for d in devices[0] if d.startswith("nvidia") and d[6:].isdigit()] == ["nvidia0"]
    assert [d for d in devices[1] if d.startswith("nvidia") and d[6:].isdigit()] == ["nvidia1"]
    assert sections(out, "linker cache") == [["libnvidia-ml.so.1"], ["libnvidia-ml.so.1"]]
    pods = [line for line in sections(out, "pods")[0] if line]
    assert len(pods) == 2, pods
    for index, line in enumerate(pods):
        found = re.fullmatch(rf"pod {index + 1}: handler runc, devices nvidia.com/gpu={index} \((.*)\), "
                             r"start-up \d+ ms", line)
        assert found, line
        gpus = [node for node in found.group(1).split(", ") if node[len("/dev/nvidia"):].isdigit()]
        assert gpus == [f"/dev/nvidia{index}"], line
    assert not [line for line in open("/proc/self/mountinfo") if str(tmp_path) in line]


def test_trial_driver_only_and_its_refusals(tmp_path):
    done = trial(str(tmp_path / "d"), "--driver-only")
    assert done.returncode == 0, done.stderr
    assert "cdi generate --driver-root " + str(tmp_path / "d" / "fake-driver" / "driver") in done.stdout
    again = trial(str(tmp_path / "d"))
    assert again.returncode == 1 and "is not a new or empty directory" in again.stderr
    few = trial(str(tmp_path / "e"), "--gpus", "1")
    assert few.returncode == 1 and "--gpus must be 2 or more" in few.stderr
