/* Status codes become Python exceptions.
 *
 * Every stria function returns a stria_status_t; the wrapper turns a failure into an instance of
 * the StriaError subclass for that code, whose str() is the library's own message
 * (stria_get_last_error(), read on the same thread right after the call, before any other stria
 * call can overwrite it). On success the Python function returns None or its outputs.
 *
 * The classes live in this extension (so the raw module is usable alone) and are re-exported by
 * the `stria` package. Each also derives from the closest builtin exception, so callers that
 * catch ValueError, MemoryError, TimeoutError or NotImplementedError keep working. */

%{
typedef struct {
  stria_status_t status;
  const char* name;
  PyObject** builtin; /* the builtin exception it also derives from, or NULL */
} stria_py_error_kind;

static PyObject* stria_py_base_error = NULL;
static PyObject* stria_py_error_classes[16];

static const stria_py_error_kind stria_py_error_kinds[] = {
    {STRIA_ERROR_INVALID_ARGUMENT, "InvalidArgumentError", &PyExc_ValueError},
    {STRIA_ERROR_UNSUPPORTED, "UnsupportedError", &PyExc_NotImplementedError},
    {STRIA_ERROR_OUT_OF_MEMORY, "OutOfMemoryError", &PyExc_MemoryError},
    {STRIA_ERROR_TRANSPORT, "TransportError", NULL},
    {STRIA_ERROR_TIMEOUT, "TimeoutError", &PyExc_TimeoutError},
    {STRIA_ERROR_CUDA, "CudaError", NULL},
    {STRIA_ERROR_ABORTED, "AbortedError", NULL},
    {STRIA_ERROR_INTERNAL, "InternalError", NULL},
};

/* What the module's initialisation returns on failure: SWIG 4.4 and later initialise the module in
   two phases (PEP 489), where %init is the body of the exec slot, which returns -1; before, the
   module init function, which returns NULL. */
#if SWIG_VERSION >= 0x040400
#define STRIA_PY_INIT_FAILED -1
#else
#define STRIA_PY_INIT_FAILED NULL
#endif

/* Creates the classes and adds them to the module dict; 0 on success. */
static int stria_py_init_errors(PyObject* dict) {
  stria_py_base_error = PyErr_NewExceptionWithDoc(
      "stria.StriaError",
      "A stria call failed. str(e) is the library's message; e.status is the stria_status_t code.",
      PyExc_RuntimeError, NULL);
  if (!stria_py_base_error || PyDict_SetItemString(dict, "StriaError", stria_py_base_error) < 0) return -1;
  for (size_t i = 0; i < sizeof stria_py_error_kinds / sizeof stria_py_error_kinds[0]; ++i) {
    const stria_py_error_kind* kind = &stria_py_error_kinds[i];
    char qualified[64];
    PyOS_snprintf(qualified, sizeof qualified, "stria.%s", kind->name);
    PyObject* bases = kind->builtin ? PyTuple_Pack(2, stria_py_base_error, *kind->builtin)
                                    : PyTuple_Pack(1, stria_py_base_error);
    if (!bases) return -1;
    PyObject* cls = PyErr_NewException(qualified, bases, NULL);
    Py_DECREF(bases);
    if (!cls) return -1;
    PyObject* code = PyLong_FromLong((long)kind->status);
    int failed = !code || PyObject_SetAttrString(cls, "status", code) < 0 ||
                 PyDict_SetItemString(dict, kind->name, cls) < 0;
    Py_XDECREF(code);
    if (failed) {
      Py_DECREF(cls);
      return -1;
    }
    if ((size_t)kind->status < sizeof stria_py_error_classes / sizeof stria_py_error_classes[0])
      stria_py_error_classes[kind->status] = cls; /* the module dict holds it too: never freed */
  }
  return 0;
}

/* Raises the exception for a failed status with this thread's last-error message. */
static void stria_py_raise(stria_status_t status) {
  PyObject* cls = NULL;
  if ((size_t)status < sizeof stria_py_error_classes / sizeof stria_py_error_classes[0])
    cls = stria_py_error_classes[status];
  if (!cls) cls = stria_py_base_error; /* a status this binding does not know yet */
  const char* text = stria_get_last_error();
  if (!text || !*text) text = stria_status_string(status);
  /* "replace": a message that quotes a path or a name in another encoding still arrives. */
  PyObject* message = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
  if (!message) return;
  PyObject* error = PyObject_CallOneArg(cls, message);
  Py_DECREF(message);
  if (!error) return;
  PyObject* code = PyLong_FromLong((long)status);
  if (code && PyObject_SetAttrString(error, "status", code) == 0) PyErr_SetObject(cls, error);
  Py_XDECREF(code);
  Py_DECREF(error);
}
%}

%init %{
  if (stria_py_init_errors(d) < 0) return STRIA_PY_INIT_FAILED;
%}

/* Every function returns a status: raise on failure, else return None (plus any outputs). */
%typemap(out) stria_status_t {
  if ($1 != STRIA_SUCCESS) {
    stria_py_raise($1);
    SWIG_fail;
  }
  $result = SWIG_Py_Void();
}
