/* The front end's replay of a linker step a resident worker kept: see replay.c. */
#ifndef CDI_SHIM_REPLAY_H
#define CDI_SHIM_REPLAY_H

#include <stddef.h>
#include <sys/types.h>

/* 1 when the step kept in STEPS_DIR for the config JSON (LEN bytes) of BUNDLE was replayed and
 * BUNDLE/config.json rewritten (CONFIG_MODE); 0 when there is none, it does not apply, or
 * anything failed before config.json was replaced: the worker does the step. */
int replay_step(const char *steps_dir, const char *bundle, const char *json, size_t len, mode_t config_mode);

#endif
