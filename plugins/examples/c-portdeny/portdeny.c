/*
 * c-portdeny: drops TCP and UDP packets whose destination port is in a list from the config.
 * A wasmswitch plugin in C, against the bindings `wit-bindgen c` generates from wit/ (see
 * README.md and plugins/build.sh).
 *
 * Config: destination ports (`53`) and inclusive ranges (`6000-6063`), separated by spaces,
 * commas or newlines; `#` starts a comment to the end of the line. At least one port.
 * Packets without parsed ports (non-IP, ICMP, later IP fragments) pass. One whose ports lie
 * beyond the header snapshot while its IP header lies inside (IPv6 extension headers, IPv4
 * options) is dropped by the switch whatever this answers (`wasmswitch_plugin_ports_unseen`).
 *
 * Counters: portdeny_denied, portdeny_passed (returned per batch in the result's trailer, no
 * host call on the data path).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <stdlib.h>

#include "plugin.h"

/* One bit per destination port: 8 KiB, one load per packet whatever the list's length. */
static uint8_t denied_ports[65536 / 8];

static uint32_t id_denied, id_passed;

/* BATCH LAYOUT offsets (wit/plugin.wit). */
enum {
    BATCH_HEADER = 16,
    B_COUNT = 2,
    B_STRIDE = 4,
    R_FLAGS = 2,
    R_L4_OFFSET = 10,
    R_CAPLEN = 14,
    R_HEADERS = 16,
    FLAG_L4_PORTS = 1 << 3,
    VERDICT_DROP = 1,
    COUNTER_RECORD = 12,
};

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Sets *err to "c-portdeny: <what> "<token>"" (the host frees it after the call); a token cut
 * to 64 bytes ends in "..." (U+2026) inside the quotes, so the reader knows it goes on. */
static bool refuse(plugin_string_t *err, const char *what, const uint8_t *tok, size_t toklen) {
    static const char prefix[] = "c-portdeny: ";
    size_t a = sizeof prefix - 1, b = 0;
    while (what[b]) b++;
    static const uint8_t ellipsis[] = {0xE2, 0x80, 0xA6};
    size_t more = 0;
    if (toklen > 64) {
        /* Cut at a character's start: a cut inside one would make the message no valid
         * UTF-8, which the host refuses as no string at all. */
        toklen = 64;
        while (toklen > 0 && (tok[toklen] & 0xC0) == 0x80) toklen--;
        more = sizeof ellipsis;
    }
    size_t n = a + b + (toklen ? 3 + toklen + more : 0);
    uint8_t *m = malloc(n ? n : 1);
    if (m == NULL) __builtin_trap();
    size_t k = 0;
    for (size_t i = 0; i < a; i++) m[k++] = (uint8_t)prefix[i];
    for (size_t i = 0; i < b; i++) m[k++] = (uint8_t)what[i];
    if (toklen) {
        m[k++] = ' ';
        m[k++] = '"';
        for (size_t i = 0; i < toklen; i++) m[k++] = tok[i];
        for (size_t i = 0; i < more; i++) m[k++] = ellipsis[i];
        m[k++] = '"';
    }
    err->ptr = m;
    err->len = k;
    return false;
}

/* Parses a decimal port (0..=65535) from [s, e); returns -1 when it is not one. */
static int32_t port(const uint8_t *s, const uint8_t *e) {
    if (s == e || e - s > 5) return -1;
    int32_t v = 0;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9') return -1;
        v = v * 10 + (*s - '0');
    }
    return v <= 65535 ? v : -1;
}

static bool is_sep(uint8_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ','; }

static bool register_counter(const char *name, uint32_t *id, plugin_string_t *err) {
    plugin_string_t n;
    plugin_string_set(&n, name);
    plugin_string_t why;
    if (wasmswitch_plugin_host_register_counter(&n, id, &why)) return true;
    *err = why; /* the host's message, handed back as init's error */
    return false;
}

bool exports_plugin_init(plugin_string_t *config, plugin_string_t *err) {
    const uint8_t *s = config->ptr, *end = config->ptr + config->len;
    size_t ports = 0;
    bool ok = true;
    __builtin_memset(denied_ports, 0, sizeof denied_ports);
    while (ok && s < end) {
        if (is_sep(*s)) {
            s++;
            continue;
        }
        if (*s == '#') {
            while (s < end && *s != '\n') s++;
            continue;
        }
        const uint8_t *t = s;
        while (s < end && !is_sep(*s) && *s != '#') s++;
        const uint8_t *dash = t;
        while (dash < s && *dash != '-') dash++;
        int32_t lo = port(t, dash), hi = dash < s ? port(dash + 1, s) : lo;
        if (lo < 0 || hi < 0 || hi < lo) {
            ok = refuse(err, "expected a port (0-65535) or a range N-M, got", t, (size_t)(s - t));
            break;
        }
        for (int32_t p = lo; p <= hi; p++) denied_ports[p >> 3] |= (uint8_t)(1u << (p & 7));
        ports += (size_t)(hi - lo + 1);
    }
    if (ok && ports == 0) ok = refuse(err, "no ports in the config (give ports to drop, e.g. `53 123 6000-6063`)", 0, 0);
    if (ok) ok = register_counter("portdeny_denied", &id_denied, err) && register_counter("portdeny_passed", &id_passed, err);
    plugin_string_free(config);
    return ok;
}

void exports_plugin_process(plugin_list_u8_t *batch, plugin_list_u8_t *ret) {
    const uint8_t *b = batch->ptr;
    size_t count = batch->len >= BATCH_HEADER ? le16(b + B_COUNT) : 0;
    size_t stride = batch->len >= BATCH_HEADER ? le16(b + B_STRIDE) : 0;
    /* A batch shorter than its header says gets an empty result, which the host treats as
     * a fault (wrong length): its on-error policy applies. It never happens with the switch. */
    if (count == 0 || stride < R_HEADERS || BATCH_HEADER + count * stride > batch->len) {
        plugin_list_u8_free(batch);
        ret->ptr = NULL;
        ret->len = 0;
        return;
    }
    uint8_t *out = malloc(4 * count + 2 * COUNTER_RECORD);
    if (out == NULL) __builtin_trap();
    uint64_t denied = 0;
    const uint8_t *r = b + BATCH_HEADER;
    for (size_t i = 0; i < count; i++, r += stride) {
        bool drop = false;
        if (le16(r + R_FLAGS) & FLAG_L4_PORTS) {
            size_t o = le16(r + R_L4_OFFSET);
            if (o + 4 <= le16(r + R_CAPLEN)) {
                const uint8_t *l4 = r + R_HEADERS + o;
                uint16_t dport = (uint16_t)(l4[2] << 8 | l4[3]);
                drop = denied_ports[dport >> 3] >> (dport & 7) & 1;
            }
        }
        put_le32(out + 4 * i, drop ? VERDICT_DROP : 0);
        denied += drop;
    }
    size_t n = 4 * count;
    uint64_t passed = count - denied;
    if (denied) {
        put_le32(out + n, id_denied);
        put_le64(out + n + 4, denied);
        n += COUNTER_RECORD;
    }
    if (passed) {
        put_le32(out + n, id_passed);
        put_le64(out + n + 4, passed);
        n += COUNTER_RECORD;
    }
    plugin_list_u8_free(batch);
    ret->ptr = out;
    ret->len = n;
}
