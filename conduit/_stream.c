/* conduit._stream: a copy with non-temporal stores, for writes into a replay ring.
 *
 * A replay ring's rows are read back long after they are written, at random,
 * so a write gains nothing from the caches. An ordinary store first reads each
 * destination line into the cache (a read for ownership), then writes it back:
 * three memory transfers per line copied. A non-temporal store writes the line
 * straight to memory: two. glibc's memcpy switches to such stores only above
 * three quarters of the last-level cache (hundreds of MB on a VM that reports
 * the host's L3), so neither numpy nor torch uses them for a push.
 *
 * Optional: setuptools builds it where a C compiler is found (Extension
 * optional=True); conduit.storage.streaming falls back to numpy's copy without it.
 * NONTEMPORAL is 1 where the non-temporal path is compiled (x86-64 with SSE2),
 * else 0 and copy() is a plain memcpy, which callers then do not bother to use.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define CONDUIT_NT 1
#else
#define CONDUIT_NT 0
#endif

static void stream_copy(char *dst, const char *src, size_t n)
{
#if CONDUIT_NT
    /* the destination's unaligned head with ordinary stores: a streaming store needs 16-byte alignment */
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    for (; n >= 64; n -= 64, src += 64, dst += 64) { /* a cache line a step: four loads, four streaming stores */
        __m128i a = _mm_loadu_si128((const __m128i *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
    for (; n >= 16; n -= 16, src += 16, dst += 16)
        _mm_stream_si128((__m128i *)dst, _mm_loadu_si128((const __m128i *)src));
    memcpy(dst, src, n);
    /* streaming stores are weakly ordered: fence them before anything publishes the rows (a lock release) */
    _mm_sfence();
#else
    memcpy(dst, src, n);
#endif
}

PyDoc_STRVAR(copy_doc,
             "copy(dst, src, nbytes)\n--\n\n"
             "Copy nbytes from address src to address dst (non-overlapping) with non-temporal stores, "
             "then fence them. Releases the GIL.");

static PyObject *copy(PyObject *self, PyObject *args)
{
    unsigned long long dst, src;
    Py_ssize_t nbytes;
    (void)self;
    if (!PyArg_ParseTuple(args, "KKn:copy", &dst, &src, &nbytes))
        return NULL;
    if (nbytes < 0) {
        PyErr_Format(PyExc_ValueError, "copy: nbytes=%zd must be >= 0", nbytes);
        return NULL;
    }
    if (nbytes > 0 && (dst == 0 || src == 0)) {
        PyErr_SetString(PyExc_ValueError, "copy: a null address");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    stream_copy((char *)(uintptr_t)dst, (const char *)(uintptr_t)src, (size_t)nbytes);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"copy", copy, METH_VARARGS, copy_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "conduit._stream", "Copies with non-temporal stores (see conduit.storage.streaming).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__stream(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "NONTEMPORAL", CONDUIT_NT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
