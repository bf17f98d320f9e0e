/*
 * Starting the Python half from a native program, relative to where the program is installed.
 *
 * The programs live in the bin/ folder of a Python prefix (a venv, or the node tree under
 * /opt/cdi-shim/releases/R): the interpreter is bin/python3 beside them and the packages are in
 * lib/pythonX.Y/site-packages. Nothing about the build machine is compiled in, so a wheel built
 * anywhere works wherever it is installed, and a process started through a link (the node's
 * `current`) stays on the release it started from.
 */
#ifndef CDS_PYLAUNCH_H
#define CDS_PYLAUNCH_H

#include <stddef.h>

/* Exec `python3 -I -S` of this program's prefix running MODULE's main() with ARGV[1:] as its
 * arguments and ARGV[0] as its name. Returns only on failure: -1, with a one-line reason in
 * MESSAGE. */
int cds_exec_python(const char *module, int argc, char **argv, char *message, size_t size);

#endif
