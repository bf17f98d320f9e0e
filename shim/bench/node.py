"""GPU against no-GPU pod start-up through a node's own containerd (`cdi-shim bench pods --endpoint`).

No lab, no checkout: the installed package, the node's CRI socket, and grpcio (the `bench` extra).
Each pod is RunPodSandbox -> CreateContainer -> StartContainer -> (the container exits) ->
StopPodSandbox -> RemovePodSandbox, a host-network pod with one container. "start-up" is
RunPodSandbox's call until StartContainer returns; "lifecycle" the whole sequence.

* A, the GPU pod: the device (default nvidia.com/gpu=0) requested on the given runtime handler
  (the one cdi-shim is registered under), or with --nri on the default handler, where the NRI
  plugin injects it. The request is a container annotation (cdi.k8s.io/cdi-shim-bench), the
  NVIDIA_VISIBLE_DEVICES env var, or the CRI CDIDevices field (containerd 1.7+ with enable_cdi).
* B, the pod without a device: the baseline handler (default: containerd's default runtime, what a
  pod without a runtimeClassName gets).

Pairs interleave the two and alternate which goes first, so drift hits both alike; ratios are
reported per pair (median of A_i/B_i) and of medians. Before the measured pairs, one pod a side
(the built-in image's probe) checks that A's container holds the device's first node and B's not.

Every pod carries the label cdi-shim.dev/bench=<run id>; at the end (and on any failure, and on
Ctrl-C) every pod of that label is stopped and removed, and the built-in image, if this run
imported it, is removed again.
"""
import os
import platform
import shutil
import statistics
import tempfile
import time
import uuid

from . import EXTRA, BenchError

LABEL = "cdi-shim.dev/bench"
ANNOTATION = "cdi.k8s.io/cdi-shim-bench"
REQUESTS = ("annotation", "env", "cdi-devices")
STEPS = ("runp", "create", "start", "wait", "stop", "remove")
METRICS = ("startup", "lifecycle") + STEPS
CHECK_RUNNING = ("is containerd running (systemctl status containerd), and is this its [grpc] address "
                 "(/etc/containerd/config.toml)?")


def endpoint_problem(socket):
    """One line naming the socket and what to check, where SOCKET is not a CRI socket we can
    open; None where it looks like one."""
    import stat

    hint = CHECK_RUNNING
    try:
        mode = os.stat(socket).st_mode
    except FileNotFoundError:
        return f"no CRI endpoint at {socket}: no such socket; {hint}"
    except OSError as err:
        return f"no CRI endpoint at {socket}: {err.strerror}; {hint}"
    if not stat.S_ISSOCK(mode):
        return f"no CRI endpoint at {socket}: not a socket; {hint}"
    if not os.access(socket, os.R_OK | os.W_OK):
        return f"CRI endpoint {socket}: permission denied (containerd's socket is root's: run as root)"
    return None


def device_node(device, spec_dirs=None):
    """The first device node path the node's CDI specs give DEVICE, or None (not resolvable here)."""
    from cdi.registry import Registry

    if spec_dirs is None:
        try:
            from shim.config import load_config

            spec_dirs = load_config().spec_dirs
        except Exception:       # the check is optional: an unreadable config only skips it
            return None
    try:
        blocks, _ = Registry(spec_dirs).resolve([device])
    except Exception:
        return None
    for block in reversed(blocks):   # the device's own edits first, then its spec's
        for node in block.get("deviceNodes") or ():
            if node.get("path"):
                return node["path"]
    return None


class NodeBench:
    """One run against one endpoint: the client, the pods it made, the image it imported."""

    def __init__(self, endpoint, timeout=60.0, log=print):
        from .cri import CRIClient, CRIError, CRIUnavailable, socket_path

        try:
            self.socket = socket_path(endpoint)
        except ValueError as err:
            raise BenchError(str(err)) from None
        problem = endpoint_problem(self.socket)
        if problem:
            raise BenchError(problem)
        try:
            self.client = CRIClient(self.socket, timeout=timeout)
        except CRIUnavailable as err:
            raise BenchError(f"cdi-shim bench pods --endpoint needs grpcio: {EXTRA} ({err})") from None
        self.CRIError = CRIError
        self.timeout, self.log = timeout, log
        self.run_id = uuid.uuid4().hex[:12]
        self.logs = tempfile.mkdtemp(prefix="cdi-shim-bench-logs-")
        self.made = 0
        self.imported = None
        try:
            self.version = self.client.version(timeout=10)
        except CRIError as err:
            self.close()
            check = (CHECK_RUNNING if err.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED") else
                     "is containerd's CRI plugin on? (disabled_plugins in config.toml must not name it)")
            said = err.details.rsplit("error: ", 1)[-1] if err.code == "UNAVAILABLE" else err.details
            raise BenchError(f"no CRI endpoint at {self.socket}: {err.code}: {said}; {check}") from None

    # -- the image --

    def use_image(self, image, ctr):
        """IMAGE where given (it must be on the node); else the built-in probe image, imported."""
        from .image import import_probe

        if image:
            if not self.client.image_status(image).image.id:
                raise BenchError(f"image {image} is not in containerd (namespace k8s.io): pull it first "
                                 "(crictl pull), or leave --image out to import the built-in one")
            return image
        reference = import_probe(ctr, self.socket)
        self.imported = reference
        try:
            self.client.wait_images([reference])
        except self.CRIError as err:
            raise BenchError(f"the imported image is not seen by the CRI plugin: {err}") from None
        return reference

    # -- one pod --

    def run_pod(self, handler, command, side, annotations=None, envs=None, cdi_devices=(), image=None,
                namespace="default"):
        """runp -> create -> start -> wait for exit -> stop -> remove; returns (times in ms, exit code, log)."""
        self.made += 1
        name = f"cdi-shim-bench-{side}-{self.made}"
        client = self.client
        log_dir = os.path.join(self.logs, name)
        os.makedirs(log_dir)
        labels = {LABEL: self.run_id}
        pod = client.pod_config(name, str(uuid.uuid4()), log_dir, namespace=namespace, labels=labels)
        container = client.container_config("main", image, command=command, envs=envs, annotations=annotations,
                                            log_path="main.log", cdi_devices=cdi_devices, labels=labels)
        clock = time.perf_counter
        times, pod_id, status = {}, None, None
        t0 = clock()
        try:
            pod_id = client.run_pod_sandbox(pod, handler)
            times["runp"] = clock() - t0
            t = clock()
            container_id = client.create_container(pod_id, container, pod)
            times["create"] = clock() - t
            t = clock()
            client.start_container(container_id)
            times["start"] = clock() - t
            times["startup"] = clock() - t0
            t = clock()
            status = client.wait_exited(container_id, timeout=self.timeout)
            times["wait"] = clock() - t
        except self.CRIError as err:
            raise BenchError(f"{side} pod on handler {handler or '(default)'}: {err}") from None
        finally:
            if pod_id:
                try:
                    t = clock()
                    client.stop_pod_sandbox(pod_id)
                    times["stop"] = clock() - t
                    t = clock()
                    client.remove_pod_sandbox(pod_id)
                    times["remove"] = clock() - t
                    times["lifecycle"] = clock() - t0
                except self.CRIError as err:      # clean() tries again at the end
                    raise BenchError(f"{side} pod {pod_id} not removed: {err}") from None
        from .cri import read_container_log

        output = read_container_log(os.path.join(log_dir, "main.log"))
        return {k: v * 1000 for k, v in times.items()}, status.exit_code, output

    # -- clean-up --

    def left(self):
        return self.client.list_pod_sandboxes(labels={LABEL: self.run_id})

    def clean(self):
        """Stop and remove every pod of this run still there; returns how many were left over."""
        left = 0
        try:
            sandboxes = self.left()
        except self.CRIError as err:
            self.log(f"warning: the run's pods (label {LABEL}={self.run_id}) not listed: {err}")
            return 0
        for sandbox in sandboxes:
            left += 1
            try:
                self.client.stop_pod_sandbox(sandbox.id)
                self.client.remove_pod_sandbox(sandbox.id)
            except self.CRIError as err:
                self.log(f"warning: pod {sandbox.metadata.name} ({sandbox.id}) not removed: {err}")
        if self.imported:
            try:
                self.client.remove_image(self.imported)
                self.imported = None
            except self.CRIError as err:
                self.log(f"warning: image {self.imported} not removed: {err}")
        return left

    def close(self):
        self.client.close()
        shutil.rmtree(self.logs, ignore_errors=True)


def _request(kind, device):
    if kind == "annotation":
        return {"annotations": {ANNOTATION: device}}
    if kind == "env":
        return {"envs": {"NVIDIA_VISIBLE_DEVICES": device.partition("=")[2] or device}}
    return {"cdi_devices": [device]}


def run(endpoint, handler=None, baseline_handler="", nri=False, image=None, command=None,
        device="nvidia.com/gpu=0", request="annotation", pairs=20, warmup=2, ctr="ctr", namespace="default",
        spec_dirs=None, log=print):
    """Measure; returns a JSON-able dict of every measurement (report() prints it)."""
    from .image import PROBE

    if handler is None and not nri:
        raise BenchError("give --handler NAME (the runtime handler cdi-shim is registered under, e.g. nvidia) "
                         "or --nri (the default handler, the device injected by cdi-shim's NRI plugin)")
    if request not in REQUESTS:
        raise BenchError(f"--request {request}: one of {', '.join(REQUESTS)}")
    gpu_handler = handler or ""
    bench = NodeBench(endpoint, log=log)
    try:
        result = {"meta": {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "endpoint": bench.socket, "pairs": pairs,
            "warmup": warmup, "runtime": f"{bench.version.runtime_name} {bench.version.runtime_version}",
            "kernel": platform.release(), "cpus": os.cpu_count(), "device": device, "request": request,
            "nri": nri, "A_handler": gpu_handler, "B_handler": baseline_handler, "namespace": namespace,
            "load_before": os.getloadavg()}}
        used = bench.use_image(image, ctr)
        argv = list(command) if command else ([] if image else [PROBE])
        result["meta"].update(image=used, image_imported=bench.imported is not None, command=argv)
        gpu = dict(_request(request, device), image=used, namespace=namespace)
        plain = dict(image=used, namespace=namespace)
        result["meta"]["check"] = _check(bench, gpu_handler, baseline_handler, gpu, plain, device, image,
                                         spec_dirs, log)
        samples = {"A": [], "B": []}
        log(f"{warmup} warm-up + {pairs} measured pairs: GPU pod ({device}, {request}) on handler "
            f"{gpu_handler or '(default)'} against a pod without it on {baseline_handler or '(default)'}")
        for index in range(warmup + pairs):
            order = [("A", gpu_handler, gpu), ("B", baseline_handler, plain)]
            if index % 2:
                order.reverse()
            for side, pod_handler, pod_args in order:
                times, code, output = bench.run_pod(pod_handler, argv, "gpu" if side == "A" else "plain", **pod_args)
                if code != 0:
                    raise BenchError(f"the {'GPU' if side == 'A' else 'plain'} pod's container exited {code}: "
                                     f"{' | '.join(output[-5:])}")
                if index >= warmup:
                    samples[side].append(times)
        result["A"], result["B"] = samples["A"], samples["B"]
        result["meta"]["load_after"] = os.getloadavg()
    except bench.CRIError as err:
        raise BenchError(str(err)) from None
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        raise
    finally:
        try:
            left = bench.clean()
            if left:
                log(f"removed {left} pod(s) the run left")
            remaining = len(bench.left())
        except bench.CRIError:
            remaining = None
        finally:
            bench.close()
    result["meta"].update(pods_made=bench.made, pods_left=remaining)
    return result


def _check(bench, gpu_handler, baseline_handler, gpu, plain, device, image, spec_dirs, log):
    """One probe pod a side, not measured: A must see the device's node, B should not."""
    if image:
        return {"checked": False, "why": "--image given (the probe is the built-in image's)"}
    path = device_node(device, spec_dirs)
    if path is None:
        return {"checked": False, "why": f"{device} has no device node in this node's CDI specs"}
    from .image import PROBE

    code, _ = bench.run_pod(gpu_handler, [PROBE, path], "check-gpu", **gpu)[1:]
    if code != 0:
        raise BenchError(f"the GPU pod does not see {path}: handler {gpu_handler or '(default)'} did not inject "
                         f"{device} (is cdi-shim its runtime, or its NRI plugin on and serving namespace "
                         f"{gpu['namespace']}? does the handler pass cdi.k8s.io/ container annotations?)")
    plain_code = bench.run_pod(baseline_handler, [PROBE, path], "check-plain", **plain)[1]
    found = {"checked": True, "node": path, "baseline_sees_it": plain_code == 0}
    if plain_code == 0:
        log(f"note: the pod without a device also sees {path} (handler {baseline_handler or '(default)'})")
    return found


def _median(values):
    return statistics.median(values) if values else float("nan")


def summarize(result):
    out = {}
    for metric in METRICS:
        xs = [s[metric] for s in result["A"] if metric in s]
        ys = [s[metric] for s in result["B"] if metric in s]
        ratios = [x / y for x, y in zip(xs, ys) if y > 0]
        out[metric] = {"A": _median(xs), "B": _median(ys),
                       "ratio_of_medians": _median(xs) / _median(ys) if ys and _median(ys) else float("nan"),
                       "paired_ratio": _median(ratios), "paired_min": min(ratios, default=float("nan")),
                       "paired_max": max(ratios, default=float("nan"))}
    return out


def report(result):
    meta = result["meta"]
    check = meta["check"]
    lines = [f"pod start-up on {meta['endpoint']} ({meta['runtime']}), {meta['pairs']} pairs interleaved "
             f"({meta['warmup']} warm-up), {meta['cpus']} CPUs, kernel {meta['kernel']}",
             f"  A = GPU pod: {meta['device']} by {meta['request']}, handler {meta['A_handler'] or '(default)'}"
             + (" (NRI)" if meta["nri"] else ""),
             f"  B = pod without a device, handler {meta['B_handler'] or '(default)'}",
             f"  image {meta['image']}" + (" (built-in, imported for the run and removed)"
                                           if meta["image_imported"] else "")
             + f", command {' '.join(meta['command']) or '(the image default)'}",
             ("  checked: A's container has " + check["node"] + ", B's "
              + ("has it too" if check["baseline_sees_it"] else "not")) if check["checked"]
             else f"  not checked that A's container has the device: {check['why']}",
             f"  {meta['pods_made']} pods made, {meta['pods_left']} left",
             "  metric          A median ms  B median ms  A/B medians  A/B paired (median)  [min .. max]"]
    summary = summarize(result)
    for metric in METRICS:
        m = summary[metric]
        label = {"startup": "start-up", "lifecycle": "lifecycle"}.get(metric, "  " + metric)
        lines.append(f"  {label:<15} {m['A']:>10.1f}  {m['B']:>11.1f}  {m['ratio_of_medians']:>10.3f}x"
                     f"  {m['paired_ratio']:>18.3f}x  [{m['paired_min']:.3f} .. {m['paired_max']:.3f}]")
    return "\n".join(lines) + "\n"


def plot(result, path):
    """Box plots of A's and B's start-up and lifecycle (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 5))
    for axis, metric in zip(axes, ("startup", "lifecycle")):
        axis.boxplot([[s[metric] for s in result[side]] for side in ("A", "B")])
        axis.set_xticks([1, 2])
        axis.set_xticklabels(["GPU pod", "no device"])
        axis.set_ylabel("ms")
        axis.set_title(metric)
    fig.suptitle(f"pod start-up on {result['meta']['endpoint']}, {result['meta']['pairs']} pairs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
