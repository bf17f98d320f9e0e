"""scripts/gpu-check.sh (for a machine with a real GPU) as far as a machine without one can
take it: without NVML it fails, saying so; against the fake driver (DRIVER_ROOT, DEV_ROOT) with
a dynamically linked stand-in for nvidia-smi (it dlopens libnvidia-ml.so.1 and prints a
`nvidia-smi -L` line) it generates, validates, counts and runs the container through runc."""
import os
import subprocess

import fakedriver

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts",
                      "gpu-check.sh")
SMI = r"""#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    if (argc != 2 || argv[1][0] != '-' || argv[1][1] != 'L') return 2;
    if (!dlopen("libnvidia-ml.so.1", RTLD_NOW)) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    printf("GPU 0: NVIDIA H100 (UUID: GPU-00000000-1111-2222-3333-000000000000)\n");
    return 0;
}
"""


def run_script(**env):
    return subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=300, env=dict(os.environ, **env))


def test_without_nvml_it_fails_saying_so(tmp_path):
    done = run_script(DRIVER_ROOT=str(tmp_path))
    assert done.returncode == 1
    assert "no NVML: libnvidia-ml.so.1 is not in the linker cache" in done.stderr, done.stderr
    assert "needs a real NVIDIA GPU" in done.stderr


def test_against_the_fake_driver_it_runs_the_container(tmp_path):
    driver = fakedriver.FakeDriver(tmp_path / "driver", gpus=1)
    try:
        source = tmp_path / "smi.c"
        source.write_text(SMI)
        smi = f"{driver.root}/usr/bin/nvidia-smi"
        subprocess.run([fakedriver.need("gcc", "gcc"), "-o", smi, str(source), "-ldl"], check=True)
        done = run_script(DRIVER_ROOT=driver.root, DEV_ROOT=driver.dev_root, PROC_ROOT=driver.proc)
    finally:
        driver.close()
    assert done.returncode == 0, (done.stdout, done.stderr)
    out = done.stdout
    assert "1 spec file(s) checked, 0 error(s)" in done.stdout + done.stderr
    assert "nvidia.com/gpu=0\n" in out and "nvidia.com/gpu=all\n" in out
    assert "3 devices, 5 device nodes" in out and "(0 sources missing)" in out, out
    assert f"the spec records {fakedriver.VERSION}" in out
    assert "GPU 0: NVIDIA H100 (UUID: GPU-00000000-1111-2222-3333-000000000000)" in out
    assert out.rstrip().endswith("== gpu-check: OK")
