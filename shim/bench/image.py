"""The benchmark's own image: one tiny program, imported into the node's containerd when no
--image is given.

The program (/probe) is a static x86-64 ELF of a few instructions written here byte by byte, so
nothing has to be built or fetched: with no argument it exits 0 at once (the measured pods'
command: the container's cost is then containerd's and the runtime's alone); with a path it
exits 0 when the path exists (access(2)) and non-zero when not, which is how one pod, not
measured, checks that the GPU side's container holds the device's node and the other side's
does not. On another architecture the benchmark asks for --image.
"""
import hashlib
import io
import json
import platform
import struct
import subprocess
import tarfile

from . import BenchError

PROBE = "/probe"
NAME = "localhost/cdi-shim-bench-probe"
NAMESPACE = "k8s.io"        # the CRI plugin's containerd namespace

_BASE = 0x400000
# mov rdi,[rsp+16] (argv[1]); test rdi,rdi; jz exit0; xor esi,esi; mov eax,21 (access);
# syscall; mov edi,eax; jmp out; exit0: xor edi,edi; out: mov eax,231 (exit_group); syscall
_X86_64_CODE = bytes.fromhex("488b7c2410" "4885ff" "740d" "31f6" "b815000000" "0f05" "89c7" "eb02"
                             "31ff" "b8e7000000" "0f05")


def probe_elf(machine=None):
    """The probe program for this machine, or None where there is none (not x86-64)."""
    if (machine or platform.machine()) not in ("x86_64", "amd64"):
        return None
    header_size, phdr_size = 64, 56
    size = header_size + phdr_size + len(_X86_64_CODE)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)          # 64-bit, little-endian, SysV
    header = ident + struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, _BASE + header_size + phdr_size, header_size, 0, 0,
                                 header_size, phdr_size, 1, 0, 0, 0)   # ET_EXEC, EM_X86_64, entry, one phdr
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, _BASE, _BASE, size, size, 0x1000)   # PT_LOAD, R+X, whole file
    return header + phdr + _X86_64_CODE


def _tar(entries):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in entries:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, 0
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def archive(program):
    """(reference, OCI image layout tarball bytes) of the one-layer image around PROGRAM."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    layer = _tar([(d, None, 0o755) for d in ("dev", "etc", "proc", "sys", "tmp")]
                 + [("etc/passwd", b"root:x:0:0:root:/:/probe\n", 0o644), ("etc/group", b"root:x:0:\n", 0o644),
                    (PROBE.lstrip("/"), program, 0o755)])
    config = json.dumps({"architecture": arch, "os": "linux",
                         "config": {"Env": ["PATH=/"], "Cmd": [PROBE], "WorkingDir": "/"},
                         "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]}}, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _digest(config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": _digest(layer),
                    "size": len(layer)}]}, sort_keys=True).encode()
    reference = f"{NAME}:{_digest(manifest)[7:19]}"
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _digest(manifest),
        "size": len(manifest), "platform": {"architecture": arch, "os": "linux"},
        "annotations": {"io.containerd.image.name": reference,
                        "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[1]}}]},
        sort_keys=True).encode()
    entries = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644), ("index.json", index, 0o644)]
    entries += [("blobs/sha256/" + _digest(blob)[7:], blob, 0o644) for blob in (layer, config, manifest)]
    return reference, _tar(entries)


def import_probe(ctr, socket, timeout=120):
    """Import the probe image into containerd at SOCKET with the `ctr` program CTR; returns its
    reference. Raises BenchError where there is no probe for this machine or ctr fails."""
    program = probe_elf()
    if program is None:
        raise BenchError(f"no built-in probe image for {platform.machine()}: give --image (one that has `true`)")
    reference, data = archive(program)
    try:
        done = subprocess.run([ctr, "--address", socket, "--namespace", NAMESPACE, "images", "import",
                               "--all-platforms", "-"], input=data, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BenchError(f"{ctr} images import: {err} (--ctr names containerd's ctr; or give --image)") from None
    if done.returncode != 0:
        raise BenchError(f"{ctr} images import into {socket} failed: "
                         f"{done.stderr.decode(errors='replace').strip()[-500:]}")
    return reference
