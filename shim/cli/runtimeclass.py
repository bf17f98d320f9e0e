"""`cdi-shim runtimeclass`: the RuntimeClass that selects the runtime."""
import click

from .common import fail as _fail


@click.command()
@click.option("--name", default="nvidia", show_default=True, help="metadata.name of the RuntimeClass.")
@click.option("--handler", default="nvidia", show_default=True,
              help="The containerd runtime name (`runtime configure --runtime-name`).")
@click.option("--example-pod", is_flag=True, help="Also print an example Pod that uses it with a GPU limit.")
@click.option("--config", "containerd_config", metavar="PATH",
              help="containerd config to check the handler against (its imports included).")
def runtimeclass(name, handler, example_pod, containerd_config):
    """Print a RuntimeClass (node.k8s.io/v1) selecting the cdi-shim runtime.

    With --config, a handler that names no configured runtime is refused with the error every pod
    using it would meet: no runtime for "<handler>" is configured.
    """
    from ..node.runtimeclass import RuntimeClassError, check_handler, check_names, render

    try:
        check_names(name, handler)
        if containerd_config:
            check_handler(handler, containerd_config)
    except RuntimeClassError as err:
        _fail(str(err))
    click.echo(render(name, handler, with_example_pod=example_pod), nl=False)
