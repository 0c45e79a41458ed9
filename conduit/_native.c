/* conduit._native: the few kernels where numpy's and ATen's per-call costs, or their
 * choice of instructions, are what a replay buffer waits for.
 *
 * copy(): a copy with non-temporal stores, for writes into a replay ring.
 * sumtree_set() / sumtree_find(): the prioritized sampler's sum-tree (conduit.samplers.sumtree).
 *
 * A replay ring's rows are read back long after they are written, at random,
 * so a write gains nothing from the caches. An ordinary store first reads each
 * destination line into the cache (a read for ownership), then writes it back:
 * three memory transfers per line copied. A non-temporal store writes the line
 * straight to memory: two. glibc's memcpy switches to such stores only above
 * three quarters of the last-level cache (hundreds of MB on a VM that reports
 * the host's L3), so neither numpy nor torch uses them for a push.
 *
 * A sum-tree over 10^5 leaves has 17 levels. In numpy each level costs a few
 * array calls of ~2 us whatever their length, so a ring push's 256 leaves took
 * ~60 us and a draw's 512 descents ~130; here both are a few microseconds.
 * conduit.samplers.sumtree keeps the numpy version, which gives the same bits.
 *
 * Optional: setuptools builds it where a C compiler is found (Extension
 * optional=True); conduit.storage.streaming and conduit.samplers.sumtree fall
 * back to numpy without it.
 * NONTEMPORAL is 1 where the non-temporal path is compiled (x86-64 with SSE2),
 * else 0 and copy() is a plain memcpy, which callers then do not bother to use.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define CONDUIT_NT 1
#else
#define CONDUIT_NT 0
#endif

/* sum-tree descents run in lockstep, this many at a time (sumtree_find) */
#ifndef LANES
#define LANES 8
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

/* -- the sum-tree: node i's children are 2i and 2i+1, the root is 1, leaf j is node size + j ------------- */

static int tree_ok(const Py_buffer *tree, Py_ssize_t size, const char *what)
{
    if (size <= 0 || (size & (size - 1)) || tree->len != 2 * size * (Py_ssize_t)sizeof(double)) {
        PyErr_Format(PyExc_ValueError, "sum-tree: %s holds %zd bytes; a tree of %zd leaves (a power of two) "
                     "holds 2 x %zd float64", what, tree->len, size, size);
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(sumtree_set_doc,
             "sumtree_set(sum, min, size, capacity, leaves, values)\n--\n\n"
             "Set leaves (int64) to values (float64), in order (the last write wins), and re-sum their ancestors "
             "in sum and min (float64 arrays of 2*size; an empty leaf's min is inf). Every leaf and value is "
             "checked first: nothing changes on IndexError or ValueError.");

static PyObject *sumtree_set(PyObject *self, PyObject *args)
{
    Py_buffer sb, mb, lb, vb;
    Py_ssize_t size, capacity;
    PyObject *result = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*w*nny*y*:sumtree_set", &sb, &mb, &size, &capacity, &lb, &vb))
        return NULL;
    double *sum = (double *)sb.buf, *min = (double *)mb.buf;
    const int64_t *leaves = (const int64_t *)lb.buf;
    const double *values = (const double *)vb.buf;
    Py_ssize_t k = lb.len / (Py_ssize_t)sizeof(int64_t);
    if (!tree_ok(&sb, size, "sum") || !tree_ok(&mb, size, "min"))
        goto done;
    if (capacity <= 0 || capacity > size || lb.len != k * (Py_ssize_t)sizeof(int64_t)
        || vb.len != k * (Py_ssize_t)sizeof(double)) {
        PyErr_Format(PyExc_ValueError, "sumtree_set: %zd bytes of leaves and %zd of values (capacity %zd of %zd)",
                     lb.len, vb.len, capacity, size);
        goto done;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (!(values[i] >= 0.0 && values[i] < HUGE_VAL)) { /* also false for NaN */
            PyErr_SetString(PyExc_ValueError, "priorities must be finite and >= 0");
            goto done;
        }
        if (leaves[i] < 0 || leaves[i] >= capacity) {
            PyErr_Format(PyExc_IndexError, "leaf index out of range [0, %zd)", capacity);
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        size_t node = (size_t)(leaves[i] + size);
        sum[node] = values[i];
        min[node] = values[i] > 0.0 ? values[i] : HUGE_VAL;
    }
    /* each leaf's ancestors are re-summed from their two children after every leaf was set, so the last
     * recomputation of a node sees its children's final values: the tree the numpy path builds, bit for bit
     * (an inner node is one addition of its two children, and IEEE addition commutes) */
    for (Py_ssize_t i = 0; i < k; i++) {
        if (i + 1 < k && leaves[i + 1] >> 1 == leaves[i] >> 1)
            continue; /* its sibling comes next (a ring's consecutive leaves): one walk for both */
        for (size_t node = (size_t)(leaves[i] + size) >> 1; node >= 1; node >>= 1) {
            double a = sum[2 * node], b = sum[2 * node + 1];
            double c = min[2 * node], d = min[2 * node + 1];
            sum[node] = a + b;
            min[node] = c < d ? c : d;
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&sb);
    PyBuffer_Release(&mb);
    PyBuffer_Release(&lb);
    PyBuffer_Release(&vb);
    return result;
}

PyDoc_STRVAR(sumtree_find_doc,
             "sumtree_find(sum, size, prefix, out)\n--\n\n"
             "For each prefix sum v (float64, 0 <= v < total) write to out (int64, as many) the leaf where the "
             "running sum passes v, never a leaf of an empty subtree.");

static PyObject *sumtree_find(PyObject *self, PyObject *args)
{
    Py_buffer sb, pb, ob;
    Py_ssize_t size;
    PyObject *result = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*ny*w*:sumtree_find", &sb, &size, &pb, &ob))
        return NULL;
    const double *sum = (const double *)sb.buf;
    const double *prefix = (const double *)pb.buf;
    int64_t *out = (int64_t *)ob.buf;
    Py_ssize_t n = pb.len / (Py_ssize_t)sizeof(double);
    if (!tree_ok(&sb, size, "sum"))
        goto done;
    if (pb.len != n * (Py_ssize_t)sizeof(double) || ob.len != n * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_Format(PyExc_ValueError, "sumtree_find: %zd bytes of prefix sums and %zd of output", pb.len, ob.len);
        goto done;
    }
    /* LANES descents in lockstep: each level's loads of the lanes are independent, so their cache misses
     * overlap instead of queueing behind one descent's chain (512 sorted points at depth 17: 13 us against 21
     * one at a time; 16 lanes no better; a branch-free step 20 us, as sorted points turn alike and the
     * branch predicts them) */
    for (Py_ssize_t i = 0; i < n; i += LANES) {
        Py_ssize_t lanes = n - i < LANES ? n - i : LANES;
        double v[LANES];
        size_t node[LANES];
        for (Py_ssize_t j = 0; j < lanes; j++) {
            v[j] = prefix[i + j];
            node[j] = 1;
        }
        for (size_t level = 1; level < (size_t)size; level <<= 1) {
            for (Py_ssize_t j = 0; j < lanes; j++) {
                size_t left = node[j] << 1; /* the left child */
                double mass = sum[left];
                /* right when v is past the left mass, but never into an empty subtree because of float rounding
                 * (the numpy path's test and subtraction: the same leaf for the same v) */
                if (v[j] >= mass && sum[left + 1] > 0.0) {
                    v[j] -= mass;
                    left += 1;
                }
                node[j] = left;
            }
        }
        for (Py_ssize_t j = 0; j < lanes; j++)
            out[i + j] = (int64_t)(node[j] - (size_t)size);
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&sb);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&ob);
    return result;
}

static PyMethodDef methods[] = {
    {"copy", copy, METH_VARARGS, copy_doc},
    {"sumtree_set", sumtree_set, METH_VARARGS, sumtree_set_doc},
    {"sumtree_find", sumtree_find, METH_VARARGS, sumtree_find_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "conduit._native",
    "Native kernels: non-temporal copies (conduit.storage.streaming), the sum-tree (conduit.samplers.sumtree).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__native(void)
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
