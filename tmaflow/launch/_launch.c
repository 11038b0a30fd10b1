/* The launch fast path in C: one Plan per launcher and tuple of argument types.
 *
 * A plan checks each argument exactly as the generated Python path does (its exact type, the
 * liveness of tmaflow memory, the device of every array and tensor map), writes it into
 * parameter storage of its own call and calls cuLaunchKernelEx, without the GIL, through the
 * pointer the driver gave tmaflow. Anything it does not accept goes back to the launcher's
 * Python methods: ``_dispatch(args)`` when a check fails (another plan, or the checked path
 * that names the error), ``_checked(args)`` while a graph captures or when reading an argument
 * raised an error that means "not of the fast kind" (AttributeError, TypeError, ValueError,
 * OverflowError, as the generated path catches); any other exception propagates.
 * Python code run while arguments are read (a property, ``get_device``, a finalizer) may
 * launch this plan again or drop it: each call packs into its own storage and holds the plan.
 * It is built by tmaflow/launch/native.py with the system C compiler; without one, launches take the
 * generated Python path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h> /* T_OBJECT(_EX), READ_RESTRICTED before 3.12's Py_ names */
#define Py_T_OBJECT_EX T_OBJECT_EX
#define _Py_T_OBJECT T_OBJECT
#define Py_AUDIT_READ READ_RESTRICTED
#endif

/* Bumped whenever the Plan constructor or the module's interface changes: native.py refuses
 * (and rebuilds) a cached build that reports another number. */
#define ABI 5

/* The CUDA 12.1+ parameter space (params.MAX_PARAM_BYTES) */
#define MAX_PARAM_BYTES 32764
/* a CUtensorMap parameter */
#define MAP_BYTES 128
/* parameter storage on the C stack up to this size, else a heap block for the call */
#define STACK_PARAM_BYTES 4096

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

/* args.PLAN_KINDS, in this order */
enum Kind { ARRAY, TENSORMAP, TORCH, CUPY, SIGNED, UNSIGNED, FLOAT, NONE };

/* Where one attribute of objects of one type lies: CPython's own LOAD_ATTR_SLOT, for the C
 * plan. The offset holds while the type keeps the version tag it had when the attribute was
 * looked up (assigning any attribute of the class or of a base clears the tag), the type's
 * attribute access is the generic one, and the attribute is a __slots__ member (a data
 * descriptor: an instance __dict__ cannot shadow it). `type` is borrowed: it is compared with
 * the type of a live object before it is read. */
typedef struct {
    PyTypeObject *type;
    unsigned int version;     /* type->tp_version_tag at the lookup; 0: no tag, offset -1 */
    Py_ssize_t offset;        /* -1: not a slot of `type` (read it by name) */
} Slot;

typedef struct {
    int kind, offset, size;
    PyObject *type; /* the argument's exact type (NULL for NONE) */
    PyObject *live, *live_anywhere; /* ARRAY / TENSORMAP: the two tokens ``arg._alloc.live``
                                     * may be (memory.live_tokens: this device, or unnamed) */
    Slot alloc, live_slot, value; /* ARRAY / TENSORMAP: arg._alloc, arg._alloc.live, and
                                   * arg.ptr or arg._bytes */
} Field;

typedef struct {
    PyObject_VAR_HEAD         /* ob_size: the number of fields */
    vectorcallfunc vectorcall;
    int dry;                  /* tests: pack, choose the stream, record both, launch nothing */
    LaunchFn launch;          /* the driver's cuLaunchKernelEx (never NULL unless dry) */
    void *function;
    LaunchConfig config;
    int size;                 /* bytes of parameter storage: every field lies inside it */
    int padded;               /* whether some of those bytes are no field's (zeroed per call) */
    unsigned long long launches; /* calls that launched (dry: that reached the launch) */
    PyObject *current_stream; /* ordinal -> stream handle, or NULL for the config's stream */
    PyObject *ordinal;
    long ordinal_value;
    PyObject *capturing;      /* truthy while any graph captures */
    PyObject *on_error;       /* err -> raises */
    PyObject *keep;           /* what the pointers above point into */
    PyObject *last_stream;    /* dry plans: the stream and the parameter bytes of the last */
    PyObject *last_params;    /* call that reached the launch */
    Field fields[];
} Plan;

static PyObject *s_alloc, *s_live, *s_ptr, *s_bytes, *s_data, *s_device_id, *s_get_device,
    *s_data_ptr, *s_dispatch, *s_checked, *attributes;
static PyObject *not_fast; /* the exceptions that hand a call to the checked path */

/* Learn where `name` lies in objects of `type` (a slot, or -1: read by name). Runs no Python
 * code: _PyType_Lookup only walks the MRO's dicts (and gives the type a version tag). */
static void slot_learn(Slot *slot, PyTypeObject *type, PyObject *name) {
    slot->type = type;
    slot->offset = -1;
    PyObject *descr = type->tp_getattro == PyObject_GenericGetAttr ? _PyType_Lookup(type, name) : NULL;
    slot->version = type->tp_version_tag; /* after the lookup, which assigns it */
    if (descr == NULL || slot->version == 0 || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) return;
    /* a member of this type or a base: another class's descriptor (assigned to a class
     * attribute) names an offset in objects of that class, which the descriptor itself refuses */
    if (!PyType_IsSubtype(type, ((PyDescrObject *)descr)->d_type)) return;
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    /* an object member (NULL: unset, or None for T_OBJECT; either is then read by name) */
    if ((member->type == Py_T_OBJECT_EX || member->type == _Py_T_OBJECT) && !(member->flags & Py_AUDIT_READ))
        slot->offset = member->offset;
}

/* obj.name borrowed from its slot, or NULL (no exception) where `slot` cannot read it: not a
 * slot of obj's type as that type is now, or unset. Runs no Python code, so what it gives
 * stays alive until the caller runs some; the caller reads by name where it gives NULL. */
static inline PyObject *slot_peek(Slot *slot, PyObject *obj, PyObject *name) {
    PyTypeObject *type = Py_TYPE(obj);
    if (type != slot->type || type->tp_version_tag != slot->version) slot_learn(slot, type, name);
    return slot->offset < 0 ? NULL : *(PyObject **)((char *)obj + slot->offset);
}

/* Whether arg._alloc.live is one of the field's tokens (live, of the plan's origin, on its
 * device or an unnamed one): 1, 0, or -1 with an exception set. Slots are read in place and
 * borrowed (no reference counting: an increment followed at once by a decrement of the same
 * count stalls the store-to-load forwarding of 3.12's split counts); anything else by name,
 * where properties, __getattr__ or finalizers may run. */
static int field_live(Field *f, PyObject *arg) {
    PyObject *alloc = slot_peek(&f->alloc, arg, s_alloc), *live;
    if (alloc != NULL && (live = slot_peek(&f->live_slot, alloc, s_live)) != NULL)
        return live == f->live || live == f->live_anywhere;
    if ((alloc = PyObject_GetAttr(arg, s_alloc)) == NULL) return -1;
    PyObject *owned = NULL;
    live = slot_peek(&f->live_slot, alloc, s_live);
    if (live == NULL && (live = owned = PyObject_GetAttr(alloc, s_live)) == NULL) {
        Py_DECREF(alloc);
        return -1;
    }
    int ok = live == f->live || live == f->live_anywhere;
    Py_XDECREF(owned);
    Py_DECREF(alloc);
    return ok;
}

/* A map's 128 bytes from its ``_bytes``: 1, or 0 (not bytes of that size) */
static int put_map(char *at, PyObject *raw) {
    if (!PyBytes_Check(raw) || PyBytes_GET_SIZE(raw) != MAP_BYTES) return 0;
    memcpy(at, PyBytes_AS_STRING(raw), MAP_BYTES); /* a constant size: inlined, no libc call */
    return 1;
}

/* The low `size` bytes of `value` (little-endian), each size a constant copy */
static void put_low(char *at, unsigned long long value, int size) {
    switch (size) {
    case 1: memcpy(at, &value, 1); break;
    case 2: memcpy(at, &value, 2); break;
    case 4: memcpy(at, &value, 4); break;
    default: memcpy(at, &value, 8);
    }
}

/* Write an int's value as 8 bytes at `at`: 1, or -1 with an exception set (not an int, out
 * of range). Runs no Python code (no __index__). */
static int put_u64(char *at, PyObject *obj) {
    unsigned long long value = PyLong_AsUnsignedLongLong(obj);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    memcpy(at, &value, 8);
    return 1;
}

/* put_u64 of a new reference, which it releases (NULL in: -1, the exception is set) */
static int put_u64_new(char *at, PyObject *obj) {
    if (obj == NULL) return -1;
    int ok = put_u64(at, obj);
    Py_DECREF(obj);
    return ok;
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

/* 1: written at `buffer`; 0: a check failed (no exception); -1: an exception is set */
static int write_field(Plan *plan, Field *f, PyObject *arg, char *buffer) {
    char *at = buffer + f->offset;
    if (f->kind == NONE) {
        if (arg != Py_None) return 0;
        memset(at, 0, 8);
        return 1;
    }
    if ((PyObject *)Py_TYPE(arg) != f->type) return 0;
    switch (f->kind) {
    case ARRAY:
    case TENSORMAP: {
        int ok = field_live(f, arg);
        if (ok < 1) return ok;
        PyObject *name = f->kind == TENSORMAP ? s_bytes : s_ptr;
        PyObject *value = slot_peek(&f->value, arg, name);
        if (value != NULL) /* borrowed: nothing below runs Python code */
            return f->kind == TENSORMAP ? put_map(at, value) : put_u64(at, value);
        if ((value = PyObject_GetAttr(arg, name)) == NULL) return -1;
        ok = f->kind == TENSORMAP ? put_map(at, value) : put_u64(at, value);
        Py_DECREF(value);
        return ok;
    }
    case TORCH: {
        int ok = on_device(plan, PyObject_CallMethodNoArgs(arg, s_get_device));
        return ok < 1 ? ok : put_u64_new(at, PyObject_CallMethodNoArgs(arg, s_data_ptr));
    }
    case CUPY: {
        PyObject *data = PyObject_GetAttr(arg, s_data);
        if (data == NULL) return -1;
        int ok = on_device(plan, PyObject_GetAttr(data, s_device_id));
        if (ok == 1) ok = put_u64_new(at, PyObject_GetAttr(data, s_ptr));
        Py_DECREF(data);
        return ok;
    }
    case SIGNED: {
        int overflow = 0;
        long long value = PyLong_AsLongLongAndOverflow(arg, &overflow);
        if (value == -1 && PyErr_Occurred()) return -1;
        long long hi = f->size == 8 ? LLONG_MAX : (1LL << (8 * f->size - 1)) - 1;
        if (overflow || value > hi || value < -hi - 1) return 0; /* the checked path names it */
        put_low(at, (unsigned long long)value, f->size);
        return 1;
    }
    case UNSIGNED: {
        unsigned long long value = PyLong_AsUnsignedLongLong(arg);
        if (value == (unsigned long long)-1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
            PyErr_Clear(); /* negative or too large: the checked path names it */
            return 0;
        }
        if (f->size < 8 && value >> (8 * f->size)) return 0;
        put_low(at, value, f->size);
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

/* The dry plan's record of a call that reached the launch: 0, or -1 with an exception set. */
static int record_dry_call(Plan *plan, const LaunchConfig *config, const char *params) {
    PyObject *stream = PyLong_FromVoidPtr(config->hStream);
    if (stream == NULL) return -1;
    PyObject *bytes = PyBytes_FromStringAndSize(params, plan->size);
    if (bytes == NULL) {
        Py_DECREF(stream);
        return -1;
    }
    Py_XSETREF(plan->last_stream, stream);
    Py_XSETREF(plan->last_params, bytes);
    return 0;
}

/* Pack `args` into `params` (plan->size bytes) and `pointers` (one per field), then launch. */
static PyObject *pack_and_launch(Plan *plan, PyObject *launcher, PyObject *const *args,
                                 Py_ssize_t n, char *params, void **pointers) {
    if (plan->padded) memset(params, 0, (size_t)plan->size); /* as the Python paths write it */
    for (Py_ssize_t i = 0; i < n; i++) {
        int ok = write_field(plan, &plan->fields[i], args[i], params);
        if (ok < 0) {
            if (!PyErr_ExceptionMatches(not_fast)) return NULL;
            PyErr_Clear(); /* the checked path reports the argument by name */
            return hand_back(launcher, s_checked, args, n);
        }
        if (ok == 0) return hand_back(launcher, s_dispatch, args, n);
        pointers[i] = params + plan->fields[i].offset;
    }
    LaunchConfig config = plan->config;
    if (plan->current_stream != NULL) {
        PyObject *stream = PyObject_CallOneArg(plan->current_stream, plan->ordinal);
        if (stream == NULL) return NULL;
        config.hStream = PyLong_AsVoidPtr(stream);
        Py_DECREF(stream);
        if (config.hStream == NULL && PyErr_Occurred()) return NULL;
    }
    int err = 0;
    if (plan->dry) {
        if (record_dry_call(plan, &config, params) < 0) return NULL;
    } else {
        /* Everything the driver reads is this call's: the GIL can go (a full launch queue
         * blocks here, and a host callback may need the GIL). */
        LaunchFn launch = plan->launch;
        void *function = plan->function;
        Py_BEGIN_ALLOW_THREADS
        err = launch(&config, function, pointers, NULL);
        Py_END_ALLOW_THREADS
    }
    if (err) {
        PyObject *code = PyLong_FromLong(err);
        if (code == NULL) return NULL;
        PyObject *raised = PyObject_CallOneArg(plan->on_error, code);
        Py_DECREF(code);
        Py_XDECREF(raised);
        return raised == NULL ? NULL : Py_NewRef(Py_None);
    }
    plan->launches++;
    Py_RETURN_NONE;
}

static PyObject *call_held(Plan *plan, PyObject *launcher, PyObject *const *args, Py_ssize_t n) {
    if (plan->capturing == NULL) return hand_back(launcher, s_checked, args, n); /* cleared */
    /* graph.ACTIVE, a list: non-empty while any graph captures */
    int capturing = PyList_CheckExact(plan->capturing) ? PyList_GET_SIZE(plan->capturing) != 0
                                                       : PyObject_IsTrue(plan->capturing);
    if (capturing < 0) return NULL;
    if (capturing) return hand_back(launcher, s_checked, args, n);
    if (n != Py_SIZE(plan)) return hand_back(launcher, s_dispatch, args, n);
    /* this call's own storage: a launch from Python code run while packing gets its own */
    uint64_t stack_params[STACK_PARAM_BYTES / 8];
    void *stack_pointers[STACK_PARAM_BYTES / 8];
    if (plan->size <= STACK_PARAM_BYTES && n <= STACK_PARAM_BYTES / 8)
        return pack_and_launch(plan, launcher, args, n, (char *)stack_params, stack_pointers);
    char *heap = PyMem_Malloc((size_t)n * sizeof(void *) + (size_t)plan->size);
    if (heap == NULL) return PyErr_NoMemory();
    void **pointers = (void **)heap;
    char *params = heap + (size_t)n * sizeof(void *);
    PyObject *result = pack_and_launch(plan, launcher, args, n, params, pointers);
    PyMem_Free(heap);
    return result;
}

/* plan(launcher, *args): the launcher's partial passes itself first */
static PyObject *plan_call(PyObject *self, PyObject *const *argv, size_t nargsf, PyObject *kw) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n < 1 || kw != NULL) {
        PyErr_SetString(PyExc_TypeError, "a launch plan takes the launcher and positional arguments");
        return NULL;
    }
    /* Python code run while packing may drop the launcher's last references to both */
    PyObject *launcher = Py_NewRef(argv[0]);
    Py_INCREF(self);
    PyObject *result = call_held((Plan *)self, launcher, argv + 1, n - 1);
    Py_DECREF(self);
    Py_DECREF(launcher);
    return result;
}

/* Plans are in cycles (launcher -> its plans -> on_error, a bound method of the launcher),
 * so they take part in garbage collection. */
static int plan_traverse(PyObject *self, visitproc visit, void *arg) {
    Plan *plan = (Plan *)self;
    for (Py_ssize_t i = 0; i < Py_SIZE(plan); i++) {
        Py_VISIT(plan->fields[i].type);
        Py_VISIT(plan->fields[i].live);
        Py_VISIT(plan->fields[i].live_anywhere);
    }
    Py_VISIT(plan->current_stream);
    Py_VISIT(plan->ordinal);
    Py_VISIT(plan->capturing);
    Py_VISIT(plan->on_error);
    Py_VISIT(plan->keep);
    Py_VISIT(plan->last_stream);
    Py_VISIT(plan->last_params);
    return 0;
}

static int plan_clear(PyObject *self) {
    Plan *plan = (Plan *)self;
    for (Py_ssize_t i = 0; i < Py_SIZE(plan); i++) {
        Py_CLEAR(plan->fields[i].type);
        Py_CLEAR(plan->fields[i].live);
        Py_CLEAR(plan->fields[i].live_anywhere);
    }
    Py_CLEAR(plan->current_stream);
    Py_CLEAR(plan->ordinal);
    Py_CLEAR(plan->capturing); /* a cleared plan hands every call back */
    Py_CLEAR(plan->on_error);
    Py_CLEAR(plan->keep);
    Py_CLEAR(plan->last_stream);
    Py_CLEAR(plan->last_params);
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

static PyObject *plan_last_params(PyObject *self, void *closure) {
    PyObject *s = ((Plan *)self)->last_params;
    return Py_NewRef(s ? s : Py_None);
}

static PyObject *plan_launches(PyObject *self, void *closure) {
    return PyLong_FromUnsignedLongLong(((Plan *)self)->launches);
}

static PyObject *plan_dry(PyObject *self, void *closure) {
    return PyBool_FromLong(((Plan *)self)->dry);
}

static PyGetSetDef plan_getset[] = {
    {"launches", plan_launches, NULL, "calls that launched (a dry plan: that reached the launch)",
     NULL},
    {"dry", plan_dry, NULL, "whether the plan packs without launching (tests)", NULL},
    {"last_stream", plan_last_stream, NULL, "a dry plan's stream of its last call", NULL},
    {"last_params", plan_last_params, NULL, "a dry plan's parameter bytes of its last call", NULL},
    {NULL},
};

static PyTypeObject PlanType;

/* Whether a field's kind and size are a parameter a plan writes */
static int field_ok(const Field *f) {
    switch (f->kind) {
    case TENSORMAP: return f->size == MAP_BYTES;
    case SIGNED:
    case UNSIGNED: return f->size == 1 || f->size == 2 || f->size == 4 || f->size == 8;
    case FLOAT: return f->size == 4 || f->size == 8;
    case ARRAY:
    case TORCH:
    case CUPY:
    case NONE: return f->size == 8;
    }
    return 0;
}

/* Whether the fields write every byte of the parameter storage (each writes `size` bytes at
 * `offset`): then a call zeroes nothing first. */
static int fields_cover(const Plan *plan) {
    char *written = PyMem_Calloc((size_t)plan->size + 1, 1);
    if (written == NULL) {
        PyErr_Clear();
        return 0; /* zero every call: right either way */
    }
    for (Py_ssize_t i = 0; i < Py_SIZE(plan); i++)
        memset(written + plan->fields[i].offset, 1, (size_t)plan->fields[i].size);
    int all = memchr(written, 0, (size_t)plan->size) == NULL;
    PyMem_Free(written);
    return all;
}

/* Plan(dry, launch, function, config, size, fields, current_stream, ordinal, capturing,
 *      on_error, keep)
 * dry: pack and record, launch nothing; launch / function / config: addresses (launch: the
 * driver's cuLaunchKernelEx, not 0 unless dry); size: bytes of parameter storage;
 * fields: ((kind, offset, size, type, live), ...) where live is None or the pair of tokens
 * (memory.live_tokens); current_stream: callable or None. */
static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    int dry, size;
    unsigned long long launch, function, config;
    PyObject *fields, *current_stream, *ordinal, *capturing, *on_error, *keep;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Plan takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "pKKKiO!OOOOO", &dry, &launch, &function, &config, &size,
                          &PyTuple_Type, &fields, &current_stream, &ordinal, &capturing,
                          &on_error, &keep))
        return NULL;
    if (!dry && launch == 0) {
        PyErr_SetString(PyExc_ValueError, "launch=0: no address of cuLaunchKernelEx (only a dry "
                                          "plan launches nothing)");
        return NULL;
    }
    if (config == 0) {
        PyErr_SetString(PyExc_ValueError, "config=0: no CUlaunchConfig to copy");
        return NULL;
    }
    if (size < 0 || size > MAX_PARAM_BYTES) {
        PyErr_Format(PyExc_ValueError, "size=%d: parameter storage is 0 to %d bytes", size,
                     MAX_PARAM_BYTES);
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(fields);
    Plan *plan = PyObject_GC_NewVar(Plan, &PlanType, n);
    if (plan == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Field *f = &plan->fields[i];
        f->type = f->live = f->live_anywhere = NULL;
        f->alloc = f->live_slot = f->value = (Slot){NULL, 0, -1}; /* learnt at the first call */
    }
    plan->current_stream = plan->ordinal = plan->capturing = plan->on_error = plan->keep = NULL;
    plan->last_stream = plan->last_params = NULL;
    plan->vectorcall = plan_call;
    plan->dry = dry;
    plan->launch = dry ? NULL : (LaunchFn)(uintptr_t)launch;
    plan->function = (void *)(uintptr_t)function;
    plan->size = size;
    plan->launches = 0;
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
        if (!field_ok(f) || (f->kind != NONE && f->type == NULL)) {
            PyErr_Format(PyExc_ValueError, "field %zd: kind %d size %d is not a parameter a plan writes",
                         i, f->kind, f->size);
            goto fail;
        }
        if (f->offset < 0 || f->offset > size - f->size) {
            PyErr_Format(PyExc_ValueError, "field %zd: offset %d + size %d lies outside the %d bytes "
                         "of parameter storage", i, f->offset, f->size, size);
            goto fail;
        }
        if (PyTuple_Check(live) && PyTuple_GET_SIZE(live) == 2) {
            f->live = Py_NewRef(PyTuple_GET_ITEM(live, 0));
            f->live_anywhere = Py_NewRef(PyTuple_GET_ITEM(live, 1));
        } else if (f->kind == ARRAY || f->kind == TENSORMAP || live != Py_None) {
            PyErr_Format(PyExc_ValueError, "field %zd: live must be a pair of tokens for an array "
                         "or tensor map, else None", i);
            goto fail;
        } else {
            f->live = Py_NewRef(live);
            f->live_anywhere = Py_NewRef(live);
        }
    }
    plan->padded = !fields_cover(plan);
    PyObject_GC_Track((PyObject *)plan);
    return (PyObject *)plan;
fail:
    Py_DECREF(plan);
    return NULL;
}

/* a module-exec step of this file and the one it includes: an interned name, or return -1 */
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return -1

#include "_launch_entry.c" /* Kernel.launch's lookup (Entry) */

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

static int module_exec(PyObject *m) {
    if (PyType_Ready(&PlanType) < 0) return -1;
    if (s_alloc == NULL) { /* process-wide: the type and these names are static */
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
        /* what native.py checks against args.PLAN_ATTRIBUTES before using this build */
        attributes = PyTuple_Pack(10, s_alloc, s_live, s_ptr, s_bytes, s_data, s_device_id,
                                  s_get_device, s_data_ptr, s_dispatch, s_checked);
        if (attributes == NULL) return -1;
        not_fast = PyTuple_Pack(4, PyExc_AttributeError, PyExc_TypeError, PyExc_ValueError,
                                PyExc_OverflowError);
        if (not_fast == NULL) return -1;
    }
    if (PyModule_AddIntConstant(m, "ABI", ABI) < 0) return -1;
    Py_INCREF(attributes);
    if (PyModule_AddObject(m, "ATTRIBUTES", attributes) < 0) {
        Py_DECREF(attributes);
        return -1;
    }
    if (PyModule_AddIntConstant(m, "MAX_PARAM_BYTES", MAX_PARAM_BYTES) < 0) return -1;
    if (entry_exec(m) < 0) return -1;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#ifdef Py_mod_multiple_interpreters /* 3.12+: the type and the interned names are static */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
#ifdef Py_mod_gil
    /* Declared used: a plan's counter and a dry plan's records are updated without atomics or
     * locks, and a Launcher (one per thread) swaps its plans unlocked; free-threaded Python
     * re-enables the GIL when it imports this module rather than race on them. */
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tmaflow_launch", NULL, 0, NULL,
                                    module_slots};

PyMODINIT_FUNC PyInit_tmaflow_launch(void) { return PyModuleDef_Init(&module); }
