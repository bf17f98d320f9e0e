"""Host programs the test bench (CRI lab, end-to-end tests) builds container images from and runs,
and the processes the labs start."""
import os
import shutil
import signal
import struct
import subprocess

CMD_TIMEOUT = 120


class LabError(Exception):
    pass


BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")


def is_static_elf(path):
    """True for an ELF executable without a PT_INTERP program header (statically linked)."""
    with open(path, "rb") as stream:
        head = stream.read(64)
        if head[:4] != b"\x7fELF":
            return False
        end = "<" if head[5] == 1 else ">"
        if head[4] == 2:
            phoff, = struct.unpack(end + "Q", head[32:40])
            phentsize, phnum = struct.unpack(end + "HH", head[54:58])
        else:
            phoff, = struct.unpack(end + "I", head[28:32])
            phentsize, phnum = struct.unpack(end + "HH", head[42:46])
        for index in range(phnum):
            stream.seek(phoff + index * phentsize)
            if struct.unpack(end + "I", stream.read(4))[0] == 3:  # PT_INTERP
                return False
    return True


def static_busybox():
    """Path of a statically linked busybox (a rootfs in one file), or None."""
    for candidate in BUSYBOX_CANDIDATES:
        if os.path.exists(candidate) and is_static_elf(candidate):
            return candidate
    return None


def need_static_busybox():
    """static_busybox(), or LabError saying what to install."""
    path = static_busybox()
    if path is None:
        raise LabError("no statically linked busybox: apt-get install busybox-static")
    return path


# Stands in for runc where the pod benchmark times it (Lab(time_runc=True)): runs runc with the
# same arguments and, for create and start, appends "VERB CONTAINER-ID MS" to the log. (A fork
# and a wait more than exec'ing runc, on every side alike.)
RUNC_TIMER_C = r"""
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    const char *verb = NULL;
    for (int i = 1; i < argc && !verb; i++)
        if (strcmp(argv[i], "create") == 0 || strcmp(argv[i], "start") == 0)
            verb = argv[i];
    argv[0] = RUNC;
    if (!verb) {
        execv(RUNC, argv);
        return 127;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t pid = fork();
    if (pid == 0) {
        execv(RUNC, argv);
        _exit(127);
    }
    int status = 0;
    if (pid < 0)
        return 127;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return 127;
    clock_gettime(CLOCK_MONOTONIC, &b);
    char line[512];
    int n = snprintf(line, sizeof(line), "%s %s %.3f\n", verb, argv[argc - 1],
                     (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);
    int fd = open(LOG, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) {
        if (write(fd, line, (size_t)n) != n)
            fprintf(stderr, "runc-timer: cannot log to %s\n", LOG);
        close(fd);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
"""


def build_runc_timer(path, runc, log, gcc):
    source = path + ".c"
    with open(source, "w") as stream:
        stream.write(RUNC_TIMER_C)
    subprocess.run([gcc, "-O2", "-o", path, source, f'-DRUNC="{runc}"', f'-DLOG="{log}"'], check=True,
                   timeout=CMD_TIMEOUT)
    return path


def find_tool(name, package):
    path = shutil.which(name) or next(
        (os.path.join(d, name) for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
         if os.access(os.path.join(d, name), os.X_OK)), None)
    if path is None:
        raise LabError(f"{name} not found: apt-get install {package}")
    return path


def stop_process(process, timeout):
    """SIGTERM PROCESS (a Popen, or None), SIGKILL it after TIMEOUT seconds, and reap it."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def kill_processes_naming(text):
    """SIGKILL every other process whose command line holds TEXT (a lab's socket: its shims)."""
    marker = text.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as stream:
                cmdline = stream.read()
        except OSError:
            continue
        if marker in cmdline:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass
