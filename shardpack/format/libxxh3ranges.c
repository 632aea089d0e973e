/* libxxh3ranges: xxh3-64 of many byte ranges of one buffer in one call, with the system libxxhash.
 *
 * Why: a reader checks every sample of a batch against its index hash on every read
 * (docs/reading.md, "Integrity").  Hashed one xxhash call a sample from Python, a batch costs 256
 * slices and calls under the GIL, and each call gives the GIL up and must win it back: behind
 * another busy Python thread (a training loop, the other worker threads of
 * execution="threads"), that wait comes 256 times a batch.  Here a batch's ranges of one shard are
 * hashed in one call, the GIL released once.  The digests are XXH3_64bits of each range, what
 * xxhash.xxh3_64_intdigest gives (the pure-Python fallback, shardpack/format/hashing.py, computes
 * the same).
 *
 * hash_ranges(buf, starts, ends, out) -> None
 *     buf: any bytes-like object (an mmap's memoryview: read-only is fine).
 *     starts, ends: native int64 arrays of n range bounds into buf (contiguous buffers).
 *     out: a writable buffer of n uint64, the digests of buf[starts[i]:ends[i]].
 * Errors: ValueError for arrays of other sizes, or a range that is not 0 <= start <= end <=
 * len(buf) (checked for every range before any byte is read).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#if defined(__x86_64__) || defined(_M_X64)
#include <xxh_x86dispatch.h>  /* the AVX2/AVX512 variant this CPU has, chosen at run time */
#define HASH XXH3_64bits_dispatch
#else
#include <xxhash.h>
#define HASH XXH3_64bits
#endif

static PyObject *hash_ranges(PyObject *self, PyObject *args) {
    Py_buffer buf, starts, ends, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &buf, &starts, &ends, &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = starts.len / (Py_ssize_t)sizeof(int64_t);
    if (starts.len % (Py_ssize_t)sizeof(int64_t) || ends.len != starts.len ||
        out.len != n * (Py_ssize_t)sizeof(uint64_t)) {
        PyErr_SetString(PyExc_ValueError, "starts, ends and out must hold n int64/uint64 each");
        goto done;
    }
    const int64_t *a = (const int64_t *)starts.buf, *b = (const int64_t *)ends.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (a[i] < 0 || a[i] > b[i] || b[i] > (int64_t)buf.len) {
            PyErr_Format(PyExc_ValueError, "range %zd [%lld, %lld) is outside the buffer of %zd "
                         "bytes", i, (long long)a[i], (long long)b[i], buf.len);
            goto done;
        }
    }
    const unsigned char *base = (const unsigned char *)buf.buf;
    uint64_t *digests = (uint64_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        digests[i] = (uint64_t)HASH(base + a[i], (size_t)(b[i] - a[i]));
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"hash_ranges", hash_ranges, METH_VARARGS,
     "hash_ranges(buf, starts, ends, out): out[i] = xxh3-64 of buf[starts[i]:ends[i]], all in one "
     "call with the GIL released."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "libxxh3ranges",
                                    "xxh3-64 of many ranges of a buffer (the GIL released).", -1,
                                    methods};

PyMODINIT_FUNC PyInit_libxxh3ranges(void) { return PyModule_Create(&module); }
