"""enable-cuda-compat's decision (shim/linker/cudacompat.py) on gcc-built libraries.

The expected results are facts of nvidia-cdi-hook 1.20.0's source: cudacompat.go
(useCompatLibraries), cuda-elf-header.go (GetCUDACompatElfHeaderFromReader, UseCompat) and the
vendored Masterminds/semver v3 (NewVersion with CoerceNewVersion: the loose form). The
end-to-end cases, with runc and the real hook's observed results, are in
tests/runtime/test_hook_fidelity.py.
"""
import os
import subprocess

import pytest

from shim.linker import cudacompat

NOTE = r"""
__asm__(".pushsection .note.cuda.fwd_compatibility,\"a\",@note\n"
        ".balign %(align)d\n.long %(namesz)d\n.long %(descsz)d\n.long 1\n.asciz \"%(owner)s\"\n.balign 4\n"
        ".asciz \"%(text)s\"\n.balign 4\n.popsection\n");
"""


def _library(tmp_path, text=None, owner="NVIDIA Corporation", align=4, namesz=None):
    source, path = tmp_path / "lib.c", tmp_path / "libcuda.so.570.86.10"
    body = "int fake_cuda_major(void) { return 570; }\n"
    if text is not None:
        body += NOTE % {"align": align, "namesz": len(owner) + 1 if namesz is None else namesz,
                        "descsz": len(text) + 1, "owner": owner, "text": text.replace('"', '\\\\\\"')}
    source.write_text(body)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(path), str(source)],
                   check=True, capture_output=True, timeout=60)
    return str(path)


def _decide(path, driver, cuda=""):
    fd = os.open(path, os.O_RDONLY)
    try:
        return cudacompat.use_compat(os.path.basename(path), fd, driver, cuda)
    finally:
        os.close(fd)


def _note(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return cudacompat.note_of(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("text, expected", [
    ("550.54.15", (550, 54, 15, "")),
    ("v12.4", (12, 4, 0, "")),
    ("12", (12, 0, 0, "")),
    ("560.35.03-rc.1+build.7", (560, 35, 3, "rc.1")),
    ("007.1", (7, 1, 0, "")),              # (the loose form takes leading zeros)
    ("550.54.15.1", None), ("unknown", None), ("", None), ("1.2-rc.01", None), ("1..2", None),
    ("1.2.", None), ("V1.2", None), ("1.2 ", None),
])
def test_versions_read_as_the_hook_s_semver(text, expected):
    assert cudacompat.version(text) == expected


def test_semver_order():
    v = cudacompat.version
    assert cudacompat.newer(v("560.35.05"), v("560.35.03"))
    assert not cudacompat.newer(v("560.35.03"), v("560.35.03"))
    assert cudacompat.newer(v("1.0.0"), v("1.0.0-rc.1"))          # a release after its prerelease
    assert cudacompat.newer(v("1.0.0-rc.10"), v("1.0.0-rc.9"))     # numeric parts as numbers
    assert cudacompat.newer(v("1.0.0-rc"), v("1.0.0-1"))           # text after numbers


def test_the_note_read(tmp_path):
    lib = _library(tmp_path, '{"Format": 1, "CUDA Version": "12.8", "Driver": [535, 550], "Device": [9]}')
    assert _note(lib) == {"cuda": "12.8", "drivers": [535, 550]}
    assert _decide(lib, "550.54.15") is True       # the host's major listed, compat newer
    assert _decide(lib, "560.28.03") is False      # not listed, although compat is newer
    assert _decide(lib, "", "12.4") is True        # no driver to compare: CUDA 12.8 > 12.4
    assert _decide(lib, "unknown", "12.8") is False
    assert _decide(lib, "550.54.15", "13.0") is True   # (with both driver versions the CUDA one is not asked)


@pytest.mark.parametrize("text", [
    '{"format": 1, "cuda version": "12.8", "DRIVER": [550]}',     # Go's encoding/json: names case-insensitively
    '{"Driver": [535], "Driver": [550], "CUDA Version": "12.8", "Other": {"x": 1}}',    # the last wins; unknown ignored
])
def test_note_fields_as_go_fills_them(tmp_path, text):
    assert _note(_library(tmp_path, text)) == {"cuda": "12.8", "drivers": [550]}


@pytest.mark.parametrize("case, kwargs", [
    ("not NVIDIA's", {"text": '{"Driver": [550]}', "owner": "Someone Else"}),
    ("not JSON", {"text": "Driver 550"}),
    ("a driver given as text", {"text": '{"Driver": ["550"]}'}),
    ("a CUDA version given as a number", {"text": '{"CUDA Version": 12.8, "Driver": [550]}'}),
    ("an empty owner name", {"text": '{"Driver": [550]}', "namesz": 0}),
    ("no note", {}),
])
def test_a_note_that_does_not_read_falls_back_to_the_majors(tmp_path, case, kwargs):
    """No note, or one GetCUDACompatElfHeaderFromReader returns nil (an owner not NVIDIA's, a
    zero size) or fails on (the JSON): the majors decide, and a host CUDA version says no."""
    lib = _library(tmp_path, **kwargs)
    assert _note(lib) is None, case
    assert _decide(lib, "560.28.03") is True, case      # 570 > 560
    assert _decide(lib, "570.1.1") is False, case
    assert _decide(lib, "560.28.03", "12.4") is False, case


def test_not_an_elf_file(tmp_path):
    path = tmp_path / "libcuda.so.570.86.10"
    path.write_bytes(b"not an ELF file" * 10)
    assert _note(str(path)) is None
    assert _decide(str(path), "560.28.03") is True
