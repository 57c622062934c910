/*
 * The few libc functions the wit-bindgen C glue calls, for a guest built with -nostdlib.
 *
 * malloc/realloc/free: a bump heap above __heap_base that counts live allocations and starts
 * over when the count drops to zero. A plugin call allocates the batch (cabi_realloc), frees
 * it in process(), allocates the result, and the post-return function frees that: every call
 * ends with nothing live, so the heap never grows past one batch and one result (plus what
 * init keeps, which it frees too). An allocation that outlives a call only delays the reset;
 * memory.grow past the switch's limit traps, which the switch handles as a fault.
 *
 * free() never writes to the block: the host reads the result list after the post-return
 * function has freed it (wasmtime runs post-return inside the call), and nothing allocates
 * in between.
 */
#include <stddef.h>
#include <stdint.h>

#include "stdlib.h"
#include "string.h"

extern unsigned char __heap_base;

static uintptr_t heap_top;  /* next free byte; 0 before the first allocation */
static uintptr_t last;      /* start of the newest allocation (for in-place realloc) */
static size_t live;         /* allocations not yet freed */

#define ALIGN 8u
#define PAGE 65536u

_Noreturn void abort(void) { __builtin_trap(); }

static int reserve(uintptr_t end) {
    uintptr_t have = __builtin_wasm_memory_size(0) * PAGE;
    if (end <= have) return 1;
    size_t pages = (end - have + PAGE - 1) / PAGE;
    return __builtin_wasm_memory_grow(0, pages) != (size_t)-1;
}

/* Each block is preceded by its size (8 bytes, keeps 8-byte alignment). */
void *malloc(size_t n) {
    if (heap_top == 0) heap_top = ((uintptr_t)&__heap_base + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1);
    uintptr_t p = heap_top + ALIGN;
    uintptr_t end = (p + n + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1);
    if (end < p || !reserve(end)) return NULL;
    *(size_t *)(p - ALIGN) = n;
    heap_top = end;
    last = p;
    live++;
    return (void *)p;
}

void free(void *ptr) {
    if (ptr == NULL) return;
    if (live > 0 && --live == 0) {
        heap_top = 0;
        last = 0;
    }
}

void *memcpy(void *dst, const void *src, size_t n) {
    /* -mbulk-memory: one memory.copy instruction, not a call back into this function. */
    __builtin_memcpy(dst, src, n);
    return dst;
}

void *memset(void *dst, int c, size_t n) {
    __builtin_memset(dst, c, n);
    return dst;
}

void *realloc(void *ptr, size_t n) {
    if (ptr == NULL) return malloc(n);
    uintptr_t p = (uintptr_t)ptr;
    size_t old = *(size_t *)(p - ALIGN);
    if (p == last) { /* the newest block grows or shrinks in place */
        uintptr_t end = (p + n + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1);
        if (end < p || !reserve(end)) return NULL;
        *(size_t *)(p - ALIGN) = n;
        heap_top = end;
        return ptr;
    }
    void *q = malloc(n);
    if (q == NULL) return NULL;
    memcpy(q, ptr, old < n ? old : n);
    free(ptr);
    return q;
}

size_t strlen(const char *s) {
    const char *e = s;
    while (*e) e++;
    return (size_t)(e - s);
}
