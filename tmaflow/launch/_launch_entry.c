/* Kernel.launch's lookup in C: included by _launch.c (one translation unit, one build).
 *
 * An Entry is what ``kernel.launch`` finds once the kernel has built a launcher
 * (``Kernel.launcher`` puts it in the instance's dict, where it shadows the method). A call
 * ``entry(*args, grid=, block=, cluster=, smem=, stream=, pdl=)`` looks the launcher up in the
 * kernel's dict under the key the Python method builds, (grid, block, cluster, smem, stream,
 * pdl, ordinal 0, thread ident), and calls it with the arguments in place. Every other call
 * goes to the Python method, ``Kernel.launch``, unchanged: keywords other than those (or a
 * positional one), a stream that is not None or an int, a process that has selected a device
 * other than 0, a key not in the dict or unhashable, and a launcher retired by a context reset
 * (the Python method builds a new one, as it does for a launcher of an older generation).
 * The entry remembers the launcher it found last, with the key's objects (held, so none is
 * freed and its address reused) and the thread: a call with the same objects in the same thread
 * takes it without building, hashing and comparing the key again.
 */

#define KEY_PARTS 6 /* grid, block, cluster, smem, stream, pdl (then ordinal and thread) */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *launchers; /* the kernel's dict (key as above) -> Launcher */
    PyObject *switched;  /* runtime.device._switched: [True] once a device other than 0 was used */
    PyObject *retired;   /* Launcher._retired_call: a retired launcher's function */
    PyObject *slow;      /* Kernel.launch bound to the kernel: every call not of the fast kind */
    PyObject *cluster;   /* the default cluster, (1, 1, 1) */
    Slot func;           /* where a Launcher (a functools.partial) keeps its function */
    PyObject *last;      /* the launcher found last (or NULL), for these key objects ... */
    PyObject *last_key[KEY_PARTS];
    unsigned long last_thread; /* ... in this thread */
} Entry;

/* Remember `launcher` as the one for these key objects in this thread (NULL: forget) */
static void entry_remember(Entry *e, PyObject *launcher, PyObject *const *key, unsigned long thread) {
    /* every field is set before any old reference goes: releasing one may run Python code
     * (a key's __del__) that switches threads, and another thread must never see the new
     * launcher beside the old key or thread */
    PyObject *old[KEY_PARTS + 1];
    old[0] = e->last;
    e->last = Py_XNewRef(launcher);
    for (int i = 0; i < KEY_PARTS; i++) {
        old[i + 1] = e->last_key[i];
        e->last_key[i] = launcher == NULL ? NULL : Py_NewRef(key[i]);
    }
    e->last_thread = thread;
    for (int i = 0; i <= KEY_PARTS; i++) Py_XDECREF(old[i]);
}

static int entry_same_key(const Entry *e, PyObject *const *key, unsigned long thread) {
    if (e->last == NULL || e->last_thread != thread) return 0;
    for (int i = 0; i < KEY_PARTS; i++)
        if (key[i] != e->last_key[i]) return 0;
    return 1;
}

static PyObject *s_grid, *s_block, *s_cluster, *s_smem, *s_stream, *s_pdl, *s_func;

/* The launcher under the Python method's key (a new reference), or NULL: without an exception
 * where the Python method must decide, with one where looking up raised (not a TypeError). */
static PyObject *entry_launcher(Entry *e, PyObject *const *kw, PyObject *kwnames) {
    PyObject *grid = NULL, *block = NULL, *cluster = e->cluster, *smem = Py_None,
             *stream = Py_None, *pdl = Py_False;
    Py_ssize_t nk = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    int seen = 0;
    for (Py_ssize_t i = 0; i < nk; i++) { /* the code object's interned names, else Python */
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        int bit = name == s_grid ? 1 : name == s_block ? 2 : name == s_cluster ? 4
                  : name == s_smem ? 8 : name == s_stream ? 16 : name == s_pdl ? 32 : 0;
        if (bit == 0 || (seen & bit)) return NULL;
        seen |= bit;
        PyObject **to = bit == 1 ? &grid : bit == 2 ? &block : bit == 4 ? &cluster
                        : bit == 8 ? &smem : bit == 16 ? &stream : &pdl;
        *to = kw[i];
    }
    if (grid == NULL || block == NULL) return NULL;
    if (stream != Py_None && !PyLong_CheckExact(stream)) return NULL; /* stream_handle's job */
    if (!PyList_CheckExact(e->switched) || PyList_GET_SIZE(e->switched) != 1 ||
        PyList_GET_ITEM(e->switched, 0) != Py_False)
        return NULL; /* current_ordinal()'s job */
    PyObject *const parts[KEY_PARTS] = {grid, block, cluster, smem, stream, pdl};
    unsigned long thread = PyThread_get_thread_ident(); /* what threading.get_ident() gives */
    PyObject *launcher;
    if (entry_same_key(e, parts, thread)) {
        launcher = Py_NewRef(e->last);
    } else {
        PyObject *ident = PyLong_FromUnsignedLong(thread);
        if (ident == NULL) return NULL;
        PyObject *zero = PyLong_FromLong(0);
        PyObject *key = zero == NULL ? NULL : PyTuple_Pack(8, grid, block, cluster, smem, stream, pdl, zero, ident);
        Py_XDECREF(zero);
        Py_DECREF(ident);
        if (key == NULL) return NULL;
        launcher = PyDict_GetItemWithError(e->launchers, key); /* borrowed */
        Py_DECREF(key);
        if (launcher == NULL) {
            if (PyErr_ExceptionMatches(PyExc_TypeError)) PyErr_Clear(); /* unhashable: Python's */
            return NULL;
        }
        Py_INCREF(launcher); /* the dict may change while it runs */
        entry_remember(e, launcher, parts, thread);
    }
    PyObject *func = slot_peek(&e->func, launcher, s_func);
    if (func == e->retired || func == NULL) { /* the Python method builds another */
        entry_remember(e, NULL, parts, 0);
        Py_DECREF(launcher);
        return NULL;
    }
    return launcher;
}

static PyObject *entry_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Entry *e = (Entry *)self;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *launcher = entry_launcher(e, args + n, kwnames);
    if (launcher == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_Vectorcall(e->slow, args, nargsf, kwnames);
    }
    /* the caller's permission to borrow args[-1] passes on: the partial puts itself there */
    PyObject *result = PyObject_Vectorcall(launcher, args, n | (nargsf & PY_VECTORCALL_ARGUMENTS_OFFSET), NULL);
    Py_DECREF(launcher);
    return result;
}

static int entry_traverse(PyObject *self, visitproc visit, void *arg) {
    Entry *e = (Entry *)self;
    Py_VISIT(e->launchers);
    Py_VISIT(e->switched);
    Py_VISIT(e->retired);
    Py_VISIT(e->slow);
    Py_VISIT(e->cluster);
    Py_VISIT(e->last);
    for (int i = 0; i < KEY_PARTS; i++) Py_VISIT(e->last_key[i]);
    return 0;
}

static int entry_clear(PyObject *self) {
    Entry *e = (Entry *)self;
    Py_CLEAR(e->launchers);
    Py_CLEAR(e->switched);
    Py_CLEAR(e->retired);
    Py_CLEAR(e->slow);
    Py_CLEAR(e->cluster);
    entry_remember(e, NULL, NULL, 0);
    return 0;
}

static void entry_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    entry_clear(self);
    PyObject_GC_Del(self);
}

/* a cleared entry (a cycle being collected) sends every call to nothing: refuse it */
static PyObject *entry_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (((Entry *)self)->slow == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this kernel's launch entry was cleared");
        return NULL;
    }
    return entry_call(self, args, nargsf, kwnames);
}

/* inspect.signature and help() follow it to the Python method */
static PyObject *entry_wrapped(PyObject *self, void *closure) {
    (void)closure;
    PyObject *slow = ((Entry *)self)->slow;
    return Py_NewRef(slow ? slow : Py_None);
}

static PyGetSetDef entry_getset[] = {
    {"__wrapped__", entry_wrapped, NULL, "the Python method this entry stands in for", NULL},
    {NULL},
};

/* Entry(launchers, switched, retired, slow, cluster) */
static PyObject *entry_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *launchers, *switched, *retired, *slow, *cluster;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Entry takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!O!OOO!", &PyDict_Type, &launchers, &PyList_Type, &switched,
                          &retired, &slow, &PyTuple_Type, &cluster))
        return NULL;
    Entry *e = PyObject_GC_New(Entry, type);
    if (e == NULL) return NULL;
    e->vectorcall = entry_vectorcall;
    e->launchers = Py_NewRef(launchers);
    e->switched = Py_NewRef(switched);
    e->retired = Py_NewRef(retired);
    e->slow = Py_NewRef(slow);
    e->cluster = Py_NewRef(cluster);
    e->func = (Slot){NULL, 0, -1};
    e->last = NULL;
    for (int i = 0; i < KEY_PARTS; i++) e->last_key[i] = NULL;
    e->last_thread = 0;
    PyObject_GC_Track((PyObject *)e);
    return (PyObject *)e;
}

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tmaflow.native.Entry",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = entry_traverse,
    .tp_clear = entry_clear,
    .tp_vectorcall_offset = offsetof(Entry, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = entry_new,
    .tp_dealloc = entry_dealloc,
    .tp_getset = entry_getset,
    .tp_doc = "Kernel.launch's lookup of a launcher, for one kernel (the Python method does the rest).",
};

/* module_exec's part: the type and its names; 0, or -1 with an exception set */
static int entry_exec(PyObject *m) {
    if (PyType_Ready(&EntryType) < 0) return -1;
    if (s_grid == NULL) {
        INTERN(s_grid, "grid");
        INTERN(s_block, "block");
        INTERN(s_cluster, "cluster");
        INTERN(s_smem, "smem");
        INTERN(s_stream, "stream");
        INTERN(s_pdl, "pdl");
        INTERN(s_func, "func");
    }
    Py_INCREF(&EntryType);
    if (PyModule_AddObject(m, "Entry", (PyObject *)&EntryType) < 0) {
        Py_DECREF(&EntryType);
        return -1;
    }
    return 0;
}
