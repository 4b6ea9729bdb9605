/* NOOP round trips through libagentos, as a C program uses it: one
 * connection, `warmup` untimed calls, then `count` calls each timed with
 * CLOCK_MONOTONIC around agentos_call alone (the reply is checked and
 * released outside the timed span). Prints the p50 and p99 in
 * microseconds on one line, as bench-noop does for the Rust client, so
 * scripts/bench-c-sdk can set them side by side. Asserts no timing.
 *
 *     noop SOCKET [COUNT [PAYLOAD_BYTES [WARMUP]]]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agentos.h"

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int by_value(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The `p` quantile of sorted samples, picked as bench's percentile() does. */
static double percentile_us(const uint64_t *sorted, size_t n, double p) {
    size_t i = (size_t)((double)(n - 1) * p + 0.5);
    return (double)sorted[i] / 1000.0;
}

/* One NOOP; 0, or -1 with a message if it failed or did not echo. */
static int noop(agentos_client *client, const uint8_t *payload, size_t len, uint64_t *took) {
    uint8_t *reply = NULL;
    size_t reply_len = 0;
    uint64_t start = now_ns();
    int status = agentos_call(client, AGENTOS_NOOP, payload, len, &reply, &reply_len);
    uint64_t end = now_ns();
    if (status != AGENTOS_OK) {
        fprintf(stderr, "noop: agentos_call failed (%d): %s\n", status, agentos_last_error());
        return -1;
    }
    int echoed = reply_len == len && memcmp(reply, payload, len) == 0;
    agentos_free(reply);
    if (!echoed) {
        fprintf(stderr, "noop: the reply is not the payload echoed\n");
        return -1;
    }
    if (took) {
        *took = end - start;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 5) {
        fprintf(stderr, "usage: %s SOCKET [COUNT [PAYLOAD_BYTES [WARMUP]]]\n", argv[0]);
        return 2;
    }
    size_t count = argc > 2 ? strtoul(argv[2], NULL, 10) : 20000;
    size_t len = argc > 3 ? strtoul(argv[3], NULL, 10) : 64;
    size_t warmup = argc > 4 ? strtoul(argv[4], NULL, 10) : 2000;
    if (count == 0) {
        fprintf(stderr, "noop: COUNT must be at least 1\n");
        return 2;
    }

    uint8_t *payload = malloc(len ? len : 1);
    uint64_t *samples = malloc(count * sizeof *samples);
    if (!payload || !samples) {
        fprintf(stderr, "noop: out of memory\n");
        return 1;
    }
    memset(payload, 0x42, len);

    agentos_client *client = agentos_connect(argv[1]);
    if (!client) {
        fprintf(stderr, "noop: cannot connect: %s\n", agentos_last_error());
        return 1;
    }
    for (size_t i = 0; i < warmup; i++) {
        if (noop(client, payload, len, NULL) != 0) {
            return 1;
        }
    }
    for (size_t i = 0; i < count; i++) {
        if (noop(client, payload, len, &samples[i]) != 0) {
            return 1;
        }
    }
    agentos_close(client);

    qsort(samples, count, sizeof *samples, by_value);
    printf("p50_us=%.2f p99_us=%.2f count=%zu payload=%zu\n", percentile_us(samples, count, 0.50),
           percentile_us(samples, count, 0.99), count, len);
    free(samples);
    free(payload);
    return 0;
}
