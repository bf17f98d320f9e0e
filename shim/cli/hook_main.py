"""`cdi-shim-hook`: the OCI hooks of `cdi-shim hook ...` with a start-up fit for every
container start.

runc runs a createContainer hook for every container, so its start is part of the
container's. `cdi-shim hook` goes through the console script (site processing, click and
the whole command line: longer than the work); `cdi-shim-hook` is a script the build writes with
`python -IS` in its first line and the import paths compiled in (no environment read,
no site), and parses its few options itself:

    cdi-shim-hook update-ldcache [--folder DIR]... [--ldconfig-path PATH]
    cdi-shim-hook create-symlinks [--link TARGET::LINK]...
    cdi-shim-hook nri [--link TARGET::LINK]... [--chmod MODE:PATH]... [--folder DIR]...

Anything else (-h/--help, an unknown option) goes to the click group behind `cdi-shim hook`,
which explains; --version is answered here, as `cdi-shim --version` words it. click is imported
only for those.
Errors print "Error: ..." on stderr and exit 1, as click does.
"""
import sys

# option -> (the function's keyword, repeatable)
_COMMANDS = {
    "update-ldcache": {"--folder": "folders", "--ldconfig-path": None},
    "create-symlinks": {"--link": "links"},
}


class _Unparsed(Exception):
    """Not something this parser knows: let click handle it."""


def parse(argv):
    """(command, {keyword: [values]}) of ARGV (without the program name)."""
    if not argv or argv[0] not in _COMMANDS:
        raise _Unparsed()
    options = _COMMANDS[argv[0]]
    values = {key: [] for key in options.values() if key}
    args = argv[1:]
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name not in options:
            raise _Unparsed()
        if not eq:
            if i + 1 >= len(args):
                raise _Unparsed()
            i += 1
            value = args[i]
        key = options[name]
        if key:
            values[key].append(value)
        i += 1
    return argv[0], values


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["nri"]:      # the one hook of an NRI adjustment (shim/nri/hook.py)
        from ..nri.hook import main as nri_hook

        return nri_hook(argv[1:])
    try:
        command, values = parse(argv)
    except _Unparsed:
        if argv == ["--version"]:
            from cdi import __version__

            sys.stdout.write(f"cdi-shim-hook, version {__version__}\n")
            return 0
        from .hook import hook

        return hook(argv, prog_name="cdi-shim-hook", help_option_names=["-h", "--help"])
    from ..linker.hooks import MAX_STATE, run

    error = run(command, values, sys.stdin.buffer.read(MAX_STATE))
    if error:
        sys.stderr.write(f"Error: {error}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
