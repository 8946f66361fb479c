/* Fast paths of shm.ring.Ring, in C: the same layout and commit protocol as the Python code.
 *
 * Core(mmap, capacity, data_sem_name, space_sem_name) holds the mapping (a buffer export, dropped by
 * release()) and the ring's two named semaphores.
 *   put(data) -> True when the record was committed (payload, header, head published last, full
 *     fence, reader woken if it announced sleeping); False when it needs the Python slow path
 *     (wrap marker or waiting for space): nothing was written then.
 *   get(spin_s) -> bytes of the next record, spinning up to spin_s seconds (GIL released) for one
 *     to arrive; None when none arrived or the record needs the Python path (wrap marker, or a
 *     header that fails its check: the Python path raises CorruptRecord).
 * Both are single-producer / single-consumer, exactly as the Python Ring. x86-64 and aarch64 (the
 * fences are full barriers from the compiler builtins).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <semaphore.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define W_HEAD 8
#define W_WWAIT 9
#define W_TAIL 16
#define W_RWAIT 17
#define DATA 256
#define REC 16
#define WRAP 0xFFFFFFFFull
#define M32 0xFFFFFFFFull
#define MIX 0x5BD1E995ull
#define HOT_SPIN_NS 5000

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    char *base;
    uint64_t cap;
    sem_t *sem_data;
    sem_t *sem_space;
    uint64_t posted_r;
    uint64_t posted_w;
} Core;

static inline uint64_t load_acq(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void store_rel(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline void fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void core_release_all(Core *self) {
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    self->base = NULL;
    if (self->sem_data) { sem_close(self->sem_data); self->sem_data = NULL; }
    if (self->sem_space) { sem_close(self->sem_space); self->sem_space = NULL; }
}

static void Core_dealloc(Core *self) {
    core_release_all(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Core_init(Core *self, PyObject *args, PyObject *kwds) {
    PyObject *mm;
    unsigned long long cap;
    const char *data_name, *space_name;
    if (!PyArg_ParseTuple(args, "OKss", &mm, &cap, &data_name, &space_name))
        return -1;
    if (PyObject_GetBuffer(mm, &self->view, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0)
        return -1;
    self->has_view = 1;
    if ((uint64_t)self->view.len < DATA + cap) {
        core_release_all(self);
        PyErr_SetString(PyExc_ValueError, "mapping is smaller than the ring it should hold");
        return -1;
    }
    self->base = (char *)self->view.buf;
    self->cap = cap;
    self->sem_data = sem_open(data_name, 0);
    self->sem_space = sem_open(space_name, 0);
    if (self->sem_data == SEM_FAILED || self->sem_space == SEM_FAILED) {
        int err = errno;
        if (self->sem_data == SEM_FAILED) self->sem_data = NULL;
        if (self->sem_space == SEM_FAILED) self->sem_space = NULL;
        core_release_all(self);
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

static PyObject *Core_put(Core *self, PyObject *data) {
    if (!self->base) {
        PyErr_SetString(PyExc_ValueError, "ring core released");
        return NULL;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t *q = (uint64_t *)self->base;
    uint64_t n = (uint64_t)b.len, cap = self->cap;
    uint64_t need = (n + 31) & ~15ull;
    uint64_t head = q[W_HEAD];                       /* written by this (the only) writer */
    uint64_t at = head % cap;
    if (n >= WRAP || at + need > cap || head + need - load_acq(&q[W_TAIL]) > cap) {
        PyBuffer_Release(&b);
        Py_RETURN_FALSE;                            /* wrap or wait: the Python path does it */
    }
    char *rec = self->base + DATA + at;
    memcpy(rec + REC, b.buf, n);
    PyBuffer_Release(&b);
    uint64_t *hdr = (uint64_t *)rec;
    hdr[0] = head;
    hdr[1] = n | ((((head >> 4) ^ n ^ MIX) & M32) << 32);
    store_rel(&q[W_HEAD], head + need);             /* commit: published last */
    fence();                                        /* head store before the ticket load */
    uint64_t t = __atomic_load_n(&q[W_RWAIT], __ATOMIC_RELAXED);
    if (t && t != self->posted_r) {
        self->posted_r = t;
        sem_post(self->sem_data);
    }
    Py_RETURN_TRUE;
}

static PyObject *Core_get(Core *self, PyObject *arg) {
    if (!self->base) {
        PyErr_SetString(PyExc_ValueError, "ring core released");
        return NULL;
    }
    double spin_s = PyFloat_AsDouble(arg);
    if (spin_s == -1.0 && PyErr_Occurred())
        return NULL;
    uint64_t *q = (uint64_t *)self->base;
    uint64_t tail = q[W_TAIL];                       /* written by this (the only) reader */
    uint64_t head = load_acq(&q[W_HEAD]);
    if (head == tail && spin_s > 0) {
        uint64_t start = now_ns(), spin_ns = (uint64_t)(spin_s * 1e9);
        Py_BEGIN_ALLOW_THREADS
        for (unsigned i = 1;; i++) {
            cpu_relax();
            head = load_acq(&q[W_HEAD]);
            if (head != tail)
                break;
            if ((i & 15) == 0) {
                uint64_t el = now_ns() - start;
                if (el >= spin_ns)
                    break;
                if (el >= HOT_SPIN_NS)
                    sched_yield();                  /* a peer queued on this CPU runs at once */
            }
        }
        Py_END_ALLOW_THREADS
    }
    if (head == tail)
        Py_RETURN_NONE;
    uint64_t cap = self->cap, at = tail % cap;
    uint64_t *hdr = (uint64_t *)(self->base + DATA + at);
    uint64_t pos = hdr[0], word = hdr[1], n = word & M32;
    if (pos != tail || n == WRAP || (word >> 32) != (((tail >> 4) ^ n ^ MIX) & M32))
        Py_RETURN_NONE;                             /* wrap marker or a bad header: Python path */
    uint64_t end = tail + ((n + 31) & ~15ull);
    if (end > head || at + REC + n > cap)
        Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(self->base + DATA + at + REC, (Py_ssize_t)n);
    if (!out)
        return NULL;
    store_rel(&q[W_TAIL], end);                     /* release after the copy */
    fence();                                        /* tail store before the ticket load */
    uint64_t t = __atomic_load_n(&q[W_WWAIT], __ATOMIC_RELAXED);
    if (t && t != self->posted_w) {
        self->posted_w = t;
        sem_post(self->sem_space);
    }
    return out;
}

static PyObject *Core_release(Core *self, PyObject *Py_UNUSED(ignored)) {
    core_release_all(self);
    Py_RETURN_NONE;
}

static PyMethodDef Core_methods[] = {
    {"put", (PyCFunction)Core_put, METH_O, "Commit one record on the fast path; False: use the slow path."},
    {"get", (PyCFunction)Core_get, METH_O, "Next record (spinning up to spin_s), or None: slow path."},
    {"release", (PyCFunction)Core_release, METH_NOARGS, "Drop the mapping export and semaphores."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shm._ringfast.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_methods = Core_methods,
    .tp_doc = "Fast put/get of shm.ring.Ring (same layout and protocol).",
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_ringfast", "C fast paths of shm.ring.Ring.", -1, NULL,
};

PyMODINIT_FUNC PyInit__ringfast(void) {
    if (PyType_Ready(&CoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
