"""runc's command line, as far as the wrapper needs to understand it.

runc (urfave/cli) takes global options, then a command, then that command's options, then
positional arguments. We find the command, the bundle, the log file and format, and take out
our own global option ``--device NAME``; everything else passes to runc unchanged.
"""
# runc's global options that take a value (runc 1.1: main.go); the rest are booleans.
GLOBAL_VALUE_OPTIONS = {"--root", "--log", "--log-format", "--criu", "--rootless"}
OWN_VALUE_OPTIONS = {"--device"}
# Options of create/run that take a value; the rest of theirs are booleans.
CREATE_VALUE_OPTIONS = {"--bundle", "-b", "--console-socket", "--pid-file", "--preserve-fds"}
INJECTING_COMMANDS = ("create", "run")


class ArgvError(Exception):
    pass


class RuncArgs:
    """What parse_runc_argv found. `runc_argv` is what runc gets: argv[1:] minus our options."""

    def __init__(self, runc_argv):
        self.runc_argv = runc_argv
        self.command = ""
        self.devices = []
        self.bundle = "."
        self.log_file = ""
        self.log_format = "text"
        self.debug = False
        self.container_id = ""


def _split(arg):
    """('--name', value or None) for '--name=value' / '-name=value' / '--name'."""
    name, sep, value = arg.partition("=")
    if name.startswith("-") and not name.startswith("--") and len(name) > 2:
        name = "-" + name  # urfave accepts -flag for --flag
    return name, (value if sep else None)


def parse_runc_argv(args):
    """Parse runc's argv (without argv[0]). Raises ArgvError for our own malformed options."""
    parsed = RuncArgs(runc_argv=[])
    index = 0
    while index < len(args):
        arg = args[index]
        if not arg.startswith("-") or arg == "-":
            break
        name, value = _split(arg)
        takes_value = name in GLOBAL_VALUE_OPTIONS or name in OWN_VALUE_OPTIONS
        if takes_value and value is None:
            if index + 1 >= len(args):
                raise ArgvError(f"option {name} needs a value")
            index += 1
            value = args[index]
        if name == "--device":
            parsed.devices.append(value)
        else:
            parsed.runc_argv.extend([arg] if value is None or "=" in arg else [arg, value])
            if name == "--log":
                parsed.log_file = value
            elif name == "--log-format":
                parsed.log_format = value
            elif name == "--debug" and (value is None or value.lower() == "true"):
                parsed.debug = True
        index += 1
    if index < len(args):
        parsed.command = args[index]
        rest = args[index + 1:]
        parsed.runc_argv.extend(args[index:])
        if parsed.command in INJECTING_COMMANDS:
            _parse_create_options(rest, parsed)
    return parsed


def _parse_create_options(rest, parsed):
    index = 0
    while index < len(rest):
        arg = rest[index]
        if not arg.startswith("-") or arg == "-":
            parsed.container_id = arg
            return
        if arg == "--":
            if index + 1 < len(rest):
                parsed.container_id = rest[index + 1]
            return
        name, value = _split(arg)
        if name in CREATE_VALUE_OPTIONS and value is None:
            index += 1
            value = rest[index] if index < len(rest) else ""
        if name in ("--bundle", "-b", "--b"):
            parsed.bundle = value
        index += 1
