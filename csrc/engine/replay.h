/* The replay of a linker step a resident worker kept: see replay.c. The front end calls it for a
 * config someone else injected; a worker for the config it just injected itself. */
#ifndef CDI_SHIM_REPLAY_H
#define CDI_SHIM_REPLAY_H

#include <stddef.h>

/* 1 when the step kept in STEPS_DIR for the config JSON (LEN bytes) of BUNDLE was replayed and
 * BUNDLE/config.json rewritten (mode CONFIG_MODE); 0 when there is none, it is not of this
 * VERSION, it does not apply, or anything failed before config.json was replaced: the worker
 * does the step. */
int replay_step(const char *steps_dir, const char *bundle, const char *json, size_t len, unsigned config_mode,
                const char *version);

#endif
