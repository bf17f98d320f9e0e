/*
 * cdi-shim and cdi-shim-hook: the Python programs, started by a native launcher so that they
 * find their interpreter and packages relative to where they are installed (pylaunch.h) and run
 * isolated from the caller's environment; a hook in a spec runs them for every container start.
 * CDS_MODULE names the module whose main() runs.
 */
#include <stdio.h>

#include "pylaunch.h"

#ifndef CDS_MODULE
#error "CDS_MODULE (the module whose main() runs) must be defined by the build"
#endif

int main(int argc, char **argv)
{
    char message[8192];
    cds_exec_python(CDS_MODULE, argc, argv, message, sizeof(message));
    fprintf(stderr, "%s: %s\n", argc > 0 ? argv[0] : "cdi-shim", message);
    return 127;
}
