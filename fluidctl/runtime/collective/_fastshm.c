/* The same-node small-message allreduce of shm.py's pipelined path, one piece, in C.

Why native: a 4 KiB allreduce between two ranks is a few hundred nanoseconds of copying; in
Python the bookkeeping around it (slicing, counters, waits) costs tens of microseconds. This
module runs exactly the protocol of ShmGroup._pipelined for a message that fits one piece
(same slots, same counters, same metadata table), so a rank on this path and a rank on the
Python path interoperate, and every failure is left to Python to explain.

Waiting: spin on the peers' counters for a short while (only when every local rank has a CPU
of its own), then sleep on a futex: a shared "doorbell" word that every poster increments after
publishing a counter, waking the sleepers it sees (each rank's SLEEP word). A waiter that does
not get the CPU back by spinning therefore costs its peers nothing, which keeps the group fair
when ranks share CPUs with other work. A wait returns to Python at least every `slice_ns`
(liveness checks, deadline, signals) and at once when a rank posted an abort.

Built as an optional extension (setup.py): when it cannot be built, shm.py uses its Python path.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define RECORD 12
#define RING 2
#define MAX_LOCAL 256

/* word indices of a rank's control line; they mirror shm.py */
enum { IN = 2, RED = 3, OUT = 4, SLEEP = 8 };
/* step results (low 2 bits: the stage to resume at) */
enum { DONE = 0, SLOW = 1, MISMATCH = 2, ABORTED = 3, FALLBACK = 4 };

typedef struct {
    volatile int64_t *ctl;        /* the control page: n lines of `words` int64 */
    volatile uint32_t *bell;      /* doorbell */
    volatile int64_t *abort_word;
    int64_t *tables;              /* 2 x world x RECORD */
    uint8_t *slots;               /* n slots of `chunk` bytes, then the result area */
    int64_t chunk, room;
    int n, index, words, world;
    int64_t spin_ns;
    int ranks[MAX_LOCAL];
} group_t;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int64_t load(volatile int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

static inline int reached(group_t *g, int word, int64_t target) {
    for (int j = 0; j < g->n; j++)
        if (j != g->index && load(&g->ctl[j * g->words + word]) < target) return 0;
    return 1;
}

/* ring the doorbell: wake whichever peer sleeps */
static void ring(group_t *g) {
    __atomic_fetch_add(g->bell, 1, __ATOMIC_SEQ_CST);
    for (int j = 0; j < g->n; j++) {
        if (j != g->index && __atomic_load_n(&g->ctl[j * g->words + SLEEP], __ATOMIC_SEQ_CST)) {
            syscall(SYS_futex, (uint32_t *)g->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
            return;
        }
    }
}

/* publish this rank's counter, then ring */
static void post(group_t *g, int word, int64_t value) {
    __atomic_store_n(&g->ctl[g->index * g->words + word], value, __ATOMIC_RELEASE);
    ring(g);
}

/* 0: every peer's `word` reached target; SLOW: slice over (or a signal); ABORTED */
static int wait_for(group_t *g, int word, int64_t target, int64_t slice_ns) {
    if (reached(g, word, target)) return 0;
    int64_t start = now_ns();
    if (g->spin_ns > 0) {
        int64_t until = start + g->spin_ns;
        for (;;) {
            for (int k = 0; k < 64; k++) {
                if (reached(g, word, target)) return 0;
                cpu_relax();
            }
            if (now_ns() > until) break;
        }
    }
    int rc = 0;
    volatile int64_t *sleep_word = &g->ctl[g->index * g->words + SLEEP];
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        uint32_t seen = __atomic_load_n(g->bell, __ATOMIC_SEQ_CST);
        __atomic_store_n(sleep_word, 1, __ATOMIC_SEQ_CST);
        if (reached(g, word, target)) break;
        if (__atomic_load_n(g->abort_word, __ATOMIC_ACQUIRE)) { rc = ABORTED; break; }
        int64_t left = start + slice_ns - now_ns();
        if (left <= 0) { rc = SLOW; break; }
        struct timespec ts = {left / 1000000000LL, left % 1000000000LL};
        long r = syscall(SYS_futex, (uint32_t *)g->bell, FUTEX_WAIT, seen, &ts, NULL, 0);
        if (r == -1 && errno == EINTR) { rc = SLOW; break; }   /* let Python see the signal */
    }
    __atomic_store_n(sleep_word, 0, __ATOMIC_RELEASE);
    Py_END_ALLOW_THREADS
    return rc;
}

/* ---- reductions: own[i] = own[i] op peer[i], numpy's semantics ---- */
#define SUM(a, b) ((a) + (b))
#define MAXF(a, b) (((a) >= (b) || (a) != (a)) ? (a) : (b))
#define MINF(a, b) (((a) <= (b) || (a) != (a)) ? (a) : (b))
#define MAXI(a, b) ((a) >= (b) ? (a) : (b))
#define MINI(a, b) ((a) <= (b) ? (a) : (b))
#define LOOP(T, F) { T *o = (T *)own; const T *p = (const T *)peer; \
    for (int64_t i = 0; i < count; i++) { o[i] = F(o[i], p[i]); } return 0; }
/* integer sums wrap as numpy's do: add as unsigned */
#define ULOOP(T, U) { T *o = (T *)own; const T *p = (const T *)peer; \
    for (int64_t i = 0; i < count; i++) { o[i] = (T)((U)o[i] + (U)p[i]); } return 0; }
#define INTS(T, U) switch (op) { case 0: ULOOP(T, U) case 2: LOOP(T, MAXI) case 3: LOOP(T, MINI) } break;

static int reduce(char code, int op, void *own, const void *peer, int64_t count) {
    switch (code) {
    case 'f': switch (op) { case 0: LOOP(float, SUM) case 2: LOOP(float, MAXF) case 3: LOOP(float, MINF) } break;
    case 'd': switch (op) { case 0: LOOP(double, SUM) case 2: LOOP(double, MAXF) case 3: LOOP(double, MINF) } break;
    case 'b': INTS(int8_t, uint8_t)
    case 'B': INTS(uint8_t, uint8_t)
    case 'h': INTS(int16_t, uint16_t)
    case 'H': INTS(uint16_t, uint16_t)
    case 'i': INTS(int32_t, uint32_t)
    case 'I': INTS(uint32_t, uint32_t)
    case 'l': case 'q': INTS(int64_t, uint64_t)
    case 'L': case 'Q': INTS(uint64_t, uint64_t)
    case '?': {               /* numpy: add and max are "or", min is "and" */
        uint8_t *o = (uint8_t *)own; const uint8_t *p = (const uint8_t *)peer;
        if (op == 3) for (int64_t i = 0; i < count; i++) o[i] = o[i] && p[i];
        else for (int64_t i = 0; i < count; i++) o[i] = o[i] || p[i];
        return 0;
    }
    }
    return -1;
}

static int supported(char code) { return code && strchr("fdbBhHiIlqLQ?", code) != NULL; }

/* ---- the group handle ---- */
static void free_group(PyObject *capsule) { PyMem_Free(PyCapsule_GetPointer(capsule, "fastshm")); }

/* group(ctl, words, n, index, world, ranks, bell, abort, tables, slots, chunk, room, spin_ns) */
static PyObject *py_group(PyObject *self, PyObject *args) {
    unsigned long long ctl, bell, abort_word, tables, slots;
    int words, n, index, world;
    long long chunk, room, spin_ns;
    PyObject *ranks;
    if (!PyArg_ParseTuple(args, "KiiiiOKKKKLLL", &ctl, &words, &n, &index, &world, &ranks,
                          &bell, &abort_word, &tables, &slots, &chunk, &room, &spin_ns))
        return NULL;
    if (n < 1 || n > MAX_LOCAL || !PySequence_Check(ranks) || PySequence_Size(ranks) != n) {
        PyErr_SetString(PyExc_ValueError, "fastshm: bad group layout");
        return NULL;
    }
    group_t *g = PyMem_Calloc(1, sizeof(group_t));
    if (!g) return PyErr_NoMemory();
    g->ctl = (volatile int64_t *)(uintptr_t)ctl;
    g->bell = (volatile uint32_t *)(uintptr_t)bell;
    g->abort_word = (volatile int64_t *)(uintptr_t)abort_word;
    g->tables = (int64_t *)(uintptr_t)tables;
    g->slots = (uint8_t *)(uintptr_t)slots;
    g->words = words; g->n = n; g->index = index; g->world = world;
    g->chunk = chunk; g->room = room; g->spin_ns = spin_ns;
    for (int j = 0; j < n; j++) {
        PyObject *item = PySequence_GetItem(ranks, j);
        g->ranks[j] = item ? (int)PyLong_AsLong(item) : -1;
        Py_XDECREF(item);
        if (PyErr_Occurred()) { PyMem_Free(g); return NULL; }
    }
    return PyCapsule_New(g, "fastshm", free_group);
}

/* element offsets of each local rank's part, as shm.py's _bounds */
static void bounds(int n, int64_t count, int64_t *cut) {
    int64_t per = (count + n - 1) / n;
    per = (per + 15) / 16 * 16;
    for (int i = 0; i <= n; i++) cut[i] = i * per < count ? i * per : count;
}

/* publish piece c's parts for the others (into this rank's ring slot), then count IN */
static void copy_in(group_t *g, const uint8_t *data, int64_t total, int64_t isz,
                    int64_t piece, int64_t base, int64_t c, int zero) {
    int64_t cut[MAX_LOCAL + 1];
    int64_t size = total - c * piece < piece ? total - c * piece : piece;
    uint8_t *mine = g->slots + g->index * g->chunk + ((base + c) % RING) * g->room;
    const uint8_t *part = data + c * piece;
    bounds(g->n, size / isz, cut);
    for (int j = 0; j < g->n; j++) {
        if (j == g->index) continue;
        int64_t lo = cut[j] * isz, hi = cut[j + 1] * isz;
        if (zero) memset(mine + lo, 0, hi - lo);
        else memcpy(mine + lo, part + lo, hi - lo);
    }
    post(g, IN, base + c + 1);
}

/* step(group, array, record_address, seq, base, code, op, zero, resume, slice_ns, piece)
   -> status | resume << 3. Runs ShmGroup._pipelined: pieces of `piece` bytes, numbered from
   `base`. `resume` 0 starts a call; after SLOW, pass back the `resume` it returned (piece
   index * 4 + stage). FALLBACK (nothing was touched): not a writable contiguous buffer. */
static PyObject *py_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "fastshm.step takes 11 arguments");
        return NULL;
    }
    group_t *g = PyCapsule_GetPointer(args[0], "fastshm");
    if (!g) return NULL;
    const int64_t *rec = (const int64_t *)(uintptr_t)PyLong_AsUnsignedLongLong(args[2]);
    int64_t seq = PyLong_AsLongLong(args[3]), base = PyLong_AsLongLong(args[4]);
    long code = PyLong_AsLong(args[5]), op = PyLong_AsLong(args[6]);
    int zero = PyObject_IsTrue(args[7]);
    long resume = PyLong_AsLong(args[8]);
    int64_t slice_ns = PyLong_AsLongLong(args[9]), piece = PyLong_AsLongLong(args[10]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return PyLong_FromLong(FALLBACK);
    }
    int64_t isz = view.itemsize > 0 ? view.itemsize : 1;
    int64_t total = view.len;
    uint8_t *data = view.buf;
    int n = g->n, me = g->index, rc = 0;
    if (!supported((char)code) || piece > g->room || piece < isz || piece % isz || total % isz) {
        PyBuffer_Release(&view);
        return PyLong_FromLong(FALLBACK);
    }
    int64_t count = total ? (total + piece - 1) / piece : 1;
    int64_t c = resume >> 2;
    int stage = (int)(resume & 3);
    int64_t *table = g->tables + (seq % 2) * g->world * RECORD;
    int64_t cut[MAX_LOCAL + 1];
    if (stage == 0) {
        int64_t *row = table + g->ranks[me] * RECORD;
        memcpy(row, rec, RECORD * 8);
        row[0] = seq;
        copy_in(g, data, total, isz, piece, base, 0, zero);
        stage = 1;
    }
    while (c < count) {
        int64_t gp = base + c, at = (gp % RING) * g->room;
        uint8_t *part = data + c * piece;
        int64_t size = total - c * piece < piece ? total - c * piece : piece;
        bounds(n, size / isz, cut);
        for (int i = 0; i <= n; i++) cut[i] *= isz;
        uint8_t *result = g->slots + n * g->chunk + at;
        if (stage == 1) {
            if ((rc = wait_for(g, IN, gp + 1, slice_ns))) break;
            if (c == 0) {
                const int64_t *first = table + g->ranks[0] * RECORD;
                for (int j = 1; j < n && !rc; j++)
                    if (memcmp(first, table + g->ranks[j] * RECORD, RECORD * 8)) rc = MISMATCH;
                if (rc) break;
            }
            uint8_t *own = part + cut[me];
            int64_t len = cut[me + 1] - cut[me];
            int empty = zero;
            for (int j = 0; j < n; j++) {
                if (j == me) continue;
                uint8_t *peer = g->slots + j * g->chunk + at + cut[me];
                if (empty) { memcpy(own, peer, len); empty = 0; }
                else reduce((char)code, (int)op, own, peer, len / isz);
            }
            if (empty) memset(own, 0, len);
            memcpy(result + cut[me], own, len);
            post(g, RED, gp + 1);
            if (c + 1 < count) copy_in(g, data, total, isz, piece, base, c + 1, zero);
            stage = 2;
        }
        if ((rc = wait_for(g, RED, gp + 1, slice_ns))) break;
        for (int j = 0; j < n; j++)
            if (j != me) memcpy(part + cut[j], result + cut[j], cut[j + 1] - cut[j]);
        post(g, OUT, gp + 1);
        c++;
        stage = 1;
    }
    PyBuffer_Release(&view);
    if (!rc) return PyLong_FromLong(DONE);
    return PyLong_FromLong(rc | (long)((c << 2) | stage) << 3);
}

/* wait(group, word, target, slice_ns) -> 0 | SLOW | ABORTED: the Python path's waiter */
static PyObject *py_wait(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "fastshm.wait takes 4 arguments");
        return NULL;
    }
    group_t *g = PyCapsule_GetPointer(args[0], "fastshm");
    if (!g) return NULL;
    long word = PyLong_AsLong(args[1]);
    int64_t target = PyLong_AsLongLong(args[2]), slice_ns = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLong(wait_for(g, (int)word, target, slice_ns));
}

/* post(group, word, value): publish this rank's counter and wake the sleepers */
static PyObject *py_post(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "fastshm.post takes 3 arguments");
        return NULL;
    }
    group_t *g = PyCapsule_GetPointer(args[0], "fastshm");
    if (!g) return NULL;
    long word = PyLong_AsLong(args[1]);
    int64_t value = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    post(g, (int)word, value);
    Py_RETURN_NONE;
}

/* ring(group): wake the sleepers (an abort was posted) */
static PyObject *py_ring(PyObject *self, PyObject *capsule) {
    group_t *g = PyCapsule_GetPointer(capsule, "fastshm");
    if (!g) return NULL;
    ring(g);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"ring", py_ring, METH_O, "wake the sleepers"},
    {"group", py_group, METH_VARARGS, "a handle on one node's shared control page"},
    {"step", (PyCFunction)(void (*)(void))py_step, METH_FASTCALL, "run or resume one call"},
    {"wait", (PyCFunction)(void (*)(void))py_wait, METH_FASTCALL, "wait for the peers' counter"},
    {"post", (PyCFunction)(void (*)(void))py_post, METH_FASTCALL, "publish a counter, wake"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastshm",
                                    "same-node small allreduce and futex waiter", -1, methods};

PyMODINIT_FUNC PyInit__fastshm(void) {
    PyObject *m = PyModule_Create(&module);
    if (m) {
        PyModule_AddIntConstant(m, "DONE", DONE);
        PyModule_AddIntConstant(m, "SLOW", SLOW);
        PyModule_AddIntConstant(m, "MISMATCH", MISMATCH);
        PyModule_AddIntConstant(m, "ABORTED", ABORTED);
        PyModule_AddIntConstant(m, "FALLBACK", FALLBACK);
    }
    return m;
}
