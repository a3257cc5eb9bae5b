/* The replay's two loops over its graph, compiled (dag.py and whatif.py keep the Python loops they
 * replace, and use them where this module was not built):
 *
 * - topological_order: Kahn's algorithm with the same last-in-first-out ready list as dag.py's, so the
 *   same order, node for node;
 * - longest_path: one pass over the edges, which come in topological order of their sources, so each
 *   node's time is final before its first outgoing edge is relaxed. The same IEEE double additions and
 *   comparisons as the Python loop, so the same answer to the bit. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static int
get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (view->itemsize != itemsize || view->ndim != 1) {
        PyErr_Format(PyExc_TypeError, "%s: expected a 1-d array of %zd-byte items", what, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *
longest_path(PyObject *self, PyObject *args)
{
    Py_ssize_t n, start, end;
    PyObject *src_obj, *dst_obj, *w_obj;
    if (!PyArg_ParseTuple(args, "nnnOOO", &n, &start, &end, &src_obj, &dst_obj, &w_obj))
        return NULL;
    if (n < 0 || start < 0 || start >= n || end < 0 || end >= n) {
        PyErr_SetString(PyExc_ValueError, "longest_path: start and end must be nodes of the graph");
        return NULL;
    }
    Py_buffer src, dst, w;
    if (get_buffer(src_obj, &src, 8, "src") < 0)
        return NULL;
    if (get_buffer(dst_obj, &dst, 8, "dst") < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (get_buffer(w_obj, &w, 8, "w") < 0) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t m = src.shape[0];
    if (dst.shape[0] != m || w.shape[0] != m) {
        PyErr_SetString(PyExc_ValueError, "longest_path: src, dst and w differ in length");
        goto done;
    }
    const int64_t *s = (const int64_t *)src.buf, *d = (const int64_t *)dst.buf;
    const double *wt = (const double *)w.buf;
    for (Py_ssize_t i = 0; i < m; i++) {
        if (s[i] < 0 || s[i] >= n || d[i] < 0 || d[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "longest_path: an edge names a node outside the graph");
            goto done;
        }
    }
    double *dl = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(double));
    if (dl == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    double t;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        dl[i] = -INFINITY;
    dl[start] = 0.0;
    for (Py_ssize_t i = 0; i < m; i++) {
        double cand = dl[s[i]] + wt[i];
        if (cand > dl[d[i]])
            dl[d[i]] = cand;
    }
    t = dl[end] > 0.0 ? dl[end] : 0.0;
    Py_END_ALLOW_THREADS
    PyMem_Free(dl);
    result = PyFloat_FromDouble(t);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&w);
    return result;
}

static PyObject *
topological_order(PyObject *self, PyObject *args)
{
    Py_ssize_t n;
    PyObject *src_obj, *dst_obj;
    if (!PyArg_ParseTuple(args, "nOO", &n, &src_obj, &dst_obj))
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "topological_order: a negative node count");
        return NULL;
    }
    Py_buffer src, dst;
    if (get_buffer(src_obj, &src, 8, "src") < 0)
        return NULL;
    if (get_buffer(dst_obj, &dst, 8, "dst") < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t m = src.shape[0];
    const int64_t *s = (const int64_t *)src.buf, *d = (const int64_t *)dst.buf;
    int64_t *first = NULL, *targets = NULL, *waiting = NULL, *ready = NULL, *order = NULL;
    if (dst.shape[0] != m) {
        PyErr_SetString(PyExc_ValueError, "topological_order: src and dst differ in length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        if (s[i] < 0 || s[i] >= n || d[i] < 0 || d[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "topological_order: an edge names a node outside the graph");
            goto done;
        }
    }
    size_t nn = (size_t)n + 1, mm = (size_t)(m ? m : 1);
    first = PyMem_Calloc(nn + 1, sizeof(int64_t));
    targets = PyMem_Malloc(mm * sizeof(int64_t));
    waiting = PyMem_Calloc(nn, sizeof(int64_t));
    ready = PyMem_Malloc(nn * sizeof(int64_t));
    order = PyMem_Malloc(nn * sizeof(int64_t));
    if (!first || !targets || !waiting || !ready || !order) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t count = 0;
    Py_BEGIN_ALLOW_THREADS
    /* the edges grouped by source, each group in the edges' order (dag.py: a stable sort by source) */
    for (Py_ssize_t i = 0; i < m; i++) {
        first[s[i] + 1]++;
        waiting[d[i]]++;
    }
    for (Py_ssize_t v = 0; v < n; v++)
        first[v + 1] += first[v];
    for (Py_ssize_t i = 0; i < m; i++)
        targets[first[s[i]]++] = d[i];
    for (Py_ssize_t v = n; v > 0; v--) /* the fill moved each start to the next group's: move them back */
        first[v] = first[v - 1];
    first[0] = 0;
    Py_ssize_t top = 0;
    for (Py_ssize_t v = 0; v < n; v++)
        if (!waiting[v])
            ready[top++] = v;
    while (top) {
        int64_t u = ready[--top];
        order[count++] = u;
        for (int64_t j = first[u]; j < first[u + 1]; j++) {
            int64_t v = targets[j];
            if (!--waiting[v])
                ready[top++] = v;
        }
    }
    Py_END_ALLOW_THREADS
    if (count < n)
        result = Py_NewRef(Py_None); /* a cycle: dag.py raises Cyclic */
    else
        result = PyBytes_FromStringAndSize((const char *)order, (Py_ssize_t)(count * sizeof(int64_t)));
done:
    PyMem_Free(first);
    PyMem_Free(targets);
    PyMem_Free(waiting);
    PyMem_Free(ready);
    PyMem_Free(order);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyMethodDef methods[] = {
    {"topological_order", topological_order, METH_VARARGS,
     "topological_order(n, src, dst) -> bytes | None: every node (int64, native order), each after all its "
     "predecessors, by Kahn's algorithm with a last-in-first-out ready list; None when the graph has a cycle."},
    {"longest_path", longest_path, METH_VARARGS,
     "longest_path(n, start, end, src, dst, w) -> float: the longest path from start to end (0 at least); "
     "src, dst: int64 arrays of edges in topological order of their sources, w: their float64 weights."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_replay_loops", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__replay_loops(void)
{
    return PyModule_Create(&module);
}
