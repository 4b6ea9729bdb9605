/* A C client of the AgentOS kernel through libagentos: HELLO, NOOP, LIST,
 * THINK, EXEC, TOOL and TASK; an agent SPAWNed, its LOGS followed until it
 * has spoken, and KILLed. Build and run:
 *
 *     cc examples/c/hello.c -Isdk-c/include -Ltarget/release -lagentos -o hello
 *     LD_LIBRARY_PATH=target/release ./hello [SOCKET]
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "agentos.h"

static int show(const char *what, char *reply) {
    if (!reply) {
        fprintf(stderr, "%s failed: %s\n", what, agentos_last_error());
        return 1;
    }
    printf("%s: %s\n", what, reply);
    agentos_free(reply);
    return 0;
}

int main(int argc, char **argv) {
    agentos_client *client = agentos_connect(argc > 1 ? argv[1] : NULL);
    if (!client) {
        fprintf(stderr, "cannot connect: %s\n", agentos_last_error());
        return 1;
    }
    int failed = 0;
    failed |= show("hello", agentos_hello(client, ""));
    failed |= show("noop", agentos_noop(client, "ping"));
    failed |= show("list", agentos_list(client, ""));
    failed |= show("think", agentos_think(client, "What is 2+2?"));
    failed |= show("exec", agentos_exec(client, "{\"code\": \"print(6 * 7)\"}"));
    failed |= show("tool", agentos_tool(client, "{\"op\": \"list\"}"));
    failed |= show("task", agentos_task(client, "{\"op\": \"list\"}"));

    /* An agent of our own: its first words come through LOGS, which waits
     * for them (follow from the log's start), then it is stopped. */
    char request[512];
    snprintf(request, sizeof request,
             "{\"name\": \"c-example-%d\", \"command\": [\"/bin/sh\", \"-c\", "
             "\"echo hello from the C example; sleep 60\"]}",
             (int)getpid());
    failed |= show("spawn", agentos_spawn(client, request));
    snprintf(request, sizeof request,
             "{\"name\": \"c-example-%d\", \"after\": 0, \"follow\": true, \"wait_ms\": 10000}",
             (int)getpid());
    failed |= show("logs", agentos_logs(client, request));
    snprintf(request, sizeof request, "{\"name\": \"c-example-%d\", \"grace_ms\": 0}",
             (int)getpid());
    failed |= show("kill", agentos_kill(client, request));

    /* The raw call, with a binary-safe payload. */
    uint8_t *reply = NULL;
    size_t reply_len = 0;
    const char payload[] = {'a', 0, 'b'};
    int status = agentos_call(client, AGENTOS_NOOP, payload, sizeof payload, &reply, &reply_len);
    if (status != AGENTOS_OK || reply_len != 3 || memcmp(reply, payload, 3) != 0) {
        fprintf(stderr, "raw noop failed (%d): %s\n", status, agentos_last_error());
        failed = 1;
    } else {
        printf("raw noop: %zu bytes back\n", reply_len);
    }
    agentos_free(reply);
    agentos_close(client);

    /* A kernel that is not there is an error, not a crash. */
    if (agentos_connect("/nonexistent/agentos.sock") != NULL || strlen(agentos_last_error()) == 0) {
        fprintf(stderr, "connecting to nothing did not fail\n");
        failed = 1;
    }
    return failed;
}
