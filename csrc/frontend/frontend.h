/* What the parts of the runtime front end (cdi-shim-runtime) share: see runtime_main.c. */
#ifndef CDI_SHIM_FRONTEND_H
#define CDI_SHIM_FRONTEND_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/un.h>

#ifndef CDS_VERSION
#define CDS_VERSION "unknown"
#endif

#define MAX_PREFIXES 16

struct settings {
    char runtime[4096];
    char device_env[256];
    char prefixes[MAX_PREFIXES][256];
    int n_prefixes;
    char socket[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* the resident process; "" = none */
    char log_file[4096]; /* our own log (log-file), and whether debug lines go to it (log-level) */
    int debug;
    int runc_binds; /* file-binds = "runc": no replay (a kept step's recipe binds them by our hook) */
    int understood; /* 0: let Python read the config file (and report its problems) */
    char *text;     /* the file's bytes (NULL: none), which a request's recipe is keyed by */
    size_t text_len;
};

/* settings.c: our config file, and whole small files. */
long read_file_mode(const char *path, size_t limit, char **out, mode_t *mode);
void load_settings(struct settings *set);

/* cmdline.c: runc's command line, parsed once (parse_line); the parts take what it found. */

/* What a create/run command line (argv from the command word on) says to us. */
struct create_line {
    const char *bundle;
    const char *pid_file; /* --pid-file's value, or NULL */
    const char *id;       /* the container id (past a "--"), or NULL */
    int has_device;       /* --device among the command's options: always Python */
    int help;             /* --help/-h: runc prints the command's help; no bundle is read */
    int end;              /* where the options end in argv (the container id, "--", or argc) */
    int run;              /* the command is run, not create */
    int runc_command;     /* where the command word is in the argv runc gets (our --device out) */
};

/* What the whole command line says to us. */
struct runc_line {
    int command;     /* the command word's index in argv; argc when there is none */
    int create;      /* create or run: CREATE holds its options */
    int has_device;  /* --device among runc's global options */
    int version;     /* --version/-v among them */
    int help;        /* runc prints its help (--help, no command, a bare `help`): ours first */
    const char *log; /* runc's --log file, or NULL */
    const char *log_format;
    struct create_line scan;
};

struct runc_line parse_line(int argc, char **argv);
void runc_argv(int argc, char **argv, const struct runc_line *line, char **out);
long device_values(char **argv, int command, int end, char *out, size_t cap);

#define MAX_CONFIG_JSON (64u << 20)

/* request_scan.c: whether a bundle's config.json holds anything for us. */
enum config_kind { NOTHING_FOR_US = 0, HOOKS_ONLY = 1, MAY_REQUEST = 2 };

enum config_kind config_kind(const char *bundle, const struct settings *set, char **json_out, long *len_out,
                             mode_t *mode);

/* runlog.c: our failures, info and debug lines, where runc's and the Python half's go. */
extern const char *log_path, *log_format;
void report(const char *message);
void debug_line(const struct settings *set, const char *message);
void info_line(const struct settings *set, const char *message);

/* passthrough.c: the programs we exec. CREATE: the create line whose device links may wait
 * (after_create.c), NULL for any other command and for help. */
int in_host_user_namespace(void);
int exec_runtime(const struct settings *set, char **argv_out, const struct create_line *create, const char *config,
                 long config_len);
int exec_python(int argc, char **argv);

/* after_create.c: exec RUNTIME with ARGV (runc's command line, ARGV[0] included), or, for a
 * create (CREATE: its line as parse_line found it, or NULL) whose config.json's device links can
 * wait (csrc/engine/devlinks.h), run it as a child and make the links in the created container;
 * the exit status for main, when it returns. CONFIG (CONFIG_LEN bytes): config.json's text when
 * the caller has it as it still is, else NULL (it is read here). */
int exec_runtime_at(const struct settings *set, const char *runtime, char **argv, const struct create_line *create,
                    const char *config, long config_len);

/* resident_client.c: create/run handed to the resident process. */
int try_resident(const struct settings *set, int argc, char **argv, const struct create_line *create);

#endif
