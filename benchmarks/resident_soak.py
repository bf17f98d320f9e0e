"""Soak of the resident process (`cdi-shim runtime serve`) under load, with real runc.

Loops of `cdi-shim-runtime create` + `runc delete` of a bundle requesting one (fake) CDI device,
through a resident server with two workers, under each load in turn:

  parallel-N    N loops at once (2, 8, 16)
  kill-worker   4 loops; a worker gets SIGKILL every 0.25 s
  kill-server   4 loops; the server gets SIGKILL a few times and is started again after 0.5 s
                (as systemd's Restart=always does)
  stop-worker   4 loops; a worker is stopped (SIGSTOP) for longer than the front end's answer
                bound, then resumed
  hostile       4 loops; meanwhile garbage, oversized lengths, 200 half-open connections and
                byte-at-a-time senders
  enospc        2 loops whose bundles are on a full tmpfs: every create fails writing config.json
  version       2 loops through a front end built saying another version (the server declines)

Reported per load: creates attempted and failed, torn configs (a config.json that is neither the
original nor a whole injected config), leftover files of ours in failed bundles, and p50/p99
create time (ms); and for the run: descriptors of the server and its workers, and leftover
processes (runc init, workers of servers killed) and containers.

    .venv/bin/python benchmarks/resident_soak.py [--creates 300] [--long] [--dir /run]

The default size takes a few minutes on a 2-core machine; --long is the outside soak's size
(about 32,000 creates). Run as root (runc). Figures on a shared machine are noisy.
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.path.dirname(sys.executable)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Soak:
    def __init__(self, base):
        self.base = base
        self.state = os.path.join(base, "state")
        self.socket = os.path.join(base, "run", "runtime.sock")
        specs = os.path.join(base, "specs")
        os.makedirs(specs)
        node = os.path.join(base, "nvidia0")
        os.mknod(node, 0o666 | 0o020000, os.makedev(195, 0))
        with open(os.path.join(specs, "nvidia.yaml"), "w") as out:
            out.write(f'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n  - name: "0"\n'
                      f"    containerEdits:\n      env: [GPU=0]\n"
                      f"      deviceNodes: [{{path: /dev/nvidia0, hostPath: {node}}}]\n")
        settings = os.path.join(base, "config.toml")
        with open(settings, "w") as out:
            out.write(f'spec-dirs = ["{specs}"]\nresident-socket = "{self.socket}"\n')
        self.env = dict(os.environ, CDI_SHIM_CONFIG=settings, CDI_SHIM_CACHE_DIR=os.path.join(base, "cache"))
        self.rootfs = os.path.join(base, "rootfs")
        os.makedirs(os.path.join(self.rootfs, "bin"))
        shutil.copy(shutil.which("busybox") or "/bin/busybox", os.path.join(self.rootfs, "bin", "busybox"))
        os.symlink("busybox", os.path.join(self.rootfs, "bin", "sh"))
        spec = subprocess.run(["runc", "spec"], cwd=base, check=True)
        del spec
        with open(os.path.join(base, "config.json")) as src:
            config = json.load(src)
        os.unlink(os.path.join(base, "config.json"))
        config["process"]["terminal"] = False
        config["process"]["args"] = ["sh", "-c", "sleep 1000"]
        config["root"] = {"path": self.rootfs, "readonly": True}
        config["annotations"] = {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}
        self.original = json.dumps(config).encode()
        self.server = None
        self.server_log = open(os.path.join(base, "serve.log"), "ab")
        self.counter = 0
        self.lock = threading.Lock()

    # -- the server --

    def start_server(self):
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self.server = subprocess.Popen([os.path.join(BIN, "cdi-shim"), "runtime", "serve", "--socket", self.socket],
                                       env=self.env, stdout=self.server_log, stderr=self.server_log,
                                       start_new_session=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(self.socket) or len(self.workers()) < 2:
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("cdi-shim runtime serve did not start")
            time.sleep(0.02)

    def workers(self):
        try:
            with open(f"/proc/{self.server.pid}/task/{self.server.pid}/children") as f:
                return [int(pid) for pid in f.read().split()]
        except OSError:
            return []

    def fds(self):
        """Open descriptors of the server, and of each worker (sorted)."""
        def count(pid):
            try:
                return len(os.listdir(f"/proc/{pid}/fd"))
            except OSError:
                return None
        return {"server": count(self.server.pid), "workers": sorted(filter(None, map(count, self.workers())))}

    # -- creates --

    def bundle(self, parent=None):
        """(container id, bundle path) of a new bundle in PARENT (default: bundles/)."""
        with self.lock:
            self.counter += 1
            name = f"soak{self.counter}"
        path = os.path.join(parent or os.path.join(self.base, "bundles"), name)
        os.makedirs(path)
        with open(os.path.join(path, "config.json"), "wb") as out:
            out.write(self.original)
        return name, path

    def create(self, runtime, name, path):
        """(ms, ok) of one create; the container is deleted."""
        start = time.perf_counter()
        result = subprocess.run([runtime, "--root", self.state, "create", "--bundle", path, name], env=self.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                timeout=300)   # (runc init keeps the create's stdio: no pipe here)
        took = (time.perf_counter() - start) * 1000
        subprocess.run(["runc", "--root", self.state, "delete", "--force", name], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return took, result.returncode == 0

    def check(self, path, ok):
        """'torn', 'leftover' or None for the bundle at PATH after a create that succeeded (OK) or not."""
        data = open(os.path.join(path, "config.json"), "rb").read()
        if data != self.original:
            try:
                config = json.loads(data)
                injected = any(d.get("path") == "/dev/nvidia0" for d in config["linux"].get("devices") or ())
            except (ValueError, KeyError, TypeError):
                return "torn"
            if not injected:
                return "torn"
        ours = [n for n in os.listdir(path) if n != "config.json"]
        return "leftover" if ours and not ok else None

    def loops(self, label, n_loops, creates, runtime=None, bundles=None, during=None):
        """N_LOOPS loops doing CREATES creates in all, of fresh bundles (removed after each) or of
        BUNDLES, a list of (name, path) made beforehand (kept)."""
        runtime = runtime or os.path.join(BIN, "cdi-shim-runtime")
        times, outcome = [], {"attempted": 0, "failed": 0, "torn": 0, "leftover": 0}
        left = [creates]
        stop = threading.Event()

        def loop():
            while True:
                with self.lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                    made = bundles.pop() if bundles else None
                name, path = made or self.bundle()
                try:
                    took, ok = self.create(runtime, name, path)
                except subprocess.TimeoutExpired:
                    took, ok = 300_000, False
                problem = self.check(path, ok)
                with self.lock:
                    outcome["attempted"] += 1
                    outcome["failed"] += not ok
                    if problem:
                        outcome[problem] += 1
                    times.append(took)
                if not made:
                    shutil.rmtree(path, ignore_errors=True)

        helper = threading.Thread(target=during, args=(stop,)) if during else None
        threads = [threading.Thread(target=loop) for _ in range(n_loops)]
        if helper:
            helper.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        if helper:
            helper.join()
        times.sort()
        outcome.update(load=label, loops=n_loops,
                       p50_ms=round(statistics.median(times), 1) if times else None,
                       p99_ms=round(times[min(len(times) - 1, int(len(times) * 0.99))], 1) if times else None)
        print(json.dumps(outcome), file=sys.stderr, flush=True)
        return outcome


# -- the loads' disturbances --

def kill_workers(soak, every, counter):
    def during(stop):
        while not stop.wait(every):
            workers = soak.workers()
            if workers:
                try:
                    os.kill(random.choice(workers), signal.SIGKILL)
                    counter[0] += 1
                except ProcessLookupError:
                    pass
    return during


def kill_server(soak, times, counter):
    def during(stop):
        gap = 0.8
        while counter[0] < times and not stop.wait(gap):
            soak.server.kill()
            soak.server.wait()
            counter[0] += 1
            time.sleep(0.5)
            soak.start_server()
    return during


def stop_worker(soak, seconds, counter):
    def during(stop):
        if stop.wait(1.0):
            return
        workers = soak.workers()
        if workers:
            os.kill(workers[0], signal.SIGSTOP)
            counter[0] += 1
            stop.wait(seconds)
            os.kill(workers[0], signal.SIGCONT)
    return during


def hostile(soak, counter):
    from shim.runtime.resident import MAGIC

    def during(stop):
        held = []
        while not stop.wait(0.2):
            for _ in range(10):
                try:
                    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    conn.connect(soak.socket)
                    kind = counter[0] % 4
                    if kind == 0:
                        conn.send(os.urandom(64))
                    elif kind == 1:
                        conn.send(MAGIC + struct.pack("<I", 0xFFFFFFF0))
                    elif kind == 2:
                        conn.send(MAGIC[:3])
                    held.append(conn)
                    counter[0] += 1
                except OSError:
                    pass
            while len(held) > 200:
                held.pop(0).close()
            for conn in held[-3:]:
                try:
                    conn.send(b"x")     # byte-at-a-time senders
                except OSError:
                    pass
        for conn in held:
            conn.close()
    return during


def other_version_front_end(base):
    sys.path.insert(0, os.path.join(ROOT, "csrc"))
    import programs

    path = os.path.join(BIN, f".cdi-shim-runtime-soak-{os.getpid()}")
    programs.build("cdi-shim-runtime", ROOT, path, "0.0.0-soak")
    return path


def leftover_processes(soak, old_workers):
    runc_inits = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        try:
            if cmdline.startswith(b"runc\0init") and soak.base.encode() in open(f"/proc/{pid}/environ", "rb").read():
                runc_inits += 1
        except OSError:
            pass
    alive = [pid for pid in old_workers if os.path.exists(f"/proc/{pid}") and
             not open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z")]
    listed = subprocess.run(["runc", "--root", soak.state, "list", "-q"], capture_output=True, text=True).stdout.split()
    return {"runc_init": runc_inits, "orphaned_workers": len(alive), "containers_left": len(listed)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=300, help="creates per load (default 300)")
    parser.add_argument("--long", action="store_true", help="the outside soak's size: 2,000 creates per load")
    parser.add_argument("--dir", default="/run", help="where bundles live (tmpfs, as containerd's)")
    args = parser.parse_args()
    n = 2000 if args.long else args.creates
    base = tempfile.mkdtemp(prefix="cdi-shim-soak.", dir=args.dir)
    soak = Soak(base)
    os.makedirs(os.path.join(base, "bundles"))
    small = os.path.join(base, "small")
    os.makedirs(small)
    results, events, other = [], {}, None
    seen_workers = set()
    try:
        soak.start_server()
        soak.loops("warm-up", 2, 10)
        fds_before = soak.fds()
        for loops in (2, 8, 16):
            results.append(soak.loops(f"parallel-{loops}", loops, n))
        seen_workers.update(soak.workers())
        events["worker_kills"] = [0]
        results.append(soak.loops("kill-worker", 4, n, during=kill_workers(soak, 0.25, events["worker_kills"])))
        seen_workers.update(soak.workers())
        events["server_kills"] = [0]
        results.append(soak.loops("kill-server", 4, max(n, 300), during=kill_server(soak, 5, events["server_kills"])))
        seen_workers.update(soak.workers())
        events["worker_stops"] = [0]
        results.append(soak.loops("stop-worker", 4, max(n, 600), during=stop_worker(soak, 20, events["worker_stops"])))
        events["hostile_connections"] = [0]
        results.append(soak.loops("hostile", 4, n, during=hostile(soak, events["hostile_connections"])))
        # bundles on a tmpfs, which is then filled: every config.json replacement fails
        m = max(n // 3, 30)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={m * 16 + 64}k", "tmpfs", small], check=True)
        full = [soak.bundle(small) for _ in range(m)]
        with open(os.path.join(small, "filler"), "wb", buffering=0) as out:
            try:
                while True:
                    out.write(b"\0" * 4096)
            except OSError:
                pass
        results.append(soak.loops("enospc", 2, m, bundles=full))
        other = other_version_front_end(base)
        results.append(soak.loops("version", 2, max(n // 3, 30), runtime=other))
        fds_after = soak.fds()
        with open(os.path.join(base, "serve.log")) as f:
            log = f.read()
        declined = log.count("front end of version 0.0.0-soak")
        summary = {
            "creates_attempted": sum(r["attempted"] for r in results),
            "creates_failed": sum(r["failed"] for r in results),
            "torn_configs": sum(r["torn"] for r in results),
            "leftover_files": sum(r["leftover"] for r in results),
            "fds_before": fds_before,
            "fds_after": fds_after,
            "events": {k: v[0] for k, v in events.items()},
            "version_declines_logged": declined,
            "loads": results,
        }
        soak.server.terminate()
        soak.server.wait(timeout=60)
        time.sleep(0.5)
        summary["leftover_processes"] = leftover_processes(soak, seen_workers)
        print(json.dumps(summary, indent=1))
    finally:
        if soak.server and soak.server.poll() is None:
            soak.server.kill()
        subprocess.run(["umount", small], stderr=subprocess.DEVNULL)
        if other and os.path.exists(other):
            os.unlink(other)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
