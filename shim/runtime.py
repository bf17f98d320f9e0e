"""`cdi-shim-runtime`: placeholder until the runtime lands (issue 3) — execs runc unchanged."""
import os
import shutil
import sys


def main():
    runc = shutil.which("runc")
    if runc is None:
        sys.stderr.write("cdi-shim-runtime: runc not found on PATH (apt-get install runc)\n")
        return 127
    os.execv(runc, [runc] + sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
