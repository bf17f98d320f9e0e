/* cdi-shim-nshook's nri subcommand (nrihook.c), started by its main (nshook.c). */
#ifndef CDI_SHIM_NRIHOOK_H
#define CDI_SHIM_NRIHOOK_H

/* `cdi-shim-nshook nri ...` (ARGV[1] is "nri"): the exit status. */
int cds_nri_hook(int argc, char **argv);

#endif
