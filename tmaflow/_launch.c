/* The launch fast path in C: one Plan per launcher and tuple of argument types.
 *
 * A plan checks each argument exactly as the generated Python path does (its exact type, the
 * liveness of tmaflow memory, the device of a torch or cupy array), writes it into the
 * launcher's parameter buffer and calls cuLaunchKernelEx through the pointer the driver gave
 * tmaflow. Anything it does not accept goes back to the launcher's Python methods:
 * ``_dispatch(args)`` when a check fails (another plan, or the checked path that names the
 * error), ``_checked(args)`` while a graph captures or when reading an argument raised.
 * It is built by tmaflow/native.py with the system C compiler; without one, launches take the
 * generated Python path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The driver's CUlaunchConfig (cuda.h), mirrored: plans copy the struct the launcher's
 * cuda.bindings object holds and change only hStream. */
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned int numAttrs;
} LaunchConfig;
_Static_assert(offsetof(LaunchConfig, hStream) == 32, "CUlaunchConfig.hStream at 32");
_Static_assert(sizeof(LaunchConfig) == 56, "CUlaunchConfig is 56 bytes");

typedef int (*LaunchFn)(const LaunchConfig *, void *, void **, void **);

enum Kind { ARRAY, MAP, TORCH, CUPY, SIGNED, UNSIGNED, FLOAT, NONE };

typedef struct {
    int kind, offset, size;
    PyObject *type; /* the argument's exact type (NULL for NONE) */
    PyObject *live; /* ARRAY / MAP: what ``arg._alloc.live`` must be */
} Field;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    LaunchFn launch;          /* NULL: a dry plan (tests): pack, choose the stream, no launch */
    void *function;
    void **kernel_params;
    char *buffer;
    LaunchConfig config;
    PyObject *current_stream; /* ordinal -> stream handle, or NULL for the config's stream */
    PyObject *ordinal;
    long ordinal_value;
    PyObject *capturing;      /* truthy while any graph captures */
    PyObject *on_error;       /* err -> raises */
    PyObject *keep;           /* what the pointers above point into */
    PyObject *last_stream;    /* dry plans: the stream the last call chose */
    Py_ssize_t nfields;
    Field fields[1];
} Plan;

static PyObject *s_alloc, *s_live, *s_ptr, *s_bytes, *s_data, *s_device_id, *s_get_device,
    *s_data_ptr, *s_dispatch, *s_checked;

/* Write a new reference's value as 8 bytes at `at` (the reference is released): 1, or -1
 * with an exception set (NULL in, not an int, out of range). */
static int put_u64(char *at, PyObject *obj) {
    if (obj == NULL) return -1;
    unsigned long long value = PyLong_AsUnsignedLongLong(obj);
    Py_DECREF(obj);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    memcpy(at, &value, 8);
    return 1;
}

/* Whether a new reference to a device ordinal is the plan's (the reference is released): 1, 0,
 * or -1 with an exception set. */
static int on_device(const Plan *plan, PyObject *ordinal) {
    if (ordinal == NULL) return -1;
    long value = PyLong_AsLong(ordinal);
    Py_DECREF(ordinal);
    if (value == -1 && PyErr_Occurred()) return -1;
    return value == plan->ordinal_value;
}

/* 1: written; 0: a check failed (no exception); -1: an exception is set */
static int write_field(const Plan *plan, const Field *f, PyObject *arg) {
    char *at = plan->buffer + f->offset;
    if (f->kind == NONE) {
        if (arg != Py_None) return 0;
        memset(at, 0, 8);
        return 1;
    }
    if ((PyObject *)Py_TYPE(arg) != f->type) return 0;
    switch (f->kind) {
    case ARRAY:
    case MAP: {
        PyObject *alloc = PyObject_GetAttr(arg, s_alloc);
        if (alloc == NULL) return -1;
        PyObject *live = PyObject_GetAttr(alloc, s_live);
        Py_DECREF(alloc);
        if (live == NULL) return -1;
        Py_DECREF(live);
        if (live != f->live) return 0;
        if (f->kind == MAP) {
            PyObject *raw = PyObject_GetAttr(arg, s_bytes);
            if (raw == NULL) return -1;
            if (!PyBytes_Check(raw) || PyBytes_GET_SIZE(raw) != f->size) {
                Py_DECREF(raw);
                return 0;
            }
            memcpy(at, PyBytes_AS_STRING(raw), (size_t)f->size);
            Py_DECREF(raw);
            return 1;
        }
        return put_u64(at, PyObject_GetAttr(arg, s_ptr));
    }
    case TORCH: {
        int ok = on_device(plan, PyObject_CallMethodNoArgs(arg, s_get_device));
        return ok < 1 ? ok : put_u64(at, PyObject_CallMethodNoArgs(arg, s_data_ptr));
    }
    case CUPY: {
        PyObject *data = PyObject_GetAttr(arg, s_data);
        if (data == NULL) return -1;
        int ok = on_device(plan, PyObject_GetAttr(data, s_device_id));
        if (ok == 1) ok = put_u64(at, PyObject_GetAttr(data, s_ptr));
        Py_DECREF(data);
        return ok;
    }
    case SIGNED: {
        int overflow = 0;
        long long value = PyLong_AsLongLongAndOverflow(arg, &overflow);
        if (value == -1 && PyErr_Occurred()) return -1;
        long long hi = f->size == 8 ? LLONG_MAX : (1LL << (8 * f->size - 1)) - 1;
        if (overflow || value > hi || value < -hi - 1) return 0; /* the checked path names it */
        memcpy(at, &value, (size_t)f->size); /* little-endian: the low bytes */
        return 1;
    }
    case UNSIGNED: {
        unsigned long long value = PyLong_AsUnsignedLongLong(arg);
        if (value == (unsigned long long)-1 && PyErr_Occurred()) { /* negative or too large */
            PyErr_Clear();
            return 0;
        }
        if (f->size < 8 && value >> (8 * f->size)) return 0;
        memcpy(at, &value, (size_t)f->size);
        return 1;
    }
    case FLOAT: {
        double value = PyFloat_AsDouble(arg);
        if (value == -1.0 && PyErr_Occurred()) return -1;
        if (f->size == 4) {
            if (isfinite(value) && fabs(value) > FLT_MAX) return 0; /* as struct's 'f' refuses */
            float narrow = (float)value;
            memcpy(at, &narrow, 4);
        } else {
            memcpy(at, &value, 8);
        }
        return 1;
    }
    }
    return 0;
}

/* ``launcher.method(args)``, the args rebuilt as a tuple (the paths that are not this one) */
static PyObject *hand_back(PyObject *launcher, PyObject *method, PyObject *const *args,
                           Py_ssize_t nargs) {
    PyObject *tuple = PyTuple_New(nargs);
    if (tuple == NULL) return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(tuple, i, args[i]);
    }
    PyObject *result = PyObject_CallMethodOneArg(launcher, method, tuple);
    Py_DECREF(tuple);
    return result;
}

/* plan(launcher, *args): the launcher's partial passes itself first */
static PyObject *plan_call(PyObject *self, PyObject *const *argv, size_t nargsf, PyObject *kw) {
    Plan *plan = (Plan *)self;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n < 1 || kw != NULL) {
        PyErr_SetString(PyExc_TypeError, "a launch plan takes the launcher and positional arguments");
        return NULL;
    }
    PyObject *launcher = argv[0];
    PyObject *const *args = argv + 1;
    n -= 1;
    if (plan->capturing == NULL) return hand_back(launcher, s_checked, args, n);
    int capturing = PyObject_IsTrue(plan->capturing);
    if (capturing < 0) return NULL;
    if (capturing) return hand_back(launcher, s_checked, args, n);
    if (n != plan->nfields) return hand_back(launcher, s_dispatch, args, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        int ok = write_field(plan, &plan->fields[i], args[i]);
        if (ok < 0) {
            PyErr_Clear(); /* the checked path reports the argument by name */
            return hand_back(launcher, s_checked, args, n);
        }
        if (ok == 0) return hand_back(launcher, s_dispatch, args, n);
    }
    LaunchConfig config = plan->config;
    if (plan->current_stream != NULL) {
        PyObject *stream = PyObject_CallOneArg(plan->current_stream, plan->ordinal);
        if (stream == NULL) return NULL;
        config.hStream = PyLong_AsVoidPtr(stream);
        if (plan->launch == NULL) Py_XSETREF(plan->last_stream, Py_NewRef(stream));
        Py_DECREF(stream);
        if (config.hStream == NULL && PyErr_Occurred()) return NULL;
    }
    if (plan->launch == NULL) Py_RETURN_NONE;
    int err = plan->launch(&config, plan->function, plan->kernel_params, NULL);
    if (err) {
        PyObject *code = PyLong_FromLong(err);
        if (code == NULL) return NULL;
        PyObject *raised = PyObject_CallOneArg(plan->on_error, code);
        Py_DECREF(code);
        Py_XDECREF(raised);
        return raised == NULL ? NULL : Py_NewRef(Py_None);
    }
    Py_RETURN_NONE;
}

/* Plans are in cycles (launcher -> its plans -> on_error, a bound method of the launcher),
 * so they take part in garbage collection. */
static int plan_traverse(PyObject *self, visitproc visit, void *arg) {
    Plan *plan = (Plan *)self;
    for (Py_ssize_t i = 0; i < plan->nfields; i++) {
        Py_VISIT(plan->fields[i].type);
        Py_VISIT(plan->fields[i].live);
    }
    Py_VISIT(plan->current_stream);
    Py_VISIT(plan->ordinal);
    Py_VISIT(plan->capturing);
    Py_VISIT(plan->on_error);
    Py_VISIT(plan->keep);
    Py_VISIT(plan->last_stream);
    return 0;
}

static int plan_clear(PyObject *self) {
    Plan *plan = (Plan *)self;
    for (Py_ssize_t i = 0; i < plan->nfields; i++) {
        Py_CLEAR(plan->fields[i].type);
        Py_CLEAR(plan->fields[i].live);
    }
    plan->nfields = 0; /* a cleared plan hands every call back */
    Py_CLEAR(plan->current_stream);
    Py_CLEAR(plan->ordinal);
    Py_CLEAR(plan->capturing);
    Py_CLEAR(plan->on_error);
    Py_CLEAR(plan->keep);
    Py_CLEAR(plan->last_stream);
    return 0;
}

static void plan_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    plan_clear(self);
    PyObject_GC_Del(self);
}

static PyObject *plan_last_stream(PyObject *self, void *closure) {
    PyObject *s = ((Plan *)self)->last_stream;
    return Py_NewRef(s ? s : Py_None);
}

static PyGetSetDef plan_getset[] = {
    {"last_stream", plan_last_stream, NULL, "a dry plan's stream of its last call", NULL},
    {NULL},
};

static PyTypeObject PlanType;

/* Plan(launch, function, kernel_params, buffer, config, fields, current_stream, ordinal,
 *      capturing, on_error, keep)
 * launch / function / kernel_params / buffer / config: addresses (launch 0: a dry plan);
 * fields: ((kind, offset, size, type, live), ...); current_stream: callable or None. */
static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    unsigned long long launch, function, kernel_params, buffer, config;
    PyObject *fields, *current_stream, *ordinal, *capturing, *on_error, *keep;
    if (!PyArg_ParseTuple(args, "KKKKKO!OOOOO", &launch, &function, &kernel_params, &buffer,
                          &config, &PyTuple_Type, &fields, &current_stream, &ordinal, &capturing,
                          &on_error, &keep))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(fields);
    Plan *plan = PyObject_GC_NewVar(Plan, &PlanType, n > 0 ? n : 1);
    if (plan == NULL) return NULL;
    plan->nfields = 0;
    plan->current_stream = plan->ordinal = plan->capturing = plan->on_error = plan->keep = NULL;
    plan->last_stream = NULL;
    plan->vectorcall = plan_call;
    plan->launch = (LaunchFn)(uintptr_t)launch;
    plan->function = (void *)(uintptr_t)function;
    plan->kernel_params = (void **)(uintptr_t)kernel_params;
    plan->buffer = (char *)(uintptr_t)buffer;
    memcpy(&plan->config, (const void *)(uintptr_t)config, sizeof(LaunchConfig));
    plan->ordinal_value = PyLong_AsLong(ordinal);
    if (plan->ordinal_value == -1 && PyErr_Occurred()) goto fail;
    plan->current_stream = current_stream == Py_None ? NULL : Py_NewRef(current_stream);
    plan->ordinal = Py_NewRef(ordinal);
    plan->capturing = Py_NewRef(capturing);
    plan->on_error = Py_NewRef(on_error);
    plan->keep = Py_NewRef(keep);
    for (Py_ssize_t i = 0; i < n; i++) {
        Field *f = &plan->fields[i];
        PyObject *ftype, *live;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, i), "iiiOO", &f->kind, &f->offset, &f->size,
                              &ftype, &live))
            goto fail;
        f->type = ftype == Py_None ? NULL : Py_NewRef(ftype);
        f->live = Py_NewRef(live);
        plan->nfields = i + 1;
        int sizes_ok = f->kind == MAP ? f->size == 128
                       : (f->kind == SIGNED || f->kind == UNSIGNED)
                           ? (f->size == 1 || f->size == 2 || f->size == 4 || f->size == 8)
                       : f->kind == FLOAT ? (f->size == 4 || f->size == 8)
                                          : f->size == 8;
        if (f->kind < ARRAY || f->kind > NONE || !sizes_ok || f->offset < 0 ||
            (f->kind != NONE && f->type == NULL)) {
            PyErr_Format(PyExc_ValueError, "field %zd: kind %d size %d is not a parameter a plan writes",
                         i, f->kind, f->size);
            goto fail;
        }
    }
    PyObject_GC_Track((PyObject *)plan);
    return (PyObject *)plan;
fail:
    Py_DECREF(plan);
    return NULL;
}

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tmaflow.native.Plan",
    .tp_basicsize = offsetof(Plan, fields),
    .tp_itemsize = sizeof(Field),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = plan_traverse,
    .tp_clear = plan_clear,
    .tp_vectorcall_offset = offsetof(Plan, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = plan_new,
    .tp_dealloc = plan_dealloc,
    .tp_getset = plan_getset,
    .tp_doc = "A launcher's packing and launch for one tuple of argument types.",
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tmaflow_launch", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_tmaflow_launch(void) {
    if (PyType_Ready(&PlanType) < 0) return NULL;
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_alloc, "_alloc");
    INTERN(s_live, "live");
    INTERN(s_ptr, "ptr");
    INTERN(s_bytes, "_bytes");
    INTERN(s_data, "data");
    INTERN(s_device_id, "device_id");
    INTERN(s_get_device, "get_device");
    INTERN(s_data_ptr, "data_ptr");
    INTERN(s_dispatch, "_dispatch");
    INTERN(s_checked, "_checked");
#undef INTERN
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
