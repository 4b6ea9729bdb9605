/*
 * agentos.h: the AgentOS kernel's C client (libagentos).
 *
 * Link with -lagentos (libagentos.so or libagentos.a). Every request is
 * one frame of the AgentOS protocol (see docs/protocol.md); replies are
 * the kernel's payloads, JSON for every opcode but NOOP.
 *
 * Memory: every reply and string the library returns is allocated by it,
 * NUL-terminated, and released by the caller with agentos_free().
 * Errors: a function returns a negative agentos_status (or NULL), and
 * agentos_last_error() says why, for the calling thread.
 * Threads: a client is locked inside; threads may share one, and their
 * calls take turns. For calls in parallel, connect once per thread.
 *
 *     agentos_client *client = agentos_connect(NULL);
 *     if (!client) { fprintf(stderr, "%s\n", agentos_last_error()); return 1; }
 *     char *hello = agentos_hello(client, "");
 *     puts(hello);
 *     agentos_free(hello);
 *     agentos_close(client);
 */
#ifndef AGENTOS_H
#define AGENTOS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A connection to the kernel. */
typedef struct agentos_client agentos_client;

/* What a call came to: 0, or why it failed (see agentos_last_error()). */
typedef enum agentos_status {
    AGENTOS_OK = 0,
    AGENTOS_ERR_ARGUMENT = -1, /* a NULL or unusable argument */
    AGENTOS_ERR_CONNECT = -2,  /* the socket could not be reached */
    AGENTOS_ERR_IO = -3,       /* reading or writing the socket failed, or it closed */
    AGENTOS_ERR_PROTOCOL = -4, /* the reply was not valid protocol */
    AGENTOS_ERR_MEMORY = -5,   /* memory could not be allocated */
    AGENTOS_ERR_BROKEN = -6    /* the connection failed earlier: connect again */
} agentos_status;

/* The protocol's opcodes. */
enum {
    AGENTOS_NOOP = 0x00,
    AGENTOS_THINK = 0x01,
    AGENTOS_EXEC = 0x02,
    AGENTOS_TOOL = 0x05,
    AGENTOS_SPAWN = 0x10,
    AGENTOS_KILL = 0x11,
    AGENTOS_LIST = 0x12,
    AGENTOS_TASK = 0x13,
    AGENTOS_LOGS = 0x16,
    AGENTOS_HELLO = 0xFE,
    AGENTOS_EXIT = 0xFF
};

/* Connects to the kernel at socket_path; NULL: where every AgentOS client
 * looks ($AGENTOS_SOCKET, the system socket as root, else the user's).
 * NULL on failure: see agentos_last_error(). */
agentos_client *agentos_connect(const char *socket_path);

/* Closes a connection (NULL is ignored). */
void agentos_close(agentos_client *client);

/* Sends one request and waits for its reply: *reply (NUL-terminated;
 * release it with agentos_free) and *reply_len (without the NUL).
 * Returns 0 or a negative agentos_status. */
int agentos_call(agentos_client *client, uint8_t opcode,
                 const void *payload, size_t payload_len,
                 uint8_t **reply, size_t *reply_len);

/* Releases a reply or string the library returned (NULL is ignored). */
void agentos_free(void *reply);

/* The calling thread's last error, as a sentence ("" if none); valid until
 * the thread's next call into the library. */
const char *agentos_last_error(void);

/* One request per opcode: `request` is the payload (NULL: empty); the
 * reply is returned as a string to release with agentos_free, or NULL
 * with agentos_last_error() set. A reply with "success": false is still a
 * reply: the kernel's "error" and "code" say why. */
char *agentos_hello(agentos_client *client, const char *request); /* "" or "{}" */
char *agentos_noop(agentos_client *client, const char *request);  /* echoed */
char *agentos_think(agentos_client *client, const char *request); /* a prompt, or THINK's JSON */
char *agentos_exec(agentos_client *client, const char *request);  /* {"code": "print(1)"} */
char *agentos_tool(agentos_client *client, const char *request);  /* {"op": "list"} */
char *agentos_spawn(agentos_client *client, const char *request); /* SPAWN's JSON */
char *agentos_kill(agentos_client *client, const char *request);  /* {"name": "worker"} */
char *agentos_list(agentos_client *client, const char *request);  /* "" or "{}" */
char *agentos_task(agentos_client *client, const char *request);  /* {"op": "list"} */
char *agentos_logs(agentos_client *client, const char *request);  /* {"name": "worker", "lines": 20} */

#ifdef __cplusplus
}
#endif

#endif /* AGENTOS_H */
