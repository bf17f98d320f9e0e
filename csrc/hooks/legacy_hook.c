/*
 * nvidia-container-runtime-hook, as cdi-shim ships it: a program of this name on dockerd's PATH is
 * what makes `docker run --gpus` available (moby's daemon/nvidia_linux.go registers its "nvidia"
 * device driver only when it finds one). The daemon then adds it as a prestart hook and sets
 * NVIDIA_VISIBLE_DEVICES; cdi-shim-runtime turns both into CDI requests and drops the hook, so
 * this program never runs under it. Anything else that runs it (plain runc, because the container
 * was started without --runtime=cdi-shim; or a person) gets a failure that says what to do
 * instead: a container that asked for a GPU must not start silently without one.
 */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-v") == 0)) {
        printf("nvidia-container-runtime-hook version %s\ncdi-shim's stand-in for the NVIDIA Container Toolkit's "
               "hook, so that dockerd offers docker run --gpus; cdi-shim-runtime does its work\n",
               CDS_VERSION);
        return 0;
    }
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: nvidia-container-runtime-hook prestart (run by runc; under cdi-shim-runtime never)\n"
               "cdi-shim's stand-in for the NVIDIA Container Toolkit's hook: with it on dockerd's PATH, "
               "docker run --gpus is offered, and cdi-shim-runtime turns the request into CDI devices and "
               "drops this hook. Run by any other runtime it fails, saying to select cdi-shim.\n");
        return 0;
    }
    fprintf(stderr,
            "nvidia-container-runtime-hook (cdi-shim): this container asked for GPUs (docker run --gpus), "
            "but its runtime is not cdi-shim, so nothing would inject them. Run it with --runtime=cdi-shim, or "
            "make cdi-shim dockerd's default runtime (cdi-shim runtime configure --runtime=docker "
            "--set-as-default), then restart the container.\n");
    return 1;
}
