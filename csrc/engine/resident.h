/* The resident process's protocol and limits, one definition for both ends: the front end
 * (csrc/frontend/runtime_main.c) compiles this header, the server (shim/runtime/resident.py)
 * reads the same values through shim._native. The protocol itself is described in resident.py. */
#ifndef CDI_SHIM_RESIDENT_H
#define CDI_SHIM_RESIDENT_H

enum {
    /* The request's magic is "CDSHIM" + this digit + NUL; a server declines ("F") any other. */
    CDS_RESIDENT_PROTOCOL = 3,
    /* How long a create waits for a worker to take its request up before it claims the
     * request back and runs the interpreter itself (every worker busy, or the server stuck). */
    CDS_RESIDENT_CLAIM_WAIT_MS = 1000,
    /* How long a create waits, from sending its request, for a worker's whole answer. A worker
     * still silent then is abandoned: the create falls back to the interpreter when that
     * worker has written nothing yet (its write permit is still there to take back), else it
     * fails. Above the linker step's own bound (LINKER_TIME_LIMIT, 10 s). */
    CDS_RESIDENT_ANSWER_WAIT_MS = 15000,
    /* A worker's bound on reading one request, as a whole (a legitimate front end sends it at
     * once), and on handing one answer over; a connection past it is closed. */
    CDS_RESIDENT_REQUEST_TIMEOUT_MS = 2000,
    /* The largest request a worker reads (header and body). */
    CDS_RESIDENT_MAX_REQUEST = 4194304,
    /* Connections a worker reads at once; past it, the oldest unfinished one is closed. */
    CDS_RESIDENT_MAX_PENDING = 128,
    /* The bytes of a create's messages (its stderr) a worker carries back in its answer;
     * more is cut with a note. */
    CDS_RESIDENT_MAX_MESSAGES = 65536,
    /* The largest answer the front end reads (status, messages, the argv to exec). */
    CDS_RESIDENT_MAX_ANSWER = 4325376
};

#endif
