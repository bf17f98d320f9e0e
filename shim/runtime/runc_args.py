"""runc's command line, as far as the wrapper needs to understand it.

runc (urfave/cli) takes global options, then a command, then that command's options, then
positional arguments. We find the command, the bundle, the log file and format, whether help
was asked for, and take out our own option ``--device NAME`` (a global option, or one of
create's and run's); everything else passes to runc unchanged.
"""
# runc's global options that take a value (runc 1.1: main.go); the rest are booleans.
GLOBAL_VALUE_OPTIONS = {"--root", "--log", "--log-format", "--criu", "--rootless"}
# Options of create/run that take a value; the rest of theirs are booleans.
CREATE_VALUE_OPTIONS = {"--bundle", "-b", "--console-socket", "--pid-file", "--preserve-fds"}
INJECTING_COMMANDS = ("create", "run")
HELP_OPTIONS = {"--help", "-h", "--h"}
HELP_COMMANDS = ("help", "h")
DEVICE_OPTION = "--device"   # ours: a CDI device to inject, taken out of what runc gets


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
        self.help = False  # runc prints help (of the command, or its own): nothing to prepare


def _split(arg):
    """('--name', value or None) for '--name=value' / '-name=value' / '--name'."""
    name, sep, value = arg.partition("=")
    if name.startswith("-") and not name.startswith("--") and len(name) > 2:
        name = "-" + name  # urfave accepts -flag for --flag
    return name, (value if sep else None)


def _take_device(args, index, value, parsed):
    """Take the --device at args[index] (VALUE: what followed "=", or None) into parsed.devices.
    Returns (the index of its last word, whether it had no value). A device name never starts
    with "-": `--device --help` asks for help, not for a device called "--help"."""
    if value is None and index + 1 < len(args) and not args[index + 1].startswith("-"):
        index += 1
        value = args[index]
    if value is not None:
        parsed.devices.append(value)
    return index, value is None


def parse_runc_argv(args):
    """Parse runc's argv (without argv[0]). Raises ArgvError for our own malformed options."""
    parsed = RuncArgs(runc_argv=[])
    missing = False
    index = 0
    while index < len(args):
        arg = args[index]
        if not arg.startswith("-") or arg == "-":
            break
        name, value = _split(arg)
        if name == DEVICE_OPTION:
            index, no_value = _take_device(args, index, value, parsed)
            missing |= no_value
            index += 1
            continue
        if name in GLOBAL_VALUE_OPTIONS and value is None:
            if index + 1 >= len(args):
                raise ArgvError(f"option {name} needs a value")
            index += 1
            value = args[index]
        parsed.runc_argv.extend([arg] if value is None or "=" in arg else [arg, value])
        if name == "--log":
            parsed.log_file = value
        elif name == "--log-format":
            parsed.log_format = value
        elif name == "--debug" and (value is None or value.lower() == "true"):
            parsed.debug = True
        elif name in HELP_OPTIONS:
            parsed.help = True
        index += 1
    if index < len(args):
        parsed.command = args[index]
        rest = args[index + 1:]
        parsed.runc_argv.append(parsed.command)
        if parsed.command in INJECTING_COMMANDS:
            missing |= _parse_create_options(rest, parsed)
        else:
            parsed.runc_argv.extend(rest)
            parsed.help |= parsed.command in HELP_COMMANDS and not rest
    else:
        parsed.help = not any(arg in ("--version", "-v") for arg in parsed.runc_argv)
    if missing and not parsed.help:
        raise ArgvError("option --device needs a value: a CDI device name, vendor.com/class=name")
    return parsed


def _parse_create_options(rest, parsed):
    """Parse create's/run's options into `parsed` (our --device taken out); True when a --device
    had no value."""
    missing = False
    index = 0
    while index < len(rest):
        arg = rest[index]
        if not arg.startswith("-") or arg == "-":
            parsed.container_id = arg
            # runc (urfave/cli) also takes its options after the container id
            after = rest[index:]
            after = after[:after.index("--")] if "--" in after else after
            parsed.help |= any(word in HELP_OPTIONS or word == "-help" for word in after)
            break
        if arg == "--":
            if index + 1 < len(rest):
                parsed.container_id = rest[index + 1]
            break
        name, value = _split(arg)
        if name == DEVICE_OPTION:
            index, no_value = _take_device(rest, index, value, parsed)
            missing |= no_value
            index += 1
            continue
        parsed.runc_argv.append(arg)
        if name in CREATE_VALUE_OPTIONS and value is None:
            index += 1
            value = rest[index] if index < len(rest) else ""
            parsed.runc_argv.extend(rest[index:index + 1])
        if name in ("--bundle", "-b", "--b"):
            parsed.bundle = value
        elif name in HELP_OPTIONS:
            parsed.help = True
        index += 1
    parsed.runc_argv.extend(rest[index:])
    return missing
